"""One database round of a worker: write the outcomes collected so far, then claim.

The worker's main loop never waits on the database. It plans a round (the queued
outcomes, how many jobs to claim) and hands it to the worker's database thread,
which runs :func:`run_round` while the main loop keeps feeding slots from the
prefetched jobs and collecting their outcomes for the next round. One round runs
at a time, so outcomes are written in batches: every success of a round in one
fenced UPDATE, every failure in one fenced UPDATE plus one INSERT of attempt rows.

This module only calls the lease protocol; it knows nothing of slots or signals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from .. import leases
from ..exceptions import LeaseLost
from ..leases import ClaimedJob, Completion, Failure

if TYPE_CHECKING:
    from .loop import RunningJob

Lease = tuple[int, int]


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

    @property
    def writes(self) -> int:
        return len(self.successes) + len(self.failures) + len(self.singles) + len(self.unclaims)


@dataclass(eq=False)
class RoundResult:
    """What the database said. ``None`` = that step did not run (a database error first)."""

    completed: frozenset[Lease] | None = None
    failed: dict[Lease, str] | None = None
    singles_done: list[bool] = field(default_factory=list)
    """Per single transition, in order: True = written, False = the lease was lost."""
    unclaimed: frozenset[Lease] | None = None
    claimed: list[ClaimedJob] | None = None
    error: DatabaseError | None = None


@dataclass(frozen=True, slots=True)
class RoundContext:
    worker_id: str
    database: str
    backend: str
    queues: Sequence[str] | None
    lease_duration: float


def run_round(plan: RoundPlan, ctx: RoundContext) -> RoundResult:
    """Run one round in the worker's database thread. Never raises a DatabaseError."""
    result = RoundResult()
    try:
        _write_and_claim(plan, ctx, result)
    except DatabaseError as exc:
        result.error = exc
        with contextlib.suppress(DatabaseError):
            connections[ctx.database].close()  # this thread's connection: reconnect next time
    return result


def _write_and_claim(plan: RoundPlan, ctx: RoundContext, result: RoundResult) -> None:
    worker, using = ctx.worker_id, ctx.database
    if plan.successes:
        completions = [Completion(r.job.id, r.job.attempt, o.result) for r, o in plan.successes]
        result.completed = leases.complete_many(worker, completions, using=using)
    if plan.failures:
        failures = [failure for _, _, failure, _ in plan.failures]
        result.failed = leases.fail_many(worker, failures, using=using)
    for running, (kind, _description) in plan.singles:
        job = running.job
        try:
            if kind == "shutdown":
                leases.release(job.id, job.attempt, worker, using=using)
            else:
                leases.mark_cancelled(job.id, job.attempt, worker, using=using)
        except LeaseLost:
            result.singles_done.append(False)
        else:
            result.singles_done.append(True)
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
