"""Exceptions raised by django-leasejobs.

The classes named in a failed attempt's ``TaskError.exception_class_path`` for
outcomes that are not a Python exception raised by the task itself (lease
expiry, timeout, kill, cancel) live here too, so the path always imports.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any

from .compat import BaseTaskTimeout, InvalidTask


class Retry(Exception):
    """Raised by a task to run again ``after`` seconds from now without using an attempt.

    The job goes back to ``pending`` (a *snooze*) and its ``max_attempts`` grows by one,
    so the attempt it used is given back. Bounded: once a job has snoozed its task's
    ``max_snoozes`` times, a further ``Retry`` counts as an ordinary failed attempt
    retried after ``after`` seconds (when attempts are left). ``after`` must be a number
    of seconds from 0 to ``retry.MAX_DELAY``; another value makes the attempt an ordinary
    failure, saying why.
    """

    def __init__(self, after: float = 0.0) -> None:
        self.after = after
        super().__init__(f"run again in {after!r}s")


class LeaseLost(Exception):
    """A fenced write matched no row: this worker no longer owns the attempt."""

    def __init__(self, job_id: int, attempt: int, worker_id: str, transition: str) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.worker_id = worker_id
        self.transition = transition
        super().__init__(
            f"lease lost: {transition} of job {job_id} attempt {attempt} by worker "
            f"{worker_id!r} matched no row (the attempt was reaped, re-claimed or finished)"
        )


class RowLocked(Exception):
    """Another transaction holds this attempt's row locked: the lease holder's write was
    not made (it never waits for a row lock). The attempt is still held; try again."""

    def __init__(self, job_id: int, attempt: int, transition: str) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.transition = transition
        super().__init__(
            f"{transition} of job {job_id} attempt {attempt} not written: another "
            "transaction holds the row locked"
        )


class InvalidTaskArguments(InvalidTask, TypeError):
    """Task arguments (or a result) that cannot be stored as JSON."""


class UnknownTask(InvalidTask):
    """A job row names something that is not a registered task."""


class JobFailure(Exception):
    """Base class for attempt outcomes that are not an exception raised by the task."""


class LeaseExpired(JobFailure):
    """The attempt's lease expired (the worker died, froze or lost the database)."""


if TYPE_CHECKING:
    _TimeoutBase = TimeoutError
else:
    _TimeoutBase = BaseTaskTimeout


class TaskTimeout(JobFailure, _TimeoutBase):
    """The attempt ran past the task's ``timeout`` and was stopped: the name and base
    class (``TimeoutError``; Django's own ``TaskTimeout`` once it has one) of the timeout
    error in Django's coming task API (django/new-features#144). Recorded as
    ``django_leasejobs.exceptions.TaskTimeout``."""


class JobKilled(JobFailure):
    """The attempt's process died or was killed."""


class JobCancelled(JobFailure):
    """The job was cancelled while this attempt ran."""


class JobReleased(JobFailure):
    """The worker shut down and put the job back to pending."""


class OutcomeNotStored(JobFailure):
    """The database refused to store the attempt's result or error as it was; the
    attempt is recorded as this failure instead, saying why."""


class ParentFailed(JobFailure):
    """A workflow step ended without running: a parent it waited for ended without
    succeeding (failed, dead, cancelled). The step's error names that parent."""


class WorkflowDoesNotExist(LookupError):
    """No workflow with this id on this backend (``get_workflow``)."""


class RemoteTraceback(Exception):
    """The traceback of a failed attempt's exception, as it was recorded where the attempt
    ran: the ``__cause__`` of its :class:`TaskFailed`, so that whatever prints or reports
    the ``TaskFailed`` (``traceback``, ``logging``, error trackers) shows it too, as
    ``concurrent.futures`` does for the errors of a process pool."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class TaskFailed(Exception):
    """A failed attempt's error, rebuilt in the worker from what was recorded where it ran.

    The task's exception object stays in the slot (a child process or a thread) that
    ran it; the worker has its class path, message and traceback text. Made by
    :func:`task_failure`, whose class is named after the original one (a
    ``builtins.ValueError`` prints and reports as ``ValueError``) and derives from this
    one. ``str()`` is the original message, and the original traceback is both
    ``remote_traceback`` and the ``__cause__`` (a :class:`RemoteTraceback`).

    The worker logs it as the ``exc_info`` of a failed attempt's log line, gives it to
    ``job_failed`` receivers as ``exception``, and sends ``job_failed`` and
    ``task_finished`` while it is being handled, so that receivers which log the
    exception being handled (Django's own ``django.tasks`` logger, error trackers) get
    the attempt's error instead of ``NoneType: None``.
    """

    def __init__(
        self,
        exception_class_path: str,
        message: str,
        remote_traceback: str,
        job_id: int,
        attempt: int,
        worker_id: str,
    ) -> None:
        self.exception_class_path = exception_class_path
        self.error_message = message
        self.remote_traceback = remote_traceback
        self.job_id = job_id
        self.attempt = attempt
        self.worker_id = worker_id
        super().__init__(message)
        if remote_traceback:
            self.__cause__ = RemoteTraceback(remote_traceback)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Its class is made at run time: pickle the call that makes it again.
        return (
            task_failure,
            (
                self.exception_class_path,
                self.error_message,
                self.remote_traceback,
                self.job_id,
                self.attempt,
                self.worker_id,
            ),
        )


@functools.lru_cache(maxsize=256)
def _failure_class(exception_class_path: str) -> type[TaskFailed]:
    """A subclass of TaskFailed named as ``exception_class_path`` (TaskFailed itself
    when no class can bear that name)."""
    module, _, name = exception_class_path.rpartition(".")
    try:
        return type(name, (TaskFailed,), {"__module__": module or "builtins", "__qualname__": name})
    except (TypeError, ValueError):  # a NUL or a lone surrogate in the name, say
        return TaskFailed


def task_failure(
    exception_class_path: str,
    message: str,
    remote_traceback: str,
    job_id: int,
    attempt: int,
    worker_id: str,
) -> TaskFailed:
    """The :class:`TaskFailed` of an attempt's recorded error."""
    kind = _failure_class(exception_class_path)
    return kind(exception_class_path, message, remote_traceback, job_id, attempt, worker_id)


def __getattr__(name: str) -> type[TaskTimeout]:
    if name == "JobTimeout":
        warnings.warn(
            "django_leasejobs.exceptions.JobTimeout is deprecated: use TaskTimeout (a "
            "TimeoutError, the name Django's coming task API gives it). Attempts that timed "
            "out before this release keep the class path "
            "'django_leasejobs.exceptions.JobTimeout' in their rows.",
            DeprecationWarning,
            stacklevel=2,
        )
        return TaskTimeout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
