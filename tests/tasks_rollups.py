"""Tasks for the rollup tests: each ends in a known way, so the job table's truth is known."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django_leasejobs import task


@task
def quick(n: int) -> int:
    """Succeeds after about 50 ms (the run-time percentiles have a known value)."""
    time.sleep(0.05)
    return n


@task(takes_context=True, backoff={"base": 0, "factor": 1, "cap": 0, "jitter": 0})
def flaky(context: Any) -> str:
    """Fails its first attempt, succeeds on the second (one retried, one succeeded)."""
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@task(max_attempts=2, backoff={"base": 0, "factor": 1, "cap": 0, "jitter": 0})
def broken() -> None:
    """Fails both its attempts (one retried, then failed for good)."""
    raise ValueError("always")


@task(max_stalls=1, max_attempts=5)
def kill_worker() -> None:
    """Kills its worker (SIGKILL of the slot's parent): the reaper dead-letters the job
    (``max_stalls=1``)."""
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(30)
