"""What each alert rule measures, read from the database on its clock.

Every query is bounded, never a scan of the job table:

* finished jobs in a rule's window (``failure_rate``, ``dead_letters``): the rollup
  table's minutes of the window (``ROLLUPS``, on by default: at most 1,440 rows per
  queue and task, whatever the traffic), counted from the start of the minute the window
  starts in; with ``ROLLUPS = False``, the job rows through ``leasejobs_job_finished_idx``
  on ``(status, finished_at)``, one range per status, so the cost follows the jobs that
  finished within the window (at most a day, ``alert_spec.MAX_WINDOW``);
* ready jobs (``backlog``, ``oldest_ready``): the pending rows, through the partial
  indexes that hold them (``models.PENDING_ROWS``);
* workers (``no_worker``): the registry rows of the backend's online workers.

:func:`finished_counts` is the one place that counts finished jobs over a window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Min, Q, QuerySet, Sum

from ..alert_spec import AlertRule, window_text
from ..leases import minute_of
from ..models import PENDING_ROWS, Job, JobRollup, JobStatus, Worker, WorkerState

FAILED = (JobStatus.FAILED, JobStatus.DEAD)
"""Finished for good without success (cancelled jobs are neither success nor failure,
as on the dashboard)."""


@dataclass(frozen=True, slots=True)
class Measure:
    """A rule's measure. ``value`` None: no verdict (``failure_rate`` with fewer than
    ``min_jobs`` finished jobs), the rule neither fires nor resolves."""

    value: float | None
    detail: str
    """What was measured, in words, for the alert's message."""


@dataclass(frozen=True, slots=True)
class FinishedCounts:
    succeeded: int = 0
    failed: int = 0
    """Failed for good, dead letters included."""
    dead: int = 0


def scope_text(rule: AlertRule) -> str:
    parts = [f"queue {rule.queue!r}" if rule.queue is not None else "every queue"]
    if rule.task is not None:
        parts.append(f"task {rule.task!r}")
    return ", ".join(parts)


def _jobs(rule: AlertRule, backend: str, using: str) -> QuerySet[Job]:
    jobs = Job.objects.using(using).filter(backend=backend)
    if rule.queue is not None:
        jobs = jobs.filter(queue=rule.queue)
    if rule.task is not None:
        jobs = jobs.filter(task_path=rule.task)
    return jobs


def finished_counts(
    rule: AlertRule, *, backend: str, since: datetime, using: str, from_rollups: bool
) -> FinishedCounts:
    """The jobs of the rule's scope that finished at or after ``since``, by outcome: from
    the rollup table's minutes (``from_rollups``: the backend's ``ROLLUPS``, from the
    start of ``since``'s minute), else from the job rows."""
    if from_rollups:
        rows = JobRollup.objects.using(using).filter(backend=backend, minute__gte=minute_of(since))
        if rule.queue is not None:
            rows = rows.filter(queue=rule.queue)
        if rule.task is not None:
            rows = rows.filter(task_path=rule.task)
        sums = rows.aggregate(succeeded=Sum("succeeded"), failed=Sum("failed"), dead=Sum("dead"))
        dead = sums["dead"] or 0
        return FinishedCounts(
            succeeded=sums["succeeded"] or 0, failed=(sums["failed"] or 0) + dead, dead=dead
        )
    statuses = (JobStatus.DEAD,) if rule.kind == "dead_letters" else (JobStatus.SUCCEEDED, *FAILED)
    counts = dict(
        _jobs(rule, backend, using)
        .filter(status__in=statuses, finished_at__gte=since)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
    )
    return FinishedCounts(
        succeeded=counts.get(JobStatus.SUCCEEDED, 0),
        failed=sum(counts.get(status, 0) for status in FAILED),
        dead=counts.get(JobStatus.DEAD, 0),
    )


def _failure_rate(
    rule: AlertRule, backend: str, now: datetime, using: str, from_rollups: bool
) -> Measure:
    since = now - timedelta(seconds=rule.window)
    counts = finished_counts(
        rule, backend=backend, since=since, using=using, from_rollups=from_rollups
    )
    finished = counts.succeeded + counts.failed
    detail = (
        f"{counts.failed} of {finished} jobs of {scope_text(rule)} that finished in the last "
        f"{window_text(rule.window)} failed"
    )
    if finished < rule.min_jobs:  # (min_jobs >= 1)
        return Measure(None, detail + f" (fewer than {rule.min_jobs}: no verdict)")
    rate = counts.failed / finished
    return Measure(rate, f"failure rate {rate:.0%}: {detail} (threshold {rule.threshold:.0%})")


def _dead_letters(
    rule: AlertRule, backend: str, now: datetime, using: str, from_rollups: bool
) -> Measure:
    since = now - timedelta(seconds=rule.window)
    dead = finished_counts(
        rule, backend=backend, since=since, using=using, from_rollups=from_rollups
    ).dead
    return Measure(
        float(dead),
        f"{dead} jobs of {scope_text(rule)} became dead letters in the last "
        f"{window_text(rule.window)} (threshold {rule.threshold:g})",
    )


def _ready(rule: AlertRule, backend: str, now: datetime, using: str) -> Measure:
    ready = (
        _jobs(rule, backend, using)
        .filter(PENDING_ROWS, run_after__lte=now)
        .aggregate(n=Count("id"), oldest=Min("run_after"))
    )
    if rule.kind == "backlog":
        return Measure(
            float(ready["n"]),
            f"{ready['n']} ready jobs wait in {scope_text(rule)} (threshold {rule.threshold:g})",
        )
    waited = max((now - ready["oldest"]).total_seconds(), 0.0) if ready["oldest"] else 0.0
    return Measure(
        waited,
        f"the oldest ready job of {scope_text(rule)} has waited {waited:.0f} s "
        f"(threshold {rule.threshold:g} s)",
    )


def _workers(
    rule: AlertRule, backend: str, now: datetime, online_after: float, using: str
) -> Measure:
    """Online workers of the backend that serve the rule's queue (an empty queue list
    on a registry row: every queue)."""
    rows = Worker.objects.using(using).filter(
        Q(backend=backend)
        & Q(state__in=[WorkerState.RUNNING, WorkerState.STOPPING])
        & Q(last_seen_at__gte=now - timedelta(seconds=online_after))
    )
    listed = rows.values_list("queues", flat=True)
    serving = sum(1 for queues in listed if not queues or rule.queue in queues)
    if serving:
        return Measure(float(serving), f"{serving} workers online serve queue {rule.queue!r}")
    return Measure(0.0, f"no worker online serves queue {rule.queue!r}")


def measure(
    rule: AlertRule,
    *,
    backend: str,
    now: datetime,
    online_after: float,
    using: str,
    from_rollups: bool = True,
) -> Measure:
    """The rule's measure at the database time ``now``.

    ``online_after``: seconds without a heartbeat after which a worker is gone
    (``stats.online_window``, as the admin says); ``from_rollups``: finished jobs are
    counted in the rollup table (the backend's ``ROLLUPS``), else in the job rows."""
    if rule.kind == "failure_rate":
        return _failure_rate(rule, backend, now, using, from_rollups)
    if rule.kind == "dead_letters":
        return _dead_letters(rule, backend, now, using, from_rollups)
    if rule.kind == "no_worker":
        return _workers(rule, backend, now, online_after, using)
    return _ready(rule, backend, now, using)
