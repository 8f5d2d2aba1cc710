"""Tasks for the worker shutdown and fault tests: evidence in marker files, keyed by job id.

Every line a task writes names the job id, the attempt and the pid of the process that
ran it, so a test can tell a re-run (a higher attempt) from a duplicate (the same attempt
twice) and find the process to check that it is gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task


def _mark(marker_dir: str, name: str, text: str) -> None:
    with open(Path(marker_dir) / name, "a") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _evidence(context: Any) -> str:
    return f"{context.job_id} {context.attempt} {os.getpid()}"


@task(takes_context=True)
def wait_for_go(context: Any, marker_dir: str, name: str, limit: float = 60.0) -> int:
    """Record ``<name>.started``, wait for the file ``<name>.go``, record ``<name>.runs``.

    Without the go file within ``limit`` seconds the attempt fails (TimeoutError).
    """
    _mark(marker_dir, f"{name}.started", _evidence(context))
    go = Path(marker_dir) / f"{name}.go"
    deadline = time.monotonic() + float(limit)
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {go} within {limit}s")
        time.sleep(0.02)
    _mark(marker_dir, f"{name}.runs", _evidence(context))
    return int(context.attempt)


@task(takes_context=True)
def record_job(context: Any, marker_dir: str, name: str) -> int:
    """Quick job: append ``<job id> <attempt> <pid>`` to ``<name>.runs``."""
    _mark(marker_dir, f"{name}.runs", _evidence(context))
    return int(context.attempt)


@task(takes_context=True)
def slow_job(context: Any, marker_dir: str, name: str, seconds: float) -> int:
    """Record ``<name>.started``, run for ``seconds``, then record ``<name>.runs``."""
    _mark(marker_dir, f"{name}.started", _evidence(context))
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        time.sleep(0.02)
    _mark(marker_dir, f"{name}.runs", _evidence(context))
    return int(context.attempt)
