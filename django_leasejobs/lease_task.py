"""``LeaseTask``: a django.tasks ``Task`` with the per-task options of this backend.

It is the backend's ``task_class``, so ``@django.tasks.task(max_attempts=5)`` works
on Django 6 and ``@django_tasks.task(...)`` on Django 5.2; ``django_leasejobs.task``
is the same decorator on both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction

from .canvas import ParentFailure, Step, step
from .compat import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, InvalidTask, Task
from .durations import as_seconds, duration_problem
from .limits import MAX_KEY_LENGTH, limit_problem, parse_rate, rate_problem
from .retry import (
    DEFAULT_MAX_SNOOZES,
    Backoff,
    BackoffCallable,
    BackoffFunction,
    backoff_problems,
)
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

    backoff: Backoff | BackoffFunction | None = None
    """Delay policy between attempts (the spelling of Django's coming API,
    django/new-features#142); None = the backend's RETRY_BACKOFF. A callable
    ``backoff(exception, task_result)`` returns the seconds to wait, or None for no retry
    (called where the attempt ran, for exceptions the task raised; timeouts and kills use
    the backend's policy); a dict is a policy like RETRY_BACKOFF's."""

    retry_backoff: Backoff | BackoffCallable | None = None
    """Deprecated spelling of ``backoff``: a dict policy, or a callable
    ``(failed attempt number, exception) -> seconds``."""

    metadata: Mapping[str, Any] | None = None
    """``using(metadata={...})``: a JSON object stored with the job (Django's coming
    API, django/new-features#141); the task reads and changes it as
    ``context.metadata``."""

    run_after_delay: timedelta | None = None
    """``using(run_after=timedelta(...))``: the job runs this long after it is enqueued
    (the database's clock)."""

    retry_on: tuple[type[BaseException], ...] | None = None
    """Only these exceptions (and their subclasses) are retried; None = all."""

    dont_retry_on: tuple[type[BaseException], ...] = ()
    """These exceptions (and their subclasses) fail the job at once; wins over retry_on."""

    max_snoozes: int | None = None
    """``Retry`` raises that do not use an attempt; None = ``retry.DEFAULT_MAX_SNOOZES``."""

    key: str | None = None
    """Dedup key: enqueueing while a pending or running job has it returns that job."""

    unique_for: float | None = None
    """Seconds (a ``timedelta`` is accepted and stored as seconds) after a job with the
    ``key`` was enqueued in which enqueueing with the key returns that job, finished or
    not (database clock); None = unique while active only. Needs ``key``."""

    debounce: float | None = None
    """Seconds (or a ``timedelta``): the job with the ``key`` runs no earlier than this
    after the last enqueue with the key, with that enqueue's arguments (a pending job with
    the key is updated in place). Needs ``key``; not with ``unique_for`` or ``run_after``."""

    result_ttl: float | None = None
    """Seconds (or a ``timedelta``) a finished job is kept: ``prune_jobs`` deletes it once
    its ``finished_at`` is older; None = its queue's ``QUEUE_RESULT_TTL``, else the
    command's ``--older-than``."""

    concurrency_limit: int | None = None
    """Most running jobs of this task at once, across every worker; with a
    ``concurrency_key``, most running jobs that share the key (default 1 then)."""

    concurrency_key: str | Callable[..., str] | None = None
    """The key whose jobs share ``concurrency_limit``: a string, or a callable called with
    the job's arguments at enqueue (``lambda customer_id, **kw: f"customer-{customer_id}"``)."""

    rate_limit: str | None = None
    """Most starts of this task's jobs in any window of one period, across every worker:
    ``"N/s"``, ``"N/m"`` or ``"N/h"`` (attempts and retries count)."""

    def __post_init__(self) -> None:
        if self.backoff is not None and self.retry_backoff is not None:
            raise InvalidTask("give backoff= only (retry_backoff= is its deprecated spelling)")
        if self.backoff is not None and not (
            isinstance(self.backoff, Backoff) or callable(self.backoff)
        ):
            problems = backoff_problems(self.backoff)
            if problems:
                raise InvalidTask("backoff " + "; ".join(problems))
            object.__setattr__(self, "backoff", Backoff.from_value(self.backoff))
        if self.metadata is not None and (
            not isinstance(self.metadata, Mapping)
            or not all(isinstance(name, str) for name in self.metadata)
        ):
            raise InvalidTask(
                f"metadata must be a dict with string keys (JSON), got {_safe_repr(self.metadata)}"
            )
        if self.run_after_delay is not None and (
            not isinstance(self.run_after_delay, timedelta) or self.run_after_delay < timedelta(0)
        ):
            raise InvalidTask(
                f"run_after must be a datetime or a timedelta >= 0, got {self.run_after_delay!r}"
            )
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
        self._check_flow_options()
        self._check_key_windows()
        if not isinstance(self.backend, str):
            raise InvalidTask(f"backend must be a TASKS alias (a string), got {self.backend!r}")
        # Explicit base call: zero-argument super() breaks in slotted dataclasses.
        Task.__post_init__(self)

    def _check_flow_options(self) -> None:
        if self.concurrency_limit is not None:
            problem = limit_problem(self.concurrency_limit)
            if problem:
                raise InvalidTask(f"concurrency_limit {problem}")
        key = self.concurrency_key
        if key is not None and not callable(key):
            problem = concurrency_key_problem(key)
            if problem:
                raise InvalidTask(f"concurrency_key {problem}")
        if self.rate_limit is not None:
            problem = rate_problem(self.rate_limit)
            if problem:
                raise InvalidTask(f"rate_limit {problem}")
            object.__setattr__(self, "rate_limit", parse_rate(self.rate_limit).text)

    def _check_key_windows(self) -> None:
        for name in ("unique_for", "debounce", "result_ttl"):
            value = getattr(self, name)
            if value is None:
                continue
            problem = duration_problem(value)
            if problem:
                raise InvalidTask(f"{name} {problem}")
            object.__setattr__(self, name, as_seconds(value))
        window = "unique_for" if self.unique_for is not None else "debounce"
        if self.unique_for is not None and self.debounce is not None:
            raise InvalidTask(
                "unique_for and debounce cannot be combined: unique_for returns the first job "
                "with the key, debounce replaces it with the last. Pass only one of them."
            )
        if (self.unique_for is not None or self.debounce is not None) and self.key is None:
            raise InvalidTask(
                f"{window} needs a dedup key: pass key= in the same call, "
                f'e.g. .using(key="invoice-42", {window}=3600).'
            )
        if self.debounce is not None and self.run_after is not None:
            raise InvalidTask(
                "debounce sets run_after itself (the last enqueue plus debounce): "
                "pass debounce or run_after, not both."
            )

    @property
    def effective_concurrency_limit(self) -> int | None:
        """The cap of this task's flow group: ``concurrency_limit``, 1 with a key alone."""
        if self.concurrency_limit is None and self.concurrency_key is not None:
            return 1
        return self.concurrency_limit

    def resolve_concurrency_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """The concurrency key of one call (the callable called with its arguments).

        Raises InvalidTask when the callable fails or gives something that is not a key.
        """
        key = self.concurrency_key
        if key is None or not callable(key):
            return key
        try:
            found = key(*args, **kwargs)
        except Exception as exc:
            raise InvalidTask(
                f"concurrency_key of {self.module_path} failed for these arguments: "
                f"{type(exc).__name__}: {_safe_str(exc)}"
            ) from exc
        problem = concurrency_key_problem(found)
        if problem:
            raise InvalidTask(f"concurrency_key of {self.module_path} {problem}")
        return str(found)

    @property
    def snooze_limit(self) -> int:
        """Snoozes a job of this task may take without using an attempt."""
        return DEFAULT_MAX_SNOOZES if self.max_snoozes is None else self.max_snoozes

    def step(self, *args: Any, on_parent_failure: ParentFailure = "fail", **kwargs: Any) -> Step:
        """This task's call as a workflow step (``django_leasejobs.workflows.step``)."""
        return step(self, *args, on_parent_failure=on_parent_failure, **kwargs)

    def using(  # type: ignore[override]
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | timedelta | None = None,
        backend: str | None = None,
        max_attempts: int | None = _UNSET,
        max_stalls: int | None = _UNSET,
        timeout: float | None = _UNSET,
        retry_backoff: Backoff | Mapping[str, float] | None = _UNSET,
        key: str | None = _UNSET,
        concurrency_key: str | Callable[..., str] | None = _UNSET,
        concurrency_limit: int | None = _UNSET,
        rate_limit: str | None = _UNSET,
        metadata: Mapping[str, Any] | None = _UNSET,
        unique_for: float | timedelta | None = _UNSET,
        debounce: float | timedelta | None = _UNSET,
        result_ttl: float | timedelta | None = _UNSET,
    ) -> LeaseTask:
        """A copy with changed defaults; also takes this backend's per-task options.

        ``run_after`` may be a ``timedelta``: the job then runs that long after it is
        enqueued. ``timeout``, ``max_attempts`` and ``retry_backoff`` are deprecated here:
        Django's coming API sets them in ``@task`` only."""
        for name, value in (
            ("timeout", timeout),
            ("retry_backoff", retry_backoff),
            ("max_attempts", max_attempts),
        ):
            if value is not _UNSET:
                warnings.warn(
                    f"using({name}=...) is deprecated: set it in @task(...) (Django's coming "
                    "task API takes timeout, max_attempts and backoff there only).",
                    DeprecationWarning,
                    stacklevel=2,
                )
        delay: Any = _UNSET
        if isinstance(run_after, timedelta):
            run_after, delay = None, run_after
        elif run_after is not None:
            delay = None  # an absolute time replaces a delay given before
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
                ("concurrency_key", concurrency_key),
                ("concurrency_limit", concurrency_limit),
                ("rate_limit", rate_limit),
                ("run_after_delay", delay),
                ("metadata", metadata),
                ("unique_for", unique_for),
                ("debounce", debounce),
                ("result_ttl", result_ttl),
            )
            if value is not _UNSET
        }
        if delay is not _UNSET and delay is not None:
            changes["run_after"] = None
        return replace(base, **changes) if changes else base  # type: ignore[arg-type]

    def enqueue_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Enqueue once the current transaction on the backend's database commits (at once
        outside a transaction; never if it rolls back): Django's coming
        ``Task.enqueue_on_commit()`` (django/new-features#161). Returns None: the job
        does not exist yet when this returns."""
        backend = self.get_backend()
        using = getattr(backend, "database", None)
        transaction.on_commit(partial(self.enqueue, *args, **kwargs), using=using)


def concurrency_key_problem(key: Any) -> str:
    """Why ``key`` cannot be a concurrency key ('' when it can)."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        return (
            f"must be a non-empty string of at most {MAX_KEY_LENGTH} characters "
            f"(or a callable that returns one), got {_safe_repr(key)}"
        )
    problem = string_problem(key)
    return f"{key!r} {problem}" if problem else ""


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)[:200]
    except Exception:
        return f"a {type(value).__name__} that cannot be shown"


