"""The writes of a schedule's life, one function each.

Like the lease protocol, each transition is a conditional UPDATE whose WHERE re-checks
what it assumes and whose row count is checked. A tick becomes a job in one
transaction that first moves the schedule's cursor (``last_tick``) past the tick, only
if it is still before it, and then inserts the run row, unique on (schedule, tick):
of N schedulers racing on one tick, one moves the cursor and the others match no row
(they wait on its row lock, then see the moved cursor). A scheduler that dies inside
the transaction moves nothing, so the tick is still due for the others; one that dies
after the commit leaves the cursor past the tick, so the tick is never enqueued again.
Everything is portable ORM; the clock is the database's (``DatabaseNow``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from ..compat import Task, TaskResult
from ..functions import DatabaseNow
from ..models import RunKind, Schedule, ScheduleRun
from ..schedule_spec import ScheduleSpec, require_aware_times


@dataclass(frozen=True, slots=True)
class EnqueuedRun:
    """A job a schedule enqueued (for a tick, or by *run now* with ``tick`` None)."""

    schedule: str
    tick: datetime | None
    job_id: int
    result: TaskResult


def _definition(spec: ScheduleSpec) -> dict[str, object]:
    return {
        "name": spec.name,
        "task_path": spec.task_path,
        "expression": spec.expression,
        "timezone": spec.timezone,
        "enabled": spec.enabled,
    }


def _by_name(rows: QuerySet[Schedule]) -> dict[str, Schedule]:
    """Rows by their name without case: MySQL/MariaDB's unique (backend, name) ignores
    case, so a schedule renamed by case alone must find its row there (and does
    everywhere, keeping its cursor and history)."""
    return {row.name.casefold(): row for row in rows}


def sync(
    backend: str, specs: Sequence[ScheduleSpec], now: datetime, using: str
) -> dict[str, Schedule]:
    """Make the state rows match settings and return them by name.

    A schedule seen for the first time (or back in settings after its removal, or
    enabled again) starts at ``now``: its first tick is the next one, never one from
    before. Rows of schedules gone from settings are marked removed and kept.
    """
    require_aware_times()
    rows = Schedule.objects.using(using)
    mine = rows.filter(backend=backend)
    known = _by_name(mine)
    missing = [spec for spec in specs if spec.name.casefold() not in known]
    if missing:
        rows.bulk_create(
            [
                Schedule(
                    backend=backend,
                    last_tick=now,
                    next_tick=spec.next_after(now),
                    **_definition(spec),  # type: ignore[arg-type]
                )
                for spec in missing
            ],
            ignore_conflicts=True,  # another worker created it first
        )
        known = _by_name(mine.all())
    changed = False
    for spec in specs:
        row = known.get(spec.name.casefold())
        if row is None:  # cannot be stored here (logged by the pass; the others go on)
            continue
        definition = _definition(spec)
        restarts = spec.enabled and (row.removed_at is not None or not row.enabled)
        if restarts:
            # Only the first worker to see it back restarts it (the fence: still off).
            changed |= bool(
                rows.filter(pk=row.pk)
                .filter(Q(removed_at__isnull=False) | Q(enabled=False))
                .update(
                    removed_at=None,
                    last_tick=now,
                    next_tick=spec.next_after(now),
                    updated_at=DatabaseNow(),
                    **definition,
                )
            )
        elif any(getattr(row, k) != v for k, v in definition.items()) or row.removed_at:
            cursor = row.last_tick or now
            rows.filter(pk=row.pk).update(
                removed_at=None,
                next_tick=spec.next_after(cursor) if spec.enabled else None,
                updated_at=DatabaseNow(),
                **definition,
            )
            changed = True
    declared = {spec.name.casefold() for spec in specs}
    gone = [row.pk for name, row in known.items() if name not in declared and not row.removed_at]
    if gone:
        rows.filter(pk__in=gone, removed_at__isnull=True).update(
            removed_at=DatabaseNow(), next_tick=None, updated_at=DatabaseNow()
        )
        changed = True
    return {row.name: row for row in (mine.all() if changed or missing else known.values())}


def enqueue_tick(
    row: Schedule,
    spec: ScheduleSpec,
    tick: datetime,
    next_tick: datetime,
    task: Task,
    using: str,
) -> EnqueuedRun | None:
    """Enqueue ``tick`` of a schedule exactly once; None when it is not this caller's.

    The cursor moves only from before ``tick`` and only while the schedule is not paused,
    so a tick that another scheduler took, or that lies at or before the cursor, or
    of a paused schedule, enqueues nothing.
    """
    try:
        with transaction.atomic(using=using):
            moved = (
                Schedule.objects.using(using)
                .filter(pk=row.pk, paused=False, enabled=True, removed_at__isnull=True)
                .filter(Q(last_tick__isnull=True) | Q(last_tick__lt=tick))
                .update(last_tick=tick, next_tick=next_tick, updated_at=DatabaseNow())
            )
            if moved != 1:
                return None
            run = ScheduleRun(schedule_id=row.pk, tick=tick, kind=RunKind.TICK)
            run.save(using=using)
            return _enqueue_run(row, spec, run, task, using)
    except IntegrityError:
        # The unique (schedule, tick) says this tick ran already: nothing to do.
        if ScheduleRun.objects.using(using).filter(schedule_id=row.pk, tick=tick).exists():
            return None
        raise


def run_now(row: Schedule, spec: ScheduleSpec, task: Task, using: str) -> EnqueuedRun:
    """Enqueue one job of a schedule outside its tick sequence (the cursor stays)."""
    with transaction.atomic(using=using):
        run = ScheduleRun(schedule_id=row.pk, tick=None, kind=RunKind.MANUAL)
        run.save(using=using)
        return _enqueue_run(row, spec, run, task, using)


def _enqueue_run(
    row: Schedule, spec: ScheduleSpec, run: ScheduleRun, task: Task, using: str
) -> EnqueuedRun:
    """The job of a run (same transaction), linked both ways."""
    result = task.enqueue(*spec.args, **spec.kwargs)
    job_id = int(result.id)
    ScheduleRun.objects.using(using).filter(pk=run.pk).update(job_id=job_id)
    updated = (
        Schedule.objects.using(using)
        .filter(pk=row.pk)
        .update(last_job_id=job_id, last_run_at=DatabaseNow(), updated_at=DatabaseNow())
    )
    if updated != 1:
        raise Schedule.DoesNotExist(f"schedule row {row.pk} vanished while enqueueing")
    return EnqueuedRun(schedule=row.name, tick=run.tick, job_id=job_id, result=result)


def skip_to(row: Schedule, tick: datetime, next_tick: datetime, using: str) -> bool:
    """Move the cursor to ``tick`` without a job (missed ticks that the policy skips)."""
    moved = (
        Schedule.objects.using(using)
        .filter(pk=row.pk, paused=False)
        .filter(Q(last_tick__isnull=True) | Q(last_tick__lt=tick))
        .update(last_tick=tick, next_tick=next_tick, updated_at=DatabaseNow())
    )
    return moved == 1


def set_paused(backend: str, name: str, paused: bool, using: str) -> bool:
    """Pause or resume a schedule; False when it already was (or has no row)."""
    changed = (
        Schedule.objects.using(using)
        .filter(backend=backend, name=name, paused=not paused)
        .update(
            paused=paused,
            paused_at=DatabaseNow() if paused else None,
            updated_at=DatabaseNow(),
        )
    )
    return changed == 1


def set_next_tick(row: Schedule, next_tick: datetime | None, using: str) -> None:
    """Record the next tick a scheduler computed (display and overdue detection only)."""
    if row.next_tick != next_tick:
        Schedule.objects.using(using).filter(pk=row.pk).update(next_tick=next_tick)
