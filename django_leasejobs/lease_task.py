"""``LeaseTask``: a django.tasks ``Task`` with the per-task options of this backend.

It is the backend's ``task_class``, so ``@django.tasks.task(max_attempts=5)`` works
on Django 6 and ``@django_tasks.task(...)`` on Django 5.2; ``django_leasejobs.task``
is the same decorator on both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .compat import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, InvalidTask, Task
from .retry import DEFAULT_MAX_SNOOZES, Backoff, BackoffCallable, backoff_problems
from .serialization import string_problem

_UNSET: Any = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTask(Task):  # type: ignore[misc]
    max_attempts: int | None = None
    """Attempts before the job is ``failed``; None = the backend's MAX_ATTEMPTS."""

    max_stalls: int | None = None
    """Expired leases before the job is ``dead``; None = the backend's MAX_STALLS."""

    timeout: float | None = None
    """Seconds one attempt may run before the worker kills it; None = no limit."""

    retry_backoff: Backoff | BackoffCallable | None = None
    """Delay policy between attempts; None = the backend's RETRY_BACKOFF. A callable gets
    the failed attempt's number and exception and returns seconds (called where the
    attempt ran, for exceptions the task raised; timeouts and kills use RETRY_BACKOFF)."""

    retry_on: tuple[type[BaseException], ...] | None = None
    """Only these exceptions (and their subclasses) are retried; None = all."""

    dont_retry_on: tuple[type[BaseException], ...] = ()
    """These exceptions (and their subclasses) fail the job at once; wins over retry_on."""

    max_snoozes: int | None = None
    """``Retry`` raises that do not use an attempt; None = ``retry.DEFAULT_MAX_SNOOZES``."""

    key: str | None = None
    """Dedup key: enqueueing while a pending or running job has it returns that job."""

    def __post_init__(self) -> None:
        if self.retry_backoff is not None and not (
            isinstance(self.retry_backoff, Backoff) or callable(self.retry_backoff)
        ):
            problems = backoff_problems(self.retry_backoff)
            if problems:
                raise InvalidTask("retry_backoff " + "; ".join(problems))
            object.__setattr__(self, "retry_backoff", Backoff.from_value(self.retry_backoff))
        for name in ("max_attempts", "max_stalls"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise InvalidTask(f"{name} must be a whole number >= 1, got {value!r}")
        for name in ("retry_on", "dont_retry_on"):
            object.__setattr__(self, name, _exception_classes(name, getattr(self, name)))
        if self.max_snoozes is not None and (
            isinstance(self.max_snoozes, bool)
            or not isinstance(self.max_snoozes, int)
            or self.max_snoozes < 0
        ):
            raise InvalidTask(f"max_snoozes must be a whole number >= 0, got {self.max_snoozes!r}")
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            raise InvalidTask(f"timeout must be a number of seconds > 0, got {self.timeout!r}")
        if self.key is not None:
            if not isinstance(self.key, str) or not 0 < len(self.key) <= 255:
                raise InvalidTask(
                    f"key must be a non-empty string of at most 255 characters, got {self.key!r}"
                )
            problem = string_problem(self.key)
            if problem:
                raise InvalidTask(f"key {self.key!r} {problem}.")
        if not isinstance(self.backend, str):
            raise InvalidTask(f"backend must be a TASKS alias (a string), got {self.backend!r}")
        # Explicit base call: zero-argument super() breaks in slotted dataclasses.
        Task.__post_init__(self)

    @property
    def snooze_limit(self) -> int:
        """Snoozes a job of this task may take without using an attempt."""
        return DEFAULT_MAX_SNOOZES if self.max_snoozes is None else self.max_snoozes

    def using(  # type: ignore[override]
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = _UNSET,
        max_stalls: int | None = _UNSET,
        timeout: float | None = _UNSET,
        retry_backoff: Backoff | Mapping[str, float] | None = _UNSET,
        key: str | None = _UNSET,
    ) -> LeaseTask:
        """A copy with changed defaults; also takes this backend's per-task options."""
        base: LeaseTask = Task.using(  # type: ignore[assignment]
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("max_attempts", max_attempts),
                ("max_stalls", max_stalls),
                ("timeout", timeout),
                ("retry_backoff", retry_backoff),
                ("key", key),
            )
            if value is not _UNSET
        }
        return replace(base, **changes) if changes else base  # type: ignore[arg-type]


def _exception_classes(name: str, value: Any) -> Any:
    """``retry_on`` / ``dont_retry_on`` as a tuple of exception classes (None stays None)."""
    if value is None and name == "retry_on":
        return None
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, tuple | list) or not all(
        isinstance(kind, type) and issubclass(kind, BaseException) for kind in value
    ):
        raise InvalidTask(f"{name} must be a tuple of exception classes, got {value!r}")
    if name == "retry_on" and not value:
        raise InvalidTask("retry_on=() would retry nothing: use max_attempts=1 instead")
    return tuple(value)


def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = 0,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    max_attempts: int | None = None,
    max_stalls: int | None = None,
    timeout: float | None = None,
    retry_backoff: Backoff | Mapping[str, float] | BackoffCallable | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    dont_retry_on: tuple[type[BaseException], ...] = (),
    max_snoozes: int | None = None,
) -> Any:
    """Declare a task with this backend's options, on Django 5.2 and 6.x alike.

    Usable bare (``@task``) or with arguments (``@task(max_attempts=5, timeout=60)``).
    """

    def wrapper(func: Callable[..., Any]) -> LeaseTask:
        return LeaseTask(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            max_attempts=max_attempts,
            max_stalls=max_stalls,
            timeout=timeout,
            retry_backoff=retry_backoff,  # type: ignore[arg-type]
            retry_on=retry_on,
            dont_retry_on=dont_retry_on,
            max_snoozes=max_snoozes,
        )

    if function is not None:
        return wrapper(function)
    return wrapper
