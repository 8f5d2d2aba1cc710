"""The housekeeping thread's ticks, and that a reap pass held up holds up no renewal.

``Housekeeping.tick`` touches the worker's registry row, runs the reap pass and, while
the worker is idle and listening, looks up the next due job; these tests record, for each
statement, whether it ran inside a transaction (``execute_wrapper``), and what it
changed. The renewals are the heartbeat's, on a connection of its own: a reap pass that
takes seconds on an overloaded server never delays one (CI's overload smoke lost a
worker's 197 leases when it did).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from django_leasejobs import leases
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.models import Worker as WorkerRow
from django_leasejobs.signals import job_reaped
from django_leasejobs.worker.housekeeping import IDLE_TOUCH_BEATS, Housekeeping
from django_leasejobs.worker.loop import Worker
from tests import tasks
from tests.conftest import ListHandler
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Statements:
    """(in a transaction, SQL) of every statement run on the test's connection."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.seen.append((context["connection"].in_atomic_block, sql))
        return execute(sql, params, many, context)

    def on(self, table: str) -> list[bool]:
        """For each statement on ``table``: whether it ran in a transaction."""
        return [atomic for atomic, sql in self.seen if table in sql]


def tick(worker: Worker, housekeeping: Housekeeping, *, beat: bool, reap: bool) -> Statements:
    statements = Statements()
    with connection.execute_wrapper(statements):
        housekeeping.tick(beat=beat, reap=reap)
    return statements


def test_an_idle_ticks_touch_and_reap_pass_share_one_transaction(worker: Worker) -> None:
    housekeeping = Housekeeping(worker.thread_context(), threading.Event())
    first = tick(worker, housekeeping, beat=True, reap=True)
    assert first.on("leasejobs_worker") == [True], first.seen
    assert first.on("leasejobs_job") and all(first.on("leasejobs_job")), first.seen
    # The next beat touches nothing (idle, state unchanged): the reap pass runs alone,
    # in its own transaction.
    for _ in range(IDLE_TOUCH_BEATS - 1):
        quiet = tick(worker, housekeeping, beat=True, reap=True)
        assert quiet.on("leasejobs_worker") == [], quiet.seen
        assert quiet.on("leasejobs_job") and all(quiet.on("leasejobs_job")), quiet.seen
    # A beat without a reap pass due touches the row on its own, in autocommit.
    alone = tick(worker, housekeeping, beat=True, reap=False)
    assert alone.on("leasejobs_worker") == [False], alone.seen
    assert alone.on("leasejobs_job") == [], alone.seen


def test_a_changed_state_is_written_on_the_next_beat(worker: Worker) -> None:
    housekeeping = Housekeeping(worker.thread_context(), threading.Event())
    tick(worker, housekeeping, beat=True, reap=False)
    worker.shutdown.begin()
    worker._publish_status()  # (the main loop publishes its state each pass)
    statements = tick(worker, housekeeping, beat=True, reap=False)
    assert statements.on("leasejobs_worker") == [False], statements.seen
    assert WorkerRow.objects.get(pk=worker.worker_id).state == "stopping"


def test_a_deleted_registry_row_is_put_back(worker: Worker) -> None:
    housekeeping = Housekeeping(worker.thread_context(), threading.Event())
    WorkerRow.objects.filter(pk=worker.worker_id).delete()
    tick(worker, housekeeping, beat=True, reap=True)
    assert WorkerRow.objects.filter(pk=worker.worker_id).exists()


def stale_job() -> int:
    """A job of a worker that is gone, its lease expired five minutes ago."""
    result = tasks.add.enqueue(1, 2)
    leases.claim("gone-worker", limit=1, lease_duration=60)
    Job.objects.filter(pk=int(result.id)).update(locked_until=timezone.now() - timedelta(minutes=5))
    return int(result.id)


