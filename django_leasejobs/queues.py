"""Queues for operators: pause, resume, and what each queue's limits are doing.

Shared by the admin, ``manage.py leasejobs_queue``, ``leasejobs_status`` and the
dashboard, so that they all tell the same story::

    from django_leasejobs import queues

    queues.pause("emails")              # no worker claims from it any more
    queues.resume("emails")             # every worker claims from it again
    queues.overview()                   # each queue: paused, limits, running, pending

A pause is a row in ``leasejobs_queue`` that every claim reads (``leases/flow.py``):
it holds on every worker at its next claim, without a restart. Running jobs finish;
enqueueing and schedules go on; the jobs wait in ``pending``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q

from .compat import DEFAULT_TASK_BACKEND_ALIAS
from .conf import MAX_QUEUE_NAME
from .functions import DatabaseNow
from .leases import NOTIFY_CHANNEL, database_now, notify
from .limits import FlowRules, Rate, describe_group, parse_rate, queue_scope, task_group
from .models import ACTIVE_ROWS, ACTIVE_STATUSES, Dependency, Job, JobStatus, Queue, RateStart


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue of a backend as operators see it."""

    name: str
    paused: bool
    paused_at: datetime | None
    limit: int | None
    """``QUEUE_LIMITS``: most running jobs at once (None: no limit)."""
    rate: str | None
    """``QUEUE_RATE_LIMITS``: most starts per period (None: no limit)."""
    running: int
    """Running jobs whose lease has not expired (what the limit counts)."""
    pending: int
    ready: int
    """Pending jobs whose ``run_after`` has passed."""
    starts_in_window: int | None
    """Starts within the rate's last period (None without a rate)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the queue as ``leasejobs_queue list --json`` prints it."""
        return {
            "name": self.name,
            "paused": self.paused,
            "paused_at": None
            if self.paused_at is None
            else self.paused_at.astimezone(UTC).isoformat(),
            "limit": self.limit,
            "rate": self.rate,
            "running": self.running,
            "pending": self.pending,
            "ready": self.ready,
            "starts_in_window": self.starts_in_window,
        }


def _backend(alias: str) -> Any:
    from .backend import LeaseJobsBackend
    from .compat import task_backends

    try:
        found = task_backends[alias]
    except Exception as exc:  # InvalidTaskBackend, on both Django lines
        raise ValueError(f"TASKS[{alias!r}] is not a task backend: {exc}") from None
    if not isinstance(found, LeaseJobsBackend):
        raise ValueError(f"TASKS[{alias!r}] is not a django-leasejobs backend")
    return found


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_QUEUE_NAME:
        raise ValueError(
            f"a queue name is a non-empty string of at most {MAX_QUEUE_NAME} characters, "
            f"got {name!r}"
        )
    return name


def _set_paused(name: str, backend: str, paused: bool) -> bool:
    """The pause or resume transition: one conditional UPDATE (the row created first).

    Returns whether it changed anything (False: the queue was already so).
    """
    using = _backend(backend).database
    _check_name(name)
    rows = Queue.objects.using(using)
    if not rows.filter(backend=backend, name=name).exists():
        try:
            with transaction.atomic(using=using):
                rows.create(backend=backend, name=name)
        except IntegrityError:
            pass  # another operator created it meanwhile: the UPDATE decides
    changed = rows.filter(backend=backend, name=name, paused=not paused).update(
        paused=paused,
        paused_at=DatabaseNow() if paused else None,
        changed_at=DatabaseNow(),
    )
    return changed == 1


