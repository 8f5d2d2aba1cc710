"""Exceptions raised by django-leasejobs.

The classes named in a failed attempt's ``TaskError.exception_class_path`` for
outcomes that are not a Python exception raised by the task itself (lease
expiry, timeout, kill, cancel) live here too, so the path always imports.
"""

from __future__ import annotations

from typing import Any

from .compat import InvalidTask


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


class JobTimeout(JobFailure):
    """The attempt ran past the task's timeout and was killed."""


class JobKilled(JobFailure):
    """The attempt's process died or was killed."""


class JobCancelled(JobFailure):
    """The job was cancelled while this attempt ran."""


class JobReleased(JobFailure):
    """The worker shut down and put the job back to pending."""


class OutcomeNotStored(JobFailure):
    """The database refused to store the attempt's result or error as it was; the
    attempt is recorded as this failure instead, saying why."""


class TaskFailed(Exception):
    """Raised (and caught) by a worker around ``task_finished`` for a FAILED job, so that
    receivers which log the exception being handled (Django's own ``django.tasks``
    logger, error trackers) get the attempt's error: its class path and message, with
    the traceback recorded where it ran."""

    def __init__(self, error: Any, job_id: int, attempt: int, worker_id: str) -> None:
        self.exception_class_path: str = error.exception_class_path
        self.error_message: str = error.message
        self.remote_traceback: str = error.traceback
        self.job_id = job_id
        self.attempt = attempt
        summary = self.exception_class_path
        if self.error_message:
            summary += f": {self.error_message}"
        super().__init__(
            f"job {job_id} attempt {attempt} failed on worker {worker_id}: {summary}"
            + (f"\n\n{self.remote_traceback}" if self.remote_traceback else "")
        )
