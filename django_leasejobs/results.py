"""The django.tasks view of a job: its ``TaskResult`` (status, errors, worker ids, return
value) and the task as it was enqueued.

Shared by the backend (``get_result``, ``enqueue``) and the worker (its slots' task
contexts, the ``task_started`` and ``task_finished`` signals), which import it, not each
other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Protocol

from .compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus
from .lease_task import LeaseTask
from .models import AttemptOutcome, JobAttempt, JobStatus
from .retry import Backoff

STATUS_TO_RESULT = {
    JobStatus.WAITING: TaskResultStatus.READY,
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTaskResult(TaskResult):  # type: ignore[misc]
    """django.tasks' ``TaskResult`` with the job's ``metadata`` (a dict; ``{}`` when the job
    has none): what Django's coming API adds (django/new-features#141)."""

    metadata: dict[str, Any] = field(default_factory=dict)

    def refresh(self) -> None:
        """Reload from the job row: one query, every field (``metadata`` too)."""
        self._copy(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """:meth:`refresh` from async code: the query runs off the event loop (the
        backend's ``aget_result``)."""
        self._copy(await self.task.get_backend().aget_result(self.id))

    def _copy(self, fresh: TaskResult) -> None:
        for name in (f.name for f in fields(self)):
            if name not in ("task", "id"):
                object.__setattr__(self, name, getattr(fresh, name, {}))


def attempt_history(
    attempts: Sequence[JobAttempt], attempt: int, last_worker: str
) -> tuple[list[TaskError], list[str]]:
    """A job's ``TaskResult.errors`` and ``worker_ids`` from its attempt rows.

    ``attempt`` and ``last_worker`` are the job's own columns: an attempt newer than
    every row (running, or succeeded: successes write no row) adds its worker.
    """
    attempts = sorted(attempts, key=lambda a: a.attempt)
    worker_ids = [a.worker for a in attempts]
    recorded = max((a.attempt for a in attempts), default=0)
    if attempt > recorded and last_worker:
        worker_ids.append(last_worker)
    errors = [
        task_error(a.error_class, a.error_message, a.traceback)
        for a in attempts
        if a.outcome != AttemptOutcome.RELEASED
    ]
    return errors, worker_ids


def task_error(error_class: str, message: str, traceback: str) -> TaskError:
    """The ``TaskError`` of one failed attempt."""
    return TaskError(
        exception_class_path=error_class or "django_leasejobs.exceptions.JobFailure",
        traceback=traceback or f"{error_class}: {message}",
    )


class EnqueuedOptions(Protocol):
    """The columns of a job that make its task as enqueued (a ``Job`` or a claim)."""

    @property
    def priority(self) -> int: ...
    @property
    def queue(self) -> str: ...
    @property
    def task_options(self) -> Any: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def retry_backoff(self) -> Any: ...


_ENQUEUED_TASKS: dict[tuple[Any, ...], tuple[Task, Task]] = {}
_ENQUEUED_TASKS_MAX = 1024


def task_as_enqueued(base: Task, job: EnqueuedOptions, backend: str) -> Task:
    """The declared task ``base`` with the options ``job`` was enqueued with, and only
    those: an option the enqueued task never set stays unset (``run_after`` None,
    ``max_attempts`` None...), whatever the job's own columns hold for running it.

    Workers call this for every job they start: a task is rebuilt (and validated) once
    per distinct set of options, then reused.
    """
    given = job.task_options if isinstance(job.task_options, Mapping) else {}
    try:
        cache_key: tuple[Any, ...] | None = (
            id(base),
            backend,
            job.priority,
            job.queue,
            job.timeout,
            job.key,
            _frozen(job.retry_backoff),
            _frozen(given),
        )
        hash(cache_key)
    except TypeError:  # a value that cannot be hashed (a malformed row): no cache
        cache_key = None
    if cache_key is not None:
        cached = _ENQUEUED_TASKS.get(cache_key)
        if cached is not None and cached[0] is base:
            return cached[1]
    task = _rebuild(base, job, backend, given)
    if cache_key is not None:
        if len(_ENQUEUED_TASKS) >= _ENQUEUED_TASKS_MAX:
            _ENQUEUED_TASKS.clear()
        _ENQUEUED_TASKS[cache_key] = (base, task)
    return task


def _frozen(value: Any) -> Any:
    return tuple(sorted(value.items())) if isinstance(value, Mapping) else value


def _rebuild(base: Task, job: EnqueuedOptions, backend: str, given: Mapping[str, Any]) -> Task:
    changes: dict[str, Any] = {"priority": job.priority, "queue_name": job.queue}
    changes["backend"] = backend
    if isinstance(given.get("run_after"), str):
        with contextlib.suppress(ValueError):
            changes["run_after"] = datetime.fromisoformat(given["run_after"])
    lease_changes: dict[str, Any] = {}
    if isinstance(base, LeaseTask):
        # A dict policy is stored on the row; a function never is (the task keeps it).
        policy = "backoff" if base.backoff is not None else "retry_backoff"
        declared = getattr(base, policy)
        stored = job.retry_backoff
        lease_changes = {
            "max_attempts": given.get("max_attempts"),
            "max_stalls": given.get("max_stalls"),
            "timeout": job.timeout,
            "key": job.key,
            policy: Backoff.from_value(stored)
            if stored is not None
            else (declared if callable(declared) else None),
            "concurrency_limit": given.get("concurrency_limit"),
            "rate_limit": given.get("rate_limit"),
            "unique_for": given.get("unique_for"),
            "debounce": given.get("debounce"),
            "result_ttl": given.get("result_ttl"),
            "concurrency_key": given.get("concurrency_key")
            if isinstance(given.get("concurrency_key"), str)
            else (base.concurrency_key if callable(base.concurrency_key) else None),
        }
    try:
        task = base.using(**changes)
        return replace(task, **lease_changes) if lease_changes else task
    except (InvalidTask, TypeError, ValueError):
        # The row's queue, priority or options are no longer valid for this backend's
        # settings: report the job anyway, with the task's own defaults.
        return base


def live_result(
    task: Task,
    job_id: int,
    status: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    backend: str,
    *,
    enqueued_at: Any = None,
    started_at: Any = None,
    last_attempted_at: Any = None,
    finished_at: Any = None,
    errors: Sequence[TaskError] = (),
    worker_ids: Sequence[str] = (),
    return_value: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> TaskResult:
    """The django.tasks view of a job the caller holds in memory (no query).

    For a job just enqueued, and for the worker's ``task_started`` /
    ``task_finished`` signals and task contexts.
    """
    result: TaskResult = LeaseTaskResult(
        task=task,
        id=str(job_id),
        status=STATUS_TO_RESULT[JobStatus(status)],
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=list(args),
        kwargs=dict(kwargs),
        backend=backend,
        errors=list(errors),
        worker_ids=list(worker_ids),
        metadata=dict(metadata or {}),
    )
    if status == JobStatus.SUCCEEDED:
        object.__setattr__(result, "_return_value", return_value)
    return result
