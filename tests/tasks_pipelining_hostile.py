"""Hostile tasks for tests/worker/test_worker_pipelining_hostile.py that tests/tasks_worker.py and
tests/tasks_worker_poison.py do not have already: a job that ends its own process with
``os._exit``, one that raises ``SystemExit``, a result no database can store (a lone
surrogate), and one that freezes its worker for a moment and then runs long. Each notes
its attempt and pid first, so a test can tell where it ran.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task
from tests.tasks_worker_poison import POISON


def _note(context: Any, marker_dir: str, name: str) -> None:
    """Append ``<job id> <attempt> <pid>`` to ``<name>.runs`` in one ``write()`` (O_APPEND:
    lines of concurrent slots never mix), before the job does its harm."""
    line = f"{context.job_id} {context.attempt} {os.getpid()}\n"
    fd = os.open(Path(marker_dir) / f"{name}.runs", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@task(takes_context=True, **POISON)
def exit_own_process(context: Any, marker_dir: str, name: str) -> None:
    """Leave the slot's process at once, status 3: no exception, no cleanup, no outcome."""
    _note(context, marker_dir, name)
    os._exit(3)


@task(takes_context=True, **POISON)
def raise_system_exit(context: Any, marker_dir: str, name: str) -> None:
    """``sys.exit(2)`` from a job: the job's own failure, not the slot's exit."""
    _note(context, marker_dir, name)
    raise SystemExit(2)


@task(takes_context=True, **POISON)
def return_lone_surrogate(context: Any, marker_dir: str, name: str) -> str:
    """A result that cannot be encoded as UTF-8, so no database can store it."""
    _note(context, marker_dir, name)
    return "half a pair: \ud800"


@task(takes_context=True)
def starve_worker_then_run_long(
    context: Any, marker_dir: str, name: str, frozen: float = 0.2, seconds: float = 0.3
) -> int:
    """Freeze the worker (this slot's parent) for ``frozen`` seconds, as a machine short
    of CPU would, then run ``seconds`` more: long enough for the worker to take back the
    jobs queued behind it in its slot. Process pool only (a thread's parent is not the
    worker)."""
    _note(context, marker_dir, name)
    worker = os.getppid()
    os.kill(worker, signal.SIGSTOP)
    try:
        time.sleep(float(frozen))
    finally:
        os.kill(worker, signal.SIGCONT)
    time.sleep(float(seconds))
    return int(context.attempt)
