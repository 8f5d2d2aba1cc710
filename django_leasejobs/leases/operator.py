"""An operator's writes: cancel a job, retry a failed or dead one.

Both write to the database of the job's backend (its ``DATABASE`` option) unless
``using`` names another alias, whoever calls them (the admin, a shell, a command).

What each of them writes, and to which statuses, is decided here once and shared with
the writes to every job matching a filter (``batch_ops.py``): :data:`NOT_STARTED` and
:func:`cancelled_columns` (a job that has not started is cancelled at once),
:func:`running_to_flag` and :func:`cancel_requested_columns` (a running job's cancel is
a request its worker sees at its next renewal), :data:`RETRIABLE` and
:func:`retried_columns` (a fresh budget).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import Case, F, Q, When

from ..conf import BACKEND_PATH, parse_options
from ..functions import DatabaseNow
from ..models import Job, JobStatus
from .dependants import give_back, settle_and_notify, steps_of
from .dialect import Dialect, dialect, retry_deadlocks
from .enqueue import NOTIFY_CHANNEL
from .values import CancelResult, RetryResult

NOT_STARTED: tuple[str, ...] = (JobStatus.WAITING, JobStatus.PENDING)
"""The statuses a cancel ends at once (a waiting workflow step like a pending job)."""
RETRIABLE: tuple[str, ...] = (JobStatus.FAILED, JobStatus.DEAD)
"""The statuses an operator's retry takes (a requeue of dead letters takes ``dead`` only)."""


def running_to_flag() -> Q:
    """A running job whose cancel is not requested yet: a cancel flags it for its worker."""
    return Q(status=JobStatus.RUNNING, cancel_requested=False)


def cancelled_columns() -> dict[str, object]:
    """What a cancel writes to a job that has not started (its ``SET`` list)."""
    return {"status": JobStatus.CANCELLED, "finished_at": DatabaseNow()}


def cancel_requested_columns() -> dict[str, object]:
    """What a cancel writes to a running job: the request its worker sees."""
    return {"cancel_requested": True}


def retried_columns() -> dict[str, object]:
    """What a retry writes: ``pending``, runnable now (database clock), with a fresh budget
    (stalls and snoozes reset, at least one more attempt). ``max_attempts`` comes last and
    reads only columns the list does not assign (MySQL evaluates ``SET`` left to right)."""
    return {
        "status": JobStatus.PENDING,
        "run_after": DatabaseNow(),
        "finished_at": None,
        "stall_count": 0,
        "snoozes": 0,
        "cancel_requested": False,
        "unknown_task_since": None,
        "max_attempts": Case(
            When(max_attempts__lte=F("attempt"), then=F("attempt") + 1),
            default=F("max_attempts"),
            output_field=Job._meta.get_field("max_attempts"),
        ),
    }


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
    jobs = Job.objects.using(d.using).filter(pk=job_id)
    with transaction.atomic(using=d.using):
        # A waiting workflow step is cancelled like a pending job; a step's dependants
        # are settled in the same transaction.
        if jobs.filter(status__in=NOT_STARTED).update(**cancelled_columns()) == 1:
            settle_and_notify(d, steps_of(d, [job_id], succeeded=False))
            return CancelResult.CANCELLED
        if jobs.filter(running_to_flag()).update(**cancel_requested_columns()) == 1:
            return CancelResult.REQUESTED
        return CancelResult.NOT_CANCELLABLE if jobs.exists() else CancelResult.NOT_FOUND


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

    A workflow step's dependants that still wait for it (finalisers, which its end
    counted down) get that count back in the same transaction (``dependants.give_back``):
    its new end releases them once, not a second time. Dependants that no longer wait
    keep their outcome.
    """
    allowed = [str(s) for s in (statuses or RETRIABLE)]
    if not set(allowed) <= set(RETRIABLE):
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
    with transaction.atomic(using=d.using):
        jobs = Job.objects.using(d.using).filter(pk=job_id)
        changed = jobs.filter(status__in=allowed).update(**retried_columns())
        if changed != 1:
            return changed
        with connections[d.using].cursor() as cursor:
            # A workflow step's end counted its waiting finalisers down: its new end will
            # count them again, so they get that count back first (same transaction).
            give_back(d, cursor, [job_id])
            if d.vendor == "postgresql":
                cursor.execute(
                    f"SELECT pg_notify(%s, queue) FROM {d.jobs} WHERE id = %s",  # noqa: S608 - identifiers quoted, values bound
                    [NOTIFY_CHANNEL, job_id],
                )
        return changed