def _safe_str(value: Any) -> str:
    try:
        return str(value)[:200]
    except Exception:
        return f"(a {type(value).__name__} that cannot be shown)"


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
    backoff: Backoff | Mapping[str, float] | BackoffFunction | None = None,
    retry_backoff: Backoff | Mapping[str, float] | BackoffCallable | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    dont_retry_on: tuple[type[BaseException], ...] = (),
    max_snoozes: int | None = None,
    concurrency_limit: int | None = None,
    concurrency_key: str | Callable[..., str] | None = None,
    rate_limit: str | None = None,
    result_ttl: float | timedelta | None = None,
) -> Any:
    """Declare a task with this backend's options, on Django 5.2 and 6.x alike.

    Usable bare (``@task``) or with arguments (``@task(max_attempts=5, timeout=60)``).
    ``retry_backoff`` is the deprecated spelling of ``backoff`` (whose callable takes
    ``(exception, task_result)``).
    """
    if retry_backoff is not None:
        warnings.warn(
            "@task(retry_backoff=...) is deprecated: use backoff=... (a dict policy as before, "
            "or a callable backoff(exception, task_result) -> seconds or None, the spelling "
            "of Django's coming task API).",
            DeprecationWarning,
            stacklevel=2,
        )

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
            backoff=backoff,  # type: ignore[arg-type]
            retry_backoff=retry_backoff,  # type: ignore[arg-type]
            retry_on=retry_on,
            dont_retry_on=dont_retry_on,
            max_snoozes=max_snoozes,
            concurrency_limit=concurrency_limit,
            concurrency_key=concurrency_key,
            rate_limit=rate_limit,
            result_ttl=result_ttl,  # type: ignore[arg-type]
        )

    if function is not None:
        return wrapper(function)
    return wrapper
