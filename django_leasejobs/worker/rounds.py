"""One database round of a worker: write the outcomes collected so far, then claim.

The worker's main loop never waits on the database. It plans a round (the queued
outcomes, how many jobs to claim) and hands it to the worker's database thread,
which runs :func:`run_round` while the main loop keeps feeding slots from the
prefetched jobs and collecting their outcomes for the next round. One round runs
at a time, so outcomes are written in batches: every success of a round in one
fenced UPDATE, every failure in one fenced UPDATE plus one INSERT of attempt rows.

Bulkheads: a batch the database refuses for a reason other than the connection (a
value it cannot store, say) is written again row by row, so one job's bad outcome
stays with that job; an outcome refused even alone is recorded as a failure of its
attempt that says why (``OutcomeNotStored``), and if even that is refused the
attempt is given up. Only connection-level errors end a round.

This module only calls the lease protocol; it knows nothing of slots or signals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import InterfaceError, OperationalError, connections

from .. import leases
from ..exceptions import LeaseLost, RowLocked
from ..leases import ClaimedJob, Completion, ErrorInfo, Failure, WriteResult, storable_text
from ..models import JobAttempt, JobStatus

if TYPE_CHECKING:
    from .loop import RunningJob

Lease = tuple[int, int]
Row = TypeVar("Row", Completion, Failure)


@dataclass(eq=False)
class RoundPlan:
    """What one round writes and claims. Built and read by the main loop only."""

    successes: list[tuple[RunningJob, Any]] = field(default_factory=list)
    """(job, its Outcome)"""
    failures: list[tuple[RunningJob, Any, Failure, float]] = field(default_factory=list)
    """(job, what happened, the Failure to write, the attempt's duration)"""
    singles: list[tuple[RunningJob, Any]] = field(default_factory=list)
    """(job, ("shutdown" | "cancelled", description)): one transition each, rare."""
    unclaims: list[tuple[RunningJob, Any]] = field(default_factory=list)
    """Prefetched jobs that never started, given back."""
    claim_limit: int = 0
    history: bool = False
    """Fetch the attempt rows of jobs that finish in this round after an earlier attempt
    (``task_finished`` receivers get every attempt's error and worker)."""

    @property
    def writes(self) -> int:
        return len(self.successes) + len(self.failures) + len(self.singles) + len(self.unclaims)


@dataclass(eq=False)
class RoundResult:
    """What the database said about one round.

    A write step that did not run (a connection-level error came first) leaves its
    ``wrote_*`` flag False: its outcomes are queued again. Within a step that ran, a
    lease is in exactly one of ``statuses`` (written: the job's new status),
    ``skipped`` (its row was locked elsewhere: write it again later),
    ``unwritable`` (the database refused even the fallback record: give it up) or
    none of them (the lease was lost).
    """

    wrote_successes: bool = False
    wrote_failures: bool = False
    statuses: dict[Lease, str] = field(default_factory=dict)
    replaced: dict[Lease, ErrorInfo] = field(default_factory=dict)
    """Outcomes the database refused as they were, recorded as this failure instead."""
    skipped: set[Lease] = field(default_factory=set)
    unwritable: dict[Lease, str] = field(default_factory=dict)
    finished_at: dict[Lease, datetime | None] = field(default_factory=dict)
    history: dict[int, list[JobAttempt]] = field(default_factory=dict)
    """Attempt rows per job id, when the plan asked for them."""
    singles_done: list[bool] = field(default_factory=list)
    """Per single transition, in order: True = written, False = the lease was lost."""
    unclaimed: frozenset[Lease] | None = None
    claimed: list[ClaimedJob] | None = None
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class RoundContext:
    worker_id: str
    database: str
    backend: str
    queues: Sequence[str] | None
    lease_duration: float


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` says the database (or the path to it) failed, not the data.

    Such errors end the round and are retried as a whole after a pause. Any other
    error raised while writing a batch is about a row: the batch is then written row
    by row, so the offending row is isolated and everything else is recorded.
    """
    return isinstance(exc, OperationalError | InterfaceError)


def run_round(plan: RoundPlan, ctx: RoundContext) -> RoundResult:
    """Run one round in the worker's database thread. Never raises."""
    result = RoundResult()
    try:
        _write_and_claim(plan, ctx, result)
    except Exception as exc:  # connection-level (or a bug): the round is retried whole
        result.error = exc
        with contextlib.suppress(Exception):
            connections[ctx.database].close()  # this thread's connection: reconnect next time
    return result


def _write_and_claim(plan: RoundPlan, ctx: RoundContext, result: RoundResult) -> None:
    worker, using = ctx.worker_id, ctx.database
    if plan.successes:
        completions = [Completion(r.job.id, r.job.attempt, o.result) for r, o in plan.successes]
        _write_successes(completions, ctx, result)
        result.wrote_successes = True
    if plan.failures:
        _write_failures([failure for _, _, failure, _ in plan.failures], ctx, result)
        result.wrote_failures = True
    for running, (kind, _description) in plan.singles:
        job = running.job
        try:
            if kind == "shutdown":
                leases.release(job.id, job.attempt, worker, using=using)
            else:
                leases.mark_cancelled(job.id, job.attempt, worker, using=using)
        except LeaseLost:
            result.singles_done.append(False)
        except RowLocked:
            result.skipped.add(job.lease)
            result.singles_done.append(False)
        except Exception as exc:
            if is_connection_error(exc):
                raise
            result.unwritable[job.lease] = _describe(exc)
            result.singles_done.append(False)
        else:
            result.singles_done.append(True)
    if plan.history:
        _fetch_history(plan, ctx, result)
    if plan.unclaims:
        given_back = [r.job.lease for r, _ in plan.unclaims]
        result.unclaimed = leases.unclaim(worker, given_back, using=using)
    if plan.claim_limit > 0:
        result.claimed = leases.claim(
            worker,
            limit=plan.claim_limit,
            lease_duration=ctx.lease_duration,
            backend=ctx.backend,
            queues=ctx.queues,
            using=using,
        )


def _note(result: RoundResult, written: WriteResult) -> None:
    result.statuses.update(written.written)
    result.skipped.update(written.skipped)
    result.finished_at.update(written.finished_at)


def _fetch_history(plan: RoundPlan, ctx: RoundContext, result: RoundResult) -> None:
    """The attempt rows of the jobs this round finished that had earlier attempts."""
    finished = {str(s) for s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)}
    jobs = [r.job for r, _ in plan.successes] + [r.job for r, *_ in plan.failures]
    wanted = {
        job.id for job in jobs if job.attempt > 1 and result.statuses.get(job.lease, "") in finished
    }
    if wanted:
        for row in JobAttempt.objects.using(ctx.database).filter(job_id__in=wanted):
            result.history.setdefault(row.job_id, []).append(row)


def _write_successes(
    completions: Sequence[Completion], ctx: RoundContext, result: RoundResult
) -> None:
    """All successes in one statement; a result the database refuses becomes a failure
    of that attempt saying why."""

    def refused(completion: Completion, exc: Exception) -> Failure:
        error = ErrorInfo(
            "django_leasejobs.exceptions.OutcomeNotStored",
            f"the task returned, but the database refused its result: {_describe(exc)}",
        )
        return Failure(completion.job_id, completion.attempt, error, None)

    def write(batch: Sequence[Completion]) -> WriteResult:
        return leases.complete_many(ctx.worker_id, batch, using=ctx.database)

    _write_batch(completions, write, refused, ctx, result)


def _write_failures(failures: Sequence[Failure], ctx: RoundContext, result: RoundResult) -> None:
    """All failures in one transaction; an error the database refuses is replaced by one
    saying why (not retried: what the database refused once it would refuse again)."""

    def refused(failure: Failure, exc: Exception) -> Failure:
        error = ErrorInfo(
            "django_leasejobs.exceptions.OutcomeNotStored",
            f"the attempt failed ({failure.error.exception_class_path}), but the database "
            f"refused its error: {_describe(exc)}",
        )
        return Failure(failure.job_id, failure.attempt, error, None, failure.outcome)

    def write(batch: Sequence[Failure]) -> WriteResult:
        return leases.fail_many(ctx.worker_id, batch, using=ctx.database)

    _write_batch(failures, write, refused, ctx, result)


def _write_batch(
    items: Sequence[Row],
    write: Callable[[Sequence[Row]], WriteResult],
    refused: Callable[[Row, Exception], Failure],
    ctx: RoundContext,
    result: RoundResult,
) -> None:
    """The bulkhead: the whole batch in one write; if the database refuses it for a reason
    other than the connection, row by row, and a row it refuses alone gets the failure
    ``refused`` makes of it instead."""
    try:
        _note(result, write(items))
        return
    except Exception as exc:
        if is_connection_error(exc):
            raise
    for item in items:
        try:
            _note(result, write([item]))
        except Exception as exc:
            if is_connection_error(exc):
                raise
            _write_fallback(refused(item, exc), ctx, result)


def _write_fallback(failure: Failure, ctx: RoundContext, result: RoundResult) -> None:
    """The last resort for one attempt: a failure whose text is our own. If even that is
    refused, the attempt is given up (the worker stops renewing it; the reaper takes it
    back when its lease expires)."""
    try:
        written = leases.fail_many(ctx.worker_id, [failure], using=ctx.database)
    except Exception as exc:
        if is_connection_error(exc):
            raise
        result.unwritable[failure.lease] = _describe(exc)
        return
    _note(result, written)
    if failure.lease in written.written:
        result.replaced[failure.lease] = failure.error


def _describe(exc: BaseException) -> str:
    return storable_text(f"{type(exc).__name__}: {storable_text(exc)}", 500)
