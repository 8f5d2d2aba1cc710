"""Tasks used by the test suite (the ``tests`` app is installed in tests.settings)."""

from __future__ import annotations

from typing import Any

from django_leasejobs import task
from django_leasejobs.compat import task as django_task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(
    max_attempts=5,
    max_stalls=2,
    timeout=30,
    retry_backoff={"base": 1, "factor": 3, "cap": 60, "jitter": 0},
)
def configured(x: Any = None) -> Any:
    return x


def wait_attempts(attempt: int, exc: BaseException) -> float:
    """A callable backoff: as many seconds as attempts."""
    return float(attempt)


@task(
    retry_on=OSError, dont_retry_on=[FileNotFoundError], max_snoozes=0, retry_backoff=wait_attempts
)
def retry_controlled() -> None:
    raise OSError("retried after wait_attempts")


@task
async def async_echo(value: Any) -> Any:
    return value


@task(takes_context=True)
def with_context(context: Any, value: Any) -> Any:
    return value


@task
def carry(*args: Any, **kwargs: Any) -> None:
    """Takes any arguments (tests/admin/test_job_search.py finds jobs by them)."""


def not_a_task() -> str:
    """A plain module-level function: a job row naming it must never run it."""
    raise AssertionError("not_a_task was called")


NOT_A_TASK_EITHER = "a module attribute that is not a task"


@django_task
def plain_django_task(x: int) -> int:
    """Declared with django.tasks' own decorator: runs with the backend's defaults."""
    return x * 2


@task(result_ttl=3600)
def kept_an_hour(x: Any = None) -> Any:
    """A task whose finished jobs are kept an hour (``result_ttl``)."""
    return x
