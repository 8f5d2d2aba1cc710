"""``async def`` tasks for tests/worker/test_async_jobs.py: they run many at once on a
slot's event loop, and leave evidence in files (one line per event, written at once)
so tests count runs and cancellations without sleeping blindly.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from django_leasejobs import task
from django_leasejobs.models import Job
from tests.tasks_worker import _mark


@task(takes_context=True)
async def nap(context: Any, marker_dir: str, name: str, seconds: float) -> list[int]:
    """Record the start (attempt, pid, clock), sleep on the loop, record the end (clock)."""
    start = f"{context.job_id} {context.attempt} {os.getpid()} {time.monotonic()}"
    _mark(marker_dir, f"{name}.starts", start)
    await asyncio.sleep(seconds)
    _mark(marker_dir, f"{name}.ends", f"{context.job_id} {context.attempt} {time.monotonic()}")
    return [context.attempt, os.getpid()]


@task(takes_context=True)
async def until_cancelled(context: Any, marker_dir: str, name: str) -> None:
    """Wait on the loop until cancelled; record the CancelledError it got, then end on it."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _mark(marker_dir, f"{name}.cancelled", f"{context.job_id} {context.attempt}")
        raise


@task(takes_context=True, timeout=1)
async def past_its_timeout(context: Any, marker_dir: str, name: str) -> None:
    await until_cancelled.func(context, marker_dir, name)


@task(takes_context=True, max_attempts=1)
async def loses_its_lease(context: Any, marker_dir: str, name: str) -> None:
    """Hand its lease to another owner, then wait: the worker's next renewal finds it gone."""
    await sync_to_async(Job.objects.filter(pk=context.job_id, attempt=context.attempt).update)(
        locked_by="thief"
    )
    await until_cancelled.func(context, marker_dir, name)


@task(takes_context=True, max_attempts=1)
async def loses_its_lease_and_ignores_cancel(context: Any, marker_dir: str, name: str) -> None:
    """Hand its lease to another owner, then swallow its CancelledError and keep waiting
    (its slot must be killed)."""
    await sync_to_async(Job.objects.filter(pk=context.job_id, attempt=context.attempt).update)(
        locked_by="thief"
    )
    await ignores_cancel.func(context, marker_dir, name)


@task(takes_context=True, max_attempts=2)
async def ignores_cancel(context: Any, marker_dir: str, name: str) -> None:
    """Swallow every CancelledError and keep waiting (its slot must be killed)."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _mark(marker_dir, f"{name}.cancelled", f"{context.job_id} {context.attempt}")


@task(takes_context=True, max_attempts=1)
async def blocks_the_loop(context: Any, marker_dir: str, name: str, seconds: float) -> None:
    """A blocking call in a coroutine: holds the slot's event loop ``seconds``."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    time.sleep(seconds)  # the fault under test


@task(takes_context=True, max_attempts=1)
async def spins_the_loop(context: Any, marker_dir: str, name: str, seconds: float) -> None:
    """A pure-Python CPU loop in a coroutine: holds the slot's event loop ``seconds``,
    letting other threads take the GIL (the monitor sees it)."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the fault under test
        pass


_TURN_ROLES = ("brief", "spin")
_turn_gates: dict[str, dict[str, asyncio.Future[None]]] = {}


@task(takes_context=True, max_attempts=1)
async def holds_the_loop_in_turn(
    context: Any, marker_dir: str, name: str, group: str, role: str, seconds: float
) -> None:
    """Two jobs of one ``group`` on one slot's loop wait for each other (at attempt 1),
    then take the loop in one turn of it, with no tick between: the ``brief`` one blocks
    it ``seconds`` with a blocking call and ends; the ``spin`` one then spins on it
    ``seconds``."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {role}")
    if context.attempt == 1:  # (a second attempt runs alone: it waits for nobody)
        loop = asyncio.get_running_loop()
        gate = _turn_gates.setdefault(group, {})
        gate[role] = mine = loop.create_future()
        if len(gate) == len(_TURN_ROLES):
            # Woken in this order, by one callback: both steps run in the same turn.
            loop.call_soon(lambda: [gate[each].set_result(None) for each in _TURN_ROLES])
        await mine
    if role == "brief":
        time.sleep(seconds)  # a short block, as a missed tick on a busy machine looks
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the fault under test
        pass


@task(takes_context=True, max_attempts=1)
async def holds_the_gil(context: Any, marker_dir: str, name: str, count: int) -> int:
    """One native call that holds the GIL throughout (``sum`` over a ``range``, in C):
    the slot's monitor thread cannot run while it lasts."""
    _mark(marker_dir, f"{name}.starts", f"{context.job_id} {context.attempt} {os.getpid()}")
    return sum(range(count))  # the fault under test


def hostile_outcome(kind: str) -> Any:
    """What a job of ``kind`` returns or raises: a NUL byte, a value that is not JSON,
    ``KeyboardInterrupt``, ``SystemExit`` (else "fine")."""
    if kind == "nul":
        return "a\x00b"
    if kind == "unstorable":
        return {"not json": object()}
    if kind == "keyboard":
        raise KeyboardInterrupt
    if kind == "exit":
        raise SystemExit(3)
    return "fine"


@task(max_attempts=1)
async def returns(kind: str) -> Any:
    """A hostile outcome of an async job (see tests/tasks_worker_poison.py for sync)."""
    await asyncio.sleep(0)
    return hostile_outcome(kind)


# -- every other feature, for an async job (tests/worker/test_async_features.py) ----------


@task(takes_context=True)
async def reports_progress(context: Any, marker_dir: str) -> str:
    """Report progress, then wait (on the loop) for the test's go-ahead file."""
    context.set_progress(0.5, "half way")
    while not (Path(marker_dir) / "go").exists():
        await asyncio.sleep(0.02)
    return "done"


@task(takes_context=True, max_attempts=2)
async def resumes_from_checkpoint(context: Any) -> Any:
    """Attempt 1 saves a checkpoint and fails; attempt 2 returns what it finds."""
    if context.attempt == 1:
        await sync_to_async(context.save_checkpoint)({"step": 1})
        raise RuntimeError("attempt 1 fails after its checkpoint")
    return {"attempt": context.attempt, "checkpoint": context.checkpoint}


@task(max_attempts=3, dont_retry_on=(ValueError,))
async def refuses_to_retry() -> None:
    await asyncio.sleep(0)
    raise ValueError("not retried: it would fail the same way again")


@task(takes_context=True)
async def sums_its_parents(context: Any) -> int:
    """A workflow step: the sum of its parents' results (read with the claim)."""
    await asyncio.sleep(0)
    return sum(context.parent_results)


@task()
def number(value: int) -> int:
    return value
