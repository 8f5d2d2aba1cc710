"""The queue's gauges, read from the database at each scrape: the dashboard's numbers.

``stats.collect`` (the admin dashboard's and ``leasejobs_status``'s query set, on the
database clock) plus, for backends with schedules, ``schedules.operations.overview``
at the same database time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import stats
from ..backend import LeaseJobsBackend
from ..compat import task_backends
from ..models import Job
from ..schedules import operations

JOB_STATES = ("ready", "scheduled", "running", "dead")


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
