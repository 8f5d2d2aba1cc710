"""The reaper: ``leases.reap`` / ``leases.find_stale`` and ``reaper.reap_once``.

Leases are expired with UPDATEs relative to the database clock (``Now()``), never
Python's clock. The tests run in autocommit (``transaction=True``), as reapers and
workers do.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.db.models.functions import Now

from django_leasejobs import leases, reaper
from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.leases import CancelResult, ReapedJob
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.signals import job_reaped
from tests.helpers_leases import (
    LEASE,
    TASK_PATH,
    THREAD_TIMEOUT,
    attempt_rows,
    claim_one,
    expire,
    make_job,
    make_jobs,
    make_ready,
    row,
    run_in_threads,
    seconds_from_db_now,
)

# The contract suite: every test runs once per path of the lease protocol (conftest.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("lease_path")]

LEASE_EXPIRED = "django_leasejobs.exceptions.LeaseExpired"
SLACK = 5.0


def running_job(worker: str = "worker-a", **fields: Any) -> Job:
    """A job claimed by ``worker`` (attempt = the given attempt + 1) with a live lease."""
    job = make_job(**fields)
    claim_one(worker, job.pk, backend=job.backend)
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def leasejobs_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog, fed by the ``django_leasejobs`` logger.

    The project's LOGGING gives that logger its own handler with ``propagate=False``, so
    records never reach caplog's root handler: attach caplog's handler to it directly
    (and keep propagation off meanwhile, so no record is captured twice).
    """
    logger = logging.getLogger("django_leasejobs")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture
def reaped_signals() -> Iterator[list[dict[str, Any]]]:
    """Every ``job_reaped`` signal sent during the test, as its keyword arguments."""
    received: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    job_reaped.connect(receiver, weak=False)
    try:
        yield received
    finally:
        job_reaped.disconnect(receiver)


# --------------------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "stall_count", "max_stalls", "expected"),
    [
        (0, 3, 0, 3, JobStatus.PENDING),  # first attempt, first stall
        (1, 3, 1, 3, JobStatus.PENDING),  # second attempt, second stall
        (2, 3, 0, 3, JobStatus.FAILED),  # last attempt
        (5, 3, 0, 3, JobStatus.FAILED),  # past the last attempt (e.g. after releases)
        (0, 3, 2, 3, JobStatus.DEAD),  # last stall
        (2, 3, 2, 3, JobStatus.DEAD),  # both used up: dead wins
        (0, 1, 0, 3, JobStatus.FAILED),  # max_attempts=1
        (0, 3, 0, 1, JobStatus.DEAD),  # max_stalls=1
    ],
)
def test_reap_outcome(
    attempt: int, max_attempts: int, stall_count: int, max_stalls: int, expected: str
) -> None:
    job = running_job(
        "worker-old",
        attempt=attempt,
        max_attempts=max_attempts,
        stall_count=stall_count,
        max_stalls=max_stalls,
        queue="low",
    )
    assert job.attempt == attempt + 1
    expire(job.pk)

    reaped = leases.reap().jobs

    assert reaped == [
        ReapedJob(
            id=job.pk,
            attempt=attempt + 1,
            worker="worker-old",
            status=expected,
            queue="low",
            task_path=TASK_PATH,
            stall_count=stall_count + 1,
            backend="default",
        )
    ]
    stored = row(job.pk)
    assert stored["status"] == expected
    assert stored["attempt"] == attempt + 1
    assert stored["stall_count"] == stall_count + 1
    assert (stored["locked_by"], stored["locked_until"]) == (None, None)
    assert stored["last_worker"] == "worker-old"
    assert stored["last_error"].startswith(LEASE_EXPIRED + ": lease expired")
    (recorded,) = attempt_rows(job.pk)
    assert recorded.attempt == attempt + 1
    assert recorded.outcome == AttemptOutcome.LEASE_EXPIRED
    assert recorded.worker == "worker-old"
    assert recorded.error_class == LEASE_EXPIRED
    assert recorded.started_at == job.last_attempted_at
    if expected == JobStatus.PENDING:
        assert stored["finished_at"] is None
        # Runnable at once, in its old place in the claim order (run_after kept).
        assert stored["run_after"] == job.run_after
        again = claim_one("worker-new", job.pk)
        assert again.attempt == attempt + 2
    else:
        assert -SLACK < seconds_from_db_now(stored["finished_at"]) <= 0.5
        assert stored["run_after"] == job.run_after
        assert leases.claim("worker-new", limit=10, lease_duration=LEASE) == []


