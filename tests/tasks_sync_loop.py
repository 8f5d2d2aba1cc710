"""Sync tasks for tests/worker/test_sync_on_loop.py (``runworker --sync-on-loop``): they
run many at once, each in a thread of a slot's own, and leave evidence in files
(one line per event, written at once) so tests count runs and stops without sleeping
blindly.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django_leasejobs import task
from django_leasejobs.models import Job
from tests.tasks_async import hostile_outcome
from tests.tasks_worker import _mark

TOLD_WITHIN = 60.0
"""How long :func:`until_told` waits for its stop before it gives up."""


@task(takes_context=True)
def doze(context: Any, marker_dir: str, name: str, seconds: float) -> list[int]:
    """Record the start (attempt, pid, thread, clock), sleep in its thread, read its own
    row through the ORM (the thread's own connection), record the end (clock)."""
    start = f"{context.job_id} {context.attempt} {os.getpid()} {threading.get_ident()}"
    _mark(marker_dir, f"{name}.starts", f"{start} {time.monotonic()}")
    time.sleep(seconds)
    if not Job.objects.filter(pk=context.job_id, locked_by=context.worker_id).exists():
        raise RuntimeError(f"job {context.job_id} is not leased to {context.worker_id}")
    _mark(marker_dir, f"{name}.ends", f"{context.job_id} {context.attempt} {time.monotonic()}")
    return [context.attempt, os.getpid()]


@task(takes_context=True)
def until_told(context: Any, marker_dir: str, name: str) -> str:
    """Wait until the worker stops the job (``context.lease_lost``); record that, and end."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    deadline = time.monotonic() + TOLD_WITHIN
    while not context.lease_lost and time.monotonic() < deadline:
        time.sleep(0.01)
    _mark(marker_dir, f"{name}.told", f"{context.job_id} {context.attempt} {context.lease_lost}")
    return "told"


@task(takes_context=True, max_attempts=2)
def ignores_its_stop(context: Any, marker_dir: str, name: str) -> None:
    """Never look at ``context.lease_lost``: its slot must be killed."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    time.sleep(3600)


@task(takes_context=True, max_attempts=1)
def loses_its_lease_and_ignores_its_stop(context: Any, marker_dir: str, name: str) -> None:
    """Hand its lease to another owner, then never look at ``context.lease_lost``: its
    slot must be killed."""
    Job.objects.filter(pk=context.job_id, attempt=context.attempt).update(locked_by="thief")
    ignores_its_stop.func(context, marker_dir, name)


@task(max_attempts=1)
def returns(kind: str) -> Any:
    """A hostile outcome of a sync job on the loop."""
    return hostile_outcome(kind)


@task(takes_context=True, max_attempts=1)
def loses_its_lease(context: Any, marker_dir: str, name: str) -> str:
    """Hand its lease to another owner, then wait to be told: the worker's next renewal
    finds the lease gone."""
    Job.objects.filter(pk=context.job_id, attempt=context.attempt).update(locked_by="thief")
    return str(until_told.func(context, marker_dir, name))


@task(takes_context=True, timeout=1, max_attempts=1)
def past_its_timeout(context: Any, marker_dir: str, name: str) -> str:
    """Run past its one-second timeout until the worker tells it to stop."""
    return str(until_told.func(context, marker_dir, name))
