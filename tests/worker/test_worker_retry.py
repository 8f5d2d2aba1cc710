"""Retry control on a real worker (issue 13, point 4), in both pools.

``retry_on`` and ``dont_retry_on`` are matched where the attempt ran, subclasses
included, with ``dont_retry_on`` winning; ``Retry(after=...)`` snoozes without using an
attempt until the task's ``max_snoozes``, then counts as a failed attempt; a callable
backoff gets the attempt number and the exception. Every attempt row says why the job
was retried, snoozed or not. A ``Retry`` with a wait that is no number of seconds ends
in a clear attempt row and never stops the worker.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from django_leasejobs import Retry
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.retry import Decision, Verdict, verdict
from tests import tasks_retry
from tests.tasks_worker_shutdown import record_job
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

POOLS = ["process", "thread"]
RETRY_CLASS = "django_leasejobs.exceptions.Retry"
FINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED)


def _attempts(job_id: int) -> list[tuple[str, str]]:
    """Each attempt row's (outcome, decision), in order."""
    rows = JobAttempt.objects.filter(job_id=job_id).order_by("attempt")
    return [(row.outcome, row.decision) for row in rows]


def _run_until_final(workers: Any, pool: str, ids: list[int]) -> None:
    worker = workers.start(args=["--pool", pool, "--concurrency", "2"])
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, status__in=FINAL).count() == len(ids),
        timeout=60,
        what="every job final",
    )
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output


@pytest.mark.parametrize("pool", POOLS)
def test_retry_control(workers: Any, pool: str) -> None:
    ids = {
        "retry_on_subclass": tasks_retry.retry_on_subclass.enqueue(),
        "retry_on_other": tasks_retry.retry_on_other.enqueue(),
        "dont_retry_subclass": tasks_retry.dont_retry_subclass.enqueue(),
        "always_snoozes": tasks_retry.always_snoozes.enqueue(),
        "snoozes_once": tasks_retry.snoozes_once.enqueue(1.5),
        "callable_backoff": tasks_retry.callable_backoff.enqueue(0.25),
        "callable_backoff_gives_text": tasks_retry.callable_backoff_gives_text.enqueue(),
        "callable_overridden": tasks_retry.callable_backoff.using(
            retry_backoff={"base": 0, "factor": 1, "cap": 0, "jitter": 0}
        ).enqueue(0.25),
    }
    job_ids = {name: int(result.id) for name, result in ids.items()}
    _run_until_final(workers, pool, list(job_ids.values()))
    jobs = {name: Job.objects.get(pk=job_id) for name, job_id in job_ids.items()}
    error = AttemptOutcome.ERROR

    # retry_on: a subclass is retried until the attempts are used up.
    assert jobs["retry_on_subclass"].status == JobStatus.FAILED
    assert _attempts(job_ids["retry_on_subclass"]) == [
        (error, "FlakyConnection is in retry_on: retried in 0s (attempt 1 of 3)"),
        (error, "FlakyConnection is in retry_on: retried in 0s (attempt 2 of 3)"),
        (error, "FlakyConnection is in retry_on: not retried: attempt 3 of 3 was the last"),
    ]
    # retry_on set: another exception fails at once, attempts left or not.
    assert jobs["retry_on_other"].status == JobStatus.FAILED
    assert _attempts(job_ids["retry_on_other"]) == [
        (error, "not retried: ValueError is not in retry_on")
    ]
    # dont_retry_on wins over retry_on, and matches subclasses (UnicodeError < ValueError).
    assert jobs["dont_retry_subclass"].status == JobStatus.FAILED
    assert _attempts(job_ids["dont_retry_subclass"]) == [
        (error, "not retried: UnicodeError is in dont_retry_on")
    ]

    # Two snoozes (max_snoozes=2) give their attempts back (max_attempts 1 -> 3); the
    # third Retry is a failed attempt, and the last one.
    snoozer = jobs["always_snoozes"]
    assert (snoozer.status, snoozer.attempt, snoozer.max_attempts, snoozer.snoozes) == (
        JobStatus.FAILED,
        3,
        3,
        2,
    )
    snoozed = AttemptOutcome.SNOOZED
    assert _attempts(snoozer.pk) == [
        (snoozed, "snoozed for 0s (1 of 2)"),
        (snoozed, "snoozed for 0s (2 of 2)"),
        (
            error,
            "Retry past the 2 snoozes allowed, counted as a failed attempt: "
            "not retried: attempt 3 of 3 was the last",
        ),
    ]
    assert JobAttempt.objects.filter(job=snoozer).first().error_class == RETRY_CLASS  # type: ignore[union-attr]

    # A snooze waits its `after` (on the database's clock), then the job runs again.
    woke = jobs["snoozes_once"]
    assert (woke.status, woke.result, woke.attempt, woke.max_attempts, woke.snoozes) == (
        JobStatus.SUCCEEDED,
        "woke up",
        2,
        4,
        1,
    )
    [first] = JobAttempt.objects.filter(job=woke)
    assert (first.outcome, first.decision) == (snoozed, "snoozed for 1.5s (1 of 10)")
    assert woke.last_attempted_at is not None
    assert (woke.last_attempted_at - first.finished_at).total_seconds() >= 1.4

    # A callable backoff gets the attempt number and the exception.
    assert _attempts(job_ids["callable_backoff"]) == [
        (error, "retried in 0.25s (attempt 1 of 2)"),
        (error, "not retried: attempt 2 of 2 was the last"),
    ]
    backoff_row = Job.objects.get(pk=job_ids["callable_backoff"])
    assert backoff_row.retry_backoff is None  # a callable is never stored
    # A policy given to using() is stored on the row and wins over the task's callable.
    assert _attempts(job_ids["callable_overridden"])[0] == (
        error,
        "retried in 0s (attempt 1 of 2)",
    )
    # One that gives no number of seconds: the backend's RETRY_BACKOFF, saying so.
    assert _attempts(job_ids["callable_backoff_gives_text"])[0] == (
        error,
        "retry_backoff gave a str, not a number of seconds: used the backend's "
        "RETRY_BACKOFF: retried in 0s (attempt 1 of 2)",
    )