def pause(name: str, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    """Pause the queue ``name`` of ``backend``: no worker claims its pending jobs until
    :func:`resume`. Running jobs finish; enqueueing goes on. Returns False when it was
    paused already. Raises ValueError for a backend that is not this app's, or a name
    that cannot be a queue's."""
    return _set_paused(name, backend, True)


def resume(name: str, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    """Resume the queue ``name`` of ``backend``; idle workers are woken at once where
    ``NOTIFY`` exists (PostgreSQL), else at their next poll. Returns False when it was
    not paused."""
    changed = _set_paused(name, backend, False)
    if changed:
        notify(NOTIFY_CHANNEL, [name], using=_backend(backend).database)
    return changed


def is_paused(name: str, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    using = _backend(backend).database
    return Queue.objects.using(using).filter(backend=backend, name=name, paused=True).exists()


def overview(backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> list[QueueView]:
    """Every queue the backend knows of (its ``QUEUES``, its limits, its paused queues
    and the queues with active jobs), with its state, limits and their use."""
    found = _backend(backend)
    using = found.database
    rules: FlowRules = found.config.flow
    now = database_now(using)
    states = {q.name: q for q in Queue.objects.using(using).filter(backend=backend)}
    counts = {
        row["queue"]: row
        for row in Job.objects.using(using)
        .filter(ACTIVE_ROWS, backend=backend)
        .values("queue")
        .annotate(
            pending=Count("id", filter=Q(status=JobStatus.PENDING)),
            ready=Count("id", filter=Q(status=JobStatus.PENDING, run_after__lte=now)),
            running=Count("id", filter=Q(status=JobStatus.RUNNING, locked_until__gt=now)),
        )
    }
    names = set(states) | set(counts) | set(rules.queue_limits) | set(rules.queue_rates)
    names |= set(getattr(found, "queues", None) or ())
    views = []
    for name in sorted(names):
        state = states.get(name)
        count: Mapping[str, Any] = counts.get(name, {})
        rate = rules.queue_rates.get(name)
        views.append(
            QueueView(
                name=name,
                paused=bool(state and state.paused),
                paused_at=state.paused_at if state else None,
                limit=rules.queue_limits.get(name),
                rate=None if rate is None else rate.text,
                running=count.get("running", 0),
                pending=count.get("pending", 0),
                ready=count.get("ready", 0),
                starts_in_window=None
                if rate is None
                else _starts(using, backend, queue_scope(name), rate, now),
            )
        )
    return views


def _starts(using: str, backend: str, scope: str, rate: Rate, now: datetime) -> int:
    return (
        RateStart.objects.using(using)
        .filter(backend=backend, scope=scope, started_at__gt=now - timedelta(seconds=rate.period))
        .count()
    )


def waiting_reasons(job: Job) -> list[str]:
    """Why the pending ``job`` is not running yet, in words (empty: nothing holds it back,
    a worker should take it at its next claim). For the admin's job page."""
    if job.status == JobStatus.WAITING:
        edges = Dependency.objects.using(job._state.db or "default").filter(child_id=job.pk)
        unfinished = edges.filter(parent__status__in=ACTIVE_STATUSES).count()
        return [
            f"a workflow step: it waits for {unfinished} of its {edges.count()} parent steps "
            "to finish, and becomes pending when the last one succeeds"
        ]
    if job.status != JobStatus.PENDING:
        return []
    found = _backend(job.backend)
    using = found.database
    rules: FlowRules = found.config.flow
    now = database_now(using)
    reasons = []
    if job.unknown_task_since is not None:
        waited = (now - job.unknown_task_since).total_seconds()
        reasons.append(
            f"a worker that did not know its task {job.task_path!r} gave it back "
            f"{waited:.0f} s after the first such worker met it: it waits for a worker "
            "running code that declares the task (dead letter after UNKNOWN_TASK_GRACE, "
            f"{found.config.unknown_task_grace:g} s)"
        )
    if job.run_after is not None and job.run_after > now:
        wait = (job.run_after - now).total_seconds()
        if job.unknown_task_since is not None:
            reasons.append(f"it may be claimed again in {wait:.0f} s")
        elif job.attempt > 0:
            reasons.append(
                f"waiting for a retry: attempt {job.attempt} did not succeed, the next one "
                f"may start in {wait:.0f} s"
            )
        else:
            reasons.append(f"scheduled: it may start in {wait:.0f} s (run_after)")
    if Queue.objects.using(using).filter(backend=job.backend, name=job.queue, paused=True).exists():
        reasons.append(f"the queue {job.queue!r} is paused")
    running = Job.objects.using(using).filter(
        backend=job.backend, status=JobStatus.RUNNING, locked_until__gt=now
    )
    queue_limit = rules.queue_limits.get(job.queue)
    if queue_limit is not None:
        busy = running.filter(queue=job.queue).count()
        if busy >= queue_limit:
            reasons.append(
                f"the queue {job.queue!r} is at its limit: {busy} of {queue_limit} running"
            )
    if job.flow_group and job.concurrency_limit:
        busy = running.filter(flow_group=job.flow_group).count()
        if busy >= job.concurrency_limit:
            reasons.append(
                f"the limit of its {describe_group(job.flow_group)} is full: {busy} of "
                f"{job.concurrency_limit} running"
            )
    for scope, rate_text, what in (
        (task_group(job.task_path), job.rate_limit, f"task {job.task_path}"),
        (
            queue_scope(job.queue),
            None if job.queue not in rules.queue_rates else rules.queue_rates[job.queue].text,
            f"queue {job.queue!r}",
        ),
    ):
        if not rate_text:
            continue
        try:
            rate = parse_rate(rate_text)
        except ValueError:
            continue
        used = _starts(using, job.backend, scope, rate, now)
        if used >= rate.count:
            reasons.append(
                f"the rate limit of the {what} is used up: {used} starts in the last "
                f"period ({rate.text})"
            )
    if not reasons:
        ahead = _ahead_in_group(job, using, now)
        if ahead:
            reasons.append(ahead)
    return reasons


def _ahead_in_group(job: Job, using: str, now: datetime) -> str:
    """Jobs of the same flow group claimed before this one (the order within a group)."""
    if not job.flow_group:
        return ""
    ahead = (
        Job.objects.using(using)
        .filter(backend=job.backend, flow_group=job.flow_group, status=JobStatus.PENDING)
        .filter(
            Q(priority__gt=job.priority)
            | Q(priority=job.priority, run_after__lt=job.run_after)
            | Q(priority=job.priority, run_after=job.run_after, pk__lt=job.pk)
        )
        .filter(run_after__lte=now)
        .count()
    )
    if not ahead:
        return ""
    return f"{ahead} job(s) of its {describe_group(job.flow_group)} come first (claim order)"
