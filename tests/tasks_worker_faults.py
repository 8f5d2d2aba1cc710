"""Tasks for the fault tests in tests/worker/test_worker_process.py, and a ``lease_lost`` probe.

A worker imports this module on demand (the row's task path names it) or at start-up
with ``OPTIONS["IMPORTS"] = ["tests.tasks_worker_faults"]``. When the worker's
environment names a file in ``LEASEJOBS_TEST_SIGNAL_LOG``, every ``lease_lost`` signal
the worker sends is appended to it as one JSON line, so a test can see the signal fire
in the worker process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.dispatch import receiver

from django_leasejobs import task
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.signals import lease_lost

SIGNAL_LOG_ENV = "LEASEJOBS_TEST_SIGNAL_LOG"


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@receiver(lease_lost, dispatch_uid="tests.tasks_worker_faults.record_lease_lost")
def record_lease_lost(
    sender: Any, job_id: int, attempt: int, worker_id: str, reason: str, **kwargs: Any
) -> None:
    path = os.environ.get(SIGNAL_LOG_ENV)
    if not path:
        return
    record = {
        "job_id": job_id,
        "attempt": attempt,
        "worker_id": worker_id,
        "reason": reason,
        "pid": os.getpid(),
    }
    _append(Path(path), json.dumps(record))


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
