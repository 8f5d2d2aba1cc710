"""The heartbeat thread's ticks, run in the test's thread on the test database.

``Heartbeat.tick`` renews the worker's leases, touches its registry row and, while the
worker is idle and listening, looks up the next due job; these tests record, for each
statement, whether it ran inside a transaction (``execute_wrapper``), and what it
changed. (The reap passes are the reaper thread's: ``test_reaper_thread.py``.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_leasejobs.models import Worker as WorkerRow
from django_leasejobs.worker.heartbeat import IDLE_TOUCH_BEATS, Heartbeat
from django_leasejobs.worker.loop import Worker

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


def tick(heartbeat: Heartbeat) -> Statements:
    statements = Statements()
    with connection.execute_wrapper(statements):
        heartbeat.tick()
    return statements


def test_an_idle_worker_touches_its_row_every_other_beat_and_no_job_row(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    first = tick(heartbeat)  # (its state is news: written at once)
    assert first.on("leasejobs_worker") == [False], first.seen
    for _ in range(IDLE_TOUCH_BEATS - 1):
        quiet = tick(heartbeat)
        assert quiet.seen == [], quiet.seen
    again = tick(heartbeat)
    assert again.on("leasejobs_worker") == [False], again.seen
    # No lease held and not listening: no renewal, no lookup, no reap pass.
    assert first.on("leasejobs_job") == again.on("leasejobs_job") == [], again.seen


def test_an_idle_listening_ticks_touch_and_lookup_share_one_transaction(worker: Worker) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("workers listen for NOTIFY on PostgreSQL only")
    worker.listening = True
    worker._publish_status()  # (the main loop publishes its state each pass)
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    first = tick(heartbeat)
    assert first.on("leasejobs_worker") == [True], first.seen
    assert first.on("leasejobs_job") == [True], first.seen
    # The next beat touches nothing (idle, state unchanged): the lookup runs alone.
    quiet = tick(heartbeat)
    assert quiet.on("leasejobs_worker") == [], quiet.seen
    assert quiet.on("leasejobs_job") == [False], quiet.seen


def test_a_changed_state_is_written_on_the_next_beat(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    tick(heartbeat)
    worker.shutdown.begin()
    worker._publish_status()
    statements = tick(heartbeat)
    assert statements.on("leasejobs_worker") == [False], statements.seen
    assert WorkerRow.objects.get(pk=worker.worker_id).state == "stopping"


def test_a_deleted_registry_row_is_put_back(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    WorkerRow.objects.filter(pk=worker.worker_id).delete()
    tick(heartbeat)
    assert WorkerRow.objects.filter(pk=worker.worker_id).exists()