def test_the_combined_tick_reaps_and_announces_after_commit(worker: Worker) -> None:
    """A stale job reaped in the touch's transaction is pending again once the tick ends,
    with its attempt row; the announcement (log, signal) comes after the commit."""
    job_id = stale_job()
    reaped_seen: list[str] = []

    def receiver(*, job_id: int, status: str, **_: Any) -> None:
        # Sent after the commit: another connection sees the reaped row already.
        reaped_seen.append(status)

    job_reaped.connect(receiver, dispatch_uid="test-housekeeping-reaped")
    try:
        housekeeping = Housekeeping(worker.thread_context(), threading.Event())
        statements = tick(worker, housekeeping, beat=True, reap=True)
    finally:
        job_reaped.disconnect(dispatch_uid="test-housekeeping-reaped")
    assert statements.on("leasejobs_worker") == [True], statements.seen
    row = Job.objects.get(pk=job_id)
    assert row.status == JobStatus.PENDING
    assert row.attempts.count() == 1
    assert reaped_seen == [JobStatus.PENDING]


def test_a_failed_repair_of_waiting_steps_is_logged_and_the_reap_stands(
    worker: Worker, leasejobs_log: ListHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor == "mysql":
        pytest.skip("MySQL/MariaDB: the failed repair raises (a transaction after the reap's)")

    def failing_repair(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("the repair failed")

    reap_module = importlib.import_module("django_leasejobs.leases.reap")  # (not leases.reap)
    monkeypatch.setattr(reap_module, "repair_waiting", failing_repair)
    job_id = stale_job()
    housekeeping = Housekeeping(worker.thread_context(), threading.Event())
    tick(worker, housekeeping, beat=False, reap=True)
    assert Job.objects.get(pk=job_id).status == JobStatus.PENDING
    (warning,) = [
        r for r in leasejobs_log.records if r.getMessage().startswith("repair of waiting")
    ]
    assert warning.getMessage() == "repair of waiting workflow steps failed: the repair failed"
    assert (warning.backend, warning.error, warning.reaper) == (
        "default",
        "the repair failed",
        worker.worker_id,
    )
    assert [r.getMessage() for r in leasejobs_log.records if hasattr(r, "count")] == [
        "released stale running jobs count=1"
    ]


def reap_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        # (Inside a transaction the activity view is read once: read it anew each time.)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            ["%leasejobs_attempt%"],
        )
        (count,) = cursor.fetchone()
    return count > 0


def test_a_reap_pass_held_up_holds_up_no_renewal(worker: Worker) -> None:
    """A reap pass that waits (here for a lock on the attempt table, as it would for a
    server that answers slowly) while the worker holds a lease: the heartbeat renews
    the lease beat after beat meanwhile. The worker's own background threads run (when
    the pass ran on the heartbeat's thread, no renewal came until the pass ended)."""
    if connection.vendor != "postgresql":
        pytest.skip("LOCK TABLE ... IN SHARE MODE is PostgreSQL's")
    stale = stale_job()
    tasks.add.enqueue(3, 4)
    (held,) = leases.claim(worker.worker_id, limit=1, lease_duration=60)
    worker.book.table.add([held.lease], time.monotonic(), 60.0)
    worker.options = dataclasses.replace(
        worker.options, heartbeat_interval=0.1, stale_lock_interval=0.1
    )
    stop = threading.Event()
    threads = worker.background_threads(stop)

    def heartbeat_at() -> object:
        return Job.objects.get(pk=held.id).heartbeat_at

    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                # The reap pass's attempt row must wait for this transaction.
                cursor.execute("LOCK TABLE leasejobs_attempt IN SHARE MODE")
            for thread in threads:
                thread.start()
            wait_until(reap_waits_for_a_lock, timeout=10, what="the reap pass to wait")
            seen = [heartbeat_at()]
            for _ in range(3):
                wait_until(
                    lambda: heartbeat_at() != seen[-1],
                    timeout=10,
                    what="a renewal while the reap pass waits",
                )
                seen.append(heartbeat_at())
            assert reap_waits_for_a_lock()  # (still held up: the renewals went past it)
            assert Job.objects.get(pk=stale).status == JobStatus.RUNNING
        # The lock gone, the pass ends: the stale job is pending again.
        wait_until(
            lambda: Job.objects.get(pk=stale).status == JobStatus.PENDING,
            timeout=10,
            what="the reap pass to end",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.wake()
        for thread in threads:
            thread.join(timeout=10)
    assert Job.objects.get(pk=held.id).locked_by == worker.worker_id
