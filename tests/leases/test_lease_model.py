"""A model-based test of the lease protocol (``django_leasejobs.leases``).

A Hypothesis state machine drives the lease functions against the real test database
with three workers (``w1``, ``w2``, ``w3``) and a handful of jobs (at most four pending
or running at a time), and keeps, in Python, what every job's row should be. Any
worker may call any fenced function with any lease it ever held, with someone else's,
or with a guessed attempt number: zombies and self-zombies are the point. After every
step one invariant compares the whole database with the model:

* the status, attempt, stall count, attempt budget, checkpoint, progress, result and
  cancel flag of every job, and its attempt rows (attempt, outcome, worker);
* one holder per job: a running row carries exactly the (``locked_by``, ``attempt``)
  the model gave it, never a lease the reaper took; no other row carries a lease;
* the status agrees with the other columns (lease, ``heartbeat_at``, ``finished_at``,
  ``started_at``), and the lease's end and ``run_after`` lie on the side of the
  database's now that the model says;
* attempt numbers never go down, except by exactly one through a successful
  ``unclaim`` (an attempt that never ran gives its number back);
* terminal states (succeeded, failed, dead, cancelled) are absorbing, except for the
  operator's ``retry`` of a failed or dead job.

Each fenced call (renew, complete, fail, checkpoint, release, mark_cancelled, unclaim)
checks in its own step that it succeeds exactly when the model says the caller holds
the lease, and that a rejected call raises ``LeaseLost`` (or is missing from
``renew``'s ``held``, or from ``unclaim``'s result) and changes nothing: the job's row
and its attempt rows are compared before and after. A claim may pick any ready jobs
(which ones is read from its result), but never one that is not ready, never a lower
priority before a higher one, and always as many as its limit allows. The reaper must
take exactly the leases that expired more than ``stale_lock_age`` ago.

The clock. Every lease time is the database's (``statement_timestamp()`` on
PostgreSQL, ``strftime('now')`` on SQLite), which a test cannot move. The
``advance_clock`` step moves every stored timestamp of every job back by the same
amount in one UPDATE instead: relative to the leases and ``run_after``, that is the
same as the clock moving forward. The model counts seconds on that virtual clock:
every step happens at a multiple of ``TICK`` (60 s), and every boundary the protocol
compares against (the lease, the lease plus a stale age, a retry delay) lies half a
tick (30 s) away from every multiple of ``TICK``. Real time passing during an example
moves the database's clock forward a little more, so the model's answers stay exact as
long as one example takes less than ``MARGIN`` seconds, which the invariant asserts
(an example takes a fraction of a second).

Runs are derandomized: the same code runs the same examples every time, so CI is
reproducible (Hypothesis also draws on constants it finds in the project's source, so
an edit anywhere may change which examples those are). The rules a random run reaches
only now and then are therefore also pinned as fixed programs of the same steps,
checked by the same model (``test_pinned_scenario``). To explore further locally:
``LEASEJOBS_MODEL_EXAMPLES=1000 LEASEJOBS_MODEL_RANDOM=1`` (random examples;
``--hypothesis-seed=N`` replays a seed); ``LEASEJOBS_MODEL_STATS=1`` with ``pytest -s``
prints how often each path of each step was taken. A failure shrinks to a short
program of ``state.<rule>(...)`` calls, printed with the failing assertion.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db.models import Count, F
from django.db.models.functions import Now
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_leasejobs import leases
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.leases import CancelResult, ErrorInfo, Progress, RetryResult
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests.helpers_leases import make_job

WORKERS = ("w1", "w2", "w3")
MAX_ACTIVE_JOBS = 4
"""At most this many pending or running jobs; finished ones make room for new ones."""
TICK = 60
"""Every step happens at a multiple of TICK seconds on the model's clock."""
LEASE = 3 * TICK + TICK // 2  # 210 s
STALE_AGES = (0, 2 * TICK)  # the reaper's stale_lock_age
RETRY_DELAYS = (None, 0, TICK + TICK // 2)  # None: fail for good
CLOCK_STEPS = (TICK, 3 * TICK, 4 * TICK, 6 * TICK)
"""60 s expires nothing; 180 s is just short of a lease; 240 s expires a lease by 30 s
(stale for a reaper with age 0 only); 360 s expires it by 150 s (stale for both ages)."""
MARGIN = TICK // 2
"""Seconds between any reachable model time and any boundary: an example must be shorter."""

ACTIVE = (JobStatus.PENDING, JobStatus.RUNNING)
TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)
RETRYABLE = (JobStatus.FAILED, JobStatus.DEAD)
TIMESTAMPS = (
    "run_after",
    "locked_until",
    "heartbeat_at",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "finished_at",
)
ERROR = ErrorInfo("tests.test_lease_model.Boom", "boom")

