"""Delete finished jobs (and their attempts), and old schedule runs, in short batches.

The one rule for which jobs may be deleted (:func:`finished`) and the one way they are
deleted (:func:`delete_finished`), used by ``manage.py prune_jobs`` (:func:`prune`) and
by the admin's *Delete finished jobs* action. The age cut-off is computed by the database
(``DatabaseNow() - interval``), never by this process's clock. Each finished job is kept
for its retention (:func:`_old`): its own ``result_ttl`` if it has one, else its queue's
``QUEUE_RESULT_TTL``, else the command's ``--older-than`` (without it, such a job is kept).
Schedule runs
(``ScheduleRun``) go by the same cut-off on ``enqueued_at``; the schedules' state rows
(``Schedule``) are never touched, and their cursor, not the run rows, is what keeps a
tick from being enqueued twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import (
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Value,
)

from .functions import DatabaseNow
from .models import (
    FINISHED_STATUSES,
    Dependency,
    FanIn,
    Job,
    JobAttempt,
    JobRollup,
    JobStatus,
    Schedule,
    ScheduleRun,
    Workflow,
)

logger = logging.getLogger("django_leasejobs")

DEFAULT_STATUSES: tuple[str, ...] = (JobStatus.SUCCEEDED, JobStatus.CANCELLED)
FAILED_STATUSES: tuple[str, ...] = (JobStatus.FAILED, JobStatus.DEAD)


def statuses_for(include_failed: bool) -> tuple[str, ...]:
    return DEFAULT_STATUSES + FAILED_STATUSES if include_failed else DEFAULT_STATUSES


@dataclass(frozen=True)
class PruneResult:
    count: int
    """Jobs deleted (or, in a dry run, that would be)."""
    batches: int
    dry_run: bool
    schedule_runs: int = 0
    """Schedule runs deleted (or, in a dry run, that would be)."""
    rollups: int = 0
    """Rollup rows deleted (or, in a dry run, that would be)."""


def _cutoff(older_than: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(DatabaseNow() - Value(older_than), output_field=DateTimeField())


def finished(statuses: tuple[str, ...] = FINISHED_STATUSES) -> Q:
    """The rule for a job that may be deleted: it has finished (its status is one of
    ``statuses``, all of them finished ones). Pending and running jobs are never deleted."""
    unfinished = set(statuses) - set(FINISHED_STATUSES)
    if unfinished:
        raise ValueError(f"not finished statuses: {sorted(unfinished)}")
    return Q(status__in=statuses)


def _old(
    older_than: timedelta | None,
    backend: str | None,
    queue_result_ttl: Mapping[str, float] | None = None,
) -> Q:
    """The rule for a finished job's retention, decided here only: its own ``result_ttl``
    wins, then its queue's (``queue_result_ttl``: queue -> seconds), then ``older_than``
    (None: a job with neither is kept). Each compared with ``finished_at`` on the database's
    clock."""
    own_cutoff = ExpressionWrapper(DatabaseNow() - F("result_ttl"), output_field=DateTimeField())
    condition = Q(result_ttl__isnull=False, finished_at__lt=own_cutoff)
    queues = dict(queue_result_ttl or {})
    for queue, seconds in sorted(queues.items()):
        condition |= Q(
            result_ttl__isnull=True,
            queue=queue,
            finished_at__lt=_cutoff(timedelta(seconds=seconds)),
        )
    if older_than is not None:
        condition |= Q(result_ttl__isnull=True, finished_at__lt=_cutoff(older_than)) & ~Q(
            queue__in=sorted(queues)
        )
    if backend is not None:
        condition &= Q(backend=backend)
    return condition


def _old_runs(older_than: timedelta, backend: str | None, using: str) -> QuerySet[ScheduleRun]:
    runs = ScheduleRun.objects.using(using).filter(enqueued_at__lt=_cutoff(older_than))
    if backend is not None:
        # The backend's few schedule ids, not a join: the batches lock run rows only.
        schedules = Schedule.objects.using(using).filter(backend=backend)
        runs = runs.filter(schedule_id__in=list(schedules.values_list("pk", flat=True)))
    return runs


def _old_rollups(retention: float, backend: str | None, using: str) -> QuerySet[JobRollup]:
    """Rollup rows whose minute is older than ``retention`` seconds (database clock)."""
    rows = JobRollup.objects.using(using).filter(minute__lt=_cutoff(timedelta(seconds=retention)))
    return rows if backend is None else rows.filter(backend=backend)


def _in_batches(
    matching: QuerySet[Any], delete: Callable[[list[int]], int], batch_size: int, using: str
) -> tuple[int, int]:
    """Delete the ``matching`` rows, ``batch_size`` per short transaction; (count, batches).

    Each batch locks up to ``batch_size`` ids (lowest first; rows locked by someone else
    are skipped where the database can) and ``delete`` removes them. Stops after the
    first short batch.
    """
    skip_locked = connections[using].features.has_select_for_update_skip_locked
    total = batches = 0
    while True:
        with transaction.atomic(using=using):
            ids = list(
                matching.select_for_update(skip_locked=skip_locked)
                .order_by("id")
                .values_list("id", flat=True)[:batch_size]
            )
            if ids:
                total += delete(ids)
                batches += 1
        if len(ids) < batch_size:
            return total, batches


def delete_finished(
    jobs: QuerySet[Job],
    *,
    statuses: tuple[str, ...] = FINISHED_STATUSES,
    batch_size: int = 1000,
    before_delete: Callable[[QuerySet[Job]], object] | None = None,
) -> tuple[int, int]:
    """Delete the finished jobs among ``jobs`` (see :func:`finished`) with their attempts;
    (count, batches).

    In batches of ``batch_size`` (see :func:`_in_batches`): the rule is re-checked on
    locked rows, so a job that was retried meanwhile stays. ``before_delete`` sees each
    batch's jobs inside its transaction, before they go (the admin logs them).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    using = jobs.db
    rows = Job.objects.using(using)

    def delete(ids: list[int]) -> int:
        if before_delete is not None:
            before_delete(rows.filter(pk__in=ids))
        # Attempts first and explicitly, in the same transaction: the result does not
        # depend on a database-level ON DELETE CASCADE.
        JobAttempt.objects.using(using).filter(job_id__in=ids).delete()
        # A deleted workflow step's edges to its parents go with it (a step that waits
        # for a deleted parent sees it as "missing": workflow_ops.parent_outcomes).
        # ... and so do its fan-in counters (leases/fanin.py), which only its edges name.
        Dependency.objects.using(using).filter(child_id__in=ids).delete()
        FanIn.objects.using(using).filter(child_id__in=ids).delete()
        _, per_model = rows.filter(pk__in=ids).delete()
        return per_model.get(Job._meta.label, 0)

    return _in_batches(jobs.filter(finished(statuses)), delete, batch_size, using)


