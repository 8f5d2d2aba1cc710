"""The fixed histogram of the rollup table (``JobRollup``): wait and run times of jobs in
log-spaced buckets, and percentiles read back from the bucket counts. No database.

Bucket 0 holds times under 1 ms; bucket ``i`` (1 to 24) holds ``[2**(i-1), 2**i)``
milliseconds; bucket 25 holds 2**24 ms (about 4 h 40 min) and more. A percentile read
from the counts is the geometric middle of the bucket its rank falls in, so for a true
percentile between 1 ms and 2**24 ms the value reported is within a factor of
``sqrt(2)`` of it (at most 29 % low or 41 % high); under 1 ms it is reported as 0.5 ms
(at most 0.5 ms off), and at 2**24 ms or more as 2**24 ms (a lower bound).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

BUCKETS = 26
"""Buckets per histogram: one under 1 ms, 24 doublings, one open-ended."""
SMALLEST = 0.001
"""The upper edge of bucket 0, in seconds."""
LARGEST = SMALLEST * 2 ** (BUCKETS - 2)
"""The lower edge of the last, open-ended bucket, in seconds (2**24 ms)."""


def bucket_of(seconds: float) -> int:
    """The bucket a duration falls in (a negative one, a clock's rounding, in bucket 0; a
    NaN in the last): the number of buckets' lower edges at or below it, so that
    ``lower_edge(b) <= seconds < upper_edge(b)`` holds exactly. One C call: a worker
    counts two durations per job."""
    return bisect_right(_EDGES, seconds)


def lower_edge(bucket: int) -> float:
    """The smallest duration of ``bucket``, in seconds."""
    return 0.0 if bucket == 0 else SMALLEST * 2 ** (bucket - 1)


def upper_edge(bucket: int) -> float:
    """The first duration past ``bucket``, in seconds (``inf`` for the last one)."""
    return math.inf if bucket == BUCKETS - 1 else SMALLEST * 2**bucket


_EDGES = tuple(lower_edge(bucket) for bucket in range(1, BUCKETS))
"""The lower edges of buckets 1 to ``BUCKETS - 1``, in order."""


def representative(bucket: int) -> float:
    """The value a percentile falling in ``bucket`` is reported as (see the module)."""
    if bucket == 0:
        return SMALLEST / 2
    if bucket == BUCKETS - 1:
        return LARGEST
    return math.sqrt(lower_edge(bucket) * upper_edge(bucket))


def percentile(counts: Sequence[int], fraction: float) -> float | None:
    """The ``fraction`` (0 to 1) percentile of the durations counted in ``counts`` (one
    count per bucket); None when nothing was counted."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, math.ceil(fraction * total))
    seen = 0
    for bucket, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return representative(bucket)
    return representative(BUCKETS - 1)
