"""The worker's reaper thread: its reap pass, and that a pass held up holds up nothing else.

The reap pass runs on the reaper thread's own connection, apart from the heartbeat's: on
a busy database server a pass can take seconds, and a renewal that waited behind it
could cost the worker its leases (the overload bench lost a worker's 200 leases so).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_leasejobs import leases
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.signals import job_reaped
from django_leasejobs.worker import Worker
from django_leasejobs.worker.reaping import Reaper
from tests import tasks
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def stale_job() -> int:
    """A job of a worker that is gone, its lease expired five minutes ago."""
    result = tasks.add.enqueue(1, 2)
    leases.claim("gone-worker", limit=1, lease_duration=60)
    Job.objects.filter(pk=int(result.id)).update(locked_until=timezone.now() - timedelta(minutes=5))
    return int(result.id)


def test_a_reap_pass_reaps_and_announces_after_commit(worker: Worker) -> None:
    """The stale job is pending again once the pass ends, with its attempt row; the
    announcement (signal) comes after the commit."""
    job_id = stale_job()
    reaped_seen: list[str] = []

    def receiver(*, job_id: int, status: str, **_: Any) -> None:
        # Sent after the commit: another connection sees the reaped row already.
        reaped_seen.append(Job.objects.get(pk=job_id).status)

    job_reaped.connect(receiver, dispatch_uid="test-reaper-thread")
    try:
        Reaper(worker.thread_context(), threading.Event()).reap()
    finally:
        job_reaped.disconnect(dispatch_uid="test-reaper-thread")
    row = Job.objects.get(pk=job_id)
    assert row.status == JobStatus.PENDING
    assert row.attempts.count() == 1
    assert reaped_seen == [JobStatus.PENDING]


def reaper_waits_for_a_lock() -> bool:
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
    worker.book.table.add(held.lease, time.monotonic(), 60.0)
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
            wait_until(reaper_waits_for_a_lock, timeout=10, what="the reap pass to wait")
            seen = [heartbeat_at()]
            for _ in range(3):
                wait_until(
                    lambda: heartbeat_at() != seen[-1],
                    timeout=10,
                    what="a renewal while the reap pass waits",
                )
                seen.append(heartbeat_at())
            assert reaper_waits_for_a_lock()  # (still held up: the renewals went past it)
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