def _delete_empty_workflows(backend: str | None, using: str) -> int:
    """Delete the workflow rows whose steps were all deleted."""
    empty = Workflow.objects.using(using).filter(
        ~Exists(Job.objects.using(using).filter(workflow_id=OuterRef("pk")))
    )
    if backend is not None:
        empty = empty.filter(backend=backend)
    deleted, _ = empty.delete()
    return deleted


def prune(
    *,
    older_than: timedelta | None,
    queue_result_ttl: Mapping[str, float] | None = None,
    include_failed: bool = False,
    batch_size: int = 1000,
    dry_run: bool = False,
    backend: str | None = None,
    using: str = "default",
    rollup_retention: float | None = None,
) -> PruneResult:
    """Delete finished jobs whose ``finished_at`` is older than their retention (database
    clock: see :func:`_old`), schedule runs whose ``enqueued_at`` is older than
    ``older_than`` (none without it), and rollup rows whose minute is older than
    ``rollup_retention`` seconds (``ROLLUP_RETENTION``; none when None).

    Each batch is its own short transaction: lock up to ``batch_size`` matching ids
    (lowest first; rows locked by someone else are skipped where the database can),
    delete their attempts, then the jobs; then the same for schedule runs. Each stops
    after its first short batch. ``dry_run`` only counts.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    statuses = statuses_for(include_failed)
    old_jobs = Job.objects.using(using).filter(_old(older_than, backend, queue_result_ttl))
    old_runs = (
        _old_runs(older_than, backend, using)
        if older_than is not None
        else ScheduleRun.objects.using(using).none()
    )
    old_rollups = (
        _old_rollups(rollup_retention, backend, using)
        if rollup_retention is not None
        else JobRollup.objects.using(using).none()
    )
    age = None if older_than is None else older_than.total_seconds()

    if dry_run:
        count = old_jobs.filter(finished(statuses)).count()
        return PruneResult(
            count=count,
            batches=-(-count // batch_size),
            dry_run=True,
            schedule_runs=old_runs.count(),
            rollups=old_rollups.count(),
        )

    def delete_runs(ids: list[int]) -> int:
        return ScheduleRun.objects.using(using).filter(pk__in=ids).delete()[0]

    total, batches = delete_finished(old_jobs, statuses=statuses, batch_size=batch_size)
    logger.info(
        "pruned finished jobs count=%d",
        total,
        extra={
            "count": total,
            "batches": batches,
            "older_than": age,
            "statuses": list(statuses),
            "backend": backend,
        },
    )
    _delete_empty_workflows(backend, using)
    runs, run_batches = _in_batches(old_runs, delete_runs, batch_size, using)
    logger.info(
        "pruned schedule runs count=%d",
        runs,
        extra={
            "count": runs,
            "batches": run_batches,
            "older_than": age,
            "backend": backend,
        },
    )

    def delete_rollups(ids: list[int]) -> int:
        return JobRollup.objects.using(using).filter(pk__in=ids).delete()[0]

    rollups, rollup_batches = _in_batches(old_rollups, delete_rollups, batch_size, using)
    logger.info(
        "pruned rollup rows count=%d",
        rollups,
        extra={
            "count": rollups,
            "batches": rollup_batches,
            "older_than": rollup_retention,
            "backend": backend,
        },
    )
    return PruneResult(
        count=total, batches=batches, dry_run=False, schedule_runs=runs, rollups=rollups
    )
