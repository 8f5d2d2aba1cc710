"""Dedup keys over time: which job an enqueue with a key returns, and debounce.

Two rules, each decided here only:

* :func:`key_holder`: the job an enqueue with a key returns instead of adding one. A
  pending or running job with the key always holds it (unique while active, enforced by
  the unique index on active keys); with a ``unique_for`` window, so does every job with
  the key enqueued within the window, whatever its status. Among them, the first (lowest
  id). The window is measured on the database's clock from each job's ``enqueued_at``.
* :func:`debounce`: the transition of a pending job to the last enqueue's columns. The
  pending job that holds the key for the same task and backend takes the new call's
  arguments and options, and becomes runnable ``delay`` seconds after now (database
  clock); its id, ``enqueued_at`` and attempt history stay. A running job is never
  touched: the conditional UPDATE matches pending rows only, so a claim that got there
  first wins, and the caller then finds the running job with :func:`key_holder`.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.expressions import CombinedExpression

from ..functions import DatabaseNow
from ..models import ACTIVE_STATUSES, Job, JobStatus
from .values import NewJob


def _since(seconds: float) -> ExpressionWrapper[CombinedExpression]:
    return ExpressionWrapper(
        DatabaseNow() - Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def runnable_after(seconds: float) -> ExpressionWrapper[CombinedExpression]:
    """``run_after`` for a job due ``seconds`` from now (database clock), as an ORM
    expression (a debounced job's)."""
    return ExpressionWrapper(
        DatabaseNow() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def key_holder(
    key: str,
    *,
    unique_for: float | None = None,
    before: int | None = None,
    using: str = "default",
) -> Job | None:
    """The job an enqueue with ``key`` returns instead of adding one; None: add one.

    The first (lowest id) job with ``key`` that is pending or running, or, with
    ``unique_for`` (seconds), that was enqueued at most ``unique_for`` seconds ago
    (database clock), finished or not. ``before``: only jobs with a lower id than this
    (the check an enqueue makes after its own insert, inside its transaction: a job
    another producer inserted and committed meanwhile wins, being first). Keys are
    compared across every backend of the database, as the unique index does.
    """
    holds = Q(status__in=ACTIVE_STATUSES)
    if unique_for is not None:
        holds |= Q(enqueued_at__gte=_since(unique_for))
    jobs = Job.objects.using(using).filter(holds, key=key)
    if before is not None:
        jobs = jobs.filter(pk__lt=before)
    return jobs.order_by("pk").first()


# The producer's columns a debounce replaces: all but the key (the same), the backend and
# the task (the WHERE requires them equal), and run_after (now + delay).
_REPLACED = tuple(
    f.name for f in fields(NewJob) if f.name not in ("key", "backend", "task_path", "run_after")
)


def debounce(row: NewJob, delay: float, *, using: str = "default") -> int | None:
    """Replace the pending job that holds ``row.key`` for ``row``'s task and backend with
    ``row``'s columns, runnable ``delay`` seconds from now (database clock).

    Returns the job's id, or None when no such pending job exists (none holds the key, a
    running one or another task's does, or a worker claimed it first). One conditional
    UPDATE, then the read of the id of the row it locked, in one transaction: a concurrent
    debounce of the same key waits for the row lock and writes after it (the last
    enqueue's arguments win), a concurrent claim either sees the row running or skips it.
    """
    if row.key is None:
        raise ValueError("debounce needs a dedup key")
    jobs = Job.objects.using(using)
    pending = jobs.filter(key=row.key, status=JobStatus.PENDING)
    changes = {name: getattr(row, name) for name in _REPLACED}
    with transaction.atomic(using=using):
        # The write first: on SQLite it takes the database's write lock before any read.
        updated = pending.filter(backend=row.backend, task_path=row.task_path).update(
            **changes, run_after=runnable_after(delay)
        )
        if updated == 0:
            return None
        # The key is unique among active jobs, and this transaction holds the row's lock.
        job_id: int = pending.values_list("pk", flat=True).get()
    return job_id