OWN = "own"
"""``by=OWN``: the call is made by the lease's own worker, with the lease's attempt."""
HOLDER = "holder"
"""``by=HOLDER``: made by whoever holds the lease's job now, with its current attempt
(when the job is not running: as ``OWN``)."""
CALLERS = st.one_of(st.just(HOLDER), st.sampled_from([OWN, *WORKERS]))
ATTEMPT_DELTAS = st.one_of(st.just(0), st.sampled_from([1, -1]))
"""Added to the caller's attempt: a guessed attempt number when not 0."""
JOB_OPTIONS = {
    "max_attempts": st.sampled_from([2, 1, 3]),
    "max_stalls": st.sampled_from([2, 1, 3]),
    "priority": st.sampled_from([0, 5]),
}

JOBS = Bundle("jobs")
LEASES = Bundle("leases")
"""Every lease a claim ever returned: current, stale or given back."""

REACHED: Counter[str] = Counter()
"""How often each path of each step was taken (printed with LEASEJOBS_MODEL_STATS=1)."""


def _reached(what: str) -> None:
    REACHED[what] += 1


@dataclass(eq=False)
class JobModel:
    """What one job's row should be."""

    number: int
    id: int
    max_attempts: int
    max_stalls: int
    priority: int
    status: str = JobStatus.PENDING
    attempt: int = 0
    holder: str | None = None
    lease_until: int = 0
    ready_at: int = 0
    stall_count: int = 0
    cancel_requested: bool = False
    checkpoint: Any = None
    progress: float | None = None
    progress_message: str = ""
    result: Any = None
    attempt_rows: Counter[tuple[int, str, str]] = field(default_factory=Counter)
    reaped: set[tuple[int, str]] = field(default_factory=set)
    """(attempt, worker) of every lease the reaper took: never held again."""

    def __repr__(self) -> str:
        return f"j{self.number}"

    def holds(self, worker: str, attempt: int) -> bool:
        return (
            self.status == JobStatus.RUNNING and self.holder == worker and self.attempt == attempt
        )

    def end_attempt(self, status: str, outcome: str | None, worker: str) -> None:
        """The holder's attempt ends in ``status``, leaving an attempt row with ``outcome``."""
        if outcome is not None:
            self.attempt_rows[(self.attempt, outcome, worker)] += 1
        self.status = status
        self.holder = None
        self.cancel_requested = False


@dataclass(frozen=True, eq=False)
class Lease:
    """A lease a claim returned: the job, the attempt, the worker."""

    job: JobModel
    attempt: int
    worker: str

    def __repr__(self) -> str:
        return f"Lease({self.job!r}, attempt {self.attempt}, {self.worker})"


def _model_settings() -> settings:
    return settings(
        max_examples=int(os.environ.get("LEASEJOBS_MODEL_EXAMPLES", "100")),
        stateful_step_count=50,
        deadline=None,
        derandomize=os.environ.get("LEASEJOBS_MODEL_RANDOM") != "1",
        database=None,  # nothing saved between runs: CI runs the same examples every time
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        report_multiple_bugs=False,
    )


