"""Every path of the lease protocol ends a job the same way: one scenario table.

Each scenario drives real calls of ``django_leasejobs.leases`` (claim, renew, the
holder's writes, unclaim, reap, cancel, retry) on one job and names the end state of
its row and of its JobAttempt rows ONCE. The ``lease_path`` fixture (conftest.py)
runs it on every path the database can take: PostgreSQL batched and portable, SQLite
(batched), MySQL/MariaDB (portable). A scenario that passes on one path and fails on
another is a difference between the paths, never a matter of expectations.

Leases expire without waiting: a claim with a negative ``lease_duration`` holds a
lease that is already over; a reap with a negative ``stale_lock_age`` takes leases
that end within that many seconds. Times are compared on the database's clock.

The tests run in autocommit (``transaction=True``), as workers and reapers do, since
some steps (racing reapers, concurrent claimers) use other connections in threads.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pytest
from django.db import connection

from django_leasejobs import leases
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.leases import (
    CancelResult,
    Completion,
    ErrorInfo,
    Failure,
    Progress,
    ReapedJob,
    RetryResult,
)
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests.helpers_leases import (
    LEASE,
    TASK_PATH,
    THREAD_TIMEOUT,
    attempt_rows,
    make_job,
    make_jobs,
    make_ready,
    row,
    run_in_threads,
    seconds_from_db_now,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("lease_path")]

A, B, C = "worker-a", "worker-b", "worker-c"
EXPIRED = -1.0
"""A ``lease_duration`` whose lease is over as soon as it is granted."""
SLACK = 5.0
"""Slack for "roughly now" on the database clock (slow CI machines)."""

VALUE_ERROR = "builtins.ValueError"
ERROR = ErrorInfo(VALUE_ERROR, "bad value", "Traceback (most recent call last):\n...")
ERROR_TEXT = "builtins.ValueError: bad value"
JOB_TIMEOUT = "django_leasejobs.exceptions.TaskTimeout"
TIMEOUT = ErrorInfo(JOB_TIMEOUT, "ran past 30s")
TIMEOUT_TEXT = f"{JOB_TIMEOUT}: ran past 30s"
LEASE_EXPIRED = "django_leasejobs.exceptions.LeaseExpired"
REAPED_TEXT = (
    f"{LEASE_EXPIRED}: lease expired: the worker stopped renewing it "
    "(it died, froze or lost the database)"
)
JOB_RELEASED = "django_leasejobs.exceptions.JobReleased"
JOB_CANCELLED = "django_leasejobs.exceptions.JobCancelled"
CANCELLED_TEXT = f"{JOB_CANCELLED}: cancelled while running"

PENDING, RUNNING, SUCCEEDED = JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED
FAILED, DEAD, CANCELLED = JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED
ERRORED, TIMED_OUT = AttemptOutcome.ERROR, AttemptOutcome.TIMEOUT
LEASE_LOST, RELEASED = AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.RELEASED
STOPPED = AttemptOutcome.CANCELLED

# run_after at the end, relative to the job as enqueued (an hour in the past)
KEPT = "kept"
NOW = "now"


def in_(seconds: int) -> str:
    """run_after moved to ``seconds`` from now (a retry delay)."""
    return f"now{seconds:+d}s"


def released_text(worker: str) -> str:
    return f"{JOB_RELEASED}: worker {worker} shut down and released the job"


# --------------------------------------------------------------------------- steps


class Step(Protocol):
    def run(self, job_id: int) -> None: ...


@dataclass(frozen=True)
class Claim:
    """``worker`` claims the job, as attempt ``attempt``."""

    worker: str
    attempt: int
    lease: float = LEASE

    def run(self, job_id: int) -> None:
        claimed = leases.claim(self.worker, limit=10, lease_duration=self.lease)
        assert [(j.id, j.attempt) for j in claimed] == [(job_id, self.attempt)]


@dataclass(frozen=True)
class ClaimNothing:
    """The job is not claimable (finished, cancelled, or its run_after is ahead)."""

    worker: str

    def run(self, job_id: int) -> None:
        assert leases.claim(self.worker, limit=10, lease_duration=LEASE) == []


@dataclass(frozen=True)
class Renew:
    worker: str
    attempt: int
    held: bool = True
    cancel_requested: bool = False

    def run(self, job_id: int) -> None:
        lease = (job_id, self.attempt)
        result = leases.renew(self.worker, [lease], lease_duration=LEASE)
        assert (result.held, result.lost, result.skipped) == (
            {lease} if self.held else set(),
            set() if self.held else {lease},
            set(),
        )
        assert result.cancel_requested == ({lease} if self.cancel_requested else set())


@dataclass(frozen=True)
class SetProgress:
    worker: str
    attempt: int
    fraction: float
    message: str

    def run(self, job_id: int) -> None:
        progress = Progress(self.fraction, self.message)
        leases.set_progress(job_id, self.attempt, self.worker, progress)


@dataclass(frozen=True)
class SaveCheckpoint:
    worker: str
    attempt: int
    data: Any

    def run(self, job_id: int) -> None:
        leases.save_checkpoint(job_id, self.attempt, self.worker, self.data)


@dataclass(frozen=True)
class Complete:
    worker: str
    attempt: int
    result: Any = None

    def run(self, job_id: int) -> None:
        leases.complete(job_id, self.attempt, self.worker, result=self.result)


@dataclass(frozen=True)
class CompleteMany:
    worker: str
    attempt: int
    result: Any = None

    def run(self, job_id: int) -> None:
        lease = (job_id, self.attempt)
        done = leases.complete_many(self.worker, [Completion(job_id, self.attempt, self.result)])
        assert (done.written, done.skipped) == ({lease: SUCCEEDED}, set())
        assert done.finished_at[lease] is not None


@dataclass(frozen=True)
class Fail:
    """``leases.fail``; ``returns`` is the status it must return."""

    worker: str
    attempt: int
    retry_delay: float | None
    returns: str
    error: ErrorInfo = ERROR
    outcome: str = ERRORED

    def run(self, job_id: int) -> None:
        status = leases.fail(
            job_id,
            self.attempt,
            self.worker,
            error=self.error,
            retry_delay=self.retry_delay,
            outcome=self.outcome,
        )
        assert status == self.returns


@dataclass(frozen=True)
class FailMany:
    """``leases.fail_many`` of this one attempt; ``returns`` is the status it reports."""

    worker: str
    attempt: int
    retry_delay: float | None
    returns: str

    def run(self, job_id: int) -> None:
        lease = (job_id, self.attempt)
        failure = Failure(job_id, self.attempt, ERROR, self.retry_delay)
        done = leases.fail_many(self.worker, [failure])
        assert (done.written, done.skipped) == ({lease: self.returns}, set())
        assert (done.finished_at[lease] is None) == (self.returns == PENDING)


@dataclass(frozen=True)
class Release:
    worker: str
    attempt: int

    def run(self, job_id: int) -> None:
        leases.release(job_id, self.attempt, self.worker)


@dataclass(frozen=True)
class MarkCancelled:
    worker: str
    attempt: int

    def run(self, job_id: int) -> None:
        leases.mark_cancelled(job_id, self.attempt, self.worker)


@dataclass(frozen=True)
class Unclaim:
    worker: str
    attempt: int

    def run(self, job_id: int) -> None:
        lease = (job_id, self.attempt)
        assert leases.unclaim(self.worker, [lease]) == {lease}


@dataclass(frozen=True)
class Reap:
    """``leases.reap``: ``reaped`` is (attempt, worker, status, stall_count) of the job,
    or None when the reap must take nothing."""

    reaped: tuple[int, str, str, int] | None
    stale_lock_age: float = 0.0

    def run(self, job_id: int) -> None:
        got = leases.reap(stale_lock_age=self.stale_lock_age).jobs
        assert got == reaped_list(job_id, self.reaped)


@dataclass(frozen=True)
class RacingReaps:
    """``reapers`` reaps at once, each on its own connection: the job is reaped by one
    of them, once."""

    reapers: int
    reaped: tuple[int, str, str, int]

    def run(self, job_id: int) -> None:
        results = [done.jobs for done in run_in_threads([leases.reap] * self.reapers)]
        assert sorted(len(got) for got in results) == [0] * (self.reapers - 1) + [1]
        assert [job for got in results for job in got] == reaped_list(job_id, self.reaped)


@dataclass(frozen=True)
class Cancel:
    returns: CancelResult

    def run(self, job_id: int) -> None:
        assert leases.cancel(job_id) is self.returns


@dataclass(frozen=True)
class Retry:
    returns: RetryResult
    statuses: tuple[str, ...] | None = None

    def run(self, job_id: int) -> None:
        assert leases.retry(job_id, statuses=self.statuses) is self.returns


def reaped_list(job_id: int, reaped: tuple[int, str, str, int] | None) -> list[ReapedJob]:
    if reaped is None:
        return []
    attempt, worker, status, stall_count = reaped
    return [
        ReapedJob(job_id, attempt, worker, status, "default", TASK_PATH, stall_count, "default")
    ]


# ----------------------------------------------- the writes of a lease that is not held


FencedWrite = Callable[[int, int, str], None]
"""A write under a lease that is not held: asserts the write was refused."""


def _raises_lease_lost(transition: str, write: Callable[[int, int, str], Any]) -> FencedWrite:
    def fenced(job_id: int, attempt: int, worker: str) -> None:
        with pytest.raises(LeaseLost) as caught:
            write(job_id, attempt, worker)
        lost = caught.value
        assert (lost.job_id, lost.attempt, lost.worker_id) == (job_id, attempt, worker)
        assert lost.transition == transition

    return fenced


def _batch_leaves_it_out(write: Callable[[int, int, str], leases.WriteResult]) -> FencedWrite:
    def fenced(job_id: int, attempt: int, worker: str) -> None:
        done = write(job_id, attempt, worker)
        assert (done.written, done.skipped) == ({}, set())

    return fenced


def _renew_reports_it_lost(job_id: int, attempt: int, worker: str) -> None:
    lease = (job_id, attempt)
    result = leases.renew(worker, {lease: Progress(0.99, "zombie")}, lease_duration=999)
    assert (result.held, result.lost, result.skipped) == (set(), {lease}, set())


def _unclaim_gives_nothing_back(job_id: int, attempt: int, worker: str) -> None:
    assert leases.unclaim(worker, [(job_id, attempt)]) == frozenset()


FENCED_WRITES: dict[str, FencedWrite] = {
    "complete": _raises_lease_lost(
        "complete", lambda pk, n, w: leases.complete(pk, n, w, result={"zombie": True})
    ),
    "complete_many": _batch_leaves_it_out(
        lambda pk, n, w: leases.complete_many(w, [Completion(pk, n, {"zombie": True})])
    ),
    "fail(retry_delay=0)": _raises_lease_lost(
        "fail", lambda pk, n, w: leases.fail(pk, n, w, error=ERROR, retry_delay=0)
    ),
    "fail(retry_delay=None)": _raises_lease_lost(
        "fail", lambda pk, n, w: leases.fail(pk, n, w, error=ERROR, retry_delay=None)
    ),
    "fail_many(retry_delay=0)": _batch_leaves_it_out(
        lambda pk, n, w: leases.fail_many(w, [Failure(pk, n, ERROR, 0)])
    ),
    "fail_many(retry_delay=None)": _batch_leaves_it_out(
        lambda pk, n, w: leases.fail_many(w, [Failure(pk, n, ERROR, None)])
    ),
    "renew": _renew_reports_it_lost,
    "release": _raises_lease_lost("release", leases.release),
    "mark_cancelled": _raises_lease_lost("cancel", leases.mark_cancelled),
    "set_progress": _raises_lease_lost(
        "progress", lambda pk, n, w: leases.set_progress(pk, n, w, Progress(0.99, "zombie"))
    ),
    "save_checkpoint": _raises_lease_lost(
        "checkpoint", lambda pk, n, w: leases.save_checkpoint(pk, n, w, {"zombie": True})
    ),
    "unclaim": _unclaim_gives_nothing_back,
}


@dataclass(frozen=True)
class Fenced:
    """Every write of ``worker`` under ``attempt`` (a lease it does not hold): each is
    refused (LeaseLost, or left out of the result) and changes nothing at all."""

    worker: str
    attempt: int

    def run(self, job_id: int) -> None:
        for name, write in FENCED_WRITES.items():
            before, attempts_before = row(job_id), JobAttempt.objects.count()
            write(job_id, self.attempt, self.worker)
            assert row(job_id) == before, f"{name} by a lease not held changed the job row"
            assert JobAttempt.objects.count() == attempts_before, f"{name} recorded an attempt"


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True, kw_only=True)
class End:
    """The job's row and JobAttempt rows at the end of a scenario, on every path."""

    status: str
    attempt: int
    stall_count: int = 0
    locked_by: str | None = None
    """The lease holder (``locked_until`` is set exactly when this is)."""
    finished: bool
    """``finished_at`` set (to the database's now), or NULL."""
    run_after: str
    """:data:`KEPT` (as enqueued), :data:`NOW`, or :func:`in_` (a retry delay)."""
    last_error: str = ""
    cancel_requested: bool = False
    attempts: tuple[tuple[int, str, str, str], ...] = ()
    """Each JobAttempt row: (attempt, outcome, error_class, worker)."""
    started: bool = True
    """``started_at`` set."""
    last_worker: str = A
    max_attempts: int | None = None
    """None: as enqueued."""
    result: Any = None
    checkpoint: Any = None
    progress: float | None = None
    progress_message: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]
    end: End
    max_attempts: int = 3
    max_stalls: int = 3


