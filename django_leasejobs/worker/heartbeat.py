"""The heartbeat thread: renews the worker's leases, and does nothing else.

Every ``HEARTBEAT_INTERVAL`` it renews all of the worker's leases in one UPDATE (with
the jobs' progress), on its own connection, for the lease ``LeaseLength`` asks for (longer
while renewals or claims come back late: ``lease_length.py``), so a renewal never waits
behind the main loop's outcome writes or claims, nor behind the housekeeping thread's
registry row and reap passes (``housekeeping.py``). A lease the database no longer
holds, or whose job an operator cancelled, is posted to the main loop's inbox: the loop
stops the job, or, when its outcome is being written, stops renewing the lease and lets
the fenced write decide. A renewal slower than a tenth of the lease is posted too (the
loop claims less). A worker that holds no lease sends nothing (its connection, opened
as the thread starts, stays idle).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from django.db import DatabaseError, connections

from .. import leases
from ..leases import storable_text
from ..signals import heartbeat_sent
from .dispatch import SLOW_ROUND_SHARE
from .inbox import CancelRequested, LeaseLost, RenewalWasSlow
from .lease_length import Stretch
from .rounds import is_connection_error
from .threads import ThreadContext, WorkerThread, next_tick

logger = logging.getLogger("django_leasejobs")

Lease = tuple[int, int]


def send_heartbeat_sent(ctx: ThreadContext, started: float, error: DatabaseError | None) -> None:
    """``heartbeat_sent``: a renewal (the heartbeat's), or while the worker holds no lease
    an update of its registry row (the housekeeping thread's), that began at ``started``."""
    heartbeat_sent.send_robust(
        type(ctx.backend),
        backend=ctx.backend.alias,
        worker_id=ctx.worker_id,
        duration=time.monotonic() - started,
        error=error,
    )


class Heartbeat(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "heartbeat")

    def loop(self) -> None:
        # Connect now, not at the first renewal: under load a connection can take seconds
        # to open, and the first renewal of a claim's leases must not wait for one.
        with contextlib.suppress(DatabaseError):  # (else the first renewal connects)
            connections[self.ctx.database].ensure_connection()
        every = self.ctx.options.heartbeat_interval
        next_beat = time.monotonic() + every
        while not self.stop_event.wait(max(0.0, next_beat - time.monotonic())):
            next_beat = next_tick(next_beat, every, time.monotonic())
            self.tick()

    def tick(self) -> None:
        """One beat: renew every lease the worker holds (nothing when it holds none)."""
        ctx = self.ctx
        started = time.monotonic()
        try:
            renewed = self._renew_leases()
        except DatabaseError as exc:
            logger.warning(
                "heartbeat failed: %s", exc, extra={"worker": ctx.worker_id, "error": str(exc)}
            )
            self._reset_connection()
            # A failed renewal breaks the series: the gap an outage leaves is a fault's,
            # not a lag to stretch the leases for.
            ctx.lease_length.idle()
            send_heartbeat_sent(ctx, started, exc)
            return
        if not renewed:
            return
        send_heartbeat_sent(ctx, started, None)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "heartbeat tick: renewed %d leases",
                renewed,
                extra={"worker": ctx.worker_id, "duration": round(time.monotonic() - started, 6)},
            )

    def _renew_leases(self) -> int:
        """Renew every lease the worker holds; how many it tried (0: it holds none).

        That is every lease not presumed lost: running, waiting for a slot, being
        stopped, or waiting for its outcome to be written, however long that takes (a
        slow write is no fault)."""
        table, inbox, length = self.ctx.table, self.ctx.inbox, self.ctx.lease_length
        asked = table.to_renew()
        if not asked:
            length.idle()
            return 0
        being_written = table.being_recorded()
        seconds = length.seconds
        started = time.monotonic()
        result = self._renew({lease: renewal.progress for lease, renewal in asked.items()}, seconds)
        answered = time.monotonic()
        took = answered - started
        # The local deadline counts from the moment the renewal was sent: the database
        # counts the lease from the statement, which came no earlier. Counting from its
        # return would credit a renewal that sat in a frozen or starved worker with time
        # the database never gave: a job handed to a slot then could start after another
        # worker re-claimed it (bench/chaos.py's stale start after a SIGSTOP).
        table.renewed({lease: asked[lease].generation for lease in result.held}, started, seconds)
        stretch = length.renewed(started, answered, seconds)
        if stretch is not None:
            self._stretched(stretch)
        if took > SLOW_ROUND_SHARE * self.ctx.options.lease_duration:
            inbox.post(RenewalWasSlow(took))
        for lease in result.lost:
            detail = "the renewal matched no row (reaped, re-claimed or finished elsewhere)"
            inbox.post(LeaseLost(lease, detail, asked[lease].generation, confirmed=True))
        for lease in result.cancel_requested:
            inbox.post(CancelRequested(lease))
        # Locked by another transaction: not renewed this time, not lost either; one that
        # stays locked past the local deadline is stopped by the watchdog. (Rows this
        # worker's own database thread is writing right now are no news.)
        foreign = result.skipped - being_written
        if foreign:
            logger.warning(
                "renewal skipped %d leases whose rows another transaction holds locked",
                len(foreign),
                extra={
                    "worker": self.ctx.worker_id,
                    "count": len(foreign),
                    "job_ids": sorted(job_id for job_id, _ in foreign),
                },
            )
        return len(asked)

    def _stretched(self, stretch: Stretch) -> None:
        base = self.ctx.options.lease_duration
        extra = {
            "worker": self.ctx.worker_id,
            "lease": stretch.seconds,
            "delay": round(stretch.delay, 3),
            "lease_duration": base,
        }
        if stretch.seconds > base:
            logger.info(
                "renewals or claims came back up to %.2fs late: asking for %gs leases "
                "(LEASE_DURATION %gs) until they come back on time",
                stretch.delay,
                stretch.seconds,
                base,
                extra=extra,
            )
        else:
            logger.info(
                "renewals and claims come back on time again: asking for %gs leases "
                "(LEASE_DURATION)",
                stretch.seconds,
                extra=extra,
            )

    def _renew(
        self, wanted: dict[Lease, leases.Progress | None], seconds: float
    ) -> leases.RenewResult:
        """Renew for ``seconds`` with the jobs' progress; if the database refuses that for
        a reason other than the connection, renew without it: no job's progress may cost
        the leases."""
        ctx = self.ctx
        try:
            return leases.renew(
                ctx.worker_id,
                wanted,
                lease_duration=seconds,
                using=ctx.database,
            )
        except Exception as exc:
            if is_connection_error(exc):
                raise
            logger.warning(
                "renewal with progress refused (%s); renewing without progress",
                storable_text(exc, 500),
                extra={"worker": ctx.worker_id, "count": len(wanted)},
            )
        return leases.renew(
            ctx.worker_id,
            list(wanted),
            lease_duration=seconds,
            using=ctx.database,
        )
