"""One scheduler pass: which ticks are due, what the catch-up policy makes of them.

Every worker runs passes from a thread (``worker/scheduler.py``); ``manage.py
leasejobs_schedules --enqueue-due`` runs one. There is no leader: passes of many
workers race freely and ``transitions.enqueue_tick`` lets exactly one of them enqueue
each tick. A pass reads the database's clock once and judges every schedule by it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..backend import LeaseJobsBackend
from ..compat import Task, task_backends
from ..exceptions import UnknownTask
from ..leases import database_now
from ..models import Schedule
from ..registry import resolve
from ..schedule_spec import ScheduleSpec
from . import transitions
from .transitions import EnqueuedRun

logger = logging.getLogger("django_leasejobs")


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What one pass does with a schedule's due ticks."""

    enqueue: tuple[datetime, ...] = ()
    """Ticks to enqueue, oldest first."""
    skip_to: datetime | None = None
    """Move the cursor here without a job (the ticks up to it were missed)."""
    missed: int = 0
    """Due ticks that get no job."""


def plan(spec: ScheduleSpec, cursor: datetime, now: datetime) -> TickPlan:
    """The catch-up policy, decided here and only here.

    * ``latest``: the most recent due tick is enqueued, earlier ones are skipped;
    * ``none``: the most recent due tick is enqueued only when it is on time
      (``ScheduleSpec.on_time_grace``), otherwise the schedule skips to its next tick;
    * ``all``: every due tick is enqueued, up to ``catch_up_limit`` of the most recent.
    """
    due, count = spec.ticks_between(cursor, now)
    if not due:
        return TickPlan()
    latest = due[-1]
    if spec.catch_up == "all":
        return TickPlan(enqueue=tuple(due), missed=count - len(due))
    if spec.catch_up == "none" and (now - latest).total_seconds() > spec.on_time_grace(latest):
        return TickPlan(skip_to=latest, missed=count)
    return TickPlan(enqueue=(latest,), missed=count - 1)


@dataclass(frozen=True, slots=True)
class PassReport:
    now: datetime
    """The database's clock at the start of the pass."""
    enqueued: tuple[EnqueuedRun, ...] = ()
    next_due: datetime | None = None
    """The earliest next tick of an active schedule (None: nothing to wait for)."""
    failed: tuple[str, ...] = field(default=())
    """Schedules whose pass failed (logged); the others went on."""


def scheduled_task(backend: LeaseJobsBackend, spec: ScheduleSpec) -> Task:
    """The registered task of a schedule, bound to the backend, queue and priority."""
    task = resolve(spec.task_path)
    return task.using(
        backend=backend.alias,
        queue_name=spec.queue if spec.queue is not None else task.queue_name,
        priority=spec.priority if spec.priority is not None else task.priority,
    )


def lease_backend(alias: str) -> LeaseJobsBackend:
    backend = task_backends[alias]
    if not isinstance(backend, LeaseJobsBackend):
        raise TypeError(f"TASKS[{alias!r}] is not a LeaseJobsBackend")
    return backend


def run_pass(
    backend: LeaseJobsBackend,
    *,
    now: datetime | None = None,
    specs: Sequence[ScheduleSpec] | None = None,
    scheduler: str = "",
) -> PassReport:
    """Enqueue every due tick of the backend's schedules; return when the next one is due.

    ``now`` replaces the database's clock (tests simulate time with it); ``specs``
    replaces the backend's ``SCHEDULES``.
    """
    using = backend.database
    if now is None:
        now = database_now(using)
    specs = backend.config.schedules if specs is None else specs
    rows = transitions.sync(backend.alias, specs, now, using)
    enqueued: list[EnqueuedRun] = []
    failed: list[str] = []
    next_due: datetime | None = None
    for spec in specs:
        if not spec.enabled:
            continue
        try:
            row = rows.get(spec.name)
            if row is None:
                raise Schedule.DoesNotExist(
                    f"no state row for schedule {spec.name!r} in backend {backend.alias!r}"
                )
            enqueued.extend(_pass_one(backend, spec, row, now, scheduler))
            if not row.paused:
                upcoming = spec.next_after(max(now, row.last_tick or now))
                next_due = upcoming if next_due is None else min(next_due, upcoming)
        except Exception as exc:  # one broken schedule never stops the others
            failed.append(spec.name)
            logger.exception(
                "schedule %s: pass failed: %s",
                spec.name,
                _text(exc),
                extra={"schedule": spec.name, "backend": backend.alias, "worker": scheduler},
            )
    return PassReport(now=now, enqueued=tuple(enqueued), next_due=next_due, failed=tuple(failed))


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return type(exc).__name__


def _pass_one(
    backend: LeaseJobsBackend, spec: ScheduleSpec, row: Schedule, now: datetime, scheduler: str
) -> list[EnqueuedRun]:
    using = backend.database
    if row.paused:
        return []
    cursor = row.last_tick or now
    decided = plan(spec, cursor, now)
    if not decided.enqueue and decided.skip_to is None:
        transitions.set_next_tick(row, spec.next_after(max(cursor, now)), using)
        return []
    extra = {"schedule": spec.name, "backend": backend.alias, "worker": scheduler}
    if decided.missed:
        logger.warning(
            "schedule %s: %d missed tick(s) skipped (catch_up=%s)",
            spec.name,
            decided.missed,
            spec.catch_up,
            extra={**extra, "count": decided.missed, "catch_up": spec.catch_up},
        )
    next_tick = spec.next_after(now)
    if decided.skip_to is not None:
        transitions.skip_to(row, decided.skip_to, next_tick, using)
        return []
    try:
        task = scheduled_task(backend, spec)
    except UnknownTask as exc:
        logger.error("schedule %s: %s", spec.name, exc, extra=extra)
        return []
    done = []
    for tick in decided.enqueue:
        started = time.monotonic()
        run = transitions.enqueue_tick(row, spec, tick, next_tick, task, using)
        if run is None:
            continue  # another scheduler took it
        done.append(run)
        logger.info(
            "schedule %s: enqueued job %s for tick %s",
            spec.name,
            run.job_id,
            tick.isoformat(),
            extra={
                **extra,
                "job_id": run.job_id,
                "tick": tick.isoformat(),
                "queue": run.result.task.queue_name,
                "duration": round(time.monotonic() - started, 6),
            },
        )
    return done
