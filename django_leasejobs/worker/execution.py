"""Running one claimed job inside a slot (child process or pool thread).

What a slot needs: resolve the row's task (registered tasks only), build the
context for ``takes_context`` tasks, call the task, and turn the outcome into a
plain, picklable :class:`Outcome` (JSON result, or error class path + traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from inspect import iscoroutinefunction
from typing import Any, ParamSpec

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

from ..compat import AnyTask, AnyTaskResult, Task, TaskContext, TaskError
from ..exceptions import InvalidTaskArguments, UnknownTask
from ..hot_values import hot_value
from ..leases import (
    MAX_PROGRESS_MESSAGE_LENGTH,
    ClaimedJob,
    ErrorInfo,
    Failure,
    ParentOutcome,
    decide,
    parent_outcomes,
    save_checkpoint,
    save_metadata,
    storable_text,
)
from ..models import AttemptOutcome, JobStatus
from ..registry import resolve
from ..results import live_result, task_as_enqueued, task_error
from ..retry import DEFAULT_MAX_SNOOZES, RETRIED, Backoff, Decision, Verdict, verdict
from ..serialization import json_value
from ..tracing import atraced, traced

logger = logging.getLogger("django_leasejobs")

P = ParamSpec("P")

NOT_RETRIED = Verdict(Decision.FAIL, "not retried: it would fail the same way again")


@hot_value
class JobSpec:
    """What a slot receives for one attempt (picklable: sent to child processes)."""

    job: ClaimedJob
    worker_id: str
    backend: str
    database: str
    start_by: float = math.inf
    """``time.monotonic()`` after which the slot must not start the job: the worker would
    call its lease lost by then (no renewal within the local deadline). A slot
    that holds jobs queued behind another gives back those it could not start in time."""
    on_loop: bool = False
    """The slot runs it on its event loop, beside others (``ASYNC_CONCURRENCY``), rather
    than alone: an ``async def`` job in the process pool, or any job there with
    ``--sync-on-loop``."""
    coroutine: bool = False
    """Its task is an ``async def`` one: it runs as a coroutine (a sync job on an event
    loop runs in a thread of the slot). Decided once by the worker (``Handover``)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        fields = (
            self.job,
            self.worker_id,
            self.backend,
            self.database,
            self.start_by,
            self.on_loop,
            self.coroutine,
        )
        return (JobSpec, fields)


