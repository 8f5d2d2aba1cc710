"""Tasks for the worker flow tests (tests/worker/test_worker_flow.py,
tests/commands/test_runworker_command.py).

They leave evidence in ``marker_dir`` (the ``marker_dir`` fixture), one line per event,
so tests count executions and follow a job without sleeping blindly. Lines are written
with one ``write()`` on a file opened with ``O_APPEND``: concurrent writers (slot
processes, pool threads) never interleave within a line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task
from django_leasejobs.exceptions import LeaseLost


def _append(marker_dir: str, name: str, text: str) -> None:
    fd = os.open(Path(marker_dir) / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def read_lines(marker_dir: str, name: str) -> list[str]:
    """The lines of one marker file ([] while it does not exist)."""
    path = Path(marker_dir) / name
    return path.read_text().splitlines() if path.exists() else []


@task(takes_context=True)
def record_id(context: Any, marker_dir: str, name: str) -> int:
    """Quick job: append ``<job id> <attempt> <pid> <thread>`` to ``<name>.ids``."""
    _append(
        marker_dir,
        f"{name}.ids",
        f"{context.job_id} {context.attempt} {os.getpid()} {threading.get_ident()}",
    )
    return context.job_id


@task
def record_label(marker_dir: str, name: str, label: str) -> str:
    """Quick job without context: append ``label`` to ``<name>.order`` (run order)."""
    _append(marker_dir, f"{name}.order", label)
    return label


@task(takes_context=True)
def context_snapshot(context: Any, marker_dir: str, name: str) -> dict[str, Any]:
    """Write what the job's context says (JSON, one line) and return the same."""
    seen = {
        "job_id": context.job_id,
        "attempt": context.attempt,
        "task_result_id": context.task_result.id,
        "task_result_status": str(context.task_result.status),
        "worker_ids": list(context.task_result.worker_ids),
        "worker_id": context.worker_id,
        "lease_lost": context.lease_lost,
        "checkpoint": context.checkpoint,
        "pid": os.getpid(),
    }
    _append(marker_dir, f"{name}.context", json.dumps(seen))
    return seen


@task(takes_context=True, max_attempts=5)
def watch_lease_lost(context: Any, marker_dir: str, name: str, seconds: float) -> str:
    """Poll ``context.lease_lost`` for up to ``seconds``; record when (and whether) it flips.

    ``<name>.watch`` gets ``started <attempt>``, then ``lost <attempt> <seconds polled>``
    once the flag is set, then ``rejected <transition>`` if a checkpoint write after
    that was refused by the fence (or ``accepted``), and ``returning <attempt>``.
    """
    _append(marker_dir, f"{name}.watch", f"started {context.attempt}")
    started = time.monotonic()
    while not context.lease_lost and time.monotonic() - started < float(seconds):
        time.sleep(0.02)
    if not context.lease_lost:
        _append(marker_dir, f"{name}.watch", f"never-lost {context.attempt}")
        return "never lost"
    _append(
        marker_dir,
        f"{name}.watch",
        f"lost {context.attempt} {time.monotonic() - started:.3f}",
    )
    try:
        context.save_checkpoint({"by": f"attempt {context.attempt}"})
    except LeaseLost as exc:
        _append(marker_dir, f"{name}.watch", f"rejected {exc.transition}")
    else:
        _append(marker_dir, f"{name}.watch", "accepted")
    _append(marker_dir, f"{name}.watch", f"returning {context.attempt}")
    return f"late result of attempt {context.attempt}"


@task(takes_context=True, priority=10)
def wait_for_gate(context: Any, marker_dir: str, name: str, timeout: float = 60.0) -> str:
    """Long job: note its start in ``<name>.started``, then run until ``<name>.gate`` exists."""
    _append(marker_dir, f"{name}.started", f"{context.task_result.id} {os.getpid()}")
    return _wait_for_gate(marker_dir, name, timeout)


def _wait_for_gate(marker_dir: str, name: str, timeout: float) -> str:
    gate = Path(marker_dir) / f"{name}.gate"
    deadline = time.monotonic() + timeout
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.02)
    return "gate opened"


@task
def gate_plain(marker_dir: str, name: str, timeout: float = 60.0) -> str:
    """``wait_for_gate`` without a context (a pool test builds no TaskResult for it)."""
    _append(marker_dir, f"{name}.started", str(os.getpid()))
    return _wait_for_gate(marker_dir, name, timeout)


@task
def blob(size: int) -> str:
    """A result of ``size`` characters (larger than a pipe's buffer when asked)."""
    return "x" * size