def test_stalls_add_up_to_dead_one_reap_at_a_time() -> None:
    job = make_job(max_attempts=10, max_stalls=3)
    statuses = []
    for n in (1, 2, 3):
        claimed = claim_one(f"worker-{n}", job.pk)
        assert claimed.attempt == n
        expire(job.pk)
        (reaped,) = leases.reap().jobs
        statuses.append((reaped.status, reaped.stall_count, row(job.pk)["stall_count"]))

    assert statuses == [
        (JobStatus.PENDING, 1, 1),
        (JobStatus.PENDING, 2, 2),
        (JobStatus.DEAD, 3, 3),
    ]
    assert [(a.attempt, a.worker, a.outcome) for a in attempt_rows(job.pk)] == [
        (n, f"worker-{n}", AttemptOutcome.LEASE_EXPIRED) for n in (1, 2, 3)
    ]
    assert leases.reap().jobs == []


def test_reap_respects_stale_lock_age() -> None:
    job = running_job()
    expire(job.pk, seconds_ago=5)
    before = row(job.pk)

    assert leases.reap(stale_lock_age=60).jobs == []
    assert row(job.pk) == before
    assert leases.find_stale(stale_lock_age=60) == []

    assert [r.id for r in leases.reap(stale_lock_age=1).jobs] == [job.pk]
    assert row(job.pk)["status"] == JobStatus.PENDING


def test_live_leases_are_never_reaped() -> None:
    live = running_job("worker-live")
    nearly = running_job("worker-nearly")
    Job.objects.filter(pk=nearly.pk).update(locked_until=Now() + timedelta(seconds=2))
    stale = running_job("worker-dead")
    expire(stale.pk)
    done = running_job("worker-done")
    leases.complete(done.pk, 1, "worker-done", result=1)
    pending = make_job()
    untouched = {pk: row(pk) for pk in (live.pk, nearly.pk, pending.pk, done.pk)}

    reaped = leases.reap(stale_lock_age=0).jobs

    assert [r.id for r in reaped] == [stale.pk]
    assert {pk: row(pk) for pk in untouched} == untouched
    assert list(JobAttempt.objects.values_list("job_id", flat=True)) == [stale.pk]
    assert leases.reap().jobs == []


def test_reap_filters_by_backend() -> None:
    mine = running_job("worker-a")
    other = running_job("worker-b", backend="other")
    expire(mine.pk, other.pk)

    assert [r.id for r in leases.reap(backend="nowhere").jobs] == []
    assert [r.id for r in leases.reap(backend="other").jobs] == [other.pk]
    assert row(mine.pk)["status"] == JobStatus.RUNNING
    assert [r.id for r in leases.reap(backend=None).jobs] == [mine.pk]


def test_find_stale_lists_and_changes_nothing() -> None:
    live = running_job("worker-live")
    stale = [running_job(f"worker-{n}") for n in range(3)]
    other = running_job("worker-o", backend="other")
    expire(*[j.pk for j in stale], other.pk)
    before = {j.pk: row(j.pk) for j in Job.objects.all()}

    found = leases.find_stale()

    assert [j.pk for j in found] == sorted([*(j.pk for j in stale), other.pk])
    assert all(isinstance(j, Job) and j.status == JobStatus.RUNNING for j in found)
    assert {j.pk: j.locked_by for j in found}[stale[0].pk] == "worker-0"
    assert [j.pk for j in leases.find_stale(backend="default")] == [j.pk for j in stale]
    assert [j.pk for j in leases.find_stale(backend="other")] == [other.pk]
    assert leases.find_stale(stale_lock_age=3600) == []
    assert {j.pk: row(j.pk) for j in Job.objects.all()} == before
    assert not JobAttempt.objects.exists()
    assert live.pk not in {j.pk for j in found}