class LeaseProtocol(RuleBasedStateMachine):
    """Workers, a reaper and an operator, checked against the model of every job's row."""

    def __init__(self) -> None:
        super().__init__()
        # Every example starts from empty tables (the test runs in autocommit).
        JobAttempt.objects.all().delete()
        Job.objects.all().delete()
        self.started = time.monotonic()
        self.now = 0
        self.jobs: list[JobModel] = []
        self.by_id: dict[int, JobModel] = {}
        self.claimed: dict[str, list[Lease]] = {w: [] for w in WORKERS}
        self.previous: dict[int, tuple[str, int]] = {}
        self.unclaimed_now: set[int] = set()
        self.retried_now: set[int] = set()
        self.writes = 0

    def _any(self, *statuses: str) -> bool:
        return any(job.status in statuses for job in self.jobs)

    # ----------------------------------------------------------------------- producers

    @initialize(target=JOBS, **JOB_OPTIONS)
    def first_job(self, max_attempts: int, max_stalls: int, priority: int) -> JobModel:
        return self.enqueue(max_attempts, max_stalls, priority)

    @precondition(lambda self: sum(j.status in ACTIVE for j in self.jobs) < MAX_ACTIVE_JOBS)
    @rule(target=JOBS, **JOB_OPTIONS)
    def enqueue(self, max_attempts: int, max_stalls: int, priority: int) -> JobModel:
        number = len(self.jobs)
        created = make_job(
            args=[number, number],
            max_attempts=max_attempts,
            max_stalls=max_stalls,
            priority=priority,
        )
        job = JobModel(number, created.pk, max_attempts, max_stalls, priority, ready_at=self.now)
        self.jobs.append(job)
        self.by_id[job.id] = job
        return job

    # ----------------------------------------------------------------------- the clock

    @precondition(
        lambda self: any(
            j.status == JobStatus.RUNNING
            or (j.status == JobStatus.PENDING and j.ready_at > self.now)
            for j in self.jobs
        )
    )
    @rule(seconds=st.sampled_from(CLOCK_STEPS))
    def advance_clock(self, seconds: int) -> None:
        """Time passes: every stored timestamp moves back by ``seconds``, in one UPDATE."""
        shift = timedelta(seconds=seconds)
        Job.objects.update(**{name: F(name) - shift for name in TIMESTAMPS})
        self.now += seconds

    # ----------------------------------------------------------------------- workers

    @precondition(lambda self: self._any(JobStatus.PENDING))
    @rule(target=LEASES, worker=st.sampled_from(WORKERS), limit=st.sampled_from([1, 2, 4]))
    def claim(self, worker: str, limit: int) -> Any:
        ready = [j for j in self.jobs if j.status == JobStatus.PENDING and j.ready_at <= self.now]

        claimed = leases.claim(worker, limit=limit, lease_duration=LEASE)

        got = [self.by_id[c.id] for c in claimed]
        _reached(f"claim: {len(got)} of {len(ready)} ready")
        assert len(set(got)) == len(got), f"a job claimed twice in one claim: {got}"
        assert len(got) == min(limit, len(ready)), (
            f"{worker} claimed {got} with limit {limit}; ready: {ready}"
        )
        for job in got:
            assert job in ready, f"{worker} claimed {job!r}, which is {job.status}, not ready"
        skipped = [j for j in ready if j not in got]
        if got and skipped:
            assert min(j.priority for j in got) >= max(j.priority for j in skipped), (
                f"{worker} claimed {got} before the higher priority {skipped}"
            )
        new = []
        for c, job in zip(claimed, got, strict=True):
            assert c.attempt == job.attempt + 1, f"{job!r} claimed as attempt {c.attempt}"
            job.status = JobStatus.RUNNING
            job.attempt = c.attempt
            job.holder = worker
            job.lease_until = self.now + LEASE
            job.cancel_requested = False
            job.progress, job.progress_message = None, ""
            new.append(Lease(job, c.attempt, worker))
        self.claimed[worker].extend(new)
        return multiple(*new)

    def _caller(self, lease: Lease, by: str, attempt_delta: int) -> tuple[JobModel, str, int]:
        """The job, worker and attempt of a call with these rule arguments."""
        job = lease.job
        if by == HOLDER and job.status == JobStatus.RUNNING:
            assert job.holder is not None
            return job, job.holder, job.attempt + attempt_delta
        worker = lease.worker if by in (OWN, HOLDER) else by
        return job, worker, lease.attempt + attempt_delta

    @staticmethod
    def _why_not(job: JobModel, worker: str, attempt: int) -> str:
        if job.status != JobStatus.RUNNING:
            return f"job {job.status}"
        if job.holder != worker:
            return "held by another worker"
        return "held by another attempt of the same worker"

    def _snapshot(self, job: JobModel) -> dict[str, Any]:
        """Every column of the job's row, and how many attempt rows it has (never updated)."""
        return Job.objects.filter(pk=job.id).annotate(attempt_rows=Count("attempts")).values().get()

    def _fenced(
        self,
        name: str,
        transition: str,
        lease: Lease,
        by: str,
        attempt_delta: int,
        write: Callable[[int, int, str], Any],
    ) -> tuple[JobModel, str, Any] | None:
        """Call ``write(job_id, attempt, worker)``; check it is fenced exactly as modelled.

        When the caller holds the lease, returns (job, worker, what ``write`` returned)
        for the rule to update the model. Otherwise checks that ``write`` raised
        ``LeaseLost`` naming ``transition`` and changed nothing, and returns None.
        """
        job, worker, attempt = self._caller(lease, by, attempt_delta)
        if job.holds(worker, attempt):
            _reached(f"{name}: by the holder")
            return job, worker, write(job.id, attempt, worker)
        _reached(f"{name}: rejected, {self._why_not(job, worker, attempt)}")
        before = self._snapshot(job)
        with pytest.raises(LeaseLost) as lost:
            write(job.id, attempt, worker)
        got = (lost.value.job_id, lost.value.attempt, lost.value.worker_id, lost.value.transition)
        assert got == (job.id, attempt, worker, transition)
        assert self._snapshot(job) == before, (
            f"a rejected {name} by {worker} (attempt {attempt}) changed {job!r}"
        )
        return None

    def _renew(
        self, worker: str, asked: dict[tuple[JobModel, int], Progress | None], plain: bool
    ) -> None:
        wanted = {(job.id, attempt): progress for (job, attempt), progress in asked.items()}
        expected = {(job, attempt) for job, attempt in asked if job.holds(worker, attempt)}
        renewed = {job for job, _ in expected}
        untouched = {job for job, _ in asked if job not in renewed}
        before = {job: self._snapshot(job) for job in untouched}

        result = leases.renew(worker, list(wanted) if plain else wanted, lease_duration=LEASE)

        _reached(
            f"renew: {'some' if expected else 'none'} held, {len(wanted) - len(expected)} lost"
        )
        expected_ids = {(job.id, attempt) for job, attempt in expected}
        assert result.held == expected_ids, f"{worker} renewed {set(result.held)}"
        assert result.lost == set(wanted) - expected_ids
        flagged = {(job.id, attempt) for job, attempt in expected if job.cancel_requested}
        assert result.cancel_requested == flagged
        for job in untouched:
            assert self._snapshot(job) == before[job], (
                f"a rejected renewal by {worker} changed {job!r}"
            )
        for job, attempt in expected:
            job.lease_until = self.now + LEASE
            progress = asked[(job, attempt)]
            if progress is not None:
                job.progress = progress.fraction
                if progress.message is not None:
                    job.progress_message = progress.message

    @rule(
        lease=LEASES,
        by=CALLERS,
        attempt_delta=ATTEMPT_DELTAS,
        fraction=st.sampled_from([None, 0.25, 0.75]),
    )
    def renew(self, lease: Lease, by: str, attempt_delta: int, fraction: float | None) -> None:
        job, worker, attempt = self._caller(lease, by, attempt_delta)
        self.writes += 1
        progress = None if fraction is None else Progress(fraction, f"{worker}#{self.writes}")
        self._renew(worker, {(job, attempt): progress}, plain=False)

    @rule(lease=LEASES)
    def heartbeat(self, lease: Lease) -> None:
        """The lease's worker renews every lease it ever claimed, stale ones included."""
        mine = self.claimed[lease.worker]
        self._renew(lease.worker, {(m.job, m.attempt): None for m in mine}, plain=True)

    @rule(lease=LEASES, by=CALLERS, attempt_delta=ATTEMPT_DELTAS)
    def complete(self, lease: Lease, by: str, attempt_delta: int) -> None:
        self.writes += 1
        value = {"write": self.writes}
        done = self._fenced(
            "complete",
            "complete",
            lease,
            by,
            attempt_delta,
            lambda job_id, attempt, worker: leases.complete(job_id, attempt, worker, result=value),
        )
        if done:
            job, worker, _ = done
            job.end_attempt(JobStatus.SUCCEEDED, None, worker)
            job.result = value
            if job.progress is not None:
                job.progress = 1.0
            job.progress_message = ""

    @rule(
        lease=LEASES,
        by=CALLERS,
        attempt_delta=ATTEMPT_DELTAS,
        retry_delay=st.sampled_from(RETRY_DELAYS),
    )
    def fail(self, lease: Lease, by: str, attempt_delta: int, retry_delay: int | None) -> None:
        done = self._fenced(
            "fail",
            "fail",
            lease,
            by,
            attempt_delta,
            lambda job_id, attempt, worker: leases.fail(
                job_id, attempt, worker, error=ERROR, retry_delay=retry_delay
            ),
        )
        if not done:
            return
        job, worker, status = done
        if job.cancel_requested:  # a cancel requested while it ran wins over a retry
            expected = JobStatus.CANCELLED
        elif retry_delay is not None and job.attempt < job.max_attempts:
            expected = JobStatus.PENDING
            job.ready_at = self.now + retry_delay
        else:
            expected = JobStatus.FAILED
        _reached(f"fail -> {expected}")
        assert status == expected, f"fail of {job!r} returned {status}, expected {expected}"
        job.end_attempt(expected, AttemptOutcome.ERROR, worker)

    @rule(lease=LEASES, by=CALLERS, attempt_delta=ATTEMPT_DELTAS)
    def save_checkpoint(self, lease: Lease, by: str, attempt_delta: int) -> None:
        self.writes += 1
        data = {"write": self.writes}
        done = self._fenced(
            "save_checkpoint",
            "checkpoint",
            lease,
            by,
            attempt_delta,
            lambda job_id, attempt, worker: leases.save_checkpoint(job_id, attempt, worker, data),
        )
        if done:
            done[0].checkpoint = data

    @rule(lease=LEASES, by=CALLERS, attempt_delta=ATTEMPT_DELTAS)
    def release(self, lease: Lease, by: str, attempt_delta: int) -> None:
        done = self._fenced("release", "release", lease, by, attempt_delta, leases.release)
        if done:
            job, worker, _ = done
            # A cancel requested while it ran wins over a release.
            status = JobStatus.CANCELLED if job.cancel_requested else JobStatus.PENDING
            if status == JobStatus.PENDING:
                job.ready_at = self.now
            _reached(f"release -> {status}")
            job.end_attempt(status, AttemptOutcome.RELEASED, worker)

    @rule(lease=LEASES, by=CALLERS, attempt_delta=ATTEMPT_DELTAS)
    def mark_cancelled(self, lease: Lease, by: str, attempt_delta: int) -> None:
        done = self._fenced(
            "mark_cancelled", "cancel", lease, by, attempt_delta, leases.mark_cancelled
        )
        if done:
            job, worker, _ = done
            job.end_attempt(JobStatus.CANCELLED, AttemptOutcome.CANCELLED, worker)

    @rule(lease=LEASES, by=CALLERS, attempt_delta=ATTEMPT_DELTAS)
    def unclaim(self, lease: Lease, by: str, attempt_delta: int) -> None:
        """Give an attempt back as never run: pending (or cancelled), attempt - 1, no row."""
        job, worker, attempt = self._caller(lease, by, attempt_delta)
        holds = job.holds(worker, attempt)
        before = None if holds else self._snapshot(job)

        given_back = leases.unclaim(worker, [(job.id, attempt)])

        if not holds:
            _reached(f"unclaim: rejected, {self._why_not(job, worker, attempt)}")
            assert given_back == frozenset(), f"{worker} unclaimed {job!r} it did not hold"
            assert self._snapshot(job) == before, f"a rejected unclaim changed {job!r}"
            return
        assert given_back == {(job.id, attempt)}
        # run_after is kept: it was due when the job was claimed, so the job is ready.
        status = JobStatus.CANCELLED if job.cancel_requested else JobStatus.PENDING
        _reached(f"unclaim -> {status}")
        job.end_attempt(status, None, worker)
        job.attempt -= 1
        self.unclaimed_now.add(job.id)

    # ----------------------------------------------------------------------- the reaper

    @precondition(lambda self: self._any(JobStatus.RUNNING))
    @rule(stale_lock_age=st.sampled_from(STALE_AGES))
    def reap(self, stale_lock_age: int) -> None:
        stale = {
            j.id: j
            for j in self.jobs
            if j.status == JobStatus.RUNNING and self.now - j.lease_until > stale_lock_age
        }

        if any(
            j.status == JobStatus.RUNNING and 0 < self.now - j.lease_until <= stale_lock_age
            for j in self.jobs
        ):
            _reached("reap: a lease expired, but not for longer than the stale age")

        reaped = leases.reap(stale_lock_age=stale_lock_age).jobs

        got = sorted(self.by_id[r.id].number for r in reaped)
        assert set(got) == {j.number for j in stale.values()}, (
            f"reap(stale_lock_age={stale_lock_age}) took {got}, expected {list(stale.values())}"
        )
        for r in reaped:
            job = stale[r.id]
            if job.cancel_requested:  # a cancel requested while it ran wins over the reaper
                status = JobStatus.CANCELLED
            elif job.stall_count + 1 >= job.max_stalls:
                status = JobStatus.DEAD
            elif job.attempt >= job.max_attempts:
                status = JobStatus.FAILED
            else:
                status = JobStatus.PENDING
                job.ready_at = self.now  # run_after: now, or kept (it was due at the claim)
            _reached(f"reap -> {status}")
            job.stall_count += 1
            assert (r.attempt, r.worker, r.status, r.stall_count) == (
                job.attempt,
                job.holder,
                status,
                job.stall_count,
            ), f"reaped {job!r}: {r}"
            job.reaped.add((job.attempt, r.worker))
            job.end_attempt(status, AttemptOutcome.LEASE_EXPIRED, r.worker)

    # ----------------------------------------------------------------------- the operator

    @precondition(lambda self: self._any(JobStatus.RUNNING))
    @rule(job=JOBS.filter(lambda job: job.status in ACTIVE))
    def cancel(self, job: JobModel) -> None:
        """The operator cancels a pending or running job (finished ones: test_leases.py).

        Only while some job runs, or most jobs would be cancelled before they ever run.
        """
        result = leases.cancel(job.id)
        _reached(f"cancel: {result}")
        if job.status == JobStatus.PENDING:
            expected = CancelResult.CANCELLED
        elif job.status == JobStatus.RUNNING and not job.cancel_requested:
            expected = CancelResult.REQUESTED
        else:
            expected = CancelResult.NOT_CANCELLABLE
        assert result == expected, f"cancel({job!r}) of a {job.status} job: {result}"
        if result == CancelResult.CANCELLED:
            job.status = JobStatus.CANCELLED
        elif result == CancelResult.REQUESTED:
            job.cancel_requested = True

    @precondition(lambda self: self._any(*RETRYABLE))
    @rule(job=JOBS.filter(lambda job: job.status in TERMINAL))
    def retry(self, job: JobModel) -> None:
        result = leases.retry(job.id)
        _reached(f"retry of a {job.status} job: {result}")
        if job.status not in RETRYABLE:
            assert result == RetryResult.WRONG_STATE, f"retry({job!r}) of a {job.status} job"
            return
        assert result == RetryResult.RETRIED, f"retry({job!r}): {result}"
        job.status = JobStatus.PENDING
        job.ready_at = self.now
        job.stall_count = 0
        job.cancel_requested = False
        job.max_attempts = max(job.max_attempts, job.attempt + 1)
        self.retried_now.add(job.id)

    # ----------------------------------------------------------------------- the invariant

    @invariant()
    def database_matches_the_model(self) -> None:
        elapsed = time.monotonic() - self.started
        assert elapsed < MARGIN, f"an example took {elapsed:.1f}s; the clock model needs less"
        # The database's now (the clock of every lease) comes with the rows, in one query.
        rows = {r["id"]: r for r in Job.objects.annotate(db_now=Now()).values()}
        attempts: dict[int, Counter[tuple[int, str, str]]] = defaultdict(Counter)
        for job_id, attempt, outcome, worker in JobAttempt.objects.values_list(
            "job_id", "attempt", "outcome", "worker"
        ):
            attempts[job_id][(attempt, outcome, worker)] += 1
        assert set(rows) == set(self.by_id)
        for job in self.jobs:
            stored = rows[job.id]
            self._check_history(job, stored)
            self._check_row(job, stored, attempts[job.id], stored.pop("db_now"))
        self.previous = {job_id: (r["status"], r["attempt"]) for job_id, r in rows.items()}
        self.unclaimed_now.clear()
        self.retried_now.clear()

    def _check_history(self, job: JobModel, stored: dict[str, Any]) -> None:
        """Attempts only go up (unclaim: down by one); terminal states only end by retry."""
        if job.id not in self.previous:
            return
        status, attempt = stored["status"], stored["attempt"]
        old_status, old_attempt = self.previous[job.id]
        if job.id in self.unclaimed_now:
            assert attempt == old_attempt - 1, f"{job!r}: unclaim took {old_attempt}->{attempt}"
        else:
            assert attempt >= old_attempt, f"{job!r}: attempt went {old_attempt}->{attempt}"
        if old_status in TERMINAL and status != old_status:
            assert job.id in self.retried_now, f"{job!r} left {old_status} for {status}"
            assert old_status in RETRYABLE and status == JobStatus.PENDING

    def _check_row(
        self,
        job: JobModel,
        stored: dict[str, Any],
        attempts: Counter[tuple[int, str, str]],
        now: datetime,
    ) -> None:
        status, attempt = stored["status"], stored["attempt"]
        assert (status, attempt) == (job.status, job.attempt), (
            f"{job!r}: database ({status}, attempt {attempt}), "
            f"model ({job.status}, attempt {job.attempt})"
        )
        assert (stored["stall_count"], stored["max_attempts"]) == (
            job.stall_count,
            job.max_attempts,
        ), f"{job!r}: stall count and attempt budget"
        assert stored["checkpoint"] == job.checkpoint, f"{job!r}: checkpoint"
        assert stored["result"] == job.result, f"{job!r}: result"
        assert (stored["progress"], stored["progress_message"]) == (
            job.progress,
            job.progress_message,
        ), f"{job!r}: progress"
        assert attempts == job.attempt_rows, (
            f"{job!r}: attempt rows {sorted(attempts.elements())}, "
            f"expected {sorted(job.attempt_rows.elements())}"
        )
        assert stored["cancel_requested"] == job.cancel_requested, f"{job!r}: cancel flag"

        # One holder, and the status agrees with every other column.
        lease = (stored["locked_by"], stored["locked_until"])
        if status == JobStatus.RUNNING:
            assert None not in lease and stored["heartbeat_at"] is not None, f"{job!r}: {lease}"
            assert stored["locked_by"] == job.holder, (
                f"{job!r} is held by {stored['locked_by']}, the model says {job.holder}"
            )
            assert (attempt, stored["locked_by"]) not in job.reaped, (
                f"{job!r}: attempt {attempt} of {stored['locked_by']} is held again after a reap"
            )
            expired = stored["locked_until"] <= now
            assert expired == (self.now > job.lease_until), (
                f"{job!r}: lease expired={expired} on the database, "
                f"{self.now - job.lease_until}s past its end in the model"
            )
        else:
            assert lease == (None, None), f"{job!r} is {status} with the lease {lease}"
        assert (stored["finished_at"] is None) == (status in ACTIVE), (
            f"{job!r} is {status} with finished_at {stored['finished_at']}"
        )
        assert (stored["started_at"] is None) == (attempt == 0), (
            f"{job!r}: attempt {attempt} with started_at {stored['started_at']}"
        )
        if status == JobStatus.PENDING:
            due = stored["run_after"] <= now
            assert due == (job.ready_at <= self.now), (
                f"{job!r}: run_after due={due}, ready in {job.ready_at - self.now}s in the model"
            )


