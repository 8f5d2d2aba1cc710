"""Tasks with flow-control options (tests/backend/test_flow_enqueue.py,
tests/worker/test_worker_flow_control.py)."""

from __future__ import annotations

import os
import time
from typing import Any

from django_leasejobs import task
from tests.tasks_worker_flow import _append


@task(concurrency_limit=2)
def two_at_a_time(x: int) -> int:
    return x


@task(concurrency_key=lambda customer_id, **kw: f"customer-{customer_id}")
def import_customer(customer_id: int, **kw: Any) -> int:
    return customer_id


@task(concurrency_key="shared", concurrency_limit=3)
def shared_key(x: int) -> int:
    return x


@task(rate_limit=" 50/m ")
def rated(x: int) -> int:
    return x


@task(concurrency_key=lambda *a, **kw: 1 / 0)
def key_raises(x: int) -> int:
    return x


@task(concurrency_key=lambda *a, **kw: 5)
def key_not_a_string(x: int) -> int:
    return x


@task
def plain(x: int) -> int:
    return x


@task(queue_name="low")
def overlap(marker_dir: str, key: str, hold: float) -> str:
    """Write ``start <key> <pid>`` and, ``hold`` seconds later, ``end <key> <pid>`` to
    ``overlap.log``: the test replays the lines to find the most jobs of a key that ran at
    once. ``hold`` lets jobs overlap if the limit let them; it is not synchronisation."""
    _append(marker_dir, "overlap.log", f"start {key} {os.getpid()} {time.monotonic()}")
    time.sleep(hold)
    _append(marker_dir, "overlap.log", f"end {key} {os.getpid()} {time.monotonic()}")
    return key


@task(queue_name="low")
def started(marker_dir: str, label: str) -> str:
    """Append ``label`` to ``started.log``."""
    _append(marker_dir, "started.log", label)
    return label
