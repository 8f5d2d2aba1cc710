"""Bulkheads in the lease protocol and the worker's database round, in process.

* What a job reports (errors, progress) is always storable (``leases.storable_text``).
* A batch of outcomes the database refuses is written again row by row; an outcome it
  refuses alone is recorded as an ``OutcomeNotStored`` failure; one it refuses even then
  is reported as unwritable (the worker gives it up). Only the connection ends a round.
* Rows locked by another transaction are skipped, never waited for (PostgreSQL, MySQL,
  MariaDB).
* A job row with the wrong JSON types claims as a job that cannot run.
* A reaped or released job keeps its place in the claim order.

tests/test_worker_poison.py shows the same with real ``runworker`` processes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.db.models import JSONField, Value

from django_leasejobs import leases
from django_leasejobs.exceptions import LeaseLost, RowLocked
from django_leasejobs.leases import Completion, ErrorInfo, Failure, Progress, storable_text
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.worker.execution import Outcome
from django_leasejobs.worker.jobs import RunningJob
from django_leasejobs.worker.rounds import Ending, RoundContext, RoundPlan, run_round
from tests.helpers_leases import (
    LEASE,
    attempt_rows,
    claim_one,
    expire,
    locked_elsewhere,
    make_job,
    make_jobs,
    refusing_to_finish,
    row,
)

db = pytest.mark.django_db(transaction=True)
row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no row locks (it serialises writers): nothing is ever skipped",
)
NOT_STORED = "django_leasejobs.exceptions.OutcomeNotStored"
WORKER = "worker-a"
CTX = RoundContext(
    worker_id=WORKER, database="default", backend="default", queues=None, lease_duration=LEASE
)


# --------------------------------------------------------------------------- storable text


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


class SneakyStr(str):
    def __contains__(self, item: object) -> bool:
        return False


@pytest.mark.parametrize(
    ("value", "limit", "stored"),
    [
        ("plain", None, "plain"),
        ("a\x00b", None, "a\\x00b"),
        ("half \ud800 pair", None, "half \\ud800 pair"),
        ("\udfff\x00", None, "\\udfff\\x00"),
        ("x" * 50, 40, "x" * 11 + "... [truncated 39 characters]"),
        ("x" * 40, 40, "x" * 40),
        (12.5, None, "12.5"),
        (Hostile(), None, "<unprintable Hostile: str() raised RuntimeError>"),
        (SneakyStr("s\x00"), None, "s\\x00"),
    ],
)
def test_storable_text(value: Any, limit: int | None, stored: str) -> None:
    text = storable_text(value, limit)
    assert text == stored
    assert type(text) is str
    text.encode("utf-8")  # never raises
    assert "\x00" not in text
    assert limit is None or len(text) <= limit


def test_error_info_is_always_storable() -> None:
    error = ErrorInfo("m." + "K" * 2000, "bad \x00 \ud800 " + "m" * 5000, "t\x00" * 50_000)
    assert len(error.exception_class_path) == leases.MAX_ERROR_CLASS_LENGTH
    assert len(error.message) == leases.MAX_ERROR_LENGTH
    assert error.message.startswith("bad \\x00 \\ud800 mmm")
    assert len(error.traceback) == leases.MAX_TRACEBACK_LENGTH
    assert error.traceback.endswith("characters]")
    # Unchanged when there is nothing to change.
    plain = ErrorInfo("builtins.ValueError", "fine")
    assert (plain.exception_class_path, plain.message, plain.last_error) == (
        "builtins.ValueError",
        "fine",
        "builtins.ValueError: fine",
    )


@db
def test_hostile_error_text_is_stored_escaped_by_fail_and_fail_many() -> None:
    one, two = (make_job() for _ in range(2))
    a = claim_one(WORKER, one.pk)
    b = claim_one(WORKER, two.pk)
    error = ErrorInfo("x.Y\x00", "m\x00 \ud800", "tb\x00")
    leases.fail(one.pk, a.attempt, WORKER, error=error, retry_delay=None)
    written = leases.fail_many(WORKER, [Failure(*b.lease, error, None)])
    assert written.written == {b.lease: JobStatus.FAILED}
    for job_id in (one.pk, two.pk):
        [attempt] = attempt_rows(job_id)
        assert (attempt.error_class, attempt.error_message) == ("x.Y\\x00", "m\\x00 \\ud800")
        assert attempt.traceback == "tb\\x00"
        assert row(job_id)["last_error"] == "x.Y\\x00: m\\x00 \\ud800"


@db
def test_hostile_progress_messages_are_stored_escaped() -> None:
    job = make_job()
    claimed = claim_one(WORKER, job.pk)
    result = leases.renew(
        WORKER, {claimed.lease: Progress(0.5, "p\x00 \ud800")}, lease_duration=LEASE
    )
    assert result.held == {claimed.lease}
    assert row(job.pk)["progress_message"] == "p\\x00 \\ud800"
    leases.set_progress(job.pk, claimed.attempt, WORKER, Progress(0.6, "q\x00"))
    assert row(job.pk)["progress_message"] == "q\\x00"


# --------------------------------------------------------------------------- malformed rows


@db
def test_rows_with_wrong_json_types_claim_as_jobs_that_cannot_run() -> None:
    good = make_job(args=[1, 2], kwargs={"a": 1})
    bad_kwargs = make_job(kwargs=[1, 2])
    bad_args = make_job(args={"a": 1})
    text_args = make_job(args="text")
    bad_backoff = make_job(retry_backoff={"base": -1})
    null_args = make_job()
    json_null = Value(None, JSONField())  # JSON null (the columns are NOT NULL)
    Job.objects.filter(pk=null_args.pk).update(args=json_null, kwargs=json_null)

    claimed = {c.id: c for c in leases.claim(WORKER, limit=10, lease_duration=LEASE)}

    assert claimed[good.pk].problem is None
    assert (claimed[good.pk].args, claimed[good.pk].kwargs) == ([1, 2], {"a": 1})
    assert (claimed[null_args.pk].args, claimed[null_args.pk].kwargs) == ([], {})
    assert claimed[null_args.pk].problem is None
    expected = {
        bad_kwargs.pk: "kwargs is a JSON array, not an object",
        bad_args.pk: "args is a JSON object, not an array",
        text_args.pk: "args is a JSON string, not an array",
        bad_backoff.pk: "retry_backoff",
    }
    for job_id, why in expected.items():
        problem = claimed[job_id].problem
        assert problem is not None and problem.startswith("the job row is malformed: ")
        assert why in problem
        # The worker's bookkeeping gets values of the right types all the same.
        assert isinstance(claimed[job_id].args, list)
        assert isinstance(claimed[job_id].kwargs, dict)
    assert claimed[bad_backoff.pk].retry_backoff is None


# --------------------------------------------------------------------------- the round


def _running(claimed: leases.ClaimedJob) -> RunningJob:
    now = time.monotonic()
    return RunningJob(job=claimed, task=None, started=now)


def _success(claimed: leases.ClaimedJob, result: Any) -> tuple[RunningJob, Outcome]:
    return _running(claimed), Outcome(claimed.lease, ok=True, result=result)


@db
def test_a_result_the_database_refuses_fails_its_own_attempt_and_the_batch_lands() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(4)]
    # object() is no JSON: json.dumps raises while the batch is built. (The worker
    # refuses such results in the slot already; the round must survive one anyway.)
    plan = RoundPlan(
        successes=[_success(c, object() if i == 1 else i) for i, c in enumerate(jobs)],
        claim_limit=5,
    )

    result = run_round(plan, CTX)

    assert result.error is None and result.wrote_successes
    bad = jobs[1].lease
    assert result.statuses == {
        **{c.lease: JobStatus.SUCCEEDED for c in jobs if c.lease != bad},
        bad: JobStatus.FAILED,
    }
    assert set(result.replaced) == {bad}
    assert result.claimed == []  # the claim of the round still ran
    for i, c in enumerate(jobs):
        stored = row(c.id)
        if c.lease == bad:
            assert (stored["status"], stored["result"]) == (JobStatus.FAILED, None)
            [attempt] = attempt_rows(c.id)
            assert (attempt.outcome, attempt.error_class) == (AttemptOutcome.ERROR, NOT_STORED)
            assert "the task returned, but the database refused its result" in (
                attempt.error_message
            )
        else:
            assert (stored["status"], stored["result"]) == (JobStatus.SUCCEEDED, i)


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL's jsonb refuses \\u0000; SQLite, MySQL and MariaDB keep it",
)
@db
def test_a_nul_result_refused_by_postgresql_fails_its_own_attempt() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(3)]
    plan = RoundPlan(
        successes=[_success(c, "a\x00b" if i == 0 else "ok") for i, c in enumerate(jobs)]
    )

    result = run_round(plan, CTX)

    assert result.error is None
    assert result.statuses[jobs[0].lease] == JobStatus.FAILED
    assert [row(c.id)["status"] for c in jobs] == [
        JobStatus.FAILED,
        JobStatus.SUCCEEDED,
        JobStatus.SUCCEEDED,
    ]
    [attempt] = attempt_rows(jobs[0].id)
    assert attempt.error_class == NOT_STORED


@db
def test_a_failure_the_database_refuses_is_replaced_by_one_saying_why() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(3, max_attempts=5)]
    error = ErrorInfo("builtins.ValueError", "boom")
    # An infinite retry delay makes a run_after no database can store.
    failures = [
        Failure(*c.lease, error, float("inf") if i == 0 else 0.0) for i, c in enumerate(jobs)
    ]
    plan = RoundPlan(
        failures=[(_running(c), None, f, 0.1) for c, f in zip(jobs, failures, strict=True)]
    )

    result = run_round(plan, CTX)

    assert result.error is None and result.wrote_failures
    assert result.statuses == {
        jobs[0].lease: JobStatus.FAILED,
        jobs[1].lease: JobStatus.PENDING,
        jobs[2].lease: JobStatus.PENDING,
    }
    assert set(result.replaced) == {jobs[0].lease}
    [attempt] = attempt_rows(jobs[0].id)
    assert attempt.error_class == NOT_STORED
    assert "the attempt failed (builtins.ValueError), but the database refused" in (
        attempt.error_message
    )
    for c in jobs[1:]:
        [attempt] = attempt_rows(c.id)
        assert (attempt.error_class, attempt.error_message) == ("builtins.ValueError", "boom")


@db
def test_an_outcome_refused_even_as_a_fallback_is_unwritable_and_the_rest_lands() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(3)]
    error = ErrorInfo("builtins.ValueError", "boom")
    plan = RoundPlan(
        successes=[_success(jobs[0], "ok"), _success(jobs[1], "ok")],
        failures=[(_running(jobs[2]), None, Failure(*jobs[2].lease, error, None), 0.1)],
    )
    with refusing_to_finish(jobs[0].id):
        result = run_round(plan, CTX)

    assert result.error is None
    assert set(result.unwritable) == {jobs[0].lease}
    assert "refused by the test trigger" in result.unwritable[jobs[0].lease]
    assert result.statuses == {jobs[1].lease: JobStatus.SUCCEEDED, jobs[2].lease: JobStatus.FAILED}
    # Nothing was written for the refused one: it still holds its lease (the worker stops
    # renewing it and the reaper takes it back).
    stored = row(jobs[0].id)
    assert (stored["status"], stored["locked_by"]) == (JobStatus.RUNNING, WORKER)
    assert not JobAttempt.objects.filter(job_id=jobs[0].id).exists()


# --------------------------------------------------------------------------- locked rows


@row_locks
@db
def test_renewal_skips_a_row_locked_elsewhere_and_renews_the_rest() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(3)]
    leases_ = [c.lease for c in jobs]
    started = time.monotonic()
    with locked_elsewhere(jobs[1].id):
        result = leases.renew(WORKER, leases_, lease_duration=LEASE)
    assert time.monotonic() - started < 30, "the renewal waited for the lock"
    assert result.skipped == {jobs[1].lease}
    assert result.held == {jobs[0].lease, jobs[2].lease}
    assert result.lost == frozenset()
    # Once the lock is gone, the row is renewed again.
    assert leases.renew(WORKER, leases_, lease_duration=LEASE).held == set(leases_)
    # A row locked elsewhere that is no longer ours is lost, not skipped.
    expire(jobs[2].id)
    leases.reap()
    with locked_elsewhere(jobs[2].id):
        result = leases.renew(WORKER, leases_, lease_duration=LEASE)
    assert (result.lost, result.skipped) == ({jobs[2].lease}, frozenset())


@row_locks
@db
def test_batched_writes_skip_a_row_locked_elsewhere_and_write_it_later() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(4)]
    error = ErrorInfo("builtins.ValueError", "boom")
    with locked_elsewhere(jobs[0].id), locked_elsewhere(jobs[2].id):
        done = leases.complete_many(
            WORKER, [Completion(*jobs[0].lease, 1), Completion(*jobs[1].lease, 2)]
        )
        failed = leases.fail_many(WORKER, [Failure(*c.lease, error, None) for c in jobs[2:]])
    assert (done.written, done.skipped) == ({jobs[1].lease: "succeeded"}, {jobs[0].lease})
    assert (failed.written, failed.skipped) == ({jobs[3].lease: "failed"}, {jobs[2].lease})
    assert not JobAttempt.objects.filter(job_id=jobs[2].id).exists()
    # Later, with the locks gone, the skipped ones are written like any other.
    assert leases.complete_many(WORKER, [Completion(*jobs[0].lease, 1)]).written == {
        jobs[0].lease: "succeeded"
    }
    assert leases.fail_many(WORKER, [Failure(*jobs[2].lease, error, None)]).written == {
        jobs[2].lease: "failed"
    }


@row_locks
@db
def test_a_round_requeues_outcomes_whose_rows_were_locked() -> None:
    jobs = [claim_one(WORKER, job_id) for job_id in make_jobs(2)]
    plan = RoundPlan(successes=[_success(c, "ok") for c in jobs])
    with locked_elsewhere(jobs[0].id):
        result = run_round(plan, CTX)
    assert result.error is None
    assert result.skipped == {jobs[0].lease}
    assert result.statuses == {jobs[1].lease: JobStatus.SUCCEEDED}
    assert row(jobs[0].id)["status"] == JobStatus.RUNNING


# --------------------------------------------------------------------------- fairness


@db
def test_a_reaped_job_is_claimed_again_before_a_backlog_of_5000() -> None:
    crashed = make_job()
    claim_one("worker-dead", crashed.pk)
    backlog = make_jobs(5000)  # enqueued while the job ran, all ready
    expire(crashed.pk)

    [reaped] = leases.reap().jobs
    assert (reaped.id, reaped.status) == (crashed.pk, JobStatus.PENDING)

    again = claim_one("worker-new")
    assert (again.id, again.attempt) == (crashed.pk, 2)
    assert claim_one("worker-new").id == backlog[0]


@db
def test_a_released_job_keeps_its_place_too() -> None:
    first = make_job()
    claimed = claim_one(WORKER, first.pk)
    backlog = make_jobs(50)
    leases.release(first.pk, claimed.attempt, WORKER)
    assert claim_one("worker-new").id == first.pk
    assert claim_one("worker-new").id == backlog[0]


@row_locks
@db
def test_release_and_cancel_never_wait_for_a_row_locked_elsewhere() -> None:
    released, cancelled = (claim_one(WORKER, job_id) for job_id in make_jobs(2))
    with locked_elsewhere(released.id), locked_elsewhere(cancelled.id):
        with pytest.raises(RowLocked):
            leases.release(released.id, released.attempt, WORKER)
        with pytest.raises(RowLocked):
            leases.mark_cancelled(cancelled.id, cancelled.attempt, WORKER)
        plan = RoundPlan(
            singles=[
                (_running(released), Ending("shutdown", "")),
                (_running(cancelled), Ending("cancelled", "")),
            ]
        )
        result = run_round(plan, CTX)
        assert result.error is None
        assert result.skipped == {released.lease, cancelled.lease}
    for c in (released, cancelled):
        assert (row(c.id)["status"], row(c.id)["locked_by"]) == (JobStatus.RUNNING, WORKER)
        assert not JobAttempt.objects.filter(job_id=c.id).exists()
    # With the locks gone, both land; a stranger's release is still LeaseLost.
    leases.release(released.id, released.attempt, WORKER)
    leases.mark_cancelled(cancelled.id, cancelled.attempt, WORKER)
    assert row(released.id)["status"] == JobStatus.PENDING
    assert row(cancelled.id)["status"] == JobStatus.CANCELLED
    with pytest.raises(LeaseLost):
        leases.release(released.id, released.attempt, WORKER)