def lost(attempt: int, worker: str) -> tuple[int, str, str, str]:
    return (attempt, LEASE_LOST, LEASE_EXPIRED, worker)


def errored(attempt: int, worker: str) -> tuple[int, str, str, str]:
    return (attempt, ERRORED, VALUE_ERROR, worker)


def released(attempt: int, worker: str) -> tuple[int, str, str, str]:
    return (attempt, RELEASED, JOB_RELEASED, worker)


# A reaped attempt, back to pending: the shared start of the zombie scenarios.
A_REAPED = (Claim(A, 1, lease=EXPIRED), Reap((1, A, PENDING, 1)))

SCENARIOS = [
    # ----------------------------------------------------------------- success
    Scenario(
        "complete: progress, checkpoint and result land",
        (
            Claim(A, 1),
            SetProgress(A, 1, 0.5, "half"),
            SaveCheckpoint(A, 1, {"page": 2}),
            Renew(A, 1),
            Complete(A, 1, result={"sum": 3}),
            ClaimNothing(B),
        ),
        End(
            status=SUCCEEDED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            result={"sum": 3},
            checkpoint={"page": 2},
            progress=1.0,
            progress_message="",  # a finished job shows no stale step
        ),
    ),
    Scenario(
        "complete_many",
        (Claim(A, 1), CompleteMany(A, 1, result=[1, 2])),
        End(status=SUCCEEDED, attempt=1, finished=True, run_after=KEPT, result=[1, 2]),
    ),
    # ----------------------------------------------------------------- failure and retries
    Scenario(
        "fail with a retry delay moves run_after",
        (Claim(A, 1), Fail(A, 1, 120, returns=PENDING), ClaimNothing(B)),
        End(
            status=PENDING,
            attempt=1,
            finished=False,
            run_after=in_(120),
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
    ),
    Scenario(
        "fail_many with a retry delay moves run_after",
        (Claim(A, 1), FailMany(A, 1, 120, returns=PENDING), ClaimNothing(B)),
        End(
            status=PENDING,
            attempt=1,
            finished=False,
            run_after=in_(120),
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
    ),
    Scenario(
        "fail without a retry delay fails for good with attempts left",
        (Claim(A, 1), Fail(A, 1, None, returns=FAILED), ClaimNothing(B)),
        End(
            status=FAILED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
    ),
    Scenario(
        "fail_many without a retry delay fails for good with attempts left",
        (Claim(A, 1), FailMany(A, 1, None, returns=FAILED), ClaimNothing(B)),
        End(
            status=FAILED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
    ),
    Scenario(
        "a timeout retried at once runs again as attempt 2",
        (
            Claim(A, 1),
            Fail(A, 1, 0, returns=PENDING, error=TIMEOUT, outcome=TIMED_OUT),
            Claim(B, 2),
        ),
        End(
            status=RUNNING,
            attempt=2,
            locked_by=B,
            finished=False,
            run_after=NOW,
            last_error=TIMEOUT_TEXT,
            attempts=((1, TIMED_OUT, JOB_TIMEOUT, A),),
            last_worker=B,
        ),
    ),
    Scenario(
        "retry, then failed at the last attempt whatever the delay",
        (
            Claim(A, 1),
            Fail(A, 1, 0, returns=PENDING),
            Claim(B, 2),
            Fail(B, 2, 120, returns=FAILED),
            ClaimNothing(C),
        ),
        End(
            status=FAILED,
            attempt=2,
            finished=True,
            run_after=NOW,  # moved by the retry, kept by the final failure
            last_error=ERROR_TEXT,
            attempts=(errored(1, A), errored(2, B)),
            last_worker=B,
        ),
        max_attempts=2,
    ),
    Scenario(
        "fail_many at the last attempt is failed, run_after kept",
        (Claim(A, 1), FailMany(A, 1, 120, returns=FAILED)),
        End(
            status=FAILED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
        max_attempts=1,
    ),
    # ----------------------------------------------------------------- release
    Scenario(
        "release keeps run_after and counts no stall",
        (Claim(A, 1), Release(A, 1)),
        End(
            status=PENDING,
            attempt=1,
            finished=False,
            run_after=KEPT,
            last_error=released_text(A),
            attempts=(released(1, A),),
        ),
    ),
    Scenario(
        "a released last attempt runs again, then fails for good",
        (Claim(A, 1), Release(A, 1), Claim(B, 2), Fail(B, 2, 0, returns=FAILED)),
        End(
            status=FAILED,
            attempt=2,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(released(1, A), errored(2, B)),
            last_worker=B,
        ),
        max_attempts=1,
    ),
    # ----------------------------------------------------------------- the reaper
    Scenario(
        "reap puts an expired lease back, run_after kept",
        (Claim(A, 1, lease=EXPIRED), Reap((1, A, PENDING, 1))),
        End(
            status=PENDING,
            attempt=1,
            stall_count=1,
            finished=False,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
    ),
    Scenario(
        "reap waits for stale_lock_age",
        (
            Claim(A, 1, lease=EXPIRED),
            Reap(None, stale_lock_age=3600),
            Reap((1, A, PENDING, 1), stale_lock_age=0),
            Claim(B, 2),
        ),
        End(
            status=RUNNING,
            attempt=2,
            stall_count=1,
            locked_by=B,
            finished=False,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
            last_worker=B,
        ),
    ),
    Scenario(
        "a short live lease is reaped only by a negative stale_lock_age",
        (Claim(A, 1, lease=2), Reap(None), Reap((1, A, PENDING, 1), stale_lock_age=-30)),
        End(
            status=PENDING,
            attempt=1,
            stall_count=1,
            finished=False,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
    ),
    Scenario(
        "a renewed expired lease is not reaped",
        (Claim(A, 1, lease=EXPIRED), Renew(A, 1), Reap(None)),
        End(status=RUNNING, attempt=1, locked_by=A, finished=False, run_after=KEPT),
    ),
    Scenario(
        "a completion before the reap is kept",
        (Claim(A, 1, lease=EXPIRED), Complete(A, 1, result="late"), Reap(None)),
        End(status=SUCCEEDED, attempt=1, finished=True, run_after=KEPT, result="late"),
    ),
    Scenario(
        "reap at the last attempt is failed",
        (Claim(A, 1, lease=EXPIRED), Reap((1, A, FAILED, 1)), ClaimNothing(B)),
        End(
            status=FAILED,
            attempt=1,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
        max_attempts=1,
    ),
    Scenario(
        "dead after max_stalls",
        (
            Claim(A, 1, lease=EXPIRED),
            Reap((1, A, PENDING, 1)),
            Claim(B, 2, lease=EXPIRED),
            Reap((2, B, DEAD, 2)),
            ClaimNothing(C),
        ),
        End(
            status=DEAD,
            attempt=2,
            stall_count=2,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A), lost(2, B)),
            last_worker=B,
        ),
        max_attempts=5,
        max_stalls=2,
    ),
    Scenario(
        "dead wins over failed when both are used up",
        (Claim(A, 1, lease=EXPIRED), Reap((1, A, DEAD, 1))),
        End(
            status=DEAD,
            attempt=1,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
        max_attempts=1,
        max_stalls=1,
    ),
    Scenario(
        "reap past the last attempt (after a release) is failed",
        (Claim(A, 1), Release(A, 1), Claim(B, 2, lease=EXPIRED), Reap((2, B, FAILED, 1))),
        End(
            status=FAILED,
            attempt=2,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(released(1, A), lost(2, B)),
            last_worker=B,
        ),
        max_attempts=1,
    ),
    Scenario(
        "two racing reapers reap the job once",
        (Claim(A, 1, lease=EXPIRED), RacingReaps(2, (1, A, PENDING, 1))),
        End(
            status=PENDING,
            attempt=1,
            stall_count=1,
            finished=False,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
    ),
    Scenario(
        "four racing reapers at the last stall: dead once",
        (
            Claim(A, 1, lease=EXPIRED),
            Reap((1, A, PENDING, 1)),
            Claim(B, 2, lease=EXPIRED),
            RacingReaps(4, (2, B, DEAD, 2)),
        ),
        End(
            status=DEAD,
            attempt=2,
            stall_count=2,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A), lost(2, B)),
            last_worker=B,
        ),
        max_stalls=2,
    ),
    # ----------------------------------------------------------------- zombies
    Scenario(
        "zombie A fenced after reap and reclaim; B's writes land",
        (
            *A_REAPED,
            Claim(B, 2),
            Fenced(A, 1),
            Renew(B, 2),
            SetProgress(B, 2, 0.5, "by b"),
            SaveCheckpoint(B, 2, {"by": "b"}),
            Fenced(A, 1),
            Complete(B, 2, result="b"),
            Fenced(A, 1),
        ),
        End(
            status=SUCCEEDED,
            attempt=2,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
            last_worker=B,
            result="b",
            checkpoint={"by": "b"},
            progress=1.0,
            progress_message="",
        ),
    ),
    Scenario(
        "zombie A fenced; B's fail_many lands",
        (*A_REAPED, Claim(B, 2), Fenced(A, 1), FailMany(B, 2, None, returns=FAILED)),
        End(
            status=FAILED,
            attempt=2,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(lost(1, A), errored(2, B)),
            last_worker=B,
        ),
    ),
    Scenario(
        "zombie A fenced; B's release lands",
        (*A_REAPED, Claim(B, 2), Fenced(A, 1), Release(B, 2), Fenced(B, 2)),
        End(
            status=PENDING,
            attempt=2,
            stall_count=1,
            finished=False,
            run_after=KEPT,
            last_error=released_text(B),
            attempts=(lost(1, A), released(2, B)),
            last_worker=B,
        ),
    ),
    Scenario(
        "zombie A fenced after the reap, before any reclaim",
        (*A_REAPED, Fenced(A, 1)),
        End(
            status=PENDING,
            attempt=1,
            stall_count=1,
            finished=False,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
    ),
    Scenario(
        "self-zombie: the same worker re-claims, the attempt fences the old one",
        (*A_REAPED, Claim(A, 2), Fenced(A, 1), Renew(A, 2), Complete(A, 2, result="fresh")),
        End(
            status=SUCCEEDED,
            attempt=2,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
            result="fresh",
        ),
    ),
    Scenario(
        "a zombie cannot clear a cancel request on the current attempt",
        (
            *A_REAPED,
            Claim(B, 2),
            Cancel(CancelResult.REQUESTED),
            Fenced(A, 1),
            Renew(B, 2, cancel_requested=True),
            MarkCancelled(B, 2),
        ),
        End(
            status=CANCELLED,
            attempt=2,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=CANCELLED_TEXT,
            attempts=(lost(1, A), (2, STOPPED, JOB_CANCELLED, B)),
            last_worker=B,
        ),
    ),
    Scenario(
        "zombie of a dead job is fenced",
        (Claim(A, 1, lease=EXPIRED), Reap((1, A, DEAD, 1)), Fenced(A, 1)),
        End(
            status=DEAD,
            attempt=1,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
        max_stalls=1,
    ),
    Scenario(
        "another worker cannot write a held lease",
        (Claim(A, 1), Fenced(B, 1), Fenced(A, 2), Renew(A, 1)),
        End(status=RUNNING, attempt=1, locked_by=A, finished=False, run_after=KEPT),
    ),
    Scenario(
        "a finished attempt's holder is fenced",
        (Claim(A, 1), Complete(A, 1, result=1), Fenced(A, 1)),
        End(status=SUCCEEDED, attempt=1, finished=True, run_after=KEPT, result=1),
    ),
    # ----------------------------------------------------------------- cancel
    Scenario(
        "a pending cancel",
        (
            Cancel(CancelResult.CANCELLED),
            ClaimNothing(A),
            Cancel(CancelResult.NOT_CANCELLABLE),
        ),
        End(
            status=CANCELLED,
            attempt=0,
            finished=True,
            run_after=KEPT,
            started=False,
            last_worker="",
        ),
    ),
    Scenario(
        "a running job flagged, then stopped by its worker",
        (
            Claim(A, 1),
            Cancel(CancelResult.REQUESTED),
            Cancel(CancelResult.NOT_CANCELLABLE),
            Renew(A, 1, cancel_requested=True),
            MarkCancelled(A, 1),
            Fenced(A, 1),
            ClaimNothing(B),
        ),
        End(
            status=CANCELLED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=CANCELLED_TEXT,
            attempts=((1, STOPPED, JOB_CANCELLED, A),),
        ),
    ),
    Scenario(
        "the flag stays while the attempt runs",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), Renew(A, 1, cancel_requested=True)),
        End(
            status=RUNNING,
            attempt=1,
            locked_by=A,
            finished=False,
            run_after=KEPT,
            cancel_requested=True,
        ),
    ),
    Scenario(
        "cancel requested while running wins over a retry",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), Fail(A, 1, 0, returns=CANCELLED)),
        End(
            status=CANCELLED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
        max_attempts=5,
    ),
    Scenario(
        "cancel requested while running wins over a fail_many retry",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), FailMany(A, 1, 120, returns=CANCELLED)),
        End(
            status=CANCELLED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
        max_attempts=5,
    ),
    Scenario(
        "cancel requested while running wins over a final failure",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), Fail(A, 1, None, returns=CANCELLED)),
        End(
            status=CANCELLED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
    ),
    Scenario(
        "cancel requested while running wins over release",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), Release(A, 1), ClaimNothing(B)),
        End(
            status=CANCELLED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=released_text(A),
            attempts=(released(1, A),),
        ),
    ),
    Scenario(
        "cancel requested while running wins over the reap",
        (
            Claim(A, 1, lease=EXPIRED),
            Cancel(CancelResult.REQUESTED),
            Reap((1, A, CANCELLED, 1)),
            ClaimNothing(B),
        ),
        End(
            status=CANCELLED,
            attempt=1,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
        max_stalls=5,
    ),
    Scenario(
        "cancel requested while running wins over unclaim",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), Unclaim(A, 1), ClaimNothing(B)),
        End(status=CANCELLED, attempt=0, finished=True, run_after=KEPT, started=False),
    ),
    Scenario(
        "a success reported after a cancel request stands",
        (Claim(A, 1), Cancel(CancelResult.REQUESTED), Complete(A, 1, result="done")),
        End(status=SUCCEEDED, attempt=1, finished=True, run_after=KEPT, result="done"),
    ),
    Scenario(
        "a finished job is not cancellable",
        (Claim(A, 1), Fail(A, 1, None, returns=FAILED), Cancel(CancelResult.NOT_CANCELLABLE)),
        End(
            status=FAILED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
        ),
    ),
    # ----------------------------------------------------------------- operator retry
    Scenario(
        "retry of a failed job: pending now, one more attempt",
        (
            Claim(A, 1),
            Fail(A, 1, None, returns=FAILED),
            Retry(RetryResult.RETRIED),
            Retry(RetryResult.WRONG_STATE),
        ),
        End(
            status=PENDING,
            attempt=1,
            finished=False,
            run_after=NOW,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
            max_attempts=2,
        ),
        max_attempts=1,
    ),
    Scenario(
        "a retried failed job runs its fresh attempt",
        (
            Claim(A, 1),
            Fail(A, 1, 60, returns=FAILED),
            Retry(RetryResult.RETRIED),
            Claim(B, 2),
            Complete(B, 2, result="second time"),
        ),
        End(
            status=SUCCEEDED,
            attempt=2,
            finished=True,
            run_after=NOW,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
            last_worker=B,
            max_attempts=2,
            result="second time",
        ),
        max_attempts=1,
    ),
    Scenario(
        "retry of a dead job resets its stalls",
        (Claim(A, 1, lease=EXPIRED), Reap((1, A, DEAD, 1)), Retry(RetryResult.RETRIED)),
        End(
            status=PENDING,
            attempt=1,
            stall_count=0,
            finished=False,
            run_after=NOW,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
        max_stalls=1,
    ),
    Scenario(
        "a retried dead job gets a fresh budget: it may stall again, then is dead again",
        (
            Claim(A, 1, lease=EXPIRED),
            Reap((1, A, DEAD, 1)),
            Retry(RetryResult.RETRIED),
            Claim(B, 2, lease=EXPIRED),
            Reap((2, B, DEAD, 1)),
        ),
        End(
            status=DEAD,
            attempt=2,
            stall_count=1,
            finished=True,
            run_after=NOW,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A), lost(2, B)),
            last_worker=B,
            max_attempts=2,
        ),
        max_attempts=1,
        max_stalls=1,
    ),
    Scenario(
        "retry limited to failed jobs leaves a dead one",
        (
            Claim(A, 1, lease=EXPIRED),
            Reap((1, A, DEAD, 1)),
            Retry(RetryResult.WRONG_STATE, statuses=(FAILED,)),
        ),
        End(
            status=DEAD,
            attempt=1,
            stall_count=1,
            finished=True,
            run_after=KEPT,
            last_error=REAPED_TEXT,
            attempts=(lost(1, A),),
        ),
        max_stalls=1,
    ),
    Scenario(
        "retry refuses pending, running and succeeded jobs",
        (
            Retry(RetryResult.WRONG_STATE),
            Claim(A, 1),
            Retry(RetryResult.WRONG_STATE),
            Complete(A, 1),
            Retry(RetryResult.WRONG_STATE),
        ),
        End(status=SUCCEEDED, attempt=1, finished=True, run_after=KEPT),
    ),
    # ----------------------------------------------------------------- unclaim
    Scenario(
        "unclaim of a first attempt: as if never started",
        (Claim(A, 1), Unclaim(A, 1), Fenced(A, 1)),
        End(status=PENDING, attempt=0, finished=False, run_after=KEPT, started=False),
    ),
    Scenario(
        "an unclaimed first attempt is claimed again as attempt 1",
        (Claim(A, 1), Unclaim(A, 1), Claim(B, 1)),
        End(
            status=RUNNING,
            attempt=1,
            locked_by=B,
            finished=False,
            run_after=KEPT,
            last_worker=B,
        ),
    ),
    Scenario(
        "unclaim of a later attempt keeps started_at and the history",
        (Claim(A, 1), Release(A, 1), Claim(B, 2), Unclaim(B, 2)),
        End(
            status=PENDING,
            attempt=1,
            finished=False,
            run_after=KEPT,
            last_error=released_text(A),
            attempts=(released(1, A),),
            last_worker=B,
        ),
    ),
    Scenario(
        "cancel requested wins over unclaim of a later attempt",
        (
            Claim(A, 1),
            Release(A, 1),
            Claim(B, 2),
            Cancel(CancelResult.REQUESTED),
            Unclaim(B, 2),
            ClaimNothing(C),
        ),
        End(
            status=CANCELLED,
            attempt=1,
            finished=True,
            run_after=KEPT,
            last_error=released_text(A),
            attempts=(released(1, A),),
            last_worker=B,
        ),
    ),
    Scenario(
        "unclaim after a retry delay keeps the moved run_after",
        (Claim(A, 1), Fail(A, 1, 0, returns=PENDING), Claim(B, 2), Unclaim(B, 2)),
        End(
            status=PENDING,
            attempt=1,
            finished=False,
            run_after=NOW,
            last_error=ERROR_TEXT,
            attempts=(errored(1, A),),
            last_worker=B,
        ),
    ),
]


