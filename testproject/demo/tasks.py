"""Tasks of the demo project: quick, slow (with progress), flaky and hopeless ones, two
under flow control (``sync_customer``: one at a time per customer; ``notify``: at most
six starts a minute), and two that the demo's schedules enqueue (``ping``,
``queue_report``)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django.db.models import Count
from django.utils import timezone

from django_leasejobs import task


class DemoError(RuntimeError):
    """Raised on purpose by the demo tasks that fail."""


@task
def add(a: int, b: int) -> int:
    """The smallest useful job."""
    return a + b


@task(takes_context=True, timeout=600)
def slow(context: Any, seconds: float = 10.0, steps: int = 10) -> dict[str, float]:
    """Sleeps ``seconds`` in ``steps`` steps, reporting progress after each one."""
    steps = max(1, int(steps))
    pause = float(seconds) / steps
    set_progress = getattr(context, "set_progress", None)
    for step in range(1, steps + 1):
        time.sleep(pause)
        if set_progress is not None:
            set_progress(step / steps, f"step {step} of {steps}")
    return {"seconds": float(seconds), "steps": steps}


@task(
    takes_context=True,
    max_attempts=5,
    retry_backoff={"base": 1.0, "factor": 2.0, "cap": 10.0, "jitter": 0.1},
)
def flaky(context: Any, succeed_on_attempt: int = 3) -> int:
    """Fails until attempt number ``succeed_on_attempt``, then returns the attempt."""
    attempt = int(context.attempt)
    if attempt < succeed_on_attempt:
        raise DemoError(f"attempt {attempt} fails on purpose (succeeds on {succeed_on_attempt})")
    return attempt


@task(max_attempts=2, retry_backoff={"base": 1.0, "factor": 1.0, "cap": 1.0, "jitter": 0.0})
def always_fails() -> None:
    """Never succeeds: ends as ``failed`` after its attempts, with the errors recorded."""
    raise DemoError("this task always fails")


@task(takes_context=True, max_stalls=2)
def crash_worker(context: Any) -> None:
    """A poison pill: kills the worker process that runs it (not just its own slot).

    The worker's jobs are recovered by the reaper; after ``max_stalls`` expired
    leases this job becomes a dead letter, which the admin can inspect and retry.
    """
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)


@task(concurrency_key=lambda customer_id, **kwargs: f"customer-{customer_id}")
def sync_customer(customer_id: int, seconds: float = 3.0) -> int:
    """One sync per customer at a time, across every worker (its concurrency key); the
    others wait in ``pending``, and the admin's job page says why."""
    time.sleep(float(seconds))
    return customer_id


@task(rate_limit="6/m")
def notify(number: int) -> int:
    """At most six starts a minute across every worker (its rate limit)."""
    return number


@task
def ping(label: str = "ping") -> dict[str, str]:
    """A scheduled demo job (every 10 s in the demo): says when it ran."""
    return {"label": label, "ran_at": timezone.now().isoformat()}


@task
def queue_report() -> dict[str, int]:
    """A scheduled demo job (every two minutes in the demo): the jobs by status."""
    from django_leasejobs.models import Job

    rows = Job.objects.order_by().values_list("status").annotate(count=Count("id"))
    return {status: count for status, count in rows}
