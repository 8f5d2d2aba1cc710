"""The queue's gauges, read from the database at each scrape: the dashboard's numbers.

``stats.collect`` (the admin dashboard's and ``leasejobs_status``'s query set, on the
database clock) plus, for backends with schedules, ``schedules.operations.overview``
at the same database time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import stats, trends
from ..backend import LeaseJobsBackend
from ..compat import task_backends
from ..models import Job
from ..schedules import operations

JOB_STATES = ("ready", "scheduled", "running", "dead")
ROLLUP_EVENTS = ("enqueued", "started", "succeeded", "failed", "retried", "dead")
QUANTILES = (0.5, 0.95)
ONE_MINUTE = timedelta(minutes=1)
ONE_HOUR = timedelta(hours=1)


def _lease_backends() -> list[LeaseJobsBackend]:
    return [b for b in task_backends.all() if isinstance(b, LeaseJobsBackend)]


def online_after(backends: list[LeaseJobsBackend]) -> float:
    """The admin's "online" window: from the slowest heartbeat of the backends."""
    heartbeats = [backend.config.heartbeat_interval for backend in backends]
    return stats.online_window(max(heartbeats, default=10.0))


class QueueCollector(Collector):
    """Gauges of the jobs table of ``using`` (default: the ``Job`` model's database)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def collect(self) -> Iterator[GaugeMetricFamily]:
        using = self.using or Job.objects.db
        backends = _lease_backends()
        health = stats.collect(using=using, online_after=online_after(backends))
        yield from _job_gauges(health)
        yield GaugeMetricFamily(
            "leasejobs_workers_online",
            "Workers whose last heartbeat is recent and that have not stopped.",
            value=health.workers_online,
        )
        yield _overdue_gauge(backends, health, using)
        yield from _rollup_gauges(health.now, using)


def _job_gauges(health: stats.Health) -> Iterator[GaugeMetricFamily]:
    jobs = GaugeMetricFamily(
        "leasejobs_jobs",
        "Jobs per queue and state: ready (pending, due), scheduled (pending, not due yet), "
        "running, dead (dead letters).",
        labels=["queue", "state"],
    )
    expired = GaugeMetricFamily(
        "leasejobs_jobs_lease_expired",
        "Running jobs past their lease that no reaper has taken back yet.",
        labels=["queue"],
    )
    oldest = GaugeMetricFamily(
        "leasejobs_oldest_ready_job_age_seconds",
        "Seconds the oldest ready job has waited since it became due (0: none is ready).",
        labels=["queue"],
    )
    finished = GaugeMetricFamily(
        "leasejobs_jobs_finished_last_hour",
        "Jobs finished in the last hour per queue: succeeded, failed (failed or dead).",
        labels=["queue", "status"],
    )
    for queue in health.queues:
        for state in JOB_STATES:
            jobs.add_metric([queue.queue, state], getattr(queue, state))
        expired.add_metric([queue.queue], queue.expired)
        oldest.add_metric([queue.queue], queue.oldest_ready_wait or 0.0)
        finished.add_metric([queue.queue, "succeeded"], queue.succeeded_last_hour)
        finished.add_metric([queue.queue, "failed"], queue.failed_last_hour)
    yield from (jobs, expired, oldest, finished)


def _overdue_gauge(
    backends: list[LeaseJobsBackend], health: stats.Health, using: str
) -> GaugeMetricFamily:
    overdue = GaugeMetricFamily(
        "leasejobs_schedules_overdue",
        "Active schedules whose tick is late by more than one period (no worker runs them).",
        labels=["backend"],
    )
    for backend in backends:
        if backend.config.schedules:
            now = health.now if backend.database == using else None
            views = operations.overview(backend.alias, now=now)
            overdue.add_metric([backend.alias], sum(1 for view in views if view.overdue))
    return overdue


def _rollup_gauges(now: datetime, using: str) -> Iterator[GaugeMetricFamily]:
    """The rollup table's numbers (``trends.per_task``): counts of the last complete minute
    and of the last hour, and the last hour's wait and run percentiles, per backend, queue
    and task."""
    labels = ["backend", "queue", "task"]
    minute = trends.minute_start(now)
    last_minute = GaugeMetricFamily(
        "leasejobs_rollup_jobs_last_minute",
        "Jobs per event in the last complete minute (rollup): enqueued, started, succeeded, "
        "failed, retried, dead.",
        labels=[*labels, "event"],
    )
    last_hour = GaugeMetricFamily(
        "leasejobs_rollup_jobs_last_hour",
        "Jobs per event in the last 60 complete minutes (rollup).",
        labels=[*labels, "event"],
    )
    waits = GaugeMetricFamily(
        "leasejobs_rollup_wait_seconds_last_hour",
        "Wait from enqueue to the first start, percentiles over the last 60 complete minutes "
        "(rollup histogram: within a factor of sqrt(2)).",
        labels=[*labels, "quantile"],
    )
    runs = GaugeMetricFamily(
        "leasejobs_rollup_run_seconds_last_hour",
        "Run time of attempts with an outcome, percentiles over the last 60 complete minutes "
        "(rollup histogram: within a factor of sqrt(2)).",
        labels=[*labels, "quantile"],
    )
    for family, since in ((last_minute, minute - ONE_MINUTE), (last_hour, minute - ONE_HOUR)):
        for row in trends.per_task(since=since, until=minute, using=using):
            key = [row.backend, row.queue, row.task_path]
            for event in ROLLUP_EVENTS:
                family.add_metric([*key, event], getattr(row.totals, event))
            if family is last_hour:
                for q in QUANTILES:
                    wait = row.totals.wait_percentile(q)
                    run = row.totals.run_percentile(q)
                    if wait is not None:
                        waits.add_metric([*key, f"{q:g}"], wait)
                    if run is not None:
                        runs.add_metric([*key, f"{q:g}"], run)
    yield from (last_minute, last_hour, waits, runs)
