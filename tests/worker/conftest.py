"""Fixtures of the worker's tests that drive a worker's parts in the test's process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_leasejobs.worker import Worker, WorkerConfig


@pytest.fixture
def worker() -> Iterator[Worker]:
    """A registered thread-pool worker object, never run: the test drives its parts (a
    heartbeat tick, a round, the hand-over) itself. A module may define its own."""
    worker = Worker(WorkerConfig(pool="thread", concurrency=1, worker_id="parts-worker"))
    worker.registration.register()
    yield worker
    worker.inbox.close()
