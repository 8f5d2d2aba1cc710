"""A worker's own signals (``django_leasejobs.signals``), from a real ``runworker``.

Each is sent with the keyword arguments its docstring and docs/operations.md list, and no
others: seen in the worker process through its events file (``tests/worker_events.py``,
one JSON line per signal: its arguments plus ``event`` and the sending ``pid``). The
variants a normal life does not show are checked where they happen: a forced stop in
tests/worker/test_worker_shutdown.py, a failed listener connection in
tests/worker/test_worker_idle.py, a pooled one in tests/e2e/test_pgbouncer.py, prefetched
jobs given back in tests/worker/test_worker_prefetch.py.
"""

from __future__ import annotations

import pytest
from django.db import connection

from tests import tasks
from tests.worker_harness import Workers

pytestmark = pytest.mark.django_db(transaction=True)

COMMON = {"event", "pid", "backend", "worker_id"}


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_workers_life_is_sent_with_the_documented_arguments(workers: Workers, pool: str) -> None:
    worker_id = f"signals-{pool}"
    args = ["--pool", pool, "--concurrency", "2", "--queues", "default,high"]
    worker = workers.start(args=[*args, "--worker-id", worker_id])
    mine = {"backend": "default", "worker_id": worker_id, "pid": worker.pid}

    [started] = worker.events("worker_started")
    assert started == {
        "event": "worker_started",
        **mine,
        "pool": pool,
        "concurrency": 2,
        "queues": ["default", "high"],
    }

    result = tasks.add.enqueue(2, 3)
    worker.wait_for_event("job_succeeded", job_id=int(result.id), attempt=1)
    if connection.vendor == "postgresql":
        [listening] = worker.wait_for_event("listening_changed")
        assert listening == {
            "event": "listening_changed",
            **mine,
            "listening": True,
            "reason": None,
            "error": None,
        }
    else:  # no LISTEN on this database: nothing changes, nothing is sent
        assert worker.events("listening_changed") == []

    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output
    [stopping] = worker.events("worker_stopping")
    assert stopping == {"event": "worker_stopping", **mine, "reason": "SIGTERM", "forced": False}
    [stopped] = worker.events("worker_stopped")
    assert stopped == {"event": "worker_stopped", **mine, "attempts": 1}

    names = [event["event"] for event in worker.events()]
    assert names.index("worker_started") < names.index("job_started")
    assert names.index("job_succeeded") < names.index("worker_stopping")
    assert names[-1] == "worker_stopped"  # the last word, after the threads ended
    for event in worker.events():
        assert set(event) >= COMMON, event
