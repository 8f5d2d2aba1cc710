"""How long a lease the worker asks for: ``LEASE_DURATION``, longer while renewals or
claims lag.

The worker calls a lease lost when no renewal came back within the lease less one
``HEARTBEAT_INTERVAL`` (the local deadline), and stops its job; the reaper then gives the
job to another worker, which runs it again. On a slow database server or a busy machine
(fsyncs queued behind other writers, a CPU shared with many processes), a renewal's round
trip and the heartbeat thread's own wait for the CPU can grow to a large share of a short
lease. Neither is a fault, and neither may make a job run twice.

So the heartbeat notes, for each renewal, how late its answer came: the time from the
previous renewal's send to this one's answer, less the ``HEARTBEAT_INTERVAL`` that was
meant to pass between them. While the last ``MEMORY`` renewals came back up to ``delay``
seconds late, renewals and claims ask for a lease of
``2 * HEARTBEAT_INTERVAL + HEADROOM * delay`` when that is longer than ``LEASE_DURATION``
(never more than ``MAX_STRETCH`` times it). The local deadline follows the lease each
statement asked for, so a worker never counts on more than the database gave.

Claims count too. A claimed job's lease runs from the claim's send; the heartbeat renews
it first at its next beat after the main loop took the job (up to a beat later than a
renewed lease's next renewal), and that renewal must come back within the lease less a
beat. So a claim asks for one ``HEARTBEAT_INTERVAL`` more than a renewal
(``claim_seconds``): a fresh job's first renewal has as long to come back as any other
job's next one. And the main loop notes, for each claim, how long it
took from its send until the loop took its jobs (and, before its first claim, how long
the worker's registration took: on a machine already overloaded when the worker starts,
its first claims ask for enough), and the lease covers the worst of the last ``MEMORY``
of those the same way. The two memories are apart (each written by its own thread), so
quick claims never push a late renewal out of mind, nor the reverse.

The price: jobs of a worker that crashes while its leases are stretched come back after
the longer lease. A renewal answered later than the lease it had (the worker was frozen
or cut off for longer: a fault, whose leases are lost anyway) stretches nothing, nor does
the gap a failed renewal leaves (a database outage is a fault too).

The limit: a renewal can ask for more only once the one before came back, so a lag that
jumps in one step past what the lease in force covers still costs that lease.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

HEADROOM = 3.0
"""A stretched lease covers a renewal this many times as late as the worst of the recent
ones: load that keeps growing is met before it costs a lease."""

MAX_STRETCH = 4.0
"""A stretched lease is at most this many ``LEASE_DURATION``."""

MEMORY = 32
"""Renewals remembered: a lease shrinks back once this many came back on time."""

STEPS = 4
"""Stretched leases are whole quarters of ``LEASE_DURATION`` (a change is rare news)."""


@dataclass(frozen=True, slots=True)
class Stretch:
    """A change of the lease the worker asks for."""

    seconds: float
    """The lease asked for from now on."""
    delay: float
    """How late the latest renewals came back, at worst (seconds)."""


class LeaseLength:
    """The lease the worker asks for now: the heartbeat thread notes its renewals
    (``renewed``, ``idle``), the main loop its round trips: its claims and its
    registration at start (``trip_came_back``), each in its own memory; both read
    ``seconds`` (the main loop for its claims and its registry row's ``problem``)."""

    def __init__(self, lease_duration: float, heartbeat_interval: float) -> None:
        self.base = lease_duration
        self.beat = heartbeat_interval
        self._delays: deque[float] = deque(maxlen=MEMORY)
        """How late the recent renewals came back (the heartbeat's)."""
        self._renewal_worst = 0.0
        self._trips: deque[float] = deque(maxlen=MEMORY)
        """How long the main loop's recent claims took to reach it (the loop's)."""
        self._trip_worst = 0.0
        """Each worst is written by its owner alone, whole (the readers take no lock)."""
        self._last: tuple[float, float] | None = None
        """The previous renewal of an unbroken series: (its send, the lease it asked)."""
        self._reported = Stretch(lease_duration, 0.0)
        """The lease length the heartbeat last reported (``renewed``)."""

    @property
    def seconds(self) -> float:
        """The lease a renewal asks for."""
        return self._wanted(max(self._renewal_worst, self._trip_worst))

    @property
    def claim_seconds(self) -> float:
        """The lease a claim asks for: a beat more than a renewal (its first renewal comes
        at the heartbeat's next beat after the loop took the job)."""
        return self.seconds + self.beat

    def problem(self) -> str:
        """'' while leases are ``LEASE_DURATION``; else why they are longer (the worker's
        registry row shows it: the admin, ``leasejobs_status``)."""
        seconds = self.seconds
        if seconds == self.base:
            return ""
        renewals, trips = self._renewal_worst, self._trip_worst
        what = "renewals" if renewals >= trips else "claims"
        return (
            f"{what} came back up to {max(renewals, trips):.2f}s late: leases stretched to "
            f"{seconds:g}s (LEASE_DURATION {self.base:g}s)"
        )

    def idle(self) -> None:
        """The heartbeat had no lease to renew, or its renewal failed: the next renewal
        has no predecessor (the gap is no lag)."""
        self._last = None

    def renewed(self, sent: float, answered: float, asked: float) -> Stretch | None:
        """A renewal sent at ``sent`` and answered at ``answered`` (monotonic), asking for
        ``asked`` seconds; the lease length to ask for when it changed since the last
        report (by this renewal, or by the main loop's claims since)."""
        previous, self._last = self._last, (sent, asked)
        if previous is None:  # the first of a series: its round trip alone
            since, had, delay = sent, asked, answered - sent
        else:
            since, had = previous
            delay = answered - since - self.beat
        if answered - since < had:  # else the lease had run out: a fault, not a lag
            self._delays.append(max(0.0, delay))
        self._renewal_worst = max(self._delays, default=0.0)
        seconds = self.seconds
        if seconds == self._reported.seconds:
            return None
        self._reported = Stretch(seconds, max(self._renewal_worst, self._trip_worst))
        return self._reported

    def trip_came_back(self, sent: float, taken: float, asked: float) -> None:
        """A round trip of the main loop: a claim sent at ``sent``, asking for ``asked``
        seconds, whose jobs the loop took at ``taken`` (monotonic), or the worker's
        registration at start, before its first claim (what the first claims may take).
        A claimed job's lease runs from the send, and its first renewal comes a beat
        after the loop took it at the latest: a claim that took long asks the next claims
        (and renewals) to cover that. One answered after its lease ran out is a fault and
        stretches nothing."""
        took = taken - sent
        if took < asked:
            self._trips.append(max(0.0, took))
            self._trip_worst = max(self._trips)

    def _wanted(self, delay: float) -> float:
        needed = 2 * self.beat + HEADROOM * delay
        if needed <= self.base:
            return self.base
        step = self.base / STEPS
        return min(MAX_STRETCH * self.base, math.ceil(needed / step) * step)
