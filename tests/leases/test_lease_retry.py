"""The snooze transition (a task raised ``Retry``: issue 13, point 4) on every lease path.

A snooze is a fenced failure like the others, in the same UPDATE: back to ``pending``
with ``run_after`` its delay from now, whatever attempts are left, its attempt given
back (``max_attempts`` + 1) and counted (``snoozes`` + 1); a cancel requested while it
ran still wins. The ``lease_path`` fixture (conftest.py) runs each test on every path
the database can take. Decisions (``rules.decide``) are checked here too, as values.
"""

from __future__ import annotations

import pytest

from django_leasejobs import leases
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.leases import ErrorInfo, Failure
from django_leasejobs.models import AttemptOutcome, JobStatus
from django_leasejobs.retry import RETRIED, Decision, Verdict
from tests.helpers_leases import (
    attempt_rows,
    claim_one,
    make_job,
    make_ready,
    row,
    seconds_from_db_now,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("lease_path")]

W = "worker-a"
ERROR = ErrorInfo("django_leasejobs.exceptions.Retry", "run again in 60s")
SLACK = 5.0


def _snooze(job_id: int, attempt: int, delay: float = 60.0) -> Failure:
    return Failure(
        job_id, attempt, ERROR, delay, AttemptOutcome.SNOOZED, True, "snoozed for 60s (1 of 10)"
    )


def test_a_snooze_goes_back_to_pending_later_and_gives_its_attempt_back() -> None:
    job = make_job(max_attempts=1)
    claimed = claim_one(W, job.pk)
    assert claimed.snoozes == 0

    assert leases.fail_many(W, [_snooze(job.pk, 1)]).written == {(job.pk, 1): "pending"}

    stored = row(job.pk)
    assert (stored["status"], stored["attempt"], stored["max_attempts"], stored["snoozes"]) == (
        JobStatus.PENDING,
        1,
        2,
        1,
    )
    assert (stored["locked_by"], stored["locked_until"], stored["finished_at"]) == (
        None,
        None,
        None,
    )
    assert abs(seconds_from_db_now(stored["run_after"]) - 60) < SLACK
    [attempt] = attempt_rows(job.pk)
    assert (attempt.outcome, attempt.decision) == (
        AttemptOutcome.SNOOZED,
        "snoozed for 60s (1 of 10)",
    )
    # The next claim sees the snooze.
    make_ready(job.pk)
    assert claim_one(W, job.pk).snoozes == 1


def test_snoozes_and_failures_in_one_batch_each_end_their_own_way() -> None:
    snoozer, last, retried = (make_job(max_attempts=1) for _ in range(3))
    retried.max_attempts = 3
    retried.save(update_fields=["max_attempts"])
    for job in (snoozer, last, retried):
        claim_one(W, job.pk)
    plain = ErrorInfo("builtins.ValueError", "boom")
    done = leases.fail_many(
        W,
        [
            _snooze(snoozer.pk, 1),
            Failure(last.pk, 1, plain, 0.0, decision="not retried: attempt 1 of 1 was the last"),
            Failure(retried.pk, 1, plain, 0.0, decision="retried in 0s (attempt 1 of 3)"),
        ],
    )
    assert done.written == {
        (snoozer.pk, 1): JobStatus.PENDING,
        (last.pk, 1): JobStatus.FAILED,
        (retried.pk, 1): JobStatus.PENDING,
    }
    counts = {
        job.pk: (row(job.pk)["max_attempts"], row(job.pk)["snoozes"])
        for job in (snoozer, last, retried)
    }
    assert counts == {snoozer.pk: (2, 1), last.pk: (1, 0), retried.pk: (3, 0)}
    assert [a.decision for a in attempt_rows(last.pk)] == [
        "not retried: attempt 1 of 1 was the last"
    ]


def test_a_cancel_requested_wins_over_a_snooze() -> None:
    job = make_job(max_attempts=1)
    claim_one(W, job.pk)
    assert leases.cancel(job.pk) is leases.CancelResult.REQUESTED

    assert leases.fail_many(W, [_snooze(job.pk, 1)]).written == {(job.pk, 1): "cancelled"}

    stored = row(job.pk)
    assert (stored["status"], stored["max_attempts"], stored["snoozes"]) == (
        JobStatus.CANCELLED,
        1,
        0,
    )
    assert stored["finished_at"] is not None
    [attempt] = attempt_rows(job.pk)
    assert (attempt.outcome, attempt.decision) == (
        AttemptOutcome.SNOOZED,
        "not retried: cancelled while it ran",
    )


def test_an_operator_retry_gives_a_fresh_snooze_budget() -> None:
    job = make_job(max_attempts=1)
    claim_one(W, job.pk)
    leases.fail_many(W, [_snooze(job.pk, 1, delay=0.0)])
    claim_one(W, job.pk)
    leases.fail(job.pk, 2, W, error=ERROR, retry_delay=None)
    assert (row(job.pk)["status"], row(job.pk)["snoozes"]) == (JobStatus.FAILED, 1)

    assert leases.retry(job.pk) is leases.RetryResult.RETRIED

    stored = row(job.pk)
    assert (stored["status"], stored["snoozes"], stored["max_attempts"]) == (
        JobStatus.PENDING,
        0,
        3,
    )


def test_a_snooze_of_a_lost_lease_writes_nothing() -> None:
    job = make_job()
    claim_one(W, job.pk)
    with pytest.raises(LeaseLost):
        leases.fail(
            job.pk, 1, "worker-b", error=ERROR, retry_delay=60.0, outcome=AttemptOutcome.SNOOZED
        )
    assert leases.fail_many("worker-b", [_snooze(job.pk, 1)]).written == {}
    stored = row(job.pk)
    assert (stored["status"], stored["snoozes"], stored["max_attempts"]) == (
        JobStatus.RUNNING,
        0,
        3,
    )
    assert attempt_rows(job.pk) == []


def _decide(verdict: Verdict, attempt: int = 1, snoozes: int = 0) -> leases.AttemptDecision:
    return leases.decide(
        verdict,
        attempt=attempt,
        max_attempts=3,
        snoozes=snoozes,
        max_snoozes=2,
        backoff_delay=lambda: 7.0,
    )


def test_decide() -> None:
    assert _decide(RETRIED) == leases.AttemptDecision(7.0, False, "retried in 7s (attempt 1 of 3)")
    assert _decide(RETRIED, attempt=3) == leases.AttemptDecision(
        7.0, False, "not retried: attempt 3 of 3 was the last"
    )
    fail = Verdict(Decision.FAIL, "not retried: ValueError is in dont_retry_on")
    assert _decide(fail) == leases.AttemptDecision(None, False, fail.reason)
    called = Verdict(Decision.RETRY, "Transient is in retry_on", 2.5)
    assert _decide(called).decision == "Transient is in retry_on: retried in 2.5s (attempt 1 of 3)"
    snooze = Verdict(Decision.SNOOZE, seconds=60.0)
    assert _decide(snooze, attempt=3, snoozes=1) == leases.AttemptDecision(
        60.0, True, "snoozed for 60s (2 of 2)"
    )
    assert _decide(snooze, attempt=2, snoozes=2) == leases.AttemptDecision(
        60.0,
        False,
        "Retry past the 2 snoozes allowed, counted as a failed attempt: "
        "retried in 60s (attempt 2 of 3)",
    )
