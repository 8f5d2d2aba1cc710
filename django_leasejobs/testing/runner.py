"""``run_jobs``: a worker's work, in the calling thread, on the calling thread's connection.

Each attempt goes through the same functions a worker uses: ``leases.claim`` (one job
at a time, in claim order), ``worker.execution.execute`` (the task resolved from the
registry, its :class:`~django_leasejobs.worker.execution.JobContext`, the verdict on its
exception), ``execution.attempt_failure`` (``rules.decide``: retry delay, snooze, the
attempt row's decision) and the fenced transitions ``leases.complete``,
``leases.fail_many``, ``leases.mark_cancelled``. ``context.set_progress`` is a renewal
(``leases.renew``), as the heartbeat sends it, so progress lands on the row and a
requested cancel is seen there.

Nothing here starts a thread or opens a connection: inside ``django.test.TestCase`` (or
pytest-django's ``db``) everything happens in the test's transaction and is rolled
back with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError

from .. import leases, registry
from ..backend import LeaseJobsBackend
from ..compat import Task, task_backends, task_finished, task_started
from ..functions import DatabaseNow
from ..leases import ClaimedJob, Completion, ErrorInfo, Failure, LeaseLost, Progress
from ..leases.rules import CANCELLED_ERROR_CLASS, CANCELLED_ERROR_MESSAGE, TIMEOUT_ERROR_CLASS
from ..models import FINISHED_STATUSES, PENDING_ROWS, AttemptOutcome, Job, JobAttempt, JobStatus
from ..retry import RETRIED
from ..worker.execution import (
    JobSpec,
    LostFlag,
    Outcome,
    attempt_failure,
    execute,
    running_result,
)

_savepoint_create = getattr(transaction, "savepoint_create", None) or transaction.savepoint
"""``savepoint_create`` on Django 6.1+, which deprecates ``savepoint``."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """One attempt :func:`run_jobs` ran, and how the job stood after its outcome was written."""

    job_id: int
    task_path: str
    queue: str
    attempt: int
    """The attempt number (1-based): ``context.attempt`` during the run."""
    status: str
    """The job's status after this attempt: ``succeeded``, ``pending`` (a retry or a
    snooze, due in ``retry_delay`` seconds), ``failed`` or ``cancelled``."""
    result: Any = None
    """The task's return value as stored (JSON), when it succeeded."""
    error: ErrorInfo | None = None
    """Why the attempt did not succeed: the exception's class path, message, traceback."""
    outcome: str = ""
    """The attempt row's outcome (``error``, ``snoozed``, ``timeout``, ``cancelled``);
    empty for a success (successes write no attempt row)."""
    decision: str = ""
    """The attempt row's decision: why the job was retried, snoozed or not."""
    retry_delay: float | None = None
    """Seconds until the next attempt when the job went back to ``pending``."""

    @property
    def succeeded(self) -> bool:
        return self.status == JobStatus.SUCCEEDED

    @property
    def finished(self) -> bool:
        """The job reached a final status (it will not run again by itself)."""
        return self.status in FINISHED_STATUSES


def lease_jobs_backend(alias: str) -> LeaseJobsBackend:
    """``TASKS[alias]``, which must be a LeaseJobsBackend with a valid configuration."""
    backend = task_backends[alias]
    if not isinstance(backend, LeaseJobsBackend):
        raise TypeError(
            f"TASKS[{alias!r}] is {type(backend).__module__}.{type(backend).__qualname__}, "
            "not django_leasejobs.backend.LeaseJobsBackend: django_leasejobs.testing runs and "
            "inspects the jobs that backend stores in the database."
        )
    backend.require_valid_config()
    return backend


def queue_list(queues: str | Sequence[str] | None) -> list[str] | None:
    if queues is None:
        return None
    return [queues] if isinstance(queues, str) else list(queues)


