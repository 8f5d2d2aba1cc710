"""Tasks for tests/testing_kit/test_testing_kit*.py: the testing kit (django_leasejobs.testing).

Each is declared with ``@django_leasejobs.task`` in the ``tests`` app, so the registry
resolves it as it would in a worker.
"""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User

from django_leasejobs import Retry, leases, task
from django_leasejobs.models import Job
from django_leasejobs.worker.execution import JobContext

A_MINUTE = {"base": 60, "factor": 1, "cap": 60, "jitter": 0}
"""Every retry waits 60 s: a retried job is not ready again within the test."""

SEEN: dict[int, dict[str, Any]] = {}
"""What a task saw while it ran, by job id (the kit runs tasks in the test's thread)."""


class Transient(Exception):
    pass


@task
def multiply(a: int, b: int) -> int:
    return a * b


@task(queue_name="low")
def low_priority_work(label: str) -> str:
    return label


@task(takes_context=True, max_attempts=3, backoff=A_MINUTE)
def flaky(context: JobContext, failures: int) -> dict[str, Any]:
    """Fails its first ``failures`` attempts."""
    if context.attempt <= failures:
        raise Transient(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt, "job_id": context.job_id}


@task(max_attempts=3, dont_retry_on=(ValueError,), backoff=A_MINUTE)
def rejects_input(value: str) -> None:
    raise ValueError(f"bad value {value!r}")


@task(max_attempts=3, retry_on=(Transient,), backoff=A_MINUTE)
def retried_on_transient(kind: str) -> None:
    raise Transient(kind) if kind == "transient" else KeyError(kind)


@task(takes_context=True, max_attempts=1)
def snoozes_once(context: JobContext, after: float) -> str:
    if context.attempt == 1 and context.checkpoint is None:
        context.save_checkpoint({"snoozed": True})
        raise Retry(after=after)
    return "woke up"


@task(takes_context=True, max_attempts=1)
def reports_progress(context: JobContext, steps: int, fail: bool = False) -> int:
    for step in range(1, steps + 1):
        context.set_progress(step / steps, f"step {step} of {steps}")
        row = Job.objects.get(pk=context.job_id)
        SEEN.setdefault(context.job_id, {})[f"step {step}"] = (row.progress, row.progress_message)
    if fail:
        raise Transient("failed after its progress")
    return steps


@task(takes_context=True, max_attempts=2, backoff=A_MINUTE)
def resumes_from_checkpoint(context: JobContext) -> dict[str, Any]:
    start = (context.checkpoint or {}).get("row", 0)
    SEEN.setdefault(context.job_id, {})[f"attempt {context.attempt}"] = start
    if context.attempt == 1:
        context.save_checkpoint({"row": 500})
        raise Transient("crashed at row 500")
    return {"resumed_at": start}


@task(takes_context=True, max_attempts=3)
def cancelled_while_running(context: JobContext) -> str:
    """Asks for its own cancel, as an operator would while it runs, then reports progress
    (the renewal that carries it says the cancel was requested)."""
    seen = SEEN.setdefault(context.job_id, {})
    seen["cancel"] = leases.cancel(context.job_id)
    seen["lost before"] = context.lease_lost
    context.set_progress(0.5, "half way")
    seen["lost after"] = context.lease_lost
    return "finished anyway"


@task(takes_context=True, max_attempts=3, backoff=A_MINUTE)
def cancelled_then_fails(context: JobContext) -> None:
    leases.cancel(context.job_id)
    raise Transient("failed after a cancel was requested")


@task(timeout=0.01, max_attempts=2, backoff=A_MINUTE)
def overruns_timeout() -> str:
    time.sleep(0.05)  # the work itself: longer than the task's timeout
    return "too late"


@task
def enqueues_follow_up(value: int) -> int:
    multiply.enqueue(value, 10)
    return value


@task(takes_context=True, max_attempts=2, backoff=A_MINUTE)
def breaks_the_transaction(context: JobContext, username: str) -> None:
    """An IntegrityError the task does not handle in an atomic block of its own: inside a
    TestCase it leaves the test's transaction unusable."""
    context.save_checkpoint({"before": "the error"})
    User.objects.create(username=username)


@task(takes_context=True)
def calls_set_progress(context: Any) -> str:
    """Uses the job context's API directly: needs a LeaseJobs context."""
    context.set_progress(0.5, "half way")
    return "done"


@task(takes_context=True)
def progress_anywhere(context: Any) -> str:
    """Reports progress where the backend's context can take it (docs/testing.md)."""
    set_progress = getattr(context, "set_progress", None)
    if set_progress is not None:
        set_progress(0.5, "half way")
    return "done"


@task(takes_context=True, max_attempts=3)
def cancel_requested_then_returns(context: JobContext) -> str:
    """Asks for its own cancel and returns without reporting progress: the worker (here,
    the kit) never saw the request, so the success stands."""
    leases.cancel(context.job_id)
    return "done before the cancel was seen"


@task(takes_context=True, timeout=0.01, max_attempts=1)
def reports_progress_past_timeout(context: JobContext) -> str:
    seen = SEEN.setdefault(context.job_id, {})
    seen["lost before"] = context.lease_lost
    time.sleep(0.05)  # the work itself: longer than the task's timeout
    context.set_progress(0.9, "almost")
    seen["lost after"] = context.lease_lost
    return "too late"


@task(takes_context=True)
async def async_double(context: JobContext, value: int) -> dict[str, int]:
    context.set_progress(0.5, "doubling")  # no database call: sent after the attempt
    await sync_to_async(context.save_checkpoint)({"value": value})  # a database call
    return {"value": value * 2, "attempt": context.attempt}