def _moment(moment: datetime | None) -> str | None:
    """``finished_at`` as the table names it: None, or "now" (the database's)."""
    if moment is None:
        return None
    ago = seconds_from_db_now(moment)
    return NOW if -SLACK < ago <= 0.5 else f"now{ago:+.3f}s"


def _run_after(moment: datetime, enqueued: datetime, expected: str) -> str:
    """``run_after`` as the table names it (:data:`KEPT`, :data:`NOW`, :func:`in_`)."""
    if moment == enqueued:
        return KEPT
    ahead = seconds_from_db_now(moment)
    if -SLACK < ahead <= 0.5:
        return NOW
    if expected.startswith("now+") and expected.endswith("s"):
        delay = int(expected[len("now") : -1])
        if delay - SLACK < ahead <= delay + 0.5:
            return expected
    return f"now{ahead:+.3f}s"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_path_ends_the_same_way(scenario: Scenario) -> None:
    job = make_job(max_attempts=scenario.max_attempts, max_stalls=scenario.max_stalls)
    make_ready(job.pk, seconds_ago=3600)
    enqueued = row(job.pk)["run_after"]

    for number, step in enumerate(scenario.steps, start=1):
        try:
            step.run(job.pk)
        except AssertionError as exc:
            raise AssertionError(f"step {number} {step!r}: {exc}") from exc
        except LeaseLost as exc:
            raise AssertionError(f"step {number} {step!r} raised {exc!r}") from exc

    end = scenario.end
    stored = row(job.pk)
    actual = {
        "status": stored["status"],
        "attempt": stored["attempt"],
        "stall_count": stored["stall_count"],
        "max_attempts": stored["max_attempts"],
        "locked_by": stored["locked_by"],
        "locked_until set": stored["locked_until"] is not None,
        "finished_at": _moment(stored["finished_at"]),
        "run_after": _run_after(stored["run_after"], enqueued, end.run_after),
        "last_error": stored["last_error"],
        "cancel_requested": stored["cancel_requested"],
        "started_at set": stored["started_at"] is not None,
        "last_worker": stored["last_worker"],
        "result": stored["result"],
        "checkpoint": stored["checkpoint"],
        "progress": stored["progress"],
        "progress_message": stored["progress_message"],
        "attempts": [(a.attempt, a.outcome, a.error_class, a.worker) for a in attempt_rows(job.pk)],
    }
    expected = {
        "status": end.status,
        "attempt": end.attempt,
        "stall_count": end.stall_count,
        "max_attempts": scenario.max_attempts if end.max_attempts is None else end.max_attempts,
        "locked_by": end.locked_by,
        "locked_until set": end.locked_by is not None,
        "finished_at": NOW if end.finished else None,
        "run_after": end.run_after,
        "last_error": end.last_error,
        "cancel_requested": end.cancel_requested,
        "started_at set": end.started,
        "last_worker": end.last_worker,
        "result": end.result,
        "checkpoint": end.checkpoint,
        "progress": end.progress,
        "progress_message": end.progress_message,
        "attempts": list(end.attempts),
    }
    assert actual == expected
    # Every recorded attempt started when its claim did, and was not recorded twice.
    for recorded in attempt_rows(job.pk):
        assert recorded.started_at is not None and recorded.finished_at is not None


