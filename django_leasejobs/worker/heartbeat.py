"""Background threads of a worker: heartbeat, watchdog and reaper.

* ``Heartbeat`` renews all of the worker's leases in one UPDATE every
  ``HEARTBEAT_INTERVAL``, carries the jobs' progress, and stops jobs whose lease
  was not renewed or whose cancel was requested. It also touches the worker's
  registry row.
* ``Watchdog`` never touches the database, so it keeps working when the database
  does not answer: it stops jobs whose last renewal is older than
  ``LEASE_DURATION - HEARTBEAT_INTERVAL`` (the worker fences itself before the
  database-side lease expires), jobs past their timeout, and escalates SIGTERM to
  SIGKILL after ``LOCK_LOST_GRACE``.
* ``Reaper`` runs the same reap pass as ``manage.py reap_stale_locks`` every
  ``STALE_LOCK_INTERVAL`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from .. import leases
from ..functions import DatabaseNow
from ..leases import storable_text
from ..models import Worker as WorkerRow
from ..reaper import reap_once
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


class Heartbeat(_WorkerThread):
    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        super().__init__(worker, stop, "heartbeat")

    def loop(self) -> None:
        interval = self.worker.options.heartbeat_interval
        while not self.stop_event.wait(interval):
            self.beat()

    def beat(self) -> None:
        worker = self.worker
        started = time.monotonic()
        # An outcome that could not be written for this long is not renewed any more: the
        # lease runs out and the reaper takes the job back (the worker gives it up).
        unrecorded_since = time.monotonic() - worker.options.local_lease_deadline
        with worker.lock:
            wanted = {
                lease: running.progress
                for lease, running in worker.running.items()
                if running.stop_reason is None
                and (running.recording_since is None or running.recording_since > unrecorded_since)
            }
            being_written = {
                lease for lease, running in worker.running.items() if running.recording
            }
        try:
            if wanted:
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
                # Locked by another transaction: not renewed this time, not lost either; one
                # that stays locked past the local deadline is stopped by the watchdog. (Rows
                # this worker's own database thread is writing right now are no news.)
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
            seen = (
                WorkerRow.objects.using(worker.database)
                .filter(pk=worker.worker_id)
                .update(
                    last_seen_at=DatabaseNow(),
                    state="stopping" if worker.stopping else "running",
                    problem=worker.problem,
                )
            )
            if not seen:  # the row was deleted (by an operator): put it back
                worker.register()
        except DatabaseError as exc:
            logger.warning(
                "heartbeat failed: %s",
                exc,
                extra={"worker": worker.worker_id, "count": len(wanted), "error": str(exc)},
            )
            self._reset_connection()
            self._sent(started, exc)
        else:
            self._sent(started, None)

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


class Reaper(_WorkerThread):
    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        super().__init__(worker, stop, "reaper")

    def loop(self) -> None:
        worker = self.worker
        while not self.stop_event.wait(worker.options.stale_lock_interval):
            try:
                reap_once(
                    stale_lock_age=worker.options.stale_lock_age,
                    backend=worker.backend.alias,
                    using=worker.database,
                    reaper=worker.worker_id,
                )
            except DatabaseError as exc:
                logger.warning(
                    "background reap failed: %s",
                    exc,
                    extra={"worker": worker.worker_id, "error": str(exc)},
                )
                self._reset_connection()
