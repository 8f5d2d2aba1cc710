"""Tasks for tests/observability/test_metrics.py: a mix of outcomes for one worker to count.

No retry backoff (the worker tests' RETRY_BACKOFF is 0), so retried jobs run again at
once.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django_leasejobs import task
from django_leasejobs.models import Job


@task()
def succeed() -> str:
    return "ok"


@task()
async def succeed_async() -> str:
    """Runs on a slot's event loop (process pool), one per slot (thread pool)."""
    return "ok"


@task(max_attempts=1)
def fail() -> None:
    raise ValueError("fails for good")


@task(takes_context=True, max_attempts=3)
def fail_then_succeed(context: Any) -> int:
    """Fails its first attempt (retried), succeeds the second."""
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return context.attempt


@task(takes_context=True, max_attempts=3)
def lose_lease_then_succeed(context: Any, hold: float) -> int:
    """First attempt: hand its lease to another owner and keep running, so the worker's
    next renewal finds it gone; the reaper takes the job back and attempt 2 succeeds."""
    if context.attempt == 1:
        job_id = int(context.task_result.id)
        Job.objects.filter(pk=job_id, attempt=1).update(locked_by="thief")
        time.sleep(hold)
    return context.attempt


@task(takes_context=True, max_attempts=3)
def die_then_succeed(context: Any) -> int:
    """First attempt: kill its own process (process pool only); attempt 2 succeeds."""
    if context.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return context.attempt
