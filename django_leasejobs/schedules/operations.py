"""What operators see and do: the schedules with their state, pause, resume, run now.

Shared by the admin, ``manage.py leasejobs_schedules``, ``leasejobs_status`` and the
dashboard, so that they all tell the same story.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..compat import DEFAULT_TASK_BACKEND_ALIAS
from ..leases import database_now
from ..models import Job, Schedule
from ..schedule_spec import ScheduleSpec, require_aware_times
from . import transitions
from .scheduler import lease_backend, scheduled_task
from .transitions import EnqueuedRun

State = Literal["active", "paused", "disabled", "removed", "new"]


class UnknownSchedule(LookupError):
    """No schedule of that name in the backend's ``SCHEDULES``."""


@dataclass(frozen=True, slots=True)
class ScheduleView:
    backend: str
    name: str
    task_path: str
    expression: str
    description: str
    timezone: str
    state: State
    """``new``: declared in settings, not yet seen by a worker's scheduler."""
    next_tick: datetime | None
    last_tick: datetime | None
    last_run_at: datetime | None
    last_job_id: int | None
    last_job_status: str | None
    overdue: bool
    """An active schedule whose next tick is more than one period in the past: no
    worker is running the schedules."""
    overdue_seconds: float
    pk: int | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (times in ISO 8601 UTC, None where absent): the schedule as
        ``leasejobs_schedules --json`` and ``leasejobs_status --json`` print it."""
        return {
            "name": self.name,
            "task_path": self.task_path,
            "expression": self.expression,
            "description": self.description,
            "timezone": self.timezone,
            "state": self.state,
            "next_tick": _iso(self.next_tick),
            "last_tick": _iso(self.last_tick),
            "last_run_at": _iso(self.last_run_at),
            "last_job_id": self.last_job_id,
            "last_job_status": self.last_job_status,
            "overdue": self.overdue,
            "overdue_seconds": self.overdue_seconds,
        }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _state(row: Schedule | None, spec: ScheduleSpec | None) -> State:
    if spec is None:
        return "removed"
    if not spec.enabled:
        return "disabled"
    if row is None:
        return "new"
    if row.paused:
        return "paused"
    return "active"


def overview(
    backend: str = DEFAULT_TASK_BACKEND_ALIAS, now: datetime | None = None
) -> list[ScheduleView]:
    """Every schedule of ``backend``: those in settings first, then removed ones."""
    lease = lease_backend(backend)
    if lease.config.schedules:
        require_aware_times()
    using = lease.database
    now = database_now(using) if now is None else now
    rows = {row.name: row for row in Schedule.objects.using(using).filter(backend=backend)}
    specs = {spec.name: spec for spec in lease.config.schedules}
    job_ids = [row.last_job_id for row in rows.values() if row.last_job_id is not None]
    statuses = dict(Job.objects.using(using).filter(pk__in=job_ids).values_list("pk", "status"))
    views = []
    for name in [*specs, *sorted(set(rows) - set(specs))]:
        spec, row = specs.get(name), rows.get(name)
        state = _state(row, spec)
        next_tick = None
        if spec is not None and state == "active" and row is not None:
            next_tick = spec.next_after(row.last_tick or now)
        elif spec is not None and state == "new":
            next_tick = spec.next_after(now)
        overdue_seconds = 0.0
        if spec is not None and next_tick is not None and state == "active":
            period = (spec.next_after(next_tick) - next_tick).total_seconds()
            late = (now - next_tick).total_seconds()
            if late > period:
                overdue_seconds = late
        views.append(
            ScheduleView(
                backend=backend,
                name=name,
                task_path=spec.task_path if spec else (row.task_path if row else ""),
                expression=spec.expression if spec else (row.expression if row else ""),
                description=spec.describe() if spec else "",
                timezone=spec.timezone if spec else (row.timezone if row else ""),
                state=state,
                next_tick=next_tick,
                last_tick=row.last_tick if row else None,
                last_run_at=row.last_run_at if row else None,
                last_job_id=row.last_job_id if row else None,
                last_job_status=statuses.get(row.last_job_id) if row and row.last_job_id else None,
                overdue=overdue_seconds > 0,
                overdue_seconds=overdue_seconds,
                pk=row.pk if row else None,
            )
        )
    return views


def _row(backend: str, name: str) -> tuple[ScheduleSpec, Schedule, str]:
    lease = lease_backend(backend)
    spec = next((s for s in lease.config.schedules if s.name == name), None)
    if spec is None:
        raise UnknownSchedule(
            f"No schedule {name!r} in TASKS[{backend!r}]['OPTIONS']['SCHEDULES']."
        )
    using = lease.database
    rows = transitions.sync(backend, lease.config.schedules, database_now(using), using)
    return spec, rows[name], using


def pause(name: str, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    """Pause a schedule: no scheduler enqueues its ticks until it is resumed.

    Returns False when it was paused already.
    """
    _, _, using = _row(backend, name)
    return transitions.set_paused(backend, name, True, using)


def resume(name: str, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    """Resume a paused schedule; the ticks it missed follow its ``catch_up`` policy.

    Returns False when it was not paused.
    """
    _, _, using = _row(backend, name)
    return transitions.set_paused(backend, name, False, using)


def run_now(name: str, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> EnqueuedRun:
    """Enqueue one job of a schedule now, outside its ticks (paused or not)."""
    lease = lease_backend(backend)
    spec, row, using = _row(backend, name)
    return transitions.run_now(row, spec, scheduled_task(lease, spec), using)