@hot_value
class Outcome:
    lease: tuple[int, int]
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    verdict: Verdict = RETRIED
    """What the slot decided about a failure's exception (``retry.verdict``)."""
    duration: float = 0.0
    cancelled: bool = False
    """An ``async def`` job that ended on a ``CancelledError`` (the slot's way to stop it),
    or a sync job on a slot's event loop that ended after it was sent one."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # One per job through a slot's pipe: a tuple pickles faster than the default, and
        # the default verdict (every success's) goes as None, not as a dataclass's state.
        fields = (
            self.lease,
            self.ok,
            self.result,
            self.error,
            None if self.verdict is RETRIED else self.verdict,
            self.duration,
            self.cancelled,
        )
        return (_unpickled_outcome, fields)


def _unpickled_outcome(
    lease: tuple[int, int],
    ok: bool,
    result: Any,
    error: ErrorInfo | None,
    verdict: Verdict | None,
    duration: float,
    cancelled: bool,
) -> Outcome:
    """An :class:`Outcome` from its pickled fields (``verdict`` None: :data:`RETRIED`)."""
    return Outcome(
        lease, ok, result, error, RETRIED if verdict is None else verdict, duration, cancelled
    )


ProgressSink = Callable[[tuple[int, int], float | None, str | None], None]


class LostFlag:
    """Set once the worker stops the attempt a thread-pool slot runs (its lease lost,
    its timeout, a cancel): ``context.lease_lost``. Nothing waits on it, so a plain
    attribute does (a ``threading.Event`` per job costs a lock and a condition)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):  # type: ignore[misc, type-arg]
    """The context a ``takes_context=True`` task receives.

    Besides django.tasks' ``task_result`` it offers ``job_id``, ``attempt`` (the
    attempt number, 1-based), ``worker_id``, ``set_progress()``, ``checkpoint`` /
    ``save_checkpoint()``, ``metadata`` / ``save_metadata()`` and ``lease_lost``.
    """

    job_id: int
    attempt_number: int
    worker_id: str
    database: str
    initial_checkpoint: Any = None
    initial_metadata: dict[str, Any] | None = None
    workflow_id: int | None = None
    initial_parents: tuple[ParentOutcome, ...] | None = None
    progress_sink: ProgressSink | None = None
    lost_flag: LostFlag = field(default_factory=LostFlag)
    _state: dict[str, Any] = field(default_factory=dict)

    @property
    def attempt(self) -> int:  # type: ignore[override]
        return self.attempt_number

    @property
    def lease(self) -> tuple[int, int]:
        return (self.job_id, self.attempt_number)

    @property
    def lease_lost(self) -> bool:
        """True once the worker knows this attempt's lease is gone (thread pool)."""
        return self.lost_flag.is_set()

    def set_progress(self, fraction: float | None, message: str | None = None) -> None:
        """Report progress (0..1) and a short message; sent with the next heartbeat.

        The message is stored as text the database accepts (at most 255 characters; a
        NUL or a lone surrogate is escaped, see ``leases.storable_text``).
        """
        if fraction is not None:
            fraction = float(fraction)
            fraction = min(max(fraction, 0.0), 1.0) if math.isfinite(fraction) else None
        if message is not None:
            message = storable_text(message, MAX_PROGRESS_MESSAGE_LENGTH)
        if self.progress_sink is not None:
            self.progress_sink(self.lease, fraction, message)

    @property
    def parents(self) -> list[ParentOutcome]:
        """A workflow step's parents, in the order the workflow gave them (read by the
        worker with the claim; else once, on first use); [] for a job that is not a step,
        or a step without parents."""
        if self.workflow_id is None:
            return []
        if self.initial_parents is not None:
            return list(self.initial_parents)
        if "parents" not in self._state:
            self._state["parents"] = parent_outcomes(self.job_id, using=self.database)
        parents: list[ParentOutcome] = self._state["parents"]
        return parents

    @property
    def parent_results(self) -> list[Any]:
        """The return values of this step's direct parents, in their order (None for a
        parent that did not succeed: only a step with ``on_parent_failure="run"`` runs
        after one)."""
        return [parent.result for parent in self.parents]

    @property
    def failed_parents(self) -> list[ParentOutcome]:
        """The parents that ended without succeeding (``on_parent_failure="run"``)."""
        return [parent for parent in self.parents if not parent.succeeded]

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint saved by any attempt of this job (None at first)."""
        return self._state.get("checkpoint", self.initial_checkpoint)

    def save_checkpoint(self, data: Any) -> None:
        """Store ``data`` (JSON) as the job's checkpoint, fenced on this attempt's lease.

        Raises ``LeaseLost`` when this attempt no longer owns the job.
        """
        value = json_value(data, "checkpoint", using=self.database)
        save_checkpoint(
            self.job_id, self.attempt_number, self.worker_id, value, using=self.database
        )
        self._state["checkpoint"] = value

    @property
    def metadata(self) -> dict[str, Any]:
        """The job's metadata (``using(metadata=...)``, as the last attempt saved it): a
        dict the task may change; saved when the attempt ends, or by
        :meth:`save_metadata` (Django's coming API, django/new-features#141)."""
        if "metadata" not in self._state:
            self._state["metadata"] = copy.deepcopy(self.initial_metadata or {})
            self._state["metadata_saved"] = copy.deepcopy(self._state["metadata"])
        metadata: dict[str, Any] = self._state["metadata"]
        return metadata

    def save_metadata(self) -> None:
        """Store :attr:`metadata` now (JSON), fenced on this attempt's lease.

        Raises ``LeaseLost`` when this attempt no longer owns the job."""
        value = json_value(self.metadata, "metadata", using=self.database)
        if not isinstance(value, dict):  # pragma: no cover - a dict stays a dict
            raise TypeError("metadata must stay a dict")
        save_metadata(self.job_id, self.attempt_number, self.worker_id, value, using=self.database)
        self._state["metadata_saved"] = copy.deepcopy(value)

    async def asave_metadata(self) -> None:
        """:meth:`save_metadata` from async code."""
        await sync_to_async(self.save_metadata)()

    def save_changed_metadata(self) -> None:
        """At the attempt's end: store :attr:`metadata` if the task changed it since it
        was read or last saved. Never raises: a lease lost meanwhile, or a value that is
        not JSON, leaves the stored metadata as it was, with a WARNING that says why."""
        if "metadata" not in self._state:
            return
        try:
            if self._state["metadata"] != self._state["metadata_saved"]:
                self.save_metadata()
        except Exception as exc:
            logger.warning(
                "metadata of job %s (attempt %s) not saved at the attempt's end: %s",
                self.job_id,
                self.attempt_number,
                storable_text(f"{type(exc).__name__}: {exc}", 500),
                extra={"job_id": self.job_id, "attempt": self.attempt_number},
            )


def error_info(exc: BaseException) -> ErrorInfo:
    """How ``exc`` is stored. Never raises, whatever the exception does (a ``__str__``
    that raises, NUL bytes, lone surrogates, a huge message or class path): ErrorInfo
    makes each part storable."""
    kind = type(exc)
    try:
        path = f"{kind.__module__}.{kind.__qualname__}"
    except Exception:
        path = "builtins.BaseException"
    try:
        trace = "".join(traceback.format_exception(exc))
    except Exception as format_error:
        trace = f"<traceback unavailable: formatting it raised {type(format_error).__name__}>"
    return ErrorInfo(exception_class_path=path, message=storable_text(exc), traceback=trace)


def running_result(
    job: ClaimedJob,
    task: AnyTask,
    backend: str,
    worker_id: str,
    *,
    status: str = JobStatus.RUNNING,
    return_value: Any = None,
) -> AnyTaskResult:
    """The django.tasks view of a claimed attempt, from what its claim returned: the
    task as it was enqueued, and the job's enqueue, first start and this attempt's
    start times (for ``task_started`` and the task's context)."""
    return live_result(
        task_as_enqueued(task, job, backend),
        job.id,
        status,
        job.args,
        job.kwargs,
        backend,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        last_attempted_at=job.last_attempted_at,
        worker_ids=[worker_id],
        return_value=return_value,
        metadata=job.metadata,
    )


def error_as_task_error(error: ErrorInfo) -> TaskError:
    return task_error(error.exception_class_path, error.message, error.traceback)


def execute(
    spec: JobSpec,
    *,
    progress_sink: ProgressSink | None = None,
    lost_flag: LostFlag | None = None,
) -> Outcome:
    """Run one attempt and describe how it ended, in the job's span when tracing is on.
    Never raises: whatever the task raises (``KeyboardInterrupt`` and ``SystemExit``
    included) is that attempt's failure. An ``async def`` task runs to its end on an event
    loop of its own (``Task.call``)."""
    return traced(spec.job, spec.backend, lambda: _attempt(spec, progress_sink, lost_flag))


class _Opened(threading.local):
    """Whether the thread opened a database connection since it was last marked clean:
    by :func:`in_own_thread` as it starts a job (a thread that closes its connections
    after each job), or by :func:`connections_forgotten` (a slot's child, whose main
    thread keeps them between jobs). ``connection_created`` is sent in the thread that
    connects."""

    connection = False


_opened = _Opened()


def _note_connection(**_: object) -> None:
    _opened.connection = True


connection_created.connect(_note_connection, dispatch_uid="django_leasejobs.in_own_thread")


def connections_forgotten() -> None:
    """The calling thread holds no database connection now (a slot's child forgot those it
    inherited from the worker): :func:`refresh_connections` has nothing to look at until
    a job opens one."""
    _opened.connection = False


def refresh_connections() -> None:
    """Before a job in a thread whose connections outlive its jobs (a process-pool slot's
    main thread): Django's ``close_old_connections()``, which closes a connection that is
    too old (``CONN_MAX_AGE``) or broken by an error, so no job starts on it. Skipped
    while no job in the thread has opened one since :func:`connections_forgotten` (there
    is nothing to close; the look at every alias costs more than a no-op job's call).
    Once one has, it runs before every job."""
    if _opened.connection:
        close_old_connections()


def in_own_thread(
    lease: tuple[int, int], attempt: Callable[P, Outcome], *args: P.args, **kwargs: P.kwargs
) -> Outcome:
    """Run one job's ``attempt(*args, **kwargs)`` in a thread that runs jobs one after
    another (a thread-pool slot, or a slot's thread under ``--sync-on-loop``), and close
    the database connections the job opened in the thread after it, so no job inherits
    another's (a job that opened none costs no ``close_all``: its asgiref ``Local`` look-up
    is a few microseconds per job). Never raises: neither :func:`execute` nor a
    coroutine's run does, and if one did, the failure stays with the job ``lease``, never
    the thread."""
    _opened.connection = False
    try:
        return attempt(*args, **kwargs)
    except BaseException as exc:
        return Outcome(lease, ok=False, error=error_info(exc))
    finally:
        if _opened.connection:
            with contextlib.suppress(Exception):
                connections.close_all()


async def execute_async(
    spec: JobSpec,
    *,
    progress_sink: ProgressSink | None = None,
    lost_flag: LostFlag | None = None,
) -> Outcome:
    """:func:`execute` on the running event loop (``Task.acall``): for a process-pool slot
    that runs many ``async def`` jobs at once, or a thread-pool slot that runs one. The
    ``CancelledError`` that the slot delivers to stop the job (its lease lost, its timeout,
    a cancel, a shutdown) ends it like any exception, with ``Outcome.cancelled`` set.
    Never raises."""
    return await atraced(
        spec.job, spec.backend, lambda: _attempt_async(spec, progress_sink, lost_flag)
    )


@hot_value
class _Call:
    """A resolved attempt, ready to call: the task and the arguments it is called with
    (the context first for a ``takes_context`` task)."""

    task: AnyTask
    args: tuple[Any, ...]
    context: JobContext | None


def _prepare(
    spec: JobSpec, progress_sink: ProgressSink | None, lost_flag: LostFlag | None
) -> _Call | Outcome:
    """What to call for the attempt, or the Outcome of one that cannot be called (a
    malformed row, a task that is not registered)."""
    job = spec.job
    if job.problem is not None:
        malformed = InvalidTaskArguments(f"job {job.id}: {job.problem}; nothing was called")
        return Outcome(job.lease, ok=False, error=error_info(malformed), verdict=NOT_RETRIED)
    try:
        task = resolve(job.task_path)
    except UnknownTask as exc:
        return Outcome(job.lease, ok=False, error=error_info(exc), verdict=NOT_RETRIED)
    if not task.takes_context:
        return _Call(task, tuple(job.args), None)
    context = JobContext(
        task_result=running_result(job, task, spec.backend, spec.worker_id),
        job_id=job.id,
        attempt_number=job.attempt,
        worker_id=spec.worker_id,
        database=spec.database,
        initial_checkpoint=job.checkpoint,
        initial_metadata=job.metadata,
        workflow_id=job.workflow_id,
        initial_parents=job.parents,
        progress_sink=progress_sink,
        lost_flag=lost_flag or LostFlag(),
    )
    return _Call(task, (context, *job.args), context)


def _succeeded(spec: JobSpec, value: Any, started: float) -> Outcome:
    """The Outcome of a call that returned ``value``: a JSON copy of it, or the clear
    failure of a value that is not JSON (it will not become JSON on a retry)."""
    try:
        result = json_value(value, "the task's return value", using=spec.database)
    except InvalidTaskArguments as exc:
        return Outcome(
            spec.job.lease,
            ok=False,
            error=error_info(exc),
            verdict=NOT_RETRIED,
            duration=time.monotonic() - started,
        )
    return Outcome(spec.job.lease, ok=True, result=result, duration=time.monotonic() - started)


def _failed(
    spec: JobSpec, task: AnyTask, exc: BaseException, started: float, *, cancelled: bool = False
) -> Outcome:
    """The Outcome of a call that raised ``exc``, with the task's retry verdict."""
    job = spec.job
    error = error_info(exc)
    if isinstance(exc, InvalidTaskArguments):
        verdict_of: Verdict = NOT_RETRIED
    else:

        def failed_result() -> AnyTaskResult:
            """The attempt's TaskResult as a ``backoff`` function sees it: FAILED, with
            this attempt's error."""
            result = running_result(
                job, task, spec.backend, spec.worker_id, status=JobStatus.FAILED
            )
            result.errors.append(error_as_task_error(error))
            return result

        verdict_of = verdict(task, exc, job.attempt, failed_result)
    return Outcome(
        job.lease,
        ok=False,
        error=error,
        verdict=verdict_of,
        duration=time.monotonic() - started,
        cancelled=cancelled,
    )


_PLAIN_CALLS: dict[int, tuple[AnyTask, bool]] = {}
"""Per registered task (by identity, the task kept alive beside its answer): whether
:func:`_calls_plainly` holds."""


def _calls_plainly(task: AnyTask) -> bool:
    """Whether ``task.call(...)`` would only call its function: a sync function, and
    django.tasks' own ``Task.call`` (not a subclass's). That ``call`` asks
    ``iscoroutinefunction`` at every call (about 1 us); asked here once per task."""
    known = _PLAIN_CALLS.get(id(task))
    if known is None or known[0] is not task:
        plain = type(task).call is Task.call and not iscoroutinefunction(task.func)
        known = _PLAIN_CALLS[id(task)] = (task, plain)
    return known[1]


def _attempt(
    spec: JobSpec, progress_sink: ProgressSink | None, lost_flag: LostFlag | None
) -> Outcome:
    started = time.monotonic()
    call = _prepare(spec, progress_sink, lost_flag)
    if isinstance(call, Outcome):
        return call
    task = call.task
    try:
        try:
            if _calls_plainly(task):
                value = task.func(*call.args, **spec.job.kwargs)
            else:
                value = task.call(*call.args, **spec.job.kwargs)
        except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the task's own
            return _failed(spec, task, exc, started)
        return _succeeded(spec, value, started)
    finally:
        if call.context is not None:
            call.context.save_changed_metadata()


async def _attempt_async(
    spec: JobSpec, progress_sink: ProgressSink | None, lost_flag: LostFlag | None
) -> Outcome:
    started = time.monotonic()
    call = _prepare(spec, progress_sink, lost_flag)
    if isinstance(call, Outcome):
        return call
    try:
        try:
            value = await call.task.acall(*call.args, **spec.job.kwargs)
        except asyncio.CancelledError as exc:
            # The slot's stop (or the task cancelled itself: the same, an ending it chose).
            return _failed(spec, call.task, exc, started, cancelled=True)
        except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the task's own
            return _failed(spec, call.task, exc, started)
        return _succeeded(spec, value, started)
    finally:
        if call.context is not None:
            with contextlib.suppress(BaseException):  # (it logs why; a cancel lands here too)
                await sync_to_async(call.context.save_changed_metadata)()


def attempt_failure(
    job: ClaimedJob,
    task: AnyTask | None,
    error: ErrorInfo,
    outcome: str,
    verdict: Verdict,
    default_backoff: Backoff,
) -> Failure:
    """The Failure to write for an attempt of ``job`` that ended with ``outcome``, as
    ``rules.decide`` has it go on (a snooze's outcome is ``snoozed``).

    ``task`` is the job's resolved task (None when it did not resolve) and
    ``default_backoff`` the backend's ``RETRY_BACKOFF``. Used by the worker's main loop
    and by ``django_leasejobs.testing``.
    """
    if job.retry_backoff is not None and verdict.decision == Decision.RETRY:
        # The job's own policy (given to using()) wins over the task's callable.
        verdict = replace(verdict, seconds=None)
    ending = decide(
        verdict,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        snoozes=job.snoozes,
        max_snoozes=getattr(task, "snooze_limit", DEFAULT_MAX_SNOOZES),
        backoff_delay=lambda: retry_delay(job, task, default_backoff),
    )
    if ending.snooze:
        outcome = AttemptOutcome.SNOOZED
    return Failure(
        job.id, job.attempt, error, ending.retry_delay, outcome, ending.snooze, ending.decision
    )


def retry_delay(job: ClaimedJob, task: AnyTask | None, default_backoff: Backoff) -> float:
    """The dict policy's delay: the job's own, else its task's, else the backend's (a
    callable backoff is called in the slot, with the exception: ``retry.verdict``)."""
    policy: Backoff | None = None
    try:
        if job.retry_backoff is not None:
            policy = Backoff.from_value(job.retry_backoff)
        elif isinstance(getattr(task, "backoff", None), Backoff):
            policy = task.backoff  # type: ignore[union-attr]
        elif isinstance(getattr(task, "retry_backoff", None), Backoff):
            policy = task.retry_backoff  # type: ignore[union-attr]
        return (policy or default_backoff).delay(job.attempt)
    except Exception:  # a bad stored policy must not stop the worker: use the backend's
        return default_backoff.delay(job.attempt)
