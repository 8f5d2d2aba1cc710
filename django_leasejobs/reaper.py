"""One reaper pass: ``leases.reap`` plus its signals and its log lines.

Used by ``manage.py reap_stale_locks``; every worker's housekeeping thread runs
``leases.reap`` itself (sometimes in one transaction with its registry touch), logs a
failed repair with ``announce_repair_failed``, and then calls ``announce_reaped``.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError

from . import leases
from .backend import LeaseJobsBackend  # the documented sender of signals
from .signals import job_reaped

logger = logging.getLogger("django_leasejobs")


def reap_once(
    *,
    stale_lock_age: float,
    backend: str | None,
    using: str,
    reaper: str = "reap_stale_locks",
    rollups: bool = True,
) -> list[leases.ReapedJob]:
    """Run the reap statement once (``rollups``: counting what it reaped in the rollup
    table); log and signal what it recovered, and log a failed repair of waiting steps."""
    started = time.monotonic()
    done = leases.reap(stale_lock_age=stale_lock_age, backend=backend, using=using, rollups=rollups)
    if done.repair_error is not None:
        announce_repair_failed(done.repair_error, backend=backend, reaper=reaper)
    announce_reaped(
        done.jobs, backend=backend, using=using, reaper=reaper, duration=time.monotonic() - started
    )
    return done.jobs


def announce_repair_failed(error: DatabaseError, *, backend: str | None, reaper: str) -> None:
    """Log that a reap pass's repair of waiting workflow steps failed (the reap stands)."""
    logger.warning(
        "repair of waiting workflow steps failed: %s",
        error,
        extra={"backend": backend, "error": str(error), "reaper": reaper},
    )


def announce_reaped(
    reaped: list[leases.ReapedJob],
    *,
    backend: str | None,
    using: str,
    reaper: str,
    duration: float,
) -> None:
    """After a reap pass committed: log what it recovered, ``NOTIFY`` idle workers of the
    jobs put back to ``pending``, and send ``job_reaped`` for each job."""
    if reaped:
        by_status: dict[str, int] = {}
        for job in reaped:
            by_status[job.status] = by_status.get(job.status, 0) + 1
        logger.warning(
            "released stale running jobs count=%d",
            len(reaped),
            extra={
                "count": len(reaped),
                "job_ids": [job.id for job in reaped],
                "by_status": by_status,
                "backend": backend,
                "reaper": reaper,
                "duration": round(duration, 6),
            },
        )
    # Wake idle workers at once for the jobs put back (they keep their place in the order).
    leases.notify(
        leases.NOTIFY_CHANNEL, (job.queue for job in reaped if job.status == "pending"), using=using
    )

    for job in reaped:
        logger.info(
            "reaped job %s attempt %s of worker %s -> %s",
            job.id,
            job.attempt,
            job.worker,
            job.status,
            extra={
                "job_id": job.id,
                "attempt": job.attempt,
                "worker": job.worker,
                "queue": job.queue,
                "status": job.status,
                "stall_count": job.stall_count,
            },
        )
        job_reaped.send_robust(
            sender=LeaseJobsBackend,
            job_id=job.id,
            backend=job.backend,
            attempt=job.attempt,
            worker_id=job.worker,
            status=job.status,
        )
