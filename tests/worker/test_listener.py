"""The listener thread on its own (PostgreSQL): it relays the notifications of its queues
to the worker's inbox, and a stop ends it at once instead of after its wait's timeout."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection

from django_leasejobs.compat import task_backends
from django_leasejobs.conf import Options
from django_leasejobs.leases import NOTIFY_CHANNEL
from django_leasejobs.worker import listener as listener_module
from django_leasejobs.worker.inbox import JobsMayBeReady, Listening
from django_leasejobs.worker.listener import Listener, listen_connection_params
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL only"
    ),
]


class RecordingInbox:
    """Stands in for the worker's inbox: keeps what the listener posts."""

    def __init__(self) -> None:
        self.posted: list[object] = []

    def post(self, message: object) -> None:
        self.posted.append(message)


def test_notifications_are_relayed_and_a_stop_ends_the_wait_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A wait far longer than the join below: only the wake-up can end it in time.
    monkeypatch.setattr(listener_module, "NOTIFY_WAIT", 600.0)
    inbox = RecordingInbox()
    ctx = SimpleNamespace(
        options=Options(),
        database="default",
        worker_id="w-listener",
        queues=("mine",),
        inbox=inbox,
        backend=task_backends["default"],
    )
    stop = threading.Event()
    listener = Listener(ctx, stop)  # type: ignore[arg-type]
    listener.start()
    try:
        wait_until(lambda: Listening(True) in inbox.posted, what="the listener to listen")
        with psycopg.connect(**listen_connection_params("default"), autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, 'other')", [NOTIFY_CHANNEL])
            conn.execute("SELECT pg_notify(%s, 'mine')", [NOTIFY_CHANNEL])
        wait_until(
            lambda: JobsMayBeReady() in inbox.posted,
            what=lambda: f"a wake-up for the queue 'mine'; posted: {inbox.posted}",
        )
    finally:
        stop.set()
        listener.wake()
        listener.join(timeout=30)
    assert not listener.is_alive(), "the stop did not end the listener's wait"
    # One wake-up: the other queue's notification was not relayed; and the listener
    # said it stopped listening.
    assert inbox.posted.count(JobsMayBeReady()) == 1
    assert inbox.posted[-1] == Listening(False)
