"""The heartbeat thread renews the worker's leases and does nothing else.

(The registry row, the reap passes and the idle next-due lookup are the housekeeping
thread's: ``test_housekeeping.py``; the renewals' lease length: ``test_lease_length.py``
and ``test_lease_clock.py``.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_leasejobs import leases
from django_leasejobs.models import Job
from django_leasejobs.worker.heartbeat import Heartbeat
from django_leasejobs.worker.loop import Worker
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Statements:
    """The SQL of every statement run on the test's connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.seen.append(sql)
        return execute(sql, params, many, context)


def test_a_beat_of_a_worker_that_holds_no_lease_sends_nothing(worker: Worker) -> None:
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    statements = Statements()
    with connection.execute_wrapper(statements):
        heartbeat.tick()
        heartbeat.tick()
    assert statements.seen == []


def test_a_beat_renews_the_leases_held_and_does_nothing_else(
    worker: Worker,
) -> None:
    tasks.add.enqueue(1, 2)
    tasks.add.enqueue(3, 4)
    claimed = leases.claim(worker.worker_id, limit=2, lease_duration=60)
    for job in claimed:
        worker.book.table.add([job.lease], time.monotonic(), 60.0)
    before = {job.id: Job.objects.get(pk=job.id).heartbeat_at for job in claimed}
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    statements = Statements()
    with connection.execute_wrapper(statements):
        heartbeat.tick()
    # One statement (MySQL/MariaDB: lock, update, read), all of them on the job rows.
    assert len(statements.seen) == (3 if connection.vendor == "mysql" else 1), statements.seen
    assert all("leasejobs_job" in sql for sql in statements.seen), statements.seen
    assert not any("leasejobs_worker" in sql for sql in statements.seen), statements.seen
    after = {job.id: Job.objects.get(pk=job.id).heartbeat_at for job in claimed}
    assert all(after[i] != before[i] for i in before), (before, after)
