"""Tasks with the spellings of Django's coming task API (tests/backend/test_next_api.py)."""

from __future__ import annotations

from typing import Any

from django_leasejobs import task

SEEN: list[tuple[BaseException, Any]] = []


class RateLimited(Exception):
    def __init__(self, wait: int) -> None:
        super().__init__(f"rate limited, wait {wait}s")
        self.wait = wait


def wait_as_told(exception: BaseException, task_result: Any) -> int | None:
    SEEN.append((exception, task_result))
    if isinstance(exception, RateLimited):
        return exception.wait
    return None


@task(max_attempts=3, backoff=wait_as_told)
def call_api(wait: int) -> None:
    if wait:
        raise RateLimited(wait)
    raise ValueError("bad request")


@task(max_attempts=3, backoff={"base": 5, "factor": 1, "cap": 5, "jitter": 0})
def fixed_backoff() -> None:
    raise ValueError("always")


@task
def noop(value: int = 0) -> int:
    return value


def undecorated() -> None:
    """Declared as a task by the tests themselves, with one spelling or another."""


@task(takes_context=True, max_attempts=2, backoff={"base": 0, "factor": 1, "cap": 0, "jitter": 0})
def count_runs(context: Any, fail_first: bool = False) -> int:
    """Counts its runs in the job's metadata; the first attempt fails when asked (the
    metadata it changed is saved when the attempt ends, success or not)."""
    metadata = context.metadata
    metadata["runs"] = metadata.get("runs", 0) + 1
    if fail_first and context.attempt == 1:
        raise ValueError("the first attempt fails")
    return int(metadata["runs"])


@task(takes_context=True)
def save_midway(context: Any) -> Any:
    """Saves its metadata during the run and returns what the row holds then."""
    from django_leasejobs.models import Job

    context.metadata["step"] = "saved"
    context.save_metadata()
    stored = Job.objects.get(pk=context.job_id).metadata
    context.metadata["step"] = "done"
    return stored


@task(takes_context=True)
def unstorable_metadata(context: Any) -> str:
    """Puts a value that is not JSON in its metadata and succeeds all the same."""
    context.metadata["when"] = object()
    return "done"