@pytest.mark.django_db(transaction=True)
def test_lease_protocol_matches_its_model() -> None:
    REACHED.clear()
    run_state_machine_as_test(LeaseProtocol, settings=_model_settings())
    if os.environ.get("LEASEJOBS_MODEL_STATS") == "1":  # with pytest -s
        print("\n".join(f"{count:6d}  {what}" for what, count in sorted(REACHED.items())))


# --------------------------------------------------------------------------- pinned scenarios
#
# The documented rules a random run reaches only now and then, as fixed programs of the
# machine's own steps: the same model and the same invariant check every step.


class Steps:
    """Runs the machine's rules by hand, checking the invariant after each one."""

    def __init__(self) -> None:
        self.machine = LeaseProtocol()
        self.machine.database_matches_the_model()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        step = getattr(self.machine, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            self.machine.database_matches_the_model()
            return getattr(result, "values", result)

        return run

    def job(self, max_attempts: int = 3, max_stalls: int = 3) -> JobModel:
        return self.enqueue(max_attempts=max_attempts, max_stalls=max_stalls, priority=0)

    def claim_one(self, worker: str = "w1") -> Lease:
        (lease,) = self.claim(worker=worker, limit=1)
        return lease

    def expire_and_reap(self) -> None:
        self.advance_clock(seconds=CLOCK_STEPS[-1])
        self.reap(stale_lock_age=STALE_AGES[-1])


def cancel_wins_over_a_retry(s: Steps) -> None:
    job = s.job()
    lease = s.claim_one()
    s.cancel(job=job)
    s.fail(lease=lease, by=OWN, attempt_delta=0, retry_delay=0)
    assert job.status == JobStatus.CANCELLED


def cancel_wins_over_a_release(s: Steps) -> None:
    job = s.job()
    lease = s.claim_one()
    s.cancel(job=job)
    s.release(lease=lease, by=OWN, attempt_delta=0)
    assert job.status == JobStatus.CANCELLED


def cancel_wins_over_the_reaper(s: Steps) -> None:
    job = s.job()
    s.claim_one()
    s.cancel(job=job)
    s.expire_and_reap()
    assert job.status == JobStatus.CANCELLED


def cancel_wins_over_an_unclaim(s: Steps) -> None:
    job = s.job()
    lease = s.claim_one()
    s.cancel(job=job)
    s.unclaim(lease=lease, by=OWN, attempt_delta=0)
    assert (job.status, job.attempt) == (JobStatus.CANCELLED, 0)


def stalls_make_a_dead_letter_that_retry_revives(s: Steps) -> None:
    job = s.job(max_attempts=5, max_stalls=2)
    first = s.claim_one("w1")
    s.expire_and_reap()
    assert (job.status, job.stall_count) == (JobStatus.PENDING, 1)
    s.complete(lease=first, by=OWN, attempt_delta=0)  # the zombie is fenced
    second = s.claim_one("w1")  # the same worker again: a self-zombie from here on
    s.expire_and_reap()
    assert job.status == JobStatus.DEAD
    s.save_checkpoint(lease=second, by=OWN, attempt_delta=0)
    s.retry(job=job)
    third = s.claim_one("w2")
    for stale in (first, second):
        s.renew(lease=stale, by=OWN, attempt_delta=0, fraction=0.25)
        s.fail(lease=stale, by=OWN, attempt_delta=0, retry_delay=None)
    s.complete(lease=third, by=OWN, attempt_delta=0)
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 3)


