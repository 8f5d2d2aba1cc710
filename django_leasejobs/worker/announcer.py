"""What a worker tells the world about itself (not about one job): log lines and signals.

Its start and stop, a stop signal, whether its listener wakes it, prefetched jobs it
gives back, its claim rounds. Each log line keeps the stable ``extra`` keys of
``reporter.py``; each signal (``django_leasejobs.signals``) is sent robustly with
``sender=LeaseJobsBackend``, ``backend`` and ``worker_id``. The announcer holds no
state, so the main loop (through its ``Reporter``) and the listener thread each use one.
"""

from __future__ import annotations

import logging
import os

from django.dispatch import Signal

from ..backend import LeaseJobsBackend
from ..conf import Options
from ..signals import (
    jobs_claimed,
    listening_changed,
    prefetch_returned,
    worker_idle,
    worker_started,
    worker_stopped,
    worker_stopping,
)

logger = logging.getLogger("django_leasejobs")


class Announcer:
    def __init__(self, worker_id: str, backend: LeaseJobsBackend) -> None:
        self.worker_id = worker_id
        self.backend = backend

    def _announce(self, signal: Signal, **extra: object) -> None:
        if signal.receivers:
            signal.send_robust(
                sender=LeaseJobsBackend,
                backend=self.backend.alias,
                worker_id=self.worker_id,
                **extra,
            )

    def worker_started(
        self,
        *,
        queues: tuple[str, ...] | None,
        pool: str,
        concurrency: int,
        options: Options,
        schedules: int,
    ) -> None:
        logger.info(
            "worker %s started: backend=%s queues=%s pool=%s concurrency=%d lease=%gs "
            "heartbeat=%gs reaper=%gs lock_lost=%s schedules=%d",
            self.worker_id,
            self.backend.alias,
            ",".join(queues) if queues else "*",
            pool,
            concurrency,
            options.lease_duration,
            options.heartbeat_interval,
            options.stale_lock_interval,
            options.lock_lost_behavior,
            schedules,
            extra={
                "worker": self.worker_id,
                "backend": self.backend.alias,
                "queues": list(queues or []),
                "pool": pool,
                "concurrency": concurrency,
                "pid": os.getpid(),
                "lease_duration": options.lease_duration,
                "heartbeat_interval": options.heartbeat_interval,
                "stale_lock_interval": options.stale_lock_interval,
                "lock_lost_behavior": options.lock_lost_behavior,
                "schedules": schedules,
            },
        )
        self._announce(
            worker_started, pool=pool, concurrency=concurrency, queues=queues, pid=os.getpid()
        )

    def stop_asked(self, name: str, shutdown_timeout: float, *, forced: bool) -> None:
        """A stop signal arrived: the first (``forced`` False) or a second one."""
        if forced:
            logger.warning(
                "%s again: stopping running jobs now and releasing them",
                name,
                extra={"worker": self.worker_id, "signal": name},
            )
        else:
            logger.info(
                "%s: stop claiming, finish running jobs (up to %.0fs); again to force",
                name,
                shutdown_timeout,
                extra={"worker": self.worker_id, "signal": name},
            )
        self._announce(worker_stopping, reason=name, forced=forced)

    def worker_stopped(self, attempts: int) -> None:
        logger.info(
            "worker %s stopped after %d attempts",
            self.worker_id,
            attempts,
            extra={"worker": self.worker_id, "count": attempts},
        )
        self._announce(worker_stopped, attempts=attempts)

    def claimed(self, count: int, limit: int) -> None:
        self._announce(jobs_claimed, count=count, limit=limit)

    def pace_changed(self, what: str, took: float, *, slow: bool) -> None:
        """The worker claims for free slots only (``slow``), or prefetches again."""
        logger.info(
            "%s took %.3fs: %s",
            what,
            took,
            "claiming for free slots only, no prefetch" if slow else "prefetching again",
            extra={"worker": self.worker_id, "duration": round(took, 6)},
        )

    def idle(self, wait: float, *, listening: bool, passed_over: bool) -> None:
        """An empty claim: the worker waits ``wait`` seconds before it looks again
        (``passed_over``: a ``--burst`` worker's claim read past a due job's locked row)."""
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "no job ready%s; next look for work in %.3fs (%s)",
                " (a due job's row was locked elsewhere)" if passed_over else "",
                wait,
                "listening" if listening else "polling",
                extra={"worker": self.worker_id, "duration": round(wait, 6)},
            )
        self._announce(worker_idle, wait=wait, listening=listening, passed_over=passed_over)

    def burst_left_due(self, waited: float) -> None:
        """A ``--burst`` worker exits although due jobs are pending: their rows stayed
        locked by other transactions for ``waited`` seconds (``loop.BURST_PATIENCE``)."""
        logger.warning(
            "--burst: exiting with due jobs left pending: their rows stayed locked by "
            "other transactions for %.1fs (another worker's claim, or a transaction that "
            "holds them with select_for_update); a worker that is not --burst takes them",
            waited,
            extra={"worker": self.worker_id, "duration": round(waited, 6)},
        )

    def gave_back(self, count: int) -> None:
        if count:
            logger.info(
                "gave back %d prefetched jobs that never started",
                count,
                extra={"worker": self.worker_id, "count": count},
            )

    def prefetch_returned(self, count: int, waited: float) -> None:
        logger.info(
            "giving back %d prefetched jobs that waited %.1fs for a slot",
            count,
            waited,
            extra={"worker": self.worker_id, "count": count},
        )
        self._announce(prefetch_returned, count=count, waited=waited)

    # -- the listener (its thread) ---------------------------------------------------------

    def listening(self, alias: str) -> None:
        logger.info(
            "listening for new jobs on database %r",
            alias,
            extra={"worker": self.worker_id, "database": alias},
        )
        self._announce(listening_changed, listening=True, reason=None, error=None)

    def listen_failed(self, error: str) -> None:
        logger.warning(
            "LISTEN connection failed (%s); polling meanwhile",
            error,
            extra={"worker": self.worker_id, "error": error},
        )
        self._announce(listening_changed, listening=False, reason="connection_failed", error=error)

    def pooled(self, alias: str, why: str, poll_interval: float) -> None:
        logger.warning(
            "not listening for new jobs: database %r goes through a connection pooler (%s), "
            "where a LISTEN would stay on a server connection other clients use; this "
            "worker polls every %gs instead. To keep instant wake-ups, set "
            'OPTIONS["LISTEN_DATABASE"] to a DATABASES alias that connects to the same '
            "database directly.",
            alias,
            why,
            poll_interval,
            extra={"worker": self.worker_id, "database": alias},
        )
        self._announce(listening_changed, listening=False, reason="pooler", error=why)
