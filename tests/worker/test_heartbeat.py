"""The heartbeat thread's ticks, run in the test's thread on the test database.

``Heartbeat.tick`` renews the worker's leases, touches its registry row and runs the
reap pass; these tests record, for each statement, whether it ran inside a transaction
(``execute_wrapper``), and what it changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_leasejobs import leases
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.models import Worker as WorkerRow
from django_leasejobs.signals import job_reaped
from django_leasejobs.worker.heartbeat import IDLE_TOUCH_BEATS, Heartbeat
from django_leasejobs.worker.loop import Worker
from tests import tasks

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


def tick(worker: Worker, heartbeat: Heartbeat, *, beat: bool, reap: bool) -> Statements:
    statements = Statements()
    with connection.execute_wrapper(statements):
        heartbeat.tick(beat=beat, reap=reap)
    return statements


def test_an_idle_ticks_touch_and_reap_pass_share_one_transaction(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    first = tick(worker, heartbeat, beat=True, reap=True)
    assert first.on("leasejobs_worker") == [True], first.seen
    assert first.on("leasejobs_job") and all(first.on("leasejobs_job")), first.seen
    # The next beat touches nothing (idle, state unchanged): the reap pass runs alone,
    # in its own transaction.
    for _ in range(IDLE_TOUCH_BEATS - 1):
        quiet = tick(worker, heartbeat, beat=True, reap=True)
        assert quiet.on("leasejobs_worker") == [], quiet.seen
        assert quiet.on("leasejobs_job") and all(quiet.on("leasejobs_job")), quiet.seen
    # A beat without a reap pass due touches the row on its own, in autocommit.
    alone = tick(worker, heartbeat, beat=True, reap=False)
    assert alone.on("leasejobs_worker") == [False], alone.seen
    assert alone.on("leasejobs_job") == [], alone.seen


def test_a_changed_state_is_written_on_the_next_beat(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    tick(worker, heartbeat, beat=True, reap=False)
    worker.shutdown.begin()
    worker._publish_status()  # (the main loop publishes its state each pass)
    statements = tick(worker, heartbeat, beat=True, reap=False)
    assert statements.on("leasejobs_worker") == [False], statements.seen
    assert WorkerRow.objects.get(pk=worker.worker_id).state == "stopping"


def test_a_deleted_registry_row_is_put_back(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    WorkerRow.objects.filter(pk=worker.worker_id).delete()
    tick(worker, heartbeat, beat=True, reap=True)
    assert WorkerRow.objects.filter(pk=worker.worker_id).exists()


def test_the_combined_tick_reaps_and_announces_after_commit(worker: Worker) -> None:
    """A stale job reaped in the touch's transaction is pending again once the tick ends,
    with its attempt row; the announcement (log, signal) comes after the commit."""
    result = tasks.add.enqueue(1, 2)
    (claimed,) = leases.claim("gone-worker", limit=1, lease_duration=60)
    Job.objects.filter(pk=claimed.id).update(locked_until=timezone.now() - timedelta(minutes=5))
    reaped_seen: list[str] = []

    def receiver(*, job_id: int, status: str, **_: Any) -> None:
        # Sent after the commit: another connection sees the reaped row already.
        reaped_seen.append(status)

    job_reaped.connect(receiver, dispatch_uid="test-heartbeat-reaped")
    try:
        heartbeat = Heartbeat(worker.thread_context(), threading.Event())
        statements = tick(worker, heartbeat, beat=True, reap=True)
    finally:
        job_reaped.disconnect(dispatch_uid="test-heartbeat-reaped")
    assert statements.on("leasejobs_worker") == [True], statements.seen
    row = Job.objects.get(pk=int(result.id))
    assert row.status == JobStatus.PENDING
    assert row.attempts.count() == 1
    assert reaped_seen == [JobStatus.PENDING]
