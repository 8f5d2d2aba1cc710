"""What a worker tells the world about its jobs: log lines, our signals, django.tasks'.

Every line goes to the ``django_leasejobs`` logger with the same ``extra`` keys
(``job_id``, ``attempt``, ``worker``, ``queue``, ``task``, and per line ``duration``,
``status``, ``error``, ``reason``...). Metrics (``runworker --metrics-port``) and
tracing receive the signals sent here. The reporter holds no job state: the main loop
calls it with the job it is about. What the worker says of itself (start, stop,
listening, prefetched jobs given back) is in ``announcer.py``, which it extends.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from django.dispatch import Signal

from ..backend import LeaseJobsBackend
from ..compat import (
    AnyTaskResult,
    TaskResultStatus,
    must_send,
    task_finished,
    task_started,
)
from ..exceptions import LeaseLost, TaskFailed, task_failure
from ..leases import ClaimedJob, ErrorInfo, storable_text
from ..logs import log_failure
from ..models import JobStatus
from ..results import STATUS_TO_RESULT, attempt_history
from ..signals import job_failed, job_started, job_succeeded, lease_lost
from .announcer import Announcer
from .execution import error_as_task_error, running_result
from .jobs import RunningJob, StopReason

logger = logging.getLogger("django_leasejobs")


_FAILED = frozenset(
    str(status) for status, result in STATUS_TO_RESULT.items() if result == TaskResultStatus.FAILED
)
"""The job statuses whose TaskResult reads FAILED (a set: no ``JobStatus`` made per job)."""


class Reporter(Announcer):
    """The announcer of a worker's own life (``announcer.py``), and of its jobs'."""

    def log_extra(self, job: ClaimedJob, **more: Any) -> dict[str, Any]:
        return {
            "job_id": job.id,
            "attempt": job.attempt,
            "worker": self.worker_id,
            "queue": job.queue,
            "task": job.task_path,
            **more,
        }

    def send(self, signal: Signal, job: ClaimedJob, **extra: Any) -> None:
        """Send one of our job signals with the keys every one of them carries."""
        if not signal.receivers:
            return  # nobody listens: skip building the arguments (twice per job)
        signal.send_robust(
            sender=LeaseJobsBackend,
            job_id=job.id,
            backend=self.backend.alias,
            attempt=job.attempt,
            worker_id=self.worker_id,
            queue=job.queue,
            **extra,
        )

    # -- a job's life -------------------------------------------------------------------

    def started(self, running: RunningJob) -> None:
        """Announce that an attempt started; whatever a receiver raises stays here."""
        try:
            self._started(running)
        except Exception as exc:  # the job runs all the same
            logger.exception(
                "announcing the start of job %s failed: %s",
                running.job.id,
                storable_text(exc, 500),
                extra=self.log_extra(running.job),
            )

    def _started(self, running: RunningJob) -> None:
        job = running.job
        if logger.isEnabledFor(logging.INFO):  # per job: skip building the extra keys
            logger.info(
                "job %s attempt %s started: %s",
                job.id,
                job.attempt,
                job.task_path,
                extra=self.log_extra(job),
            )
        self.send(
            job_started,
            job,
            task_path=job.task_path,
            enqueued_at=job.enqueued_at,
            claimed_at=job.last_attempted_at,
        )
        if running.task is not None and must_send(task_started, logging.INFO):
            running.task_result = self._task_result(running, JobStatus.RUNNING, None)
            task_started.send_robust(type(self.backend), task_result=running.task_result)

    def succeeded(self, running: RunningJob, duration: float, result: Any) -> None:
        job = running.job
        if logger.isEnabledFor(logging.INFO):  # per job: skip building the extra keys
            logger.info(
                "job %s attempt %s succeeded in %.3fs",
                job.id,
                job.attempt,
                duration,
                extra=self.log_extra(job, duration=round(duration, 6)),
            )
        self.send(job_succeeded, job, task_path=job.task_path, duration=duration)
        self._finished(running, JobStatus.SUCCEEDED, result)

    def failed(
        self,
        running: RunningJob,
        status: str,
        error: ErrorInfo,
        duration: float,
        delay: float | None,
    ) -> None:
        job = running.job
        failure = task_failure(
            error.exception_class_path,
            error.message,
            error.traceback,
            job.id,
            job.attempt,
            self.worker_id,
        )
        log_failure(
            logger,
            logging.ERROR if status == JobStatus.FAILED else logging.WARNING,
            failure,
            "job %s attempt %s failed (%s: %s) -> %s",
            job.id,
            job.attempt,
            error.exception_class_path,
            error.message[:200],
            status,
            extra=self.log_extra(
                job,
                duration=round(duration, 6),
                status=status,
                error=error.exception_class_path,
                retry_in=delay if status == JobStatus.PENDING else None,
            ),
        )
        # Sent while the failure is being handled, as Django's own runner sends
        # task_finished: receivers that log or report the exception being handled
        # (Django's django.tasks logger, error trackers) get the attempt's error.
        try:
            raise failure
        except TaskFailed:
            self.send(
                job_failed,
                job,
                task_path=job.task_path,
                status=status,
                error=error,
                exception=failure,
                duration=duration,
            )
            self._finished(running, status, None, error)

    def released(self, running: RunningJob, duration: float, *, collateral: bool) -> None:
        """A job went back to pending without an attempt counted: at shutdown, or as the
        collateral of another job's fault (:meth:`collateral` said why when its slot
        died)."""
        job = running.job
        logger.warning(
            "released job %s attempt %s back to pending %s",
            job.id,
            job.attempt,
            "as collateral" if collateral else "at shutdown",
            extra=self.log_extra(job, duration=round(duration, 6)),
        )

    def deferred_unknown(
        self, running: RunningJob, why: str, delay: float, waited: float, aside: float
    ) -> None:
        """A job of a task this worker does not know went back to wait for one that does;
        the worker claims no job of that task for ``aside`` seconds."""
        job = running.job
        logger.warning(
            "job %s: task %r is unknown to this worker (%s); gave it back, claimable again "
            "in %.0fs: a worker running code that declares the task will take it; this "
            "worker leaves the task's jobs alone for %.0fs (waiting %.0fs so far; dead "
            "letter after UNKNOWN_TASK_GRACE)",
            job.id,
            job.task_path,
            why,
            delay,
            aside,
            waited,
            extra=self.log_extra(job, retry_in=delay, duration=round(waited, 3)),
        )

    def stopping(self, running: RunningJob, reason: StopReason, detail: str) -> None:
        job = running.job
        if reason == "lease_lost":
            logger.error(
                "lease lost for job %s attempt %s: %s; stopping it",
                job.id,
                job.attempt,
                detail,
                extra=self.log_extra(job, reason=detail),
            )
            self.send(lease_lost, job, reason=detail)
        else:
            logger.warning(
                "stopping job %s attempt %s: %s %s",
                job.id,
                job.attempt,
                reason,
                detail,
                extra=self.log_extra(job, reason=reason),
            )

    def collateral(self, running: RunningJob, culprit: tuple[int, int], why: str) -> None:
        """A job died with its slot's event loop for another job's fault: it runs again."""
        job = running.job
        logger.warning(
            "job %s attempt %s released as collateral: its slot was killed because %s",
            job.id,
            job.attempt,
            why,
            extra=self.log_extra(job, reason=why, culprit_job_id=culprit[0]),
        )

    def lost_on_write(self, running: RunningJob, transition: str) -> None:
        job = running.job
        exc = LeaseLost(job.id, job.attempt, self.worker_id, transition)
        logger.error(
            "lease lost for job %s attempt %s: %s",
            job.id,
            job.attempt,
            exc,
            extra=self.log_extra(job, transition=transition),
        )
        if running.stop_reason != "lease_lost":  # else stopping() reported this loss already
            self.send(lease_lost, job, reason=str(exc))

    def given_up(self, running: RunningJob, why: str) -> None:
        job = running.job
        logger.error(
            "could not record job %s attempt %s (%s); no longer renewing its lease, "
            "the reaper takes it back when it expires",
            job.id,
            job.attempt,
            why,
            extra=self.log_extra(job, error=why),
        )

    def not_recorded_at_shutdown(self, running: RunningJob) -> None:
        job = running.job
        logger.error(
            "could not record job %s attempt %s before shutdown (database errors); "
            "it runs again after its lease expires",
            job.id,
            job.attempt,
            extra=self.log_extra(job),
        )

    def bookkeeping_failed(self, running: RunningJob, exc: Exception) -> None:
        job = running.job
        error = storable_text(exc, 500)
        logger.exception(
            "bookkeeping of job %s attempt %s failed: %s",
            job.id,
            job.attempt,
            error,
            extra=self.log_extra(job, error=error),
        )

    # -- django.tasks signals -------------------------------------------------------------

    def _task_result(self, running: RunningJob, status: str, result: Any) -> AnyTaskResult:
        """The in-memory django.tasks view of this attempt, for the signals' receivers."""
        assert running.task is not None  # noqa: S101 - only called when the task resolved
        return running_result(
            running.job,
            running.task,
            self.backend.alias,
            self.worker_id,
            status=status,
            return_value=result,
        )

    def _finished(
        self, running: RunningJob, status: str, result: Any, error: ErrorInfo | None = None
    ) -> None:
        if running.task is None or status == JobStatus.PENDING:
            return
        level = logging.ERROR if status in _FAILED else logging.INFO
        if not must_send(task_finished, level):
            return
        finished = self._finished_result(running, status, result, error)
        task_finished.send_robust(type(self.backend), task_result=finished)

    def _finished_result(
        self, running: RunningJob, status: str, result: Any, error: ErrorInfo | None
    ) -> AnyTaskResult:
        """The started job's TaskResult with its final status, when it finished, every
        attempt's error and worker (a copy: no second validation of the arguments,
        which costs more than the rest of a short job)."""
        if running.task_result is None:
            finished = self._task_result(running, status, result)
        else:
            finished = copy.copy(running.task_result)
        job = running.job
        if running.history is not None:
            errors, worker_ids = attempt_history(running.history, job.attempt, self.worker_id)
        else:  # a first attempt: nothing before it, so no query was needed
            errors = [] if error is None else [error_as_task_error(error)]
            worker_ids = [self.worker_id]
        object.__setattr__(finished, "status", STATUS_TO_RESULT[JobStatus(status)])
        object.__setattr__(finished, "finished_at", running.finished_at)
        object.__setattr__(finished, "errors", errors)
        object.__setattr__(finished, "worker_ids", worker_ids)
        if status == JobStatus.SUCCEEDED:
            object.__setattr__(finished, "_return_value", result)
        return finished
