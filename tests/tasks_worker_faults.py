"""Tasks for the fault tests in tests/worker/test_worker_process.py.

A worker imports this module on demand (the row's task path names it). The tests see
the worker's ``lease_lost`` signals through its events (``tests/worker_events.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task
from django_leasejobs.exceptions import LeaseLost


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@task(takes_context=True)
def finish_on_go(context: Any, marker_dir: str, name: str, how: str) -> Any:
    """Record the pid, wait for ``<name>.go``, then end the attempt the way ``how`` says.

    ``how``: ``"return"`` (succeed), ``"raise"`` (fail) or ``"checkpoint"`` (save a
    checkpoint first; a rejected checkpoint is recorded in ``<name>.rejected``).
    """
    directory = Path(marker_dir)
    _append(directory / f"{name}.pids", f"{context.attempt} {os.getpid()}")
    go = directory / f"{name}.go"
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if how == "raise":
        raise RuntimeError(f"late failure of attempt {context.attempt}")
    if how == "checkpoint":
        try:
            context.save_checkpoint({"late": context.attempt})
        except LeaseLost as exc:
            _append(directory / f"{name}.rejected", f"{context.attempt} {exc.transition}")
            raise
    return f"late {context.attempt}"


@task(takes_context=True)
def spawn_and_exit_on_sigterm(context: Any, marker_dir: str, name: str) -> str:
    """Start a grandchild, record both pids; on SIGTERM record it and exit at once.

    The grandchild does not get the SIGTERM (it goes to the job's process only): it is
    left for the worker's SIGKILL of the whole process group after the grace period.
    """
    directory = Path(marker_dir)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def on_term(signum: int, frame: Any) -> None:
        _append(directory / f"{name}.sigterm", f"{context.attempt} {os.getpid()}")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    _append(directory / f"{name}.pids", f"{context.attempt} {os.getpid()} {child.pid}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    child.kill()
    return "finished"