@pytest.mark.parametrize("pool", POOLS)
def test_retry_with_a_bad_wait_fails_its_attempt_and_the_worker_goes_on(
    workers: Any, marker_dir: str, pool: str
) -> None:
    bad = {
        kind: int(tasks_retry.bad_retry_after.enqueue(kind).id) for kind in tasks_retry.BAD_AFTER
    }
    healthy = [int(record_job.enqueue(marker_dir, "healthy").id) for _ in range(4)]

    worker = workers.start(args=["--pool", pool, "--concurrency", "1", "--burst"])
    assert worker.wait(timeout=90) == 0, worker.output

    assert set(Job.objects.filter(pk__in=healthy).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    why = {
        "negative": "gave a negative number of seconds",
        "nan": "gave NaN seconds",
        "infinite": "gave more than the 2592000 seconds allowed",
        "huge": "gave more than the 2592000 seconds allowed",
        "huge_int": "gave a number out of range",
        "text": "gave a str, not a number of seconds",
        "none": "gave a NoneType, not a number of seconds",
    }
    for kind, job_id in bad.items():
        job = Job.objects.get(pk=job_id)
        assert (job.status, job.snoozes) == (JobStatus.FAILED, 0), (kind, job.status)
        [attempt] = JobAttempt.objects.filter(job=job)
        assert (attempt.outcome, attempt.error_class) == (AttemptOutcome.ERROR, RETRY_CLASS)
        assert attempt.decision == (
            f"Retry(after=...) {why[kind]}: counted as a failed attempt: "
            "not retried: attempt 1 of 1 was the last"
        ), kind


class _HostileRetry(Retry):
    @property
    def after(self) -> float:
        raise ZeroDivisionError

    @after.setter
    def after(self, value: float) -> None:
        pass


def _raising_backoff(attempt: int, exc: BaseException) -> float:
    raise RuntimeError(f"no backoff for {exc!r}")


def test_verdicts_where_the_attempt_ran() -> None:
    strict = tasks_retry.dont_retry_subclass  # retry_on=(Exception,), dont_retry_on=(ValueError,)
    # A Retry is the task asking: it wins over retry_on and dont_retry_on.
    assert verdict(strict, Retry(after=5), 1) == Verdict(Decision.SNOOZE, seconds=5.0)
    assert verdict(strict, Retry(after=2), 1).seconds == 2.0  # an int is seconds too
    assert verdict(strict, KeyError("k"), 1) == Verdict(Decision.RETRY, "KeyError is in retry_on")
    assert verdict(tasks_retry.bad_retry_after, _HostileRetry(), 1) == Verdict(
        Decision.RETRY, "Retry(after=...) raised ZeroDivisionError: counted as a failed attempt"
    )
    raising = replace(tasks_retry.callable_backoff, retry_backoff=_raising_backoff)
    assert verdict(raising, ValueError("x"), 1) == Verdict(
        Decision.RETRY, "retry_backoff raised RuntimeError: used the backend's RETRY_BACKOFF"
    )
    assert verdict(tasks_retry.callable_backoff, tasks_retry.Transient(0.5), 3).seconds == 1.5