def run_jobs(
    backend: str = "default",
    *,
    queues: str | Sequence[str] | None = None,
    max_jobs: int | None = None,
    include_scheduled: bool = False,
    worker_id: str = "test-worker",
) -> list[JobRun]:
    """Run the backend's ready jobs in this thread, one attempt at a time, until none is
    ready (or ``max_jobs`` attempts ran); return one :class:`JobRun` per attempt, in order.

    ``queues``: a queue name or a list of them (default: every queue). Jobs enqueued by
    the jobs themselves run too, when they are ready.

    ``include_scheduled=True`` runs jobs whose ``run_after`` is still in the future as
    well: before each claim, every pending job of the backend (in ``queues``) due later
    is made due now (its ``run_after`` becomes the database's now). That covers jobs
    enqueued with ``run_after`` and retries and snoozes waiting for their delay, so a
    failing job runs until its attempts are used up (a ``Retry`` snoozes until its
    ``max_snoozes``). Without it, a failed attempt leaves its job ``pending`` with a
    future ``run_after``, and the next ``run_jobs(include_scheduled=True)`` runs it.

    A job that enqueues itself again for ever makes this loop for ever: pass
    ``max_jobs``. Not a worker: no lease expires (nothing renews in the background),
    ``timeout`` cannot interrupt a task (see docs/testing.md).
    """
    lease_backend = lease_jobs_backend(backend)
    if max_jobs is not None and max_jobs < 0:
        raise ValueError(f"max_jobs must be >= 0 or None, got {max_jobs!r}")
    wanted = queue_list(queues)
    using = lease_backend.database
    runs: list[JobRun] = []
    while max_jobs is None or len(runs) < max_jobs:
        if include_scheduled:
            _make_due(lease_backend, wanted)
        claimed = leases.claim(
            worker_id,
            limit=1,
            lease_duration=lease_backend.config.lease_duration,
            backend=lease_backend.alias,
            queues=wanted,
            using=using,
            flow=lease_backend.config.flow,
        )
        if not claimed:
            break
        runs.append(_run_attempt(claimed[0], lease_backend, worker_id))
    return runs


async def arun_jobs(
    backend: str = "default",
    *,
    queues: str | Sequence[str] | None = None,
    max_jobs: int | None = None,
    include_scheduled: bool = False,
    worker_id: str = "test-worker",
) -> list[JobRun]:
    """:func:`run_jobs` from an ``async def`` test: run in the thread Django's async ORM
    uses (``sync_to_async``), so in the test's database transaction; an ``async def``
    task runs to its end there on an event loop of its own."""
    return await sync_to_async(run_jobs)(
        backend,
        queues=queues,
        max_jobs=max_jobs,
        include_scheduled=include_scheduled,
        worker_id=worker_id,
    )


def _make_due(backend: LeaseJobsBackend, queues: list[str] | None) -> None:
    """Pending jobs due later become due now: the database's clock, as the column's
    default writes it for a job enqueued without ``run_after``."""
    later = Job.objects.using(backend.database).filter(
        PENDING_ROWS, backend=backend.alias, run_after__gt=DatabaseNow()
    )
    if queues is not None:
        later = later.filter(queue__in=queues)
    later.update(run_after=DatabaseNow())


class _Attempt:
    """The worker's view of one running attempt: what its renewals said."""

    def __init__(self, job: ClaimedJob, backend: LeaseJobsBackend, worker_id: str) -> None:
        self.job = job
        self.backend = backend
        self.worker_id = worker_id
        self.lost_flag = LostFlag()
        self.cancel_requested = False
        self.lease_lost = False
        self.started = time.monotonic()
        self.unsent: Progress | None = None

    def timed_out(self) -> bool:
        timeout = self.job.timeout
        return timeout is not None and time.monotonic() - self.started > timeout

    def progress(self, lease: tuple[int, int], fraction: float | None, message: str | None) -> None:
        """``context.set_progress``: a renewal carrying the progress, as the heartbeat's.

        An ``async def`` task runs on an event loop, where Django refuses database
        calls: its progress waits for the attempt to return (:meth:`flush`), as it
        would wait for a worker's next heartbeat.
        """
        if _in_event_loop():
            self.unsent = Progress(fraction, message)
        else:
            self._renew(Progress(fraction, message))
        if self.timed_out():
            self.lost_flag.set()  # what the worker's watchdog tells a thread-pool slot

    def flush(self) -> None:
        """Write the progress an async task reported (the renewal after the attempt)."""
        if self.unsent is not None:
            seen = self.cancel_requested
            self._renew(self.unsent)
            self.unsent = None
            # The outcome came before this renewal: a cancel it reports does not void it
            # (a worker keeps an outcome that raced a stop, too).
            self.cancel_requested = seen

    def _renew(self, progress: Progress) -> None:
        lease = self.job.lease
        renewed = leases.renew(
            self.worker_id,
            {lease: progress},
            lease_duration=self.backend.config.lease_duration,
            using=self.backend.database,
        )
        if lease in renewed.cancel_requested:
            self.cancel_requested = True
        if lease in renewed.lost:
            self.lease_lost = True
        if self.cancel_requested or self.lease_lost:
            # What the worker tells a thread-pool slot it stops: the task can see it.
            self.lost_flag.set()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run_attempt(job: ClaimedJob, backend: LeaseJobsBackend, worker_id: str) -> JobRun:
    using = backend.database
    try:
        task: Task | None = registry.resolve(job.task_path)
    except Exception:  # UnknownTask, a module that fails to import: execute() reports it
        task = None
    attempt = _Attempt(job, backend, worker_id)
    if task is not None and task_started.receivers:
        started = running_result(job, task, backend.alias, worker_id)
        task_started.send_robust(type(backend), task_result=started)
    connection = connections[using]
    savepoint = _savepoint_create(using=using) if connection.in_atomic_block else None
    outcome = execute(
        JobSpec(job=job, worker_id=worker_id, backend=backend.alias, database=using),
        progress_sink=attempt.progress,
        lost_flag=attempt.lost_flag,
    )
    try:
        try:
            attempt.flush()
            run = _record(attempt, task, outcome)
        except (DatabaseError, TransactionManagementError):
            if savepoint is None:
                raise
            # The task left the test's transaction unusable (a database error it did not
            # handle inside its own atomic block): undo this attempt's writes, as a
            # rolled-back transaction would, and record the outcome again.
            transaction.set_rollback(False, using=using)
            transaction.savepoint_rollback(savepoint, using=using)
            run = _record(attempt, task, outcome)
    except BaseException:
        # Recording failed (LeaseLost, a database error again, anything): undo the
        # attempt's writes and release the savepoint, as an atomic block would.
        if savepoint is not None:
            _roll_back_to(savepoint, using)
        raise
    else:
        if savepoint is not None:
            transaction.savepoint_commit(savepoint, using=using)
    if task is not None and run.finished and task_finished.receivers:
        finished = backend.get_result(str(job.id))
        task_finished.send_robust(type(backend), task_result=finished)
    return run


