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