def test_reaping_a_job_with_a_cancel_request_cancels_it() -> None:
    # The operator's cancel wins: the job must not run again after its worker died.
    job = running_job(max_stalls=5)
    assert leases.cancel(job.pk) is CancelResult.REQUESTED
    expire(job.pk)

    (reaped,) = leases.reap().jobs

    assert (reaped.id, reaped.status, reaped.stall_count) == (job.pk, JobStatus.CANCELLED, 1)
    stored = row(job.pk)
    assert stored["status"] == JobStatus.CANCELLED
    assert (stored["locked_by"], stored["locked_until"]) == (None, None)
    assert stored["finished_at"] is not None
    assert stored["run_after"] == job.run_after
    (recorded,) = attempt_rows(job.pk)
    assert (recorded.attempt, recorded.outcome) == (1, AttemptOutcome.LEASE_EXPIRED)
    make_ready(job.pk)
    assert leases.claim("worker-b", limit=10, lease_duration=LEASE) == []


# --------------------------------------------------------------------------- races


def test_two_concurrent_reapers_reap_each_job_once() -> None:
    total = 500
    ids = make_jobs(total, max_stalls=5)
    claimed = leases.claim("worker-gone", limit=total, lease_duration=LEASE)
    assert len(claimed) == total
    assert expire() == total

    first, second = (done.jobs for done in run_in_threads([leases.reap, leases.reap]))

    first_ids = [r.id for r in first]
    second_ids = [r.id for r in second]
    assert len(first_ids) + len(second_ids) == total
    assert not set(first_ids) & set(second_ids), "a job was reaped by both reapers"
    assert sorted(first_ids + second_ids) == ids
    assert {(r.attempt, r.stall_count, r.status) for r in first + second} == {
        (1, 1, JobStatus.PENDING)
    }
    stored = set(Job.objects.values_list("status", "attempt", "stall_count", "locked_by"))
    assert stored == {(JobStatus.PENDING, 1, 1, None)}
    per_job = Counter(JobAttempt.objects.values_list("job_id", flat=True))
    assert per_job == dict.fromkeys(ids, 1)
    assert set(JobAttempt.objects.values_list("attempt", "outcome", "worker")) == {
        (1, AttemptOutcome.LEASE_EXPIRED, "worker-gone")
    }


def test_completion_before_the_reap_is_kept() -> None:
    job = running_job()
    expire(job.pk)

    # The holder is late, but nobody took the job yet: its completion counts.
    leases.complete(job.pk, 1, "worker-a", result="done")
    done = row(job.pk)

    assert leases.reap().jobs == []
    assert row(job.pk) == done
    assert done["status"] == JobStatus.SUCCEEDED and done["result"] == "done"
    assert not JobAttempt.objects.exists()


def test_reap_before_the_completion_fences_the_holder() -> None:
    job = running_job()
    expire(job.pk)
    assert [r.id for r in leases.reap().jobs] == [job.pk]
    reaped = row(job.pk)

    with pytest.raises(LeaseLost):
        leases.complete(job.pk, 1, "worker-a", result="too late")

    assert row(job.pk) == reaped
    assert reaped["status"] == JobStatus.PENDING and reaped["result"] is None
    assert len(attempt_rows(job.pk)) == 1


def test_completions_racing_the_reaper_end_one_way_or_the_other() -> None:
    # Two lease holders complete their (expired) jobs while a reaper runs. Every job
    # ends either succeeded (its complete returned) or reaped (its complete raised
    # LeaseLost): never both, never neither.
    total, head_start = 300, 25
    ids = make_jobs(total)
    holders = ("holder-even", "holder-odd")
    mine: dict[str, list[int]] = {holder: [] for holder in holders}
    for n, pk in enumerate(ids):  # claim_one takes the oldest job: go in id order
        holder = holders[n % 2]
        claim_one(holder, pk)
        mine[holder].append(pk)
    assert expire() == total
    started = [threading.Event() for _ in holders]
    finished = threading.Event()
    completed: list[int] = []
    lost: list[int] = []

    def holder_run(index: int) -> None:
        holder = holders[index]
        for n, pk in enumerate(mine[holder], start=1):
            try:
                leases.complete(pk, 1, holder, result=pk)
            except LeaseLost:
                lost.append(pk)
            else:
                completed.append(pk)
            if n == head_start:
                started[index].set()
        started[index].set()

    def holders_run() -> None:
        try:
            run_in_threads([lambda: holder_run(0), lambda: holder_run(1)])
        finally:
            finished.set()

    def reaper_run() -> list[ReapedJob]:
        for event in started:
            assert event.wait(THREAD_TIMEOUT)
        reaped = leases.reap().jobs
        while not finished.is_set():
            reaped += leases.reap().jobs
            finished.wait(0.005)
        return reaped + leases.reap().jobs

    _, reaped = run_in_threads([holders_run, reaper_run])

    reaped_ids = [r.id for r in reaped]
    assert len(reaped_ids) == len(set(reaped_ids)), "a job was reaped twice"
    assert not set(completed) & set(lost)
    assert sorted(completed + lost) == ids
    assert sorted(reaped_ids) == sorted(lost), "reaped jobs and LeaseLost completions differ"
    assert len(completed) >= 2 * head_start
    rows = {
        pk: (status, result, stall)
        for pk, status, result, stall in Job.objects.values_list(
            "id", "status", "result", "stall_count"
        )
    }
    for pk in completed:
        assert rows[pk] == (JobStatus.SUCCEEDED, pk, 0), pk
    for pk in lost:
        assert rows[pk] == (JobStatus.PENDING, None, 1), pk
    assert sorted(JobAttempt.objects.values_list("job_id", flat=True)) == sorted(lost)