def test_the_table_has_one_scenario_per_name() -> None:
    names = Counter(s.name for s in SCENARIOS)
    assert [name for name, n in names.items() if n > 1] == []


# --------------------------------------------------------------------------- concurrency


def test_concurrent_claimers_drain_every_job_exactly_once() -> None:
    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip(
            f"{connection.vendor} has no SELECT ... FOR UPDATE SKIP LOCKED: "
            "it serialises writers instead of locking rows"
        )
    total, claimers, batch = 2000, 8, 16
    ids = make_jobs(total)

    def drain(worker: str) -> Callable[[], list[int]]:
        def run() -> list[int]:
            mine: list[int] = []
            deadline = time.monotonic() + THREAD_TIMEOUT
            while claimed := leases.claim(worker, limit=batch, lease_duration=300):
                assert len(claimed) <= batch
                assert {j.attempt for j in claimed} == {1}
                mine.extend(j.id for j in claimed)
                todo = [Completion(j.id, j.attempt, result=j.id) for j in claimed]
                while todo:  # a lease skipped (row locked elsewhere) is still held: again
                    assert time.monotonic() < deadline, f"{worker}: leases skipped until timeout"
                    done = leases.complete_many(worker, todo)
                    asked = {c.lease for c in todo}
                    assert asked - set(done.written) - done.skipped == set(), "a lease was lost"
                    assert set(done.written.values()) <= {SUCCEEDED}
                    todo = [c for c in todo if c.lease in done.skipped]
            return mine

        return run

    workers = [f"claimer-{n}" for n in range(claimers)]
    results = run_in_threads([drain(w) for w in workers])

    claimed_ids = [pk for mine in results for pk in mine]
    twice = [pk for pk, n in Counter(claimed_ids).items() if n > 1]
    assert twice == [], f"claimed by more than one claimer: {twice[:10]}"
    assert sorted(claimed_ids) == ids, "some jobs were never claimed"
    owner = {pk: worker for worker, mine in zip(workers, results, strict=True) for pk in mine}
    stored = {
        pk: (status, attempt, result, locked_by, last_worker)
        for pk, status, attempt, result, locked_by, last_worker in Job.objects.values_list(
            "id", "status", "attempt", "result", "locked_by", "last_worker"
        )
    }
    assert stored == {pk: (SUCCEEDED, 1, pk, None, owner[pk]) for pk in ids}
    assert not JobAttempt.objects.exists()
