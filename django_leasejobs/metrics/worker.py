"""A worker's own counters and histograms, served by ``runworker --metrics-port``.

They are fed by the signals the worker's main process sends as it records each
outcome (``signals.py``): in a process pool the slots only run jobs and send
nothing, so one worker's totals are exact. Labels are the backend alias, the queue
and the task path: never a job id or an argument. The queue's gauges
(``QueueCollector``) are not served here: every worker reading the jobs table at
every scrape would multiply the load; scrape the Django view for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIServer

from django.db import DatabaseError
from django.dispatch import Signal
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from .. import signals
from ..models import JobStatus

JOB_LABELS = ("backend", "queue", "task")
KILLED_ERRORS = frozenset(
    {
        "django_leasejobs.exceptions.JobKilled",
        "django_leasejobs.exceptions.TaskTimeout",
        "django_leasejobs.exceptions.JobTimeout",  # rows written before TaskTimeout
    }
)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
ROUND_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500)


class WorkerMetrics:
    """The metrics of the worker in this process, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def jobs(name: str, documentation: str) -> Counter:
            return Counter(f"leasejobs_worker_jobs_{name}", documentation, JOB_LABELS, registry=r)

        self.started = jobs("started", "Attempts started.")
        self.succeeded = jobs("succeeded", "Attempts that succeeded (recorded).")
        self.failed = jobs("failed", "Attempts that failed and ended the job (failed or dead).")
        self.retried = jobs("retried", "Attempts that failed and left the job to be retried.")
        self.cancelled = jobs("cancelled", "Attempts stopped by an operator's cancel.")
        self.lease_lost = Counter(
            "leasejobs_worker_jobs_lease_lost",
            "Attempts whose lease this worker lost.",
            ["backend", "queue"],
            registry=r,
        )
        self.killed = jobs(
            "killed", "Failed attempts whose process died or was killed (timeouts included)."
        )
        self.duration = Histogram(
            "leasejobs_worker_job_duration_seconds",
            "Run time of recorded attempts (succeeded or failed).",
            JOB_LABELS,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "leasejobs_worker_job_start_latency_seconds",
            "From enqueue to the first attempt's claim (database clock).",
            JOB_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.claimed = Histogram(
            "leasejobs_worker_claim_round_jobs",
            "Jobs claimed per claim round (0: the round found none).",
            ["backend"],
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.heartbeat = Histogram(
            "leasejobs_worker_heartbeat_duration_seconds",
            "Duration of heartbeats (lease renewals and the registry touch).",
            ["backend"],
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "leasejobs_worker_heartbeat_failures",
            "Heartbeats that failed with a database error.",
            ["backend"],
            registry=r,
        )

    def connect(self) -> None:
        """Count this process's worker signals (the worker's main process only). The
        receivers are strong references: they keep these metrics alive."""
        receivers: list[tuple[Signal, Callable[..., None]]] = [
            (signals.job_started, self._started),
            (signals.job_succeeded, self._succeeded),
            (signals.job_failed, self._failed),
            (signals.lease_lost, self._lease_lost),
            (signals.jobs_claimed, self._claimed),
            (signals.heartbeat_sent, self._heartbeat),
        ]
        for signal, receiver in receivers:
            signal.connect(receiver, weak=False, dispatch_uid=f"leasejobs-metrics-{id(self)}")

    def serve(self, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
        """Serve the metrics over HTTP from a daemon thread."""
        return start_http_server(port, addr=host, registry=self.registry)

    def _started(
        self,
        *,
        backend: str,
        queue: str,
        task_path: str,
        attempt: int,
        enqueued_at: datetime | None,
        claimed_at: datetime | None,
        **_: Any,
    ) -> None:
        self.started.labels(backend, queue, task_path).inc()
        if attempt == 1 and enqueued_at is not None and claimed_at is not None:
            latency = max((claimed_at - enqueued_at).total_seconds(), 0.0)
            self.latency.labels(backend, queue, task_path).observe(latency)

    def _succeeded(
        self, *, backend: str, queue: str, task_path: str, duration: float, **_: Any
    ) -> None:
        self.succeeded.labels(backend, queue, task_path).inc()
        self.duration.labels(backend, queue, task_path).observe(duration)

    def _failed(
        self,
        *,
        backend: str,
        queue: str,
        task_path: str,
        status: str,
        error: Any,
        duration: float,
        **_: Any,
    ) -> None:
        labels = (backend, queue, task_path)
        if status == JobStatus.PENDING:
            self.retried.labels(*labels).inc()
        elif status == JobStatus.CANCELLED:
            self.cancelled.labels(*labels).inc()
        else:
            self.failed.labels(*labels).inc()
        if error.exception_class_path in KILLED_ERRORS:
            self.killed.labels(*labels).inc()
        self.duration.labels(*labels).observe(duration)

    def _lease_lost(self, *, backend: str, queue: str, **_: Any) -> None:
        self.lease_lost.labels(backend, queue).inc()

    def _claimed(self, *, backend: str, count: int, **_: Any) -> None:
        self.claimed.labels(backend).observe(count)

    def _heartbeat(
        self, *, backend: str, duration: float, error: DatabaseError | None, **_: Any
    ) -> None:
        self.heartbeat.labels(backend).observe(duration)
        if error is not None:
            self.heartbeat_failures.labels(backend).inc()