def _roll_back_to(savepoint: str, using: str) -> None:
    """Roll back to ``savepoint`` and release it; when the database refuses, leave the
    transaction marked for rollback (the caller re-raises its own exception)."""
    transaction.set_rollback(False, using=using)
    try:
        transaction.savepoint_rollback(savepoint, using=using)
        transaction.savepoint_commit(savepoint, using=using)
    except DatabaseError:
        transaction.set_rollback(True, using=using)


def _record(attempt: _Attempt, task: Task | None, outcome: Outcome) -> JobRun:
    """Write the attempt's ending with the worker's fenced transitions."""
    job, worker_id, using = attempt.job, attempt.worker_id, attempt.backend.database
    if attempt.lease_lost:
        raise LeaseLost(job.id, job.attempt, worker_id, "renew")
    if attempt.cancel_requested:
        # The worker stops a job whose cancel it saw at a renewal; what the task did
        # after that does not count (a thread-pool slot's outcome is void).
        leases.mark_cancelled(job.id, job.attempt, worker_id, using=using)
        error = ErrorInfo(CANCELLED_ERROR_CLASS, CANCELLED_ERROR_MESSAGE)
        return _run(job, str(JobStatus.CANCELLED), error=error, outcome=AttemptOutcome.CANCELLED)
    if attempt.timed_out():
        elapsed = time.monotonic() - attempt.started
        error = ErrorInfo(
            TIMEOUT_ERROR_CLASS,
            f"attempt ran past its timeout of {job.timeout:g}s and ended after {elapsed:.3g}s "
            "(run in-process by django_leasejobs.testing, which cannot interrupt it)",
        )
        failure = attempt_failure(
            job, task, error, AttemptOutcome.TIMEOUT, RETRIED, attempt.backend.config.retry_backoff
        )
        return _failed(job, worker_id, failure, using)
    if outcome.ok:
        written = leases.complete_many(
            worker_id,
            [Completion(job.id, job.attempt, outcome.result, job.workflow_id is not None)],
            using=using,
        )
        status = _written(written, job, worker_id, "complete")
        return _run(job, status, result=outcome.result if status == JobStatus.SUCCEEDED else None)
    error = outcome.error or ErrorInfo("django_leasejobs.exceptions.JobFailure")
    failure = attempt_failure(
        job,
        task,
        error,
        AttemptOutcome.ERROR,
        outcome.verdict,
        attempt.backend.config.retry_backoff,
    )
    return _failed(job, worker_id, failure, using)


def _failed(job: ClaimedJob, worker_id: str, failure: Failure, using: str) -> JobRun:
    status = _written(leases.fail_many(worker_id, [failure], using=using), job, worker_id, "fail")
    # The attempt row as written: a cancel requested while the attempt ran overrides
    # the retry the verdict asked for (leases.finish).
    row = JobAttempt.objects.using(using).filter(job_id=job.id, attempt=job.attempt).last()
    return _run(
        job,
        status,
        error=failure.error,
        outcome=str(failure.outcome) if row is None else row.outcome,
        decision=failure.decision if row is None else row.decision,
        retry_delay=failure.retry_delay if status == JobStatus.PENDING else None,
    )


def _written(written: leases.WriteResult, job: ClaimedJob, worker_id: str, what: str) -> str:
    if job.lease not in written.written:
        raise LeaseLost(job.id, job.attempt, worker_id, what)
    return written.written[job.lease]


def _run(job: ClaimedJob, status: str, **fields: Any) -> JobRun:
    return JobRun(
        job_id=job.id,
        task_path=job.task_path,
        queue=job.queue,
        attempt=job.attempt,
        status=str(status),
        **fields,
    )
