"""Tasks for worker tests: they leave evidence in files and in the database.

Each run appends a line to ``<marker_dir>/<name>.runs`` (attempt and pid), so tests
can count executions and find processes without sleeping blindly.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task


def _mark(marker_dir: str, name: str, text: str) -> None:
    with open(Path(marker_dir) / name, "a") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())


_CONNECTIONS_SEEN: list[object] = []
"""The database connections this process's jobs ran on (kept, so no id is reused)."""


@task
def reuses_a_connection() -> dict[str, Any]:
    """Whether this job runs on a database connection an earlier job of its process ran
    on, and the process (a process-pool slot)."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    reused = any(seen is raw for seen in _CONNECTIONS_SEEN)
    _CONNECTIONS_SEEN.append(raw)
    return {"pid": os.getpid(), "reused": reused}


@task(takes_context=True)
def record(context: Any, marker_dir: str, name: str) -> int:
    """Quick job: record that it ran (attempt and pid)."""
    _mark(marker_dir, f"{name}.runs", f"{context.attempt} {os.getpid()}")
    return context.attempt


@task(takes_context=True)
def spawn_and_wait(context: Any, marker_dir: str, name: str, seconds: float) -> int:
    """Start a grandchild (a sleeping Python process), record both pids, wait ``seconds``."""
    child = subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep({float(seconds) + 60})"]
    )
    _mark(marker_dir, f"{name}.pids", f"{context.attempt} {os.getpid()} {child.pid}")
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    child.kill()
    _mark(marker_dir, f"{name}.runs", f"{context.attempt} {os.getpid()}")
    return context.attempt


@task(takes_context=True)
def handle_sigterm(context: Any, marker_dir: str, name: str, ignore: bool) -> str:
    """Install a SIGTERM handler that records the signal (and exits unless ``ignore``)."""

    def on_term(signum: int, frame: Any) -> None:
        _mark(marker_dir, f"{name}.sigterm", f"{context.attempt} {os.getpid()}")
        if not ignore:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    _mark(marker_dir, f"{name}.pids", f"{context.attempt} {os.getpid()}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "finished"


@task(takes_context=True, max_attempts=2, backoff={"base": 0, "jitter": 0})
def crash_own_process(context: Any, marker_dir: str, name: str) -> None:
    """A poison pill that kills its own process."""
    _mark(marker_dir, f"{name}.runs", f"{context.attempt} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)


@task(takes_context=True, max_stalls=2, max_attempts=10)
def kill_worker(context: Any, marker_dir: str, name: str) -> None:
    """A poison pill that kills the whole worker (its parent process)."""
    _mark(marker_dir, f"{name}.runs", f"{context.attempt} {os.getpid()}")
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(30)


@task(takes_context=True, timeout=1, max_attempts=1)
def overrun(context: Any, marker_dir: str, name: str) -> None:
    """Runs past its 1 s timeout (and spawns a grandchild that must die with it)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    _mark(marker_dir, f"{name}.pids", f"{context.attempt} {os.getpid()} {child.pid}")
    time.sleep(120)


@task(takes_context=True)
def progress_and_checkpoint(context: Any, marker_dir: str, name: str, steps: int) -> Any:
    """Reports progress and saves a checkpoint per step; resumes from the checkpoint."""
    start = (context.checkpoint or {}).get("step", 0)
    _mark(marker_dir, f"{name}.runs", f"{context.attempt} {os.getpid()} from {start}")
    for step in range(start + 1, steps + 1):
        context.set_progress(step / steps, f"step {step}")
        context.save_checkpoint({"step": step})
        _mark(marker_dir, f"{name}.steps", f"{context.attempt} {step}")
        wait_for = Path(marker_dir) / f"{name}.go{step}"
        deadline = time.monotonic() + 60
        while not wait_for.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return {"resumed_from": start, "attempt": context.attempt}


@task
def fail_always(message: str) -> None:
    raise ValueError(message)


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
def frozen_objects() -> int:
    """How many objects the cyclic GC leaves out in the process that runs it (the
    worker's start-up heap: ``gc.freeze``)."""
    return gc.get_freeze_count()
