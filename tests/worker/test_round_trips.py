"""Round trips per job: the worker batches claims and outcome writes.

Every statement any worker connection sends is counted through an execute wrapper
installed on each new connection (and on this thread's). The worker runs in this
process (``Worker.run()``, burst mode) with real slot processes, so the count is the
real one: claims, batched completions and failures, registry rows. A regression to
one write per job (or a claim per job) makes the per-job figure jump past the bound.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from django_leasejobs.compat import task_backends
from django_leasejobs.models import Job, JobAttempt, JobStatus
from django_leasejobs.worker.loop import Worker, WorkerConfig

from .. import tasks, tasks_worker

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 400


class StatementCounter:
    """Counts statements per thread name, for every connection it is installed on."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        with self.lock:
            self.counts[threading.current_thread().name] += 1
        return execute(sql, params, many, context)

    def worker_statements(self) -> int:
        """Statements of the main loop and the database thread (not heartbeat/reaper)."""
        return sum(
            n
            for name, n in self.counts.items()
            if name.startswith("leasejobs-db") or not name.startswith("leasejobs-")
        )


@pytest.fixture
def counter() -> Iterator[StatementCounter]:
    counting = StatementCounter()

    def install(sender: Any, connection: Any, **kwargs: Any) -> None:
        # Once per connection object: the test's own connection reconnects during the
        # test (the worker closes it) and keeps its wrappers across reconnections.
        if counting not in connection.execute_wrappers:
            connection.execute_wrappers.append(counting)

    connection_created.connect(install)
    connection.ensure_connection()
    connection.execute_wrappers.append(counting)
    try:
        yield counting
    finally:
        connection_created.disconnect(install)
        while counting in connection.execute_wrappers:
            connection.execute_wrappers.remove(counting)


def _run_worker(pool: str) -> Worker:
    worker = Worker(WorkerConfig(burst=True, concurrency=4, pool=pool))  # type: ignore[arg-type]
    assert worker.run() == 0
    return worker


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_successes_cost_a_fraction_of_a_round_trip_per_job(
    counter: StatementCounter, pool: str
) -> None:
    task_backends["default"].bulk_enqueue([(tasks.add, [i, 1], {}) for i in range(JOBS)])
    counter.counts.clear()

    _run_worker(pool)

    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == JOBS
    per_job = counter.worker_statements() / JOBS
    # One claim and one completion per job would be 2.0; batching makes it far less.
    assert per_job < 0.5, f"{per_job:.2f} statements per job: {dict(counter.counts)}"
    # On PostgreSQL, a round's claim runs beside its writes, on a thread of its own.
    beside = counter.counts["leasejobs-db-claim_0"]
    assert (beside > 0) is (connection.vendor == "postgresql"), dict(counter.counts)


def test_failures_are_written_in_batches_too(counter: StatementCounter) -> None:
    task_backends["default"].bulk_enqueue(
        [(tasks_worker.fail_always.using(max_attempts=1), ["boom"], {}) for _ in range(JOBS)]
    )
    counter.counts.clear()

    _run_worker("process")

    assert Job.objects.filter(status=JobStatus.FAILED).count() == JOBS
    assert JobAttempt.objects.count() == JOBS
    per_job = counter.worker_statements() / JOBS
    # Per failure: the fenced UPDATE and the attempt rows' INSERT, shared by a batch.
    assert per_job < 1.0, f"{per_job:.2f} statements per job: {dict(counter.counts)}"


def test_a_worker_that_never_claimed_beside_its_writes_starts_no_claim_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second database thread starts with the first claim beside a round's writes,
    and not at all without one: closing the worker does not start it just to close a
    connection it never opened. (Nothing to claim: the rounds write nothing.)"""
    started: list[str] = []
    start = threading.Thread.start

    def record(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", record)
    _run_worker("thread")
    assert any(name.startswith("leasejobs-db_") for name in started), started
    assert not any(name.startswith("leasejobs-db-claim") for name in started), started