def used_up_attempts_fail_and_retry_gives_one_more(s: Steps) -> None:
    job = s.job(max_attempts=2, max_stalls=3)
    first = s.claim_one()
    s.fail(lease=first, by=OWN, attempt_delta=0, retry_delay=RETRY_DELAYS[-1])
    s.claim(worker="w2", limit=4)  # not due yet: claims nothing
    s.advance_clock(seconds=CLOCK_STEPS[0])
    s.claim(worker="w2", limit=4)  # 60 s of a 90 s delay: still nothing
    s.advance_clock(seconds=CLOCK_STEPS[0])
    s.claim_one("w2")
    s.expire_and_reap()  # the last attempt stalled: failed, not dead
    assert job.status == JobStatus.FAILED
    s.retry(job=job)
    assert job.max_attempts == 3
    third = s.claim_one("w3")
    s.fail(lease=third, by=OWN, attempt_delta=0, retry_delay=0)
    assert job.status == JobStatus.FAILED


def the_reaper_waits_for_the_stale_age(s: Steps) -> None:
    job = s.job()
    lease = s.claim_one()
    s.advance_clock(seconds=CLOCK_STEPS[2])  # expired, but not for longer than 120 s
    s.reap(stale_lock_age=STALE_AGES[-1])
    assert job.status == JobStatus.RUNNING
    s.heartbeat(lease=lease)  # an expired lease not reaped yet can still be renewed
    s.advance_clock(seconds=CLOCK_STEPS[2])
    s.reap(stale_lock_age=0)
    assert job.status == JobStatus.PENDING


def an_unclaimed_attempt_number_is_given_again(s: Steps) -> None:
    job = s.job()
    lease = s.claim_one("w1")
    s.unclaim(lease=lease, by=OWN, attempt_delta=0)
    assert (job.status, job.attempt) == (JobStatus.PENDING, 0)
    again = s.claim_one("w2")
    assert again.attempt == lease.attempt
    s.save_checkpoint(lease=lease, by=OWN, attempt_delta=0)  # w1 gave it up: fenced
    s.mark_cancelled(lease=again, by=OWN, attempt_delta=0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "scenario",
    [
        cancel_wins_over_a_retry,
        cancel_wins_over_a_release,
        cancel_wins_over_the_reaper,
        cancel_wins_over_an_unclaim,
        stalls_make_a_dead_letter_that_retry_revives,
        used_up_attempts_fail_and_retry_gives_one_more,
        the_reaper_waits_for_the_stale_age,
        an_unclaimed_attempt_number_is_given_again,
    ],
    ids=lambda scenario: scenario.__name__,
)
def test_pinned_scenario(scenario: Callable[[Steps], None]) -> None:
    scenario(Steps())
