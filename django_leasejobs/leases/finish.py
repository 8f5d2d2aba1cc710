"""The lease holder's writes that end an attempt: success, failure, release, cancel."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db import connections, transaction

from ..exceptions import LeaseLost, RowLocked
from ..models import AttemptOutcome, JobStatus
from .claim import datetime_reader
from .dependants import EndedStep, settle_and_notify, steps_of
from .dialect import Dialect, dialect, placeholders, retry_deadlocks
from .fenced import Rows, SetList, update_one, write
from .rules import (
    CANCELLED_ERROR_CLASS,
    CANCELLED_ERROR_MESSAGE,
    COLLATERAL_ERROR_CLASS,
    RELEASED_ERROR_CLASS,
    Value,
    ending_is_final,
    ending_status,
    released_error_message,
    retrying,
    snoozing,
    storable_text,
)
from .values import Completion, ErrorInfo, Failure, WriteResult


def complete_many(
    worker_id: str, completions: Sequence[Completion], *, using: str = "default"
) -> WriteResult:
    """Record many successful attempts in one fenced UPDATE: ``succeeded``, the result,
    the lease cleared.

    A lease missing from the result was lost (nothing was written for it) or skipped
    (its row was locked by another transaction).
    """
    if not completions:
        return WriteResult({})
    d = dialect(using)
    asked = {
        c.lease: {"result": None if c.result is None else json.dumps(c.result)} for c in completions
    }
    steps = {c.lease for c in completions if c.in_workflow}

    def succeed() -> tuple[Rows, frozenset[tuple[int, int]]]:
        if not steps:  # plain jobs: one statement, as ever
            return write(d, worker_id, asked, _succeeded(d), {"result": "json"}, _DONE)
        # Workflow steps: their dependants are released in the same transaction.
        with transaction.atomic(using=using):
            rows, skipped = write(d, worker_id, asked, _succeeded(d), {"result": "json"}, _DONE)
            ended = [
                EndedStep(int(job), True)
                for job, attempt, _, workflow in rows
                if workflow is not None and (int(job), int(attempt)) in steps
            ]
            settle_and_notify(d, ended)
        return rows, skipped

    rows, skipped = retry_deadlocks(d.using, succeed) if steps else succeed()
    # A job that became a workflow step while it ran (a step deduplicated against it by
    # its key): its dependants right after, in their own transaction (a crash between the
    # two leaves them to the reaper's repair).
    late = [
        EndedStep(int(job), True)
        for job, attempt, _, workflow in rows
        if workflow is not None and (int(job), int(attempt)) not in steps
    ]
    if late:

        def settle_late() -> None:
            with transaction.atomic(using=using):
                settle_and_notify(d, late)

        retry_deadlocks(d.using, settle_late)
    succeeded = str(JobStatus.SUCCEEDED)
    when = datetime_reader(d)
    return WriteResult(
        {(int(job), int(attempt)): succeeded for job, attempt, _, _ in rows},
        skipped,
        {(int(job), int(attempt)): when(finished) for job, attempt, finished, _ in rows},
    )


_DONE = ("finished_at", "workflow_id")
"""What a success reads back: when it finished, and whether it was a workflow step."""


def complete(
    job_id: int, attempt: int, worker_id: str, *, result: Any = None, using: str = "default"
) -> None:
    """Record one successful attempt, as :func:`complete_many` does (a workflow step's
    dependants released with it); unlike it, wait for the row if another transaction
    holds it locked."""
    encoded = None if result is None else json.dumps(result)
    d = dialect(using)

    def succeed() -> None:
        with transaction.atomic(using=using):
            update_one(
                d, (job_id, attempt), worker_id, _succeeded(d), {"result": encoded}, "complete"
            )
            settle_and_notify(d, steps_of(d, [job_id], succeeded=True))

    retry_deadlocks(d.using, succeed)


def _succeeded(d: Dialect) -> SetList:
    """The SET list of a successful attempt (per-row value: ``result``)."""

    def set_list(value: Value) -> str:
        return (
            f"status = 'succeeded', result = {value('result')}, locked_by = NULL, "
            f"locked_until = NULL, finished_at = {d.now}, "
            "progress = CASE WHEN j.progress IS NULL THEN NULL ELSE 1.0 END, "
            "progress_message = '', cancel_requested = FALSE"
        )

    return set_list


def fail_many(
    worker_id: str, failures: Sequence[Failure], *, using: str = "default"
) -> WriteResult:
    """Record many failed attempts at once; the result maps each written lease to the
    job's new status.

    Each job is retried (``pending``, ``run_after`` its failure's ``retry_delay`` from
    now) when a delay was given and its attempts are not used up (or the failure is a
    snooze, which gives its attempt back: ``rules.snoozing``), else it is ``failed``; a
    job whose cancel was requested while the attempt ran ends ``cancelled``
    (``rules.ending_status``). One fenced UPDATE for the job rows and one
    INSERT for their attempt rows, in one transaction. A lease missing from the result
    was lost or skipped (see :class:`WriteResult`).
    """
    return _end_attempts(worker_id, [(f, JobStatus.FAILED) for f in failures], using)


def dead_letter_many(
    worker_id: str, failures: Sequence[Failure], *, using: str = "default"
) -> WriteResult:
    """End attempts for good as ``dead`` (``cancelled`` when a cancel was requested),
    with their attempt rows, as :func:`fail_many` does (``retry_delay`` is ignored)."""
    return _end_attempts(
        worker_id, [(replace(f, retry_delay=None), JobStatus.DEAD) for f in failures], using
    )


def fail(
    job_id: int,
    attempt: int,
    worker_id: str,
    *,
    error: ErrorInfo,
    retry_delay: float | None,
    outcome: str = AttemptOutcome.ERROR,
    using: str = "default",
) -> str:
    """Record one failed attempt (:func:`fail_many` of one); return the job's new status.

    :class:`LeaseLost` when the attempt is not this worker's any more, :class:`RowLocked`
    when another transaction holds its row (nothing written; try again).
    """
    failure = Failure(job_id, attempt, error, retry_delay, outcome)
    done = fail_many(worker_id, [failure], using=using)
    return _raise_unless_written(done, failure.lease, worker_id, "fail")


def release(job_id: int, attempt: int, worker_id: str, *, using: str = "default") -> None:
    """Put a running job back to ``pending`` at once, without counting a stall.

    For a worker that shuts down before the attempt finished. The attempt is
    recorded with outcome ``released``. The job keeps its ``run_after`` and so its
    place in the claim order, as a reaped job does. A job whose cancel was requested
    ends ``cancelled`` instead.
    """
    error = ErrorInfo(RELEASED_ERROR_CLASS, released_error_message(worker_id))
    failure = Failure(job_id, attempt, error, None, AttemptOutcome.RELEASED)
    done = _end_attempts(worker_id, [(failure, JobStatus.PENDING)], using)
    _raise_unless_written(done, failure.lease, worker_id, "release")


def release_collateral(
    job_id: int, attempt: int, worker_id: str, why: str, *, using: str = "default"
) -> None:
    """Put a running job back to ``pending`` at once, its attempt given back and no stall
    counted: it died with its slot's event loop, killed for another job's fault (``why``
    names that job and what it did). The attempt row (outcome ``collateral``) says so. A
    job whose cancel was requested ends ``cancelled`` instead.
    """
    error = ErrorInfo(COLLATERAL_ERROR_CLASS, storable_text(why, 2000))
    failure = Failure(job_id, attempt, error, None, AttemptOutcome.COLLATERAL, give_back=True)
    done = _end_attempts(worker_id, [(failure, JobStatus.PENDING)], using)
    _raise_unless_written(done, failure.lease, worker_id, "release")


def mark_cancelled(job_id: int, attempt: int, worker_id: str, *, using: str = "default") -> None:
    """Record that the worker stopped a running attempt because a cancel was requested."""
    error = ErrorInfo(CANCELLED_ERROR_CLASS, CANCELLED_ERROR_MESSAGE)
    failure = Failure(job_id, attempt, error, None, AttemptOutcome.CANCELLED)
    done = _end_attempts(worker_id, [(failure, JobStatus.CANCELLED)], using)
    _raise_unless_written(done, failure.lease, worker_id, "cancel")


def _raise_unless_written(
    done: WriteResult, lease: tuple[int, int], worker_id: str, transition: str
) -> str:
    if lease in done.written:
        return done.written[lease]
    if lease in done.skipped:
        raise RowLocked(*lease, transition)
    raise LeaseLost(*lease, worker_id, transition)


def _end_attempts(
    worker_id: str, endings: Sequence[tuple[Failure, str]], using: str
) -> WriteResult:
    """The fenced UPDATE ending attempts that did not succeed, plus their attempt rows.

    Each failure comes with the status its job takes when it is not retried and no
    cancel was requested (``rules.ending_status``).
    """
    if not endings:
        return WriteResult({})
    d = dialect(using)
    by_lease = {failure.lease: failure for failure, _ in endings}
    asked = {
        failure.lease: {
            "delay": None if failure.retry_delay is None else d.offset(failure.retry_delay),
            "snooze": int(failure.snooze),
            "otherwise": str(otherwise),
            "last_error": failure.error.last_error,
            "give_back": int(failure.give_back),
        }
        for failure, otherwise in endings
    }

    def set_list(value: Value) -> str:
        # Every fragment reads cancel_requested, assigned last, and the first three read
        # max_attempts, assigned after them (MySQL assigns in order).
        return (
            f"status = {ending_status(value)}, "
            f"run_after = CASE WHEN {retrying(value)} "
            f"THEN {d.now_plus_value(value('delay'))} ELSE j.run_after END, "
            f"finished_at = CASE WHEN {ending_is_final(value)} THEN {d.now} ELSE NULL END, "
            f"locked_by = NULL, locked_until = NULL, last_error = {value('last_error')}, "
            f"max_attempts = j.max_attempts + {snoozing(value)} + {value('give_back')}, "
            f"snoozes = j.snoozes + {snoozing(value)}, "
            "cancel_requested = FALSE"
        )

    kinds = {
        "delay": d.offset_type(),
        "snooze": "int",
        "otherwise": "text",
        "last_error": "text",
        "give_back": "int",
    }

    def end() -> tuple[Rows, frozenset[tuple[int, int]]]:
        with transaction.atomic(using=using):
            rows, skipped = write(d, worker_id, asked, set_list, kinds, _ENDED)
            insert_attempts(
                d,
                [
                    (_as_ended(by_lease[(int(job), int(attempt))], str(status)), worker_id, started)
                    for job, attempt, status, started, _, _, _ in rows
                ],
            )
            settle_and_notify(
                d,
                [
                    EndedStep(int(job), False, str(path), str(status))
                    for job, _, status, _, _, workflow, path in rows
                    if workflow is not None and status in FINAL_STATUSES
                ],
            )
        return rows, skipped

    rows, skipped = retry_deadlocks(d.using, end)
    when = datetime_reader(d)
    return WriteResult(
        {(int(job), int(attempt)): str(status) for job, attempt, status, *_ in rows},
        skipped,
        {(int(row[0]), int(row[1])): when(row[4]) for row in rows},
    )


_ENDED = ("status", "last_attempted_at", "finished_at", "workflow_id", "task_path")
"""What an ended attempt reads back: its status, times, and whether a workflow step ended
for good (its dependants are settled in the same transaction)."""
FINAL_STATUSES = frozenset({JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED})


def _as_ended(failure: Failure, status: str) -> Failure:
    """The failure as its attempt row tells it: a cancel requested while it ran overrode
    any retry or snooze its worker decided."""
    if status == JobStatus.CANCELLED and failure.decision:
        return replace(failure, decision="not retried: cancelled while it ran")
    return failure


ATTEMPT_COLUMNS = (
    "job_id",
    "attempt",
    "worker",
    "outcome",
    "error_class",
    "error_message",
    "traceback",
    "decision",
    "started_at",
)


ATTEMPT_KINDS = ("id", "int", "text", "text", "text", "text", "text", "text", "datetime")
"""The kind of each of ``ATTEMPT_COLUMNS``, for ``Dialect.rows_from``."""


def insert_attempts(d: Dialect, attempts: Sequence[tuple[Failure, str, Any]]) -> None:
    """One INSERT of a JobAttempt row per ended attempt: (failure, worker, started at);
    on PostgreSQL its rows come as arrays (``Dialect.rows_from``), the same SQL however
    many rows."""
    if not attempts:
        return
    rows = [
        (
            failure.job_id,
            failure.attempt,
            worker,
            failure.outcome,
            failure.error.exception_class_path,
            failure.error.message,
            failure.error.traceback,
            failure.decision,
            started,
        )
        for failure, worker, started in attempts
    ]
    columns = ", ".join(d.q(c) for c in ATTEMPT_COLUMNS)
    if d.arrays:
        source, params = d.rows_from(rows, ATTEMPT_KINDS)
        values = f"SELECT * FROM {source}"  # noqa: S608 - identifiers quoted, values bound
    else:
        values = "VALUES " + ", ".join([f"({placeholders(len(ATTEMPT_COLUMNS))})"] * len(rows))
        params = [value for row in rows for value in row]
    with connections[d.using].cursor() as cursor:
        cursor.execute(f"INSERT INTO {d.attempts} ({columns}) {values}", params)
