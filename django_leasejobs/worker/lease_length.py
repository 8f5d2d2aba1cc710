"""How long a lease the worker asks for: ``LEASE_DURATION``, longer while renewals lag.

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
    """The lease the worker asks for now. The heartbeat thread writes it (``renewed``,
    ``idle``); the main loop reads it for its claims (``seconds``) and its registry row
    (``problem``)."""

    def __init__(self, lease_duration: float, heartbeat_interval: float) -> None:
        self.base = lease_duration
        self.beat = heartbeat_interval
        self._now = Stretch(lease_duration, 0.0)
        """Replaced whole (one reference: the main loop reads it without a lock)."""
        self._delays: deque[float] = deque(maxlen=MEMORY)
        self._last: tuple[float, float] | None = None
        """The previous renewal of an unbroken series: (its send, the lease it asked)."""

    @property
    def seconds(self) -> float:
        """The lease to ask for."""
        return self._now.seconds

    def problem(self) -> str:
        """'' while leases are ``LEASE_DURATION``; else why they are longer (the worker's
        registry row shows it: the admin, ``leasejobs_status``)."""
        now = self._now
        if now.seconds == self.base:
            return ""
        return (
            f"renewals came back up to {now.delay:.2f}s late: leases stretched to "
            f"{now.seconds:g}s (LEASE_DURATION {self.base:g}s)"
        )

    def idle(self) -> None:
        """The heartbeat had no lease to renew, or its renewal failed: the next renewal
        has no predecessor (the gap is no lag)."""
        self._last = None

    def renewed(self, sent: float, answered: float) -> Stretch | None:
        """A renewal sent at ``sent`` and answered at ``answered`` (monotonic), asking for
        :attr:`seconds` (only this method changes it); the new lease length when it
        changed."""
        asked = self._now.seconds
        previous, self._last = self._last, (sent, asked)
        if previous is None:  # the first of a series: its round trip alone
            since, had, delay = sent, asked, answered - sent
        else:
            since, had = previous
            delay = answered - since - self.beat
        if answered - since < had:  # else the lease had run out: a fault, not a lag
            self._delays.append(max(0.0, delay))
        worst = max(self._delays, default=0.0)
        wanted = self._wanted(worst)
        if wanted == self._now.seconds:
            return None
        self._now = Stretch(wanted, worst)
        return self._now

    def _wanted(self, delay: float) -> float:
        needed = 2 * self.beat + HEADROOM * delay
        if needed <= self.base:
            return self.base
        step = self.base / STEPS
        return min(MAX_STRETCH * self.base, math.ceil(needed / step) * step)