# --------------------------------------------------------------------------- reap_once


def test_reap_once_logs_and_signals_what_it_reaped(
    leasejobs_log: pytest.LogCaptureFixture, reaped_signals: list[dict[str, Any]]
) -> None:
    jobs = [running_job(f"worker-{n}") for n in range(3)]
    live = running_job("worker-live")
    dead = running_job("worker-x", max_stalls=1)
    expire(*[j.pk for j in jobs], dead.pk)
    expected_ids = sorted([*(j.pk for j in jobs), dead.pk])

    reaped = reaper.reap_once(stale_lock_age=0, backend="default", using="default")

    assert sorted(r.id for r in reaped) == expected_ids
    summary = [
        r for r in leasejobs_log.records if r.getMessage().startswith("released stale running")
    ]
    assert len(summary) == 1
    record = summary[0]
    assert record.name == "django_leasejobs"
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "released stale running jobs count=4"
    assert record.count == 4
    assert sorted(record.job_ids) == expected_ids
    assert record.by_status == {JobStatus.PENDING: 3, JobStatus.DEAD: 1}
    assert (record.backend, record.reaper) == ("default", "reap_stale_locks")
    assert record.duration >= 0
    per_job = {r.job_id: r for r in leasejobs_log.records if hasattr(r, "job_id")}
    assert sorted(per_job) == expected_ids
    assert per_job[dead.pk].status == JobStatus.DEAD and per_job[dead.pk].worker == "worker-x"

    assert sorted(s["job_id"] for s in reaped_signals) == expected_ids
    by_job = {s["job_id"]: s for s in reaped_signals}
    assert by_job[jobs[1].pk]["worker_id"] == "worker-1"
    assert by_job[jobs[1].pk]["attempt"] == 1
    assert by_job[jobs[1].pk]["status"] == JobStatus.PENDING
    assert by_job[dead.pk]["status"] == JobStatus.DEAD
    assert all(s["backend"] == "default" for s in reaped_signals)
    assert live.pk not in by_job


def test_reap_once_with_nothing_to_reap_is_silent(
    leasejobs_log: pytest.LogCaptureFixture, reaped_signals: list[dict[str, Any]]
) -> None:
    running_job()  # a live lease
    make_job()  # a pending job

    assert reaper.reap_once(stale_lock_age=0, backend="default", using="default") == []

    assert [r for r in leasejobs_log.records if r.name.startswith("django_leasejobs")] == []
    assert reaped_signals == []


def test_reap_once_passes_its_reaper_name(leasejobs_log: pytest.LogCaptureFixture) -> None:
    job = running_job()
    expire(job.pk)

    reaper.reap_once(stale_lock_age=0, backend=None, using="default", reaper="worker-7/reaper")

    (record,) = [r for r in leasejobs_log.records if hasattr(r, "count")]
    assert (record.reaper, record.backend, record.job_ids) == ("worker-7/reaper", None, [job.pk])


def test_job_reaped_is_sent_by_the_backend_class() -> None:
    job = running_job()
    expire(job.pk)
    received: list[int] = []

    def receiver(sender: Any, job_id: int, **kwargs: Any) -> None:
        received.append(job_id)

    job_reaped.connect(receiver, sender=LeaseJobsBackend, weak=False)
    try:
        reaper.reap_once(stale_lock_age=0, backend="default", using="default")
    finally:
        job_reaped.disconnect(receiver, sender=LeaseJobsBackend)

    assert received == [job.pk]


