"""An operator's writes: cancel a job, retry a failed or dead one.

Both write to the database of the job's backend (its ``DATABASE`` option) unless
``using`` names another alias, whoever calls them (the admin, a shell, a command).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import IntegrityError, connections, transaction

from ..conf import BACKEND_PATH, parse_options
from ..models import JobStatus
from .dependants import settle_and_notify, steps_of
from .dialect import Dialect, dialect, placeholders, retry_deadlocks
from .enqueue import NOTIFY_CHANNEL
from .values import CancelResult, RetryResult


def backend_database(backend: str) -> str:
    """The database alias that holds the jobs of the task backend ``backend``."""
    params = (getattr(settings, "TASKS", None) or {}).get(backend)
    if not isinstance(params, dict) or params.get("BACKEND") != BACKEND_PATH:
        raise ValueError(f"TASKS[{backend!r}] is not a django-leasejobs backend")
    options, _ = parse_options(params.get("OPTIONS"))
    return options.database


def cancel(job_id: int, *, backend: str = "default", using: str | None = None) -> CancelResult:
    """Cancel a job: a pending one at once; a running one by flagging it for its worker."""
    d = dialect(using or backend_database(backend))
    return retry_deadlocks(d.using, lambda: _cancel(d, job_id))


def _cancel(d: Dialect, job_id: int) -> CancelResult:
    with transaction.atomic(using=d.using), connections[d.using].cursor() as cursor:
        # A waiting workflow step is cancelled like a pending job; a step's dependants
        # are settled in the same transaction.
        cursor.execute(
            f"UPDATE {d.jobs} AS j SET status = 'cancelled', finished_at = {d.now} "  # noqa: S608 - identifiers quoted, values bound
            "WHERE j.id = %s AND j.status IN ('pending', 'waiting')",
            [job_id],
        )
        if cursor.rowcount == 1:
            settle_and_notify(d, steps_of(d, [job_id], succeeded=False))
            return CancelResult.CANCELLED
        cursor.execute(
            f"UPDATE {d.jobs} AS j SET cancel_requested = TRUE "  # noqa: S608 - identifiers quoted, values bound
            "WHERE j.id = %s AND j.status = 'running' AND NOT j.cancel_requested",
            [job_id],
        )
        if cursor.rowcount == 1:
            return CancelResult.REQUESTED
        cursor.execute(f"SELECT 1 FROM {d.jobs} WHERE id = %s", [job_id])  # noqa: S608 - identifiers quoted, values bound
        return CancelResult.NOT_CANCELLABLE if cursor.fetchone() else CancelResult.NOT_FOUND


def retry(
    job_id: int,
    *,
    statuses: Sequence[str] | None = None,
    backend: str = "default",
    using: str | None = None,
) -> RetryResult:
    """Put a failed or dead job back to ``pending``, runnable at once (on PostgreSQL a
    ``NOTIFY`` on commit wakes the idle workers of its queue).

    Only ``failed`` and ``dead`` jobs (or the given subset of them) are retried. The
    job gets a fresh budget: its stall and snooze counts are reset and it may run at
    least one more attempt (``max_attempts`` becomes at least ``attempt + 1``). Its
    attempt history stays.
    """
    allowed = [str(s) for s in (statuses or (JobStatus.FAILED, JobStatus.DEAD))]
    if not set(allowed) <= {JobStatus.FAILED, JobStatus.DEAD}:
        raise ValueError(f"only failed or dead jobs can be retried, not {allowed}")
    d = dialect(using or backend_database(backend))
    try:
        changed = retry_deadlocks(d.using, lambda: _retry(d, job_id, allowed))
    except IntegrityError:  # the dedup key is held by another pending or running job
        return RetryResult.KEY_TAKEN
    if changed == 1:
        return RetryResult.RETRIED
    with connections[d.using].cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {d.jobs} WHERE id = %s", [job_id])  # noqa: S608 - identifiers quoted, values bound
        return RetryResult.WRONG_STATE if cursor.fetchone() else RetryResult.NOT_FOUND


def _retry(d: Dialect, job_id: int, allowed: list[str]) -> int:
    with transaction.atomic(using=d.using), connections[d.using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {d.jobs} AS j SET status = 'pending', run_after = {d.now}, "  # noqa: S608 - identifiers quoted, values bound
            "finished_at = NULL, stall_count = 0, snoozes = 0, cancel_requested = FALSE, "
            "unknown_task_since = NULL, "
            "max_attempts = CASE WHEN j.max_attempts <= j.attempt THEN j.attempt + 1 "
            "ELSE j.max_attempts END "
            f"WHERE j.id = %s AND j.status IN ({placeholders(len(allowed))})",
            [job_id, *allowed],
        )
        changed = int(cursor.rowcount)
        if changed == 1 and d.vendor == "postgresql":
            cursor.execute(
                f"SELECT pg_notify(%s, queue) FROM {d.jobs} WHERE id = %s",  # noqa: S608 - identifiers quoted, values bound
                [NOTIFY_CHANNEL, job_id],
            )
        return changed
