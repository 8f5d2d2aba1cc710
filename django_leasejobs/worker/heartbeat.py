"""Background threads of a worker: heartbeat (with the reaper's passes) and watchdog.

* ``Heartbeat`` renews all of the worker's leases in one UPDATE every
  ``HEARTBEAT_INTERVAL``, carries the jobs' progress, and stops jobs whose lease
  was not renewed or whose cancel was requested. It touches the worker's registry
  row: every beat while the worker holds a lease or its state changed, every
  ``IDLE_TOUCH_BEATS`` beats otherwise. On the same connection it runs the reap
  pass of ``manage.py reap_stale_locks`` every ``STALE_LOCK_INTERVAL`` seconds. While
  the worker holds no lease and listens for ``NOTIFY``, each beat also looks up when
  the next job of its queues comes due, which the main loop takes as its safety poll
  (``Worker.heard_next_due``). What falls on one tick shares one transaction, so an
  idle worker makes one commit per tick.
* ``Watchdog`` never touches the database, so it keeps working when the database
  does not answer: it stops jobs whose last renewal is older than
  ``LEASE_DURATION - HEARTBEAT_INTERVAL`` (the worker fences itself before the
  database-side lease expires), jobs past their timeout, and escalates SIGTERM to
  SIGKILL after ``LOCK_LOST_GRACE``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections, transaction

from .. import leases
from ..functions import DatabaseNow
from ..leases import storable_text
from ..models import Worker as WorkerRow
from ..reaper import announce_reaped
from ..signals import heartbeat_sent
from .rounds import is_connection_error

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("django_leasejobs")


class _WorkerThread(threading.Thread):
    def __init__(self, worker: Worker, stop: threading.Event, name: str) -> None:
        super().__init__(name=f"leasejobs-{name}", daemon=True)
        self.worker = worker
        self.stop_event = stop

    def _reset_connection(self) -> None:
        with contextlib.suppress(DatabaseError):
            connections[self.worker.database].close()

    def run(self) -> None:
        try:
            while True:
                try:
                    self.loop()
                    return
                except Exception:  # a bug or a hostile value: log it, never die
                    logger.exception(
                        "%s thread failed; restarting it",
                        self.name,
                        extra={"worker": self.worker.worker_id},
                    )
                    self._reset_connection()
                    if self.stop_event.wait(1.0):
                        return
        finally:
            connections.close_all()

    def loop(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class NextDue:
    """When the next pending job of a worker's queues comes due: seconds from the lookup
    (negative or 0: due already), or None when none is pending."""

    seconds: float | None


IDLE_TOUCH_BEATS = 2
"""A worker that holds no lease touches its registry row every this many beats (the
admin and ``leasejobs_status`` call a worker gone after ``3 * HEARTBEAT_INTERVAL + 5`` s)."""


def _advance(due: float, every: float, now: float) -> float:
    """The next time of a tick due at ``due``; one that fell behind starts again from now."""
    following = due + every
    return following if following > now else now + every


class Heartbeat(_WorkerThread):
    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        super().__init__(worker, stop, "heartbeat")
        self._beats_since_touch = 0
        self._touched_state: tuple[str, str] | None = None
        self._reap_took = 0.0

    def loop(self) -> None:
        options = self.worker.options
        beat_every = options.heartbeat_interval
        reap_every = options.stale_lock_interval
        started = time.monotonic()
        next_beat = started + beat_every
        next_reap = started + reap_every if reap_every > 0 else math.inf
        while not self.stop_event.wait(max(0.0, min(next_beat, next_reap) - time.monotonic())):
            now = time.monotonic()
            beat, reap = now >= next_beat, now >= next_reap
            if beat:
                next_beat = _advance(next_beat, beat_every, now)
            if reap:
                next_reap = _advance(next_reap, reap_every, now)
            self.tick(beat=beat, reap=reap)

    def tick(self, *, beat: bool, reap: bool) -> None:
        """One tick: the beat (renewals, the registry row) and/or the reap pass."""
        worker = self.worker
        started = time.monotonic()
        renewed = 0
        touch = look = False
        reaped: list[leases.ReapedJob] = []
        due: NextDue | None = None
        doing = "heartbeat"
        try:
            if beat:
                renewed = self._renew_leases()
                touch = self._touch_due(renewed)
                # An idle listening worker's safety poll rides on its tick (see module doc).
                look = not renewed and worker.listening
            if not (touch or look):
                doing = "background reap"
            together = touch + reap + look > 1
            with transaction.atomic(using=worker.database) if together else nullcontext():
                if touch:
                    self._touch()
                if reap:
                    reaped = self._reap()
                if look:
                    due = NextDue(worker.seconds_to_next_due())
        except DatabaseError as exc:
            logger.warning(
                "%s failed: %s",
                doing,
                exc,
                extra={"worker": worker.worker_id, "error": str(exc)},
            )
            self._reset_connection()
            if renewed or touch:
                self._sent(started, exc)
            return
        if renewed or touch:
            self._sent(started, None)
        if due is not None:
            worker.heard_next_due(due)
        if logger.isEnabledFor(logging.DEBUG):
            done = [f"renewed {renewed} leases"] if renewed else []
            done += ["registry row"] if touch else []
            done += [f"reap pass ({len(reaped)} reaped)"] if reap else []
            done += ["next-due lookup"] if look else []
            logger.debug(
                "heartbeat tick: %s%s",
                ", ".join(done) or "nothing due",
                " in one transaction" if touch + reap + look > 1 else "",
                extra={
                    "worker": worker.worker_id,
                    "duration": round(time.monotonic() - started, 6),
                },
            )
        if reaped:
            announce_reaped(
                reaped,
                backend=worker.backend.alias,
                using=worker.database,
                reaper=worker.worker_id,
                duration=self._reap_took,
            )

    def _renew_leases(self) -> int:
        """Renew every lease the worker holds; how many it tried (0: it holds none)."""
        worker = self.worker
        # Every lease the worker still holds: running, waiting for a slot, being stopped,
        # or waiting for its outcome to be written (however long that takes: a slow write
        # is no fault). Only a lease presumed lost is let go.
        with worker.lock:
            wanted = {
                lease: running.progress
                for lease, running in worker.running.items()
                if running.stop_reason != "lease_lost"
            }
            being_written = {
                lease for lease, running in worker.running.items() if running.recording
            }
        if not wanted:
            return 0
        result = self._renew(wanted)
        now = time.monotonic()
        with worker.lock:
            for lease in result.held:
                if lease in worker.running:
                    worker.running[lease].last_renewed = now
        for lease in result.lost:
            worker.stop(
                lease,
                "lease_lost",
                "the renewal matched no row (reaped, re-claimed or finished elsewhere)",
            )
        for lease in result.cancel_requested:
            worker.stop(lease, "cancelled", "an operator cancelled the job")
        # Locked by another transaction: not renewed this time, not lost either; one that
        # stays locked past the local deadline is stopped by the watchdog. (Rows this
        # worker's own database thread is writing right now are no news.)
        foreign = result.skipped - being_written
        if foreign:
            logger.warning(
                "renewal skipped %d leases whose rows another transaction holds locked",
                len(foreign),
                extra={
                    "worker": worker.worker_id,
                    "count": len(foreign),
                    "job_ids": sorted(job_id for job_id, _ in foreign),
                },
            )
        return len(wanted)

    def _state(self) -> tuple[str, str]:
        worker = self.worker
        return ("stopping" if worker.stopping else "running", worker.problem)

    def _touch_due(self, renewed: int) -> bool:
        self._beats_since_touch += 1
        return (
            renewed > 0
            or self._touched_state != self._state()
            or self._beats_since_touch >= IDLE_TOUCH_BEATS
        )

    def _touch(self) -> None:
        """Update the worker's registry row (put it back if an operator deleted it)."""
        worker = self.worker
        state, problem = self._state()
        seen = (
            WorkerRow.objects.using(worker.database)
            .filter(pk=worker.worker_id)
            .update(last_seen_at=DatabaseNow(), state=state, problem=problem)
        )
        if not seen:
            worker.register()
        self._beats_since_touch = 0
        self._touched_state = (state, problem)

    def _reap(self) -> list[leases.ReapedJob]:
        worker = self.worker
        started = time.monotonic()
        reaped = leases.reap(
            stale_lock_age=worker.options.stale_lock_age,
            backend=worker.backend.alias,
            using=worker.database,
        )
        self._reap_took = time.monotonic() - started
        return reaped

    def _sent(self, started: float, error: DatabaseError | None) -> None:
        worker = self.worker
        heartbeat_sent.send_robust(
            type(worker.backend),
            backend=worker.backend.alias,
            worker_id=worker.worker_id,
            duration=time.monotonic() - started,
            error=error,
        )

    def _renew(self, wanted: dict[tuple[int, int], leases.Progress | None]) -> leases.RenewResult:
        """Renew with the jobs' progress; if the database refuses that for a reason other
        than the connection, renew without it: no job's progress may cost the leases."""
        worker = self.worker
        try:
            return leases.renew(
                worker.worker_id,
                wanted,
                lease_duration=worker.options.lease_duration,
                using=worker.database,
            )
        except Exception as exc:
            if is_connection_error(exc):
                raise
            logger.warning(
                "renewal with progress refused (%s); renewing without progress",
                storable_text(exc, 500),
                extra={"worker": worker.worker_id, "count": len(wanted)},
            )
        return leases.renew(
            worker.worker_id,
            list(wanted),
            lease_duration=worker.options.lease_duration,
            using=worker.database,
        )


class Watchdog(_WorkerThread):
    TICK = 0.1

    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        super().__init__(worker, stop, "watchdog")

    def loop(self) -> None:
        while not self.stop_event.wait(self.TICK):
            self.check()

    def check(self) -> None:
        worker = self.worker
        now = time.monotonic()
        deadline = worker.options.local_lease_deadline
        with worker.lock:
            snapshot = [
                (lease, running)
                for lease, running in worker.running.items()
                if running.stop_reason is None
            ]
        for lease, running in snapshot:
            silent = now - running.last_renewed
            if silent > deadline:
                worker.stop(
                    lease,
                    "lease_lost",
                    f"no successful renewal for {silent:.1f}s (local deadline {deadline:g}s): "
                    "cut off from the database, or the worker was paused",
                )
            elif (
                running.dispatched
                and running.job.timeout is not None
                and now - running.started > running.job.timeout
            ):
                worker.stop(lease, "timeout", f"after {now - running.started:.1f}s")
        worker.pool.escalate()