def test_job_reaped_names_the_jobs_backend_when_reaping_every_backend(
    reaped_signals: list[dict[str, Any]],
) -> None:
    job = running_job(backend="other")
    expire(job.pk)

    reaper.reap_once(stale_lock_age=0, backend=None, using="default")

    assert [(s["job_id"], s["backend"]) for s in reaped_signals] == [(job.pk, "other")]


def test_a_reaped_cancel_requested_job_ends_cancelled_with_the_flag_cleared() -> None:
    # Every transition that ends an attempt clears cancel_requested; the reap too.
    job = make_job()
    claim_one("worker-old", job.pk)
    assert leases.cancel(job.pk) == leases.CancelResult.REQUESTED
    expire(job.pk)

    [reaped] = leases.reap().jobs

    assert reaped.status == JobStatus.CANCELLED
    stored = row(job.pk)
    assert (stored["status"], stored["cancel_requested"]) == (JobStatus.CANCELLED, False)
    assert stored["finished_at"] is not None


class Commits:
    """Counts the commits of the test's connection (Django commits through
    ``connection.commit()`` at the end of an outermost ``atomic``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        commit = connection.commit

        def counting() -> None:
            self.count += 1
            commit()

        monkeypatch.setattr(connection, "commit", counting)


def test_a_reap_pass_is_one_commit_where_no_deadlock_victim_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle worker's housekeeping thread runs a pass every ``STALE_LOCK_INTERVAL``: the reap
    and the repair of waiting workflow steps in one transaction (MySQL/MariaDB: two, so
    that a deadlock victim can be run again)."""
    job = running_job()
    expire(job.pk)
    commits = Commits(monkeypatch)
    assert [r.id for r in leases.reap(using="default").jobs] == [job.pk]
    assert commits.count == (2 if connection.vendor == "mysql" else 1)


class FailRepair:
    """An execute wrapper: the repair's look for waiting steps fails."""

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "'waiting'" in sql:
            raise OperationalError("the repair failed")
        return execute(sql, params, many, context)


@pytest.fixture
def expired_job() -> int:
    """The id of a running job whose lease has expired: a reap's one job."""
    job = running_job()
    expire(job.pk)
    return job.pk


def test_a_failed_repair_of_waiting_steps_leaves_the_reap_standing(
    expired_job: int, leasejobs_log: pytest.LogCaptureFixture
) -> None:
    if connection.vendor == "mysql":
        pytest.skip("MySQL/MariaDB commit the reap before the repair (its own transaction)")
    with connection.execute_wrapper(FailRepair()):
        done = leases.reap(using="default")
    assert [r.id for r in done.jobs] == [expired_job]
    assert isinstance(done.repair_error, OperationalError)
    assert str(done.repair_error) == "the repair failed"
    assert row(expired_job)["status"] == JobStatus.PENDING
    assert len(attempt_rows(expired_job)) == 1
    assert leasejobs_log.records == []  # (the caller logs it: reap_once, housekeeping)


def test_a_failed_repair_of_waiting_steps_raises_after_the_reap_on_mysql(expired_job: int) -> None:
    if connection.vendor != "mysql":
        pytest.skip("elsewhere the repair is a savepoint of the reap's transaction")
    with connection.execute_wrapper(FailRepair()), pytest.raises(OperationalError):
        leases.reap(using="default")
    assert row(expired_job)["status"] == JobStatus.PENDING  # (committed before the repair)
    assert len(attempt_rows(expired_job)) == 1


def test_reap_once_logs_a_failed_repair_of_waiting_steps(
    expired_job: int, leasejobs_log: pytest.LogCaptureFixture
) -> None:
    if connection.vendor == "mysql":
        pytest.skip("MySQL/MariaDB: the failed repair raises")
    with connection.execute_wrapper(FailRepair()):
        reaped = reaper.reap_once(stale_lock_age=0, backend="default", using="default")
    assert [r.id for r in reaped] == [expired_job]
    (warning,) = [
        r for r in leasejobs_log.records if r.getMessage().startswith("repair of waiting")
    ]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == "repair of waiting workflow steps failed: the repair failed"
    assert (warning.backend, warning.error, warning.reaper) == (
        "default",
        "the repair failed",
        "reap_stale_locks",
    )
    # The reap is announced as ever.
    assert [r.getMessage() for r in leasejobs_log.records if hasattr(r, "count")] == [
        "released stale running jobs count=1"
    ]
