"""Tasks for tests/worker/test_worker_retry.py: retry control (issue 13, point 4) on a real worker.

``retry_on`` / ``dont_retry_on`` matched by ``isinstance`` where the attempt ran
(subclasses count), ``Retry(after=...)`` snoozes and their bound, a callable backoff,
and hostile ``Retry`` waits that must end in a clear attempt row.
"""

from __future__ import annotations

import math
from typing import Any

from django_leasejobs import Retry, task
from django_leasejobs.worker.execution import JobContext

NO_WAIT = {"base": 0, "jitter": 0}


class Transient(Exception):
    pass


class FlakyConnection(Transient):
    """A subclass: ``retry_on=(Transient,)`` retries it too."""


@task(max_attempts=3, retry_on=(Transient,), retry_backoff=NO_WAIT)
def retry_on_subclass() -> None:
    raise FlakyConnection("connection reset")


@task(max_attempts=3, retry_on=(Transient,), retry_backoff=NO_WAIT)
def retry_on_other() -> None:
    raise ValueError("not transient")


@task(max_attempts=3, retry_on=(Exception,), dont_retry_on=(ValueError,), retry_backoff=NO_WAIT)
def dont_retry_subclass() -> None:
    raise UnicodeError("a ValueError: dont_retry_on wins over retry_on")


@task(max_attempts=1, max_snoozes=2)
def always_snoozes() -> None:
    raise Retry(after=0)


@task(takes_context=True)
def snoozes_once(context: JobContext, after: float) -> str:
    if context.attempt == 1:
        raise Retry(after=after)
    return "woke up"


def wait_from_exception(attempt: int, exc: BaseException) -> float:
    """A callable backoff: the wait the exception names, times the attempt number."""
    return float(exc.args[0]) * attempt


@task(max_attempts=2, retry_backoff=wait_from_exception)
def callable_backoff(wait: float) -> None:
    raise Transient(wait)


def bad_backoff(attempt: int, exc: BaseException) -> Any:
    return "soon"


@task(max_attempts=2, retry_backoff=bad_backoff)
def callable_backoff_gives_text() -> None:
    raise Transient("the backoff gives text")


BAD_AFTER: dict[str, Any] = {
    "negative": -1,
    "nan": math.nan,
    "infinite": math.inf,
    "huge": 1e300,
    "huge_int": 10**400,
    "text": "soon",
    "none": None,
}


@task(max_attempts=1)
def bad_retry_after(kind: str) -> None:
    raise Retry(after=BAD_AFTER[kind])
