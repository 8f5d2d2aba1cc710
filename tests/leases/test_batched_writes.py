"""The lease holder's batched writes: ``complete_many``, ``fail_many`` and ``unclaim``.

A worker writes every success of a database round in one fenced UPDATE, every
failure in one fenced UPDATE plus one INSERT of attempt rows, and gives back the
prefetched jobs it never started (``django_leasejobs/worker/rounds.py``). Each row of
a batch is fenced like the single transitions in ``tests/test_leases.py``: a lease
that was lost is left out of the result and its row is not touched, while the rest
of the batch is written.

Like ``tests/test_leases.py``, the tests run in autocommit (``transaction=True``), as
a worker's database thread does.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from django_leasejobs import leases
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.leases import CancelResult, Completion, ErrorInfo, Failure, Progress
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests.helpers_leases import (
    LEASE,
    THREAD_TIMEOUT,
    attempt_rows,
    claim_one,
    expire,
    job_table_scans,
    make_job,
    make_jobs,
    make_ready,
    row,
    run_in_threads,
    seconds_from_db_now,
)

# The contract suite: every test runs once per path of the lease protocol (conftest.py).
pytestmark = pytest.mark.usefixtures("lease_path")

db = pytest.mark.django_db(transaction=True)

ON_POSTGRESQL = connection.vendor == "postgresql"
ERROR = ErrorInfo("builtins.ValueError", "bad value", "Traceback (most recent call last):\n...")
# Slack for "roughly now" comparisons on the database clock (slow CI machines).
SLACK = 5.0
# Slack when a time is bracketed by two readings of the database clock.
TIGHT = 0.5

Lease = tuple[int, int]
T = TypeVar("T")


def complete_many(worker: str, completions: Any) -> frozenset[tuple[int, int]]:
    """The leases ``leases.complete_many`` wrote (none of these tests lock rows elsewhere)."""
    result = leases.complete_many(worker, completions)
    assert result.skipped == frozenset()
    return frozenset(result.written)


def fail_many(worker: str, failures: Any) -> dict[tuple[int, int], str]:
    """Each lease ``leases.fail_many`` wrote and the job's new status."""
    result = leases.fail_many(worker, failures)
    assert result.skipped == frozenset()
    return result.written


# --------------------------------------------------------------------------- helpers


def claim_batch(worker: str, count: int, **fields: Any) -> list[leases.ClaimedJob]:
    """Create ``count`` pending jobs and claim them all for ``worker``; sorted by id.

    Only the new jobs may be ready: any other pending job must be parked in the future.
    """
    ids = make_jobs(count, **fields)
    claimed = leases.claim(worker, limit=count, lease_duration=LEASE)
    assert sorted(c.id for c in claimed) == ids
    assert {c.attempt for c in claimed} == {1}
    return sorted(claimed, key=lambda c: c.id)


def park(job_id: int) -> None:
    """Move a pending job's ``run_after`` an hour ahead, so later claims skip it."""
    assert Job.objects.filter(pk=job_id).update(run_after=Now() + timedelta(hours=1)) == 1


def lost_leases(worker: str) -> dict[str, Lease]:
    """Leases that ``worker`` no longer holds, one per way of losing one.

    Called before the test's own jobs exist: every claim here takes the one job it
    just created, and every job left pending is parked, so later claims skip them.
    """
    lost: dict[str, Lease] = {}

    # Another worker holds the lease (same attempt number): only locked_by differs.
    job = make_job()
    theirs = claim_one("worker-b", job.pk)
    lost["other worker"] = (job.pk, theirs.attempt)

    # The same worker released attempt 1 and re-claimed attempt 2: only the attempt differs.
    job = make_job()
    first = claim_one(worker, job.pk)
    leases.release(job.pk, first.attempt, worker)
    assert claim_one(worker, job.pk).attempt == 2
    lost["stale attempt (released, re-claimed)"] = (job.pk, first.attempt)

    # Reaped after its lease expired, and re-claimed by another worker.
    job = make_job()
    first = claim_one(worker, job.pk)
    expire(job.pk)
    assert [r.id for r in leases.reap().jobs] == [job.pk]
    assert claim_one("worker-b", job.pk).attempt == 2
    lost["stale attempt (reaped, re-claimed)"] = (job.pk, first.attempt)

    # Reaped and not re-claimed yet: pending, the lease columns cleared.
    job = make_job()
    first = claim_one(worker, job.pk)
    expire(job.pk)
    assert [r.id for r in leases.reap().jobs] == [job.pk]
    park(job.pk)
    lost["reaped, pending"] = (job.pk, first.attempt)

    # Finished already (a duplicate write of the same outcome).
    job = make_job()
    first = claim_one(worker, job.pk)
    leases.complete(job.pk, first.attempt, worker, result="first")
    lost["finished"] = (job.pk, first.attempt)

    # Not running, yet locked_by and attempt still match: only the status clause fences it.
    # (The protocol never leaves such a row; the check constraint allows it.)
    job = make_job()
    first = claim_one(worker, job.pk)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PENDING)
    park(job.pk)
    assert (row(job.pk)["locked_by"], row(job.pk)["attempt"]) == (worker, first.attempt)
    lost["not running, lease columns intact"] = (job.pk, first.attempt)

    lost["no such job"] = (10**12, 1)
    return lost


def snapshot(leases_: Sequence[Lease]) -> dict[int, tuple[dict[str, Any], list[Any]]]:
    """Each job's row and attempt rows, to show that a fenced write changed nothing."""
    return {
        job_id: (
            row(job_id),
            list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt").values()),
        )
        for job_id, _ in leases_
        if Job.objects.filter(pk=job_id).exists()
    }


def shuffled(items: Sequence[T], seed: int) -> list[T]:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


def between_db_clock(
    before: datetime, after: datetime, value: datetime | None, plus: float
) -> bool:
    """``value`` is ``plus`` seconds after some database time between two readings."""
    assert value is not None
    low = before + timedelta(seconds=plus - TIGHT)
    high = after + timedelta(seconds=plus + TIGHT)
    return low <= value <= high


def statements(queries: Sequence[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries]


TRANSACTION_WORDS = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def is_transaction_statement(sql: str) -> bool:
    return sql.strip().upper().startswith(TRANSACTION_WORDS)


# --------------------------------------------------------------------------- complete_many


@db
@pytest.mark.parametrize("write", ["complete_many", "fail_many"])
def test_a_batched_write_of_one_held_lease_runs_on_this_database(write: str) -> None:
    # The smallest batch, on its own. (SQLite once rejected these statements: their
    # RETURNING named the updated table's alias, "RETURNING j.id", which SQLite refuses.)
    claimed = claim_one("worker-a", make_job().pk)
    if write == "complete_many":
        written: Any = complete_many("worker-a", [Completion(*claimed.lease, 3)])
        assert written == {claimed.lease}
        assert row(claimed.id)["status"] == JobStatus.SUCCEEDED
    else:
        written = fail_many("worker-a", [Failure(*claimed.lease, ERROR, None)])
        assert written == {claimed.lease: JobStatus.FAILED}
        assert row(claimed.id)["status"] == JobStatus.FAILED


@db
def test_complete_many_writes_every_held_lease_in_the_batch() -> None:
    results: list[Any] = [
        {"sum": 3, "items": [1, 2], "nested": {"ok": True}},
        [1, "two", None, 3.5],
        "sent",
        '{"looks": "like json"}',  # a str stays a str: not decoded into a dict
        "quote ' and \" and unicode é ✓",
        42,
        2.5,
        0,
        True,
        None,
    ]
    claimed = claim_batch("worker-a", len(results))
    leases.set_progress(claimed[0].id, 1, "worker-a", Progress(0.3, "working"))
    leases.set_progress(claimed[1].id, 1, "worker-a", Progress(None, "only a message"))
    assert leases.cancel(claimed[2].id) is CancelResult.REQUESTED
    completions = [Completion(c.id, c.attempt, r) for c, r in zip(claimed, results, strict=True)]
    before = leases.database_now()

    written = complete_many("worker-a", completions)

    after = leases.database_now()
    assert written == frozenset(c.lease for c in claimed)
    assert isinstance(written, frozenset)
    for job, result in zip(claimed, results, strict=True):
        stored = row(job.id)
        assert stored["status"] == JobStatus.SUCCEEDED
        assert stored["result"] == result
        assert type(stored["result"]) is type(result)
        assert (stored["locked_by"], stored["locked_until"]) == (None, None)
        assert stored["cancel_requested"] is False
        assert stored["attempt"] == 1
        assert before <= stored["finished_at"] <= after
    # A None result is SQL NULL, as complete() stores it (not the JSON value null).
    assert Job.objects.filter(pk=claimed[-1].id, result__isnull=True).exists()
    assert not Job.objects.filter(pk=claimed[-2].id, result__isnull=True).exists()
    # Progress becomes 1.0 only where a fraction was set; a finished job keeps no stale
    # message ("100% working").
    assert (row(claimed[0].id)["progress"], row(claimed[0].id)["progress_message"]) == (1.0, "")
    assert (row(claimed[1].id)["progress"], row(claimed[1].id)["progress_message"]) == (None, "")
    assert all(row(c.id)["progress"] is None for c in claimed[2:])
    # A success writes no attempt row.
    assert JobAttempt.objects.count() == 0


@db
@pytest.mark.parametrize(
    "result",
    [
        {"a": [1, {"b": None}]},
        ["x", 1, 2.25, False],
        "plain",
        "",
        "null",
        12345678901234567890,
        -7,
        0.1,
        None,
    ],
    ids=["dict", "list", "str", "empty-str", "str-null", "bigint", "int", "float", "none"],
)
def test_complete_many_stores_results_exactly_as_complete_does(result: Any) -> None:
    single, batched = claim_batch("worker-a", 2)

    leases.complete(single.id, single.attempt, "worker-a", result=result)
    assert complete_many("worker-a", [Completion(*batched.lease, result)]) == {batched.lease}

    assert row(batched.id)["result"] == row(single.id)["result"] == result
    assert type(row(batched.id)["result"]) is type(result)
    # SQL NULL only for None; JSON-null-looking strings and falsy values are values.
    for job in (single, batched):
        assert Job.objects.filter(pk=job.id, result__isnull=True).exists() is (result is None)
    # The same state apart from the times.
    times = ("finished_at", "locked_until", "heartbeat_at", "started_at", "last_attempted_at")
    a, b = row(single.id), row(batched.id)
    ignore = {"id", "args", "enqueued_at", "run_after", *times}
    assert {k: v for k, v in a.items() if k not in ignore} == {
        k: v for k, v in b.items() if k not in ignore
    }


@db
def test_complete_many_skips_lost_leases_and_writes_the_rest() -> None:
    lost = lost_leases("worker-a")
    mine = claim_batch("worker-a", 3)
    untouched = snapshot(list(lost.values()))
    batch = [Completion(*lease, {"zombie": name}) for name, lease in lost.items()]
    # The held leases first, in the middle and last: position in the batch does not matter.
    batch.insert(0, Completion(*mine[0].lease, "one"))
    batch.insert(4, Completion(*mine[1].lease, "two"))
    batch.append(Completion(*mine[2].lease, "three"))

    written = complete_many("worker-a", batch)

    assert written == {m.lease for m in mine}
    assert [row(m.id)["result"] for m in mine] == ["one", "two", "three"]
    assert {row(m.id)["status"] for m in mine} == {JobStatus.SUCCEEDED}
    for name, lease in lost.items():
        assert lease not in written, name
    assert snapshot(list(lost.values())) == untouched
    # The current holders of the lost jobs still hold their leases.
    released = (lost["stale attempt (released, re-claimed)"][0], 2)
    reaped = (lost["stale attempt (reaped, re-claimed)"][0], 2)
    assert leases.renew("worker-a", [released], lease_duration=LEASE).held == {released}
    theirs = [reaped, lost["other worker"]]
    assert leases.renew("worker-b", theirs, lease_duration=LEASE).held == set(theirs)


@db
def test_batched_writes_of_an_expired_lease_not_yet_reaped_still_land() -> None:
    # The fence is status + worker + attempt, never the clock (as for renew): until the
    # reaper takes a job, its holder may still record the outcome.
    done, failed = claim_batch("worker-a", 2)
    assert expire(done.id, failed.id) == 2

    assert complete_many("worker-a", [Completion(*done.lease, "late")]) == {done.lease}
    assert fail_many("worker-a", [Failure(*failed.lease, ERROR, None)]) == {
        failed.lease: JobStatus.FAILED
    }

    assert (row(done.id)["status"], row(done.id)["result"]) == (JobStatus.SUCCEEDED, "late")
    assert row(failed.id)["status"] == JobStatus.FAILED
    assert leases.reap().jobs == []


@db
def test_complete_many_of_only_lost_leases_writes_nothing() -> None:
    lost = lost_leases("worker-a")
    untouched = snapshot(list(lost.values()))

    assert complete_many("worker-a", [Completion(*x, 1) for x in lost.values()]) == set()

    assert snapshot(list(lost.values())) == untouched


@db
def test_complete_many_twice_writes_once() -> None:
    claimed = claim_batch("worker-a", 2)
    batch = [Completion(*c.lease, "first") for c in claimed]
    assert complete_many("worker-a", batch) == {c.lease for c in claimed}
    finished = [row(c.id) for c in claimed]

    again = complete_many("worker-a", [Completion(*c.lease, "second") for c in claimed])

    assert again == frozenset()
    assert [row(c.id) for c in claimed] == finished
    with pytest.raises(LeaseLost):
        leases.complete(claimed[0].id, claimed[0].attempt, "worker-a", result="third")


@db
def test_complete_many_of_nothing_sends_no_query() -> None:
    with CaptureQueriesContext(connection) as captured:
        assert complete_many("worker-a", []) == frozenset()
        assert complete_many("worker-a", ()) == frozenset()
    assert statements(captured.captured_queries) == []


@db
@pytest.mark.parametrize("size", [1, 20, 200])
def test_complete_many_is_one_statement(size: int, lease_path: str) -> None:
    """Batched: one statement for the whole batch. Portable (MySQL/MariaDB, and the path
    the fixture forces): the statements that path sends, and none of the batched ones."""
    claimed = claim_batch("worker-a", size)
    batch = [Completion(*c.lease, {"n": i}) for i, c in enumerate(shuffled(claimed, size))]

    with CaptureQueriesContext(connection) as captured:
        written = complete_many("worker-a", batch)

    sql = statements(captured.captured_queries)
    if lease_path == "batched":
        assert len(sql) == 1, sql
        assert "UPDATE" in sql[0].upper()
    else:
        assert_portable_statements(sql)
    assert written == {c.lease for c in claimed}
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == size


def assert_portable_statements(sql: list[str]) -> None:
    """The portable path's write, three statements however many rows: the rows locked
    without waiting (where the database has row locks), one fenced UPDATE, the written
    rows read back; no RETURNING and no ``FROM (VALUES ...)``, which MySQL/MariaDB lack."""
    work = [s for s in sql if not is_transaction_statement(s)]
    assert len(work) == 3, work
    lock, *writes, read_back = work
    assert lock.upper().startswith("SELECT"), lock
    assert (
        "FOR UPDATE SKIP LOCKED" in lock.upper()
    ) == connection.features.has_select_for_update_skip_locked
    assert all(w.upper().startswith("UPDATE") and "j.attempt =" in w for w in writes), writes
    assert read_back.upper().startswith("SELECT"), read_back
    assert not any("RETURNING" in s.upper() or "(VALUES" in s.upper() for s in work), work


# --------------------------------------------------------------------------- fail_many


@db
def test_fail_many_decides_retry_failure_and_cancel_per_job() -> None:
    # (a) attempts left, retryable; (a2) the same with a fractional delay and on its
    # second attempt; (b) attempts used up; (c) no retry_delay; (d) cancel requested.
    retry, retry2, used_up, final, cancelled = claim_batch("worker-a", 5, max_attempts=3)
    Job.objects.filter(pk=used_up.id).update(max_attempts=1)
    # retry2 runs its second attempt: claim 1 failed and was retried.
    leases.fail(retry2.id, 1, "worker-a", error=ERROR, retry_delay=0)
    make_ready(retry2.id)
    retry2 = claim_one("worker-c", retry2.id)
    assert retry2.attempt == 2
    assert leases.cancel(cancelled.id) is CancelResult.REQUESTED
    run_after = {c.id: row(c.id)["run_after"] for c in (used_up, final, cancelled)}
    last_attempted = {
        c.id: row(c.id)["last_attempted_at"] for c in (retry, retry2, used_up, final, cancelled)
    }
    long_message = "m" * 5000
    timeout = ErrorInfo("django_leasejobs.exceptions.TaskTimeout", long_message, "tb: timeout")
    killed = ErrorInfo("django_leasejobs.exceptions.JobKilled", "", "")
    batch_a = [
        Failure(*retry.lease, ERROR, 30.0),
        Failure(*used_up.lease, timeout, 30.0, AttemptOutcome.TIMEOUT),
        Failure(*final.lease, killed, None, AttemptOutcome.KILLED),
        Failure(*cancelled.lease, ERROR, 30.0),
    ]
    batch_c = [Failure(*retry2.lease, ERROR, 2.5, AttemptOutcome.TIMEOUT)]
    before = leases.database_now()

    statuses_a = fail_many("worker-a", batch_a)
    statuses_c = fail_many("worker-c", batch_c)

    after = leases.database_now()
    assert statuses_a == {
        retry.lease: JobStatus.PENDING,
        used_up.lease: JobStatus.FAILED,
        final.lease: JobStatus.FAILED,
        cancelled.lease: JobStatus.CANCELLED,
    }
    assert statuses_c == {retry2.lease: JobStatus.PENDING}
    assert all(type(s) is str for s in [*statuses_a.values(), *statuses_c.values()])

    for job in (retry, retry2, used_up, final, cancelled):
        stored = row(job.id)
        assert (stored["locked_by"], stored["locked_until"]) == (None, None), job.id
        assert stored["cancel_requested"] is False
        assert stored["attempt"] == job.attempt
        assert stored["stall_count"] == 0
        assert stored["last_attempted_at"] == last_attempted[job.id]

    # (a) back to pending, runnable retry_delay seconds after the database's now.
    stored = row(retry.id)
    assert stored["status"] == JobStatus.PENDING and stored["finished_at"] is None
    assert between_db_clock(before, after, stored["run_after"], 30.0), stored["run_after"]
    stored = row(retry2.id)
    assert stored["status"] == JobStatus.PENDING and stored["finished_at"] is None
    assert between_db_clock(before, after, stored["run_after"], 2.5), stored["run_after"]
    # (b), (c), (d): finished now; run_after untouched.
    for job, status in ((used_up, "failed"), (final, "failed"), (cancelled, "cancelled")):
        stored = row(job.id)
        assert stored["status"] == status
        assert before <= stored["finished_at"] <= after
        assert stored["run_after"] == run_after[job.id]

    # last_error: "class: message", cut to MAX_ERROR_LENGTH with a marker; the class alone
    # when no message.
    assert row(retry.id)["last_error"] == "builtins.ValueError: bad value"
    assert row(used_up.id)["last_error"] == (
        "django_leasejobs.exceptions.TaskTimeout: " + leases.storable_text(long_message, 2000)
    )
    assert row(final.id)["last_error"] == "django_leasejobs.exceptions.JobKilled"

    # One attempt row per written failure, for the attempt that failed.
    def attempt_of(job_id: int, number: int) -> JobAttempt:
        return JobAttempt.objects.get(job_id=job_id, attempt=number)

    expected = {
        retry.id: (1, "worker-a", AttemptOutcome.ERROR, ERROR),
        used_up.id: (1, "worker-a", AttemptOutcome.TIMEOUT, timeout),
        final.id: (1, "worker-a", AttemptOutcome.KILLED, killed),
        cancelled.id: (1, "worker-a", AttemptOutcome.ERROR, ERROR),
        retry2.id: (2, "worker-c", AttemptOutcome.TIMEOUT, ERROR),
    }
    for job_id, (number, worker, outcome, error) in expected.items():
        got = attempt_of(job_id, number)
        assert (got.worker, got.outcome, got.error_class) == (
            worker,
            outcome,
            error.exception_class_path,
        )
        assert got.error_message == error.message[: leases.MAX_ERROR_LENGTH]
        assert got.traceback == error.traceback
        assert got.started_at == last_attempted[job_id]
        assert got.started_at is not None
        assert before <= got.finished_at <= after
    assert len(attempt_of(used_up.id, 1).error_message) == leases.MAX_ERROR_LENGTH
    assert [a.attempt for a in attempt_rows(retry2.id)] == [1, 2]
    assert JobAttempt.objects.count() == 6  # five from fail_many, one from the earlier fail()


@db
def test_fail_many_retried_job_is_claimable_once_due() -> None:
    soon, later = claim_batch("worker-a", 2, max_attempts=3)

    statuses = fail_many(
        "worker-a", [Failure(*soon.lease, ERROR, 0.0), Failure(*later.lease, ERROR, 3600.0)]
    )

    assert statuses == {soon.lease: JobStatus.PENDING, later.lease: JobStatus.PENDING}
    again = leases.claim("worker-b", limit=10, lease_duration=LEASE)
    assert [(j.id, j.attempt) for j in again] == [(soon.id, 2)]
    assert 3600 - SLACK < seconds_from_db_now(row(later.id)["run_after"]) <= 3600 + TIGHT


# Every combination of what fail() decides on: cancel requested, retry_delay, attempts left.
SCENARIOS = [
    (cancel, delay, used_up)
    for cancel in (False, True)
    for delay in (None, 0.0, 45.0)
    for used_up in (False, True)
]


def expected_status(cancel: bool, delay: float | None, used_up: bool) -> str:
    if cancel:
        return JobStatus.CANCELLED
    if delay is None or used_up:
        return JobStatus.FAILED
    return JobStatus.PENDING


@db
def test_fail_many_decides_like_fail_in_every_case() -> None:
    singles = claim_batch("worker-a", len(SCENARIOS))
    batched = claim_batch("worker-a", len(SCENARIOS))
    failures: list[Failure] = []
    outcomes = [AttemptOutcome.ERROR, AttemptOutcome.TIMEOUT, AttemptOutcome.KILLED]
    for i, ((cancel, delay, used_up), one, many) in enumerate(
        zip(SCENARIOS, singles, batched, strict=True)
    ):
        Job.objects.filter(pk__in=[one.id, many.id]).update(
            max_attempts=1 if used_up else 2, cancel_requested=cancel
        )
        error = ErrorInfo(f"tests.Error{i}", f"message {i}" if i % 3 else "", f"tb {i}")
        failures.append(Failure(many.id, many.attempt, error, delay, outcomes[i % 3]))
    run_after = {c.id: row(c.id)["run_after"] for c in batched}

    single_statuses = [
        leases.fail(
            one.id,
            one.attempt,
            "worker-a",
            error=f.error,
            retry_delay=f.retry_delay,
            outcome=f.outcome,
        )
        for one, f in zip(singles, failures, strict=True)
    ]
    batched_statuses = fail_many("worker-a", shuffled(failures, 7))

    assert batched_statuses == {
        c.lease: expected_status(*s) for c, s in zip(batched, SCENARIOS, strict=True)
    }
    assert single_statuses == [expected_status(*s) for s in SCENARIOS]
    compared = ("status", "attempt", "locked_by", "locked_until", "cancel_requested", "last_error")
    for scenario, one, many in zip(SCENARIOS, singles, batched, strict=True):
        a, b = row(one.id), row(many.id)
        assert {k: a[k] for k in compared} == {k: b[k] for k in compared}, scenario
        assert (a["finished_at"] is None) is (b["finished_at"] is None), scenario
        if expected_status(*scenario) == JobStatus.PENDING:
            assert scenario[1] is not None
            assert seconds_from_db_now(b["run_after"]) == pytest.approx(scenario[1], abs=SLACK)
            assert b["finished_at"] is None
        else:
            assert b["run_after"] == run_after[many.id], scenario
            assert b["finished_at"] is not None
        fields = ("attempt", "worker", "outcome", "error_class", "error_message", "traceback")
        single_attempts = list(JobAttempt.objects.filter(job_id=one.id).values(*fields))
        batched_attempts = list(JobAttempt.objects.filter(job_id=many.id).values(*fields))
        assert single_attempts == batched_attempts, scenario
        assert len(batched_attempts) == 1


@db
def test_fail_many_skips_lost_leases_and_writes_the_rest() -> None:
    lost = lost_leases("worker-a")
    mine = claim_batch("worker-a", 3, max_attempts=2)
    untouched = snapshot(list(lost.values()))
    delays = (None, 0.0, 60.0)
    outcomes = (AttemptOutcome.ERROR, AttemptOutcome.TIMEOUT, AttemptOutcome.KILLED)
    batch = [
        Failure(*lease, ErrorInfo("tests.Zombie", name), delays[i % 3], outcomes[i % 3])
        for i, (name, lease) in enumerate(lost.items())
    ]
    batch.insert(0, Failure(*mine[0].lease, ERROR, 60.0))
    batch.insert(3, Failure(*mine[1].lease, ERROR, None))
    batch.append(Failure(*mine[2].lease, ERROR, 60.0, AttemptOutcome.KILLED))

    statuses = fail_many("worker-a", batch)

    assert statuses == {
        mine[0].lease: JobStatus.PENDING,
        mine[1].lease: JobStatus.FAILED,
        mine[2].lease: JobStatus.PENDING,
    }
    for name, lease in lost.items():
        assert lease not in statuses, name
    assert snapshot(list(lost.values())) == untouched
    assert not JobAttempt.objects.filter(error_class="tests.Zombie").exists()
    assert [
        (a.job_id, a.attempt, a.outcome)
        for a in JobAttempt.objects.filter(job_id__in=[m.id for m in mine]).order_by("job_id")
    ] == [
        (mine[0].id, 1, AttemptOutcome.ERROR),
        (mine[1].id, 1, AttemptOutcome.ERROR),
        (mine[2].id, 1, AttemptOutcome.KILLED),
    ]


@db
def test_fail_many_of_only_lost_leases_writes_nothing() -> None:
    lost = lost_leases("worker-a")
    untouched = snapshot(list(lost.values()))
    attempts = JobAttempt.objects.count()

    statuses = fail_many("worker-a", [Failure(*x, ERROR, 0.0) for x in lost.values()])

    assert statuses == {}
    assert snapshot(list(lost.values())) == untouched
    assert JobAttempt.objects.count() == attempts


@db
def test_fail_many_twice_writes_once() -> None:
    claimed = claim_batch("worker-a", 2)
    batch = [Failure(*c.lease, ERROR, None) for c in claimed]
    assert set(fail_many("worker-a", batch)) == {c.lease for c in claimed}
    finished = snapshot([c.lease for c in claimed])

    assert fail_many("worker-a", batch) == {}

    assert snapshot([c.lease for c in claimed]) == finished
    assert JobAttempt.objects.count() == 2


@db
def test_fail_many_with_the_same_lease_twice_writes_it_once() -> None:
    one, two = claim_batch("worker-a", 2)
    batch = [
        Failure(*one.lease, ERROR, None),
        Failure(*two.lease, ERROR, None),
        Failure(*one.lease, ERROR, None),
    ]

    statuses = fail_many("worker-a", batch)

    assert statuses == {one.lease: JobStatus.FAILED, two.lease: JobStatus.FAILED}
    assert [(a.job_id, a.attempt) for a in JobAttempt.objects.order_by("job_id")] == [
        (one.id, 1),
        (two.id, 1),
    ]


@db
def test_fail_many_of_nothing_sends_no_query() -> None:
    with CaptureQueriesContext(connection) as captured:
        assert fail_many("worker-a", []) == {}
        assert fail_many("worker-a", ()) == {}
    assert statements(captured.captured_queries) == []


def _fail_many_statements(size: int) -> tuple[list[str], dict[Lease, str]]:
    claimed = claim_batch("worker-a", size, max_attempts=2)
    batch = [
        Failure(*c.lease, ERROR, None if i % 2 else 10.0, AttemptOutcome.ERROR)
        for i, c in enumerate(shuffled(claimed, size))
    ]
    with CaptureQueriesContext(connection) as captured:
        statuses = fail_many("worker-a", batch)
    assert set(statuses) == {c.lease for c in claimed}
    assert JobAttempt.objects.filter(job_id__in=[c.id for c in claimed]).count() == size
    return statements(captured.captured_queries), statuses


@db
def test_fail_many_query_count_does_not_grow_with_the_batch(lease_path: str) -> None:
    small, _ = _fail_many_statements(2)
    large, statuses = _fail_many_statements(20)
    assert sorted(statuses.values()).count(JobStatus.PENDING) == 10
    if lease_path == "portable":
        for sql in (small, large):
            work = [s for s in sql if not is_transaction_statement(s)]
            assert_portable_statements(work[:-1])
            assert work[-1].upper().lstrip().startswith("INSERT INTO"), work[-1]
        return

    # One UPDATE of the job rows and one INSERT of the attempt rows, in one transaction:
    # the transaction's own statements are BEGIN (SQLite's explicit one; PostgreSQL's
    # is implicit and logged as BEGIN by Django) and COMMIT.
    for sql in (small, large):
        work = [s for s in sql if not is_transaction_statement(s)]
        assert len(work) == 2, sql
        assert "UPDATE" in work[0].upper() and "RETURNING" in work[0].upper()
        assert work[1].upper().lstrip().startswith("INSERT INTO")
        assert "leasejobs_attempt" in work[1]
        assert [s.split()[0].upper() for s in sql if is_transaction_statement(s)] == [
            "BEGIN",
            "COMMIT",
        ], sql
        assert len(sql) == 4
    assert len(small) == len(large)


@db
def test_fail_many_with_no_lease_held_writes_no_attempt_rows(lease_path: str) -> None:
    # Nothing matched: the INSERT is not sent at all. (Where rows can be locked, rows
    # missing from the write are told apart by one SELECT: locked elsewhere, or lost.)
    lost = lost_leases("worker-a")
    with CaptureQueriesContext(connection) as captured:
        assert fail_many("worker-a", [Failure(*x, ERROR, 0) for x in lost.values()]) == {}
    work = [s for s in statements(captured.captured_queries) if not is_transaction_statement(s)]
    told_apart = ["SELECT"] if connection.features.has_select_for_update_skip_locked else []
    if lease_path == "batched":
        assert "UPDATE" in work[0].upper()
        assert [s.split()[0].upper() for s in work[1:]] == told_apart
    else:  # the rows are locked first: none is this worker's, so no UPDATE is sent
        assert [s.split()[0].upper() for s in work] == ["SELECT", *told_apart]
    assert not any("INSERT" in s.upper() for s in work)


# --------------------------------------------------------------------------- unclaim


@db
def test_unclaim_gives_back_a_first_attempt_as_if_never_claimed() -> None:
    job = make_job(stall_count=1, max_attempts=3)
    pending = row(job.pk)
    claimed = claim_one("worker-a", job.pk)
    assert row(job.pk)["started_at"] is not None

    given_back = leases.unclaim("worker-a", [claimed.lease])

    assert given_back == {claimed.lease}
    stored = row(job.pk)
    assert stored["status"] == JobStatus.PENDING
    assert stored["attempt"] == 0
    assert (stored["locked_by"], stored["locked_until"]) == (None, None)
    assert (stored["started_at"], stored["finished_at"]) == (None, None)
    assert stored["cancel_requested"] is False
    assert stored["stall_count"] == 1
    assert stored["run_after"] == pending["run_after"]
    assert JobAttempt.objects.count() == 0
    # Claimable at once, and the next claim runs attempt 1 again.
    again = claim_one("worker-b", job.pk)
    assert again.lease == claimed.lease == (job.pk, 1)


@db
def test_unclaim_of_a_later_attempt_keeps_started_at() -> None:
    job = make_job(max_attempts=3)
    first = claim_one("worker-a", job.pk)
    started_at = row(job.pk)["started_at"]
    assert leases.fail(job.pk, first.attempt, "worker-a", error=ERROR, retry_delay=0) == "pending"
    make_ready(job.pk)
    second = claim_one("worker-a", job.pk)
    assert second.attempt == 2

    assert leases.unclaim("worker-a", [second.lease]) == {second.lease}

    stored = row(job.pk)
    assert stored["status"] == JobStatus.PENDING
    assert stored["attempt"] == 1
    assert stored["started_at"] == started_at
    assert (stored["locked_by"], stored["locked_until"], stored["finished_at"]) == (
        None,
        None,
        None,
    )
    assert [(a.attempt, a.outcome) for a in attempt_rows(job.pk)] == [(1, AttemptOutcome.ERROR)]
    assert claim_one("worker-b", job.pk).attempt == 2


@db
def test_unclaim_of_a_cancel_requested_job_cancels_it() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    assert leases.cancel(job.pk) is CancelResult.REQUESTED
    before = leases.database_now()

    assert leases.unclaim("worker-a", [claimed.lease]) == {claimed.lease}

    after = leases.database_now()
    stored = row(job.pk)
    assert stored["status"] == JobStatus.CANCELLED
    assert before <= stored["finished_at"] <= after
    assert (stored["locked_by"], stored["locked_until"], stored["cancel_requested"]) == (
        None,
        None,
        False,
    )
    assert stored["attempt"] == 0
    assert JobAttempt.objects.count() == 0
    make_ready(job.pk)
    assert leases.claim("worker-b", limit=10, lease_duration=LEASE) == []
    assert leases.cancel(job.pk) is CancelResult.NOT_CANCELLABLE


@db
def test_unclaim_gives_back_only_held_leases() -> None:
    lost = lost_leases("worker-a")
    mine = claim_batch("worker-a", 3)
    untouched = snapshot(list(lost.values()))
    asked = [*lost.values(), *(m.lease for m in mine), mine[1].lease]  # one named twice

    given_back = leases.unclaim("worker-a", shuffled(asked, 3))

    assert given_back == {m.lease for m in mine}
    assert snapshot(list(lost.values())) == untouched
    for m in mine:
        stored = row(m.id)
        assert (stored["status"], stored["attempt"], stored["locked_by"]) == (
            JobStatus.PENDING,
            0,
            None,
        )
    assert not JobAttempt.objects.filter(job_id__in=[m.id for m in mine]).exists()


@db
def test_unclaim_of_nothing_sends_no_query() -> None:
    with CaptureQueriesContext(connection) as captured:
        assert leases.unclaim("worker-a", []) == frozenset()
        assert leases.unclaim("worker-a", iter(())) == frozenset()
    assert statements(captured.captured_queries) == []


@db
@pytest.mark.parametrize(
    "zombie_write",
    [
        "complete",
        "complete_many",
        "fail_many",
        "renew",
    ],
)
def test_an_unclaimed_lease_is_fenced_once_another_worker_claims_it(zombie_write: str) -> None:
    job = make_job()
    unclaimed = claim_one("worker-a", job.pk)
    assert leases.unclaim("worker-a", [unclaimed.lease]) == {unclaimed.lease}
    current = claim_one("worker-b", job.pk)
    assert current.lease == unclaimed.lease  # the same attempt number again
    before = snapshot([current.lease])

    if zombie_write == "complete":
        with pytest.raises(LeaseLost) as caught:
            leases.complete(job.pk, unclaimed.attempt, "worker-a", result="zombie")
        assert caught.value.transition == "complete"
    elif zombie_write == "complete_many":
        assert complete_many("worker-a", [Completion(*unclaimed.lease, "z")]) == set()
    elif zombie_write == "fail_many":
        assert fail_many("worker-a", [Failure(*unclaimed.lease, ERROR, None)]) == {}
    else:
        renewed = leases.renew("worker-a", [unclaimed.lease], lease_duration=999)
        assert renewed.lost == {unclaimed.lease}

    assert snapshot([current.lease]) == before
    assert row(job.pk)["locked_by"] == "worker-b"
    leases.complete(job.pk, current.attempt, "worker-b", result="real")
    assert (row(job.pk)["status"], row(job.pk)["result"]) == (JobStatus.SUCCEEDED, "real")


@db
def test_an_unclaimed_lease_cannot_be_given_back_twice_or_after_a_new_claim() -> None:
    job = make_job()
    unclaimed = claim_one("worker-a", job.pk)
    assert leases.unclaim("worker-a", [unclaimed.lease]) == {unclaimed.lease}
    pending = row(job.pk)

    # Already pending: the attempt counter must not go back again.
    assert leases.unclaim("worker-a", [unclaimed.lease]) == frozenset()
    assert row(job.pk) == pending
    current = claim_one("worker-b", job.pk)
    claimed_row = row(job.pk)
    # Another worker's claim of the same attempt number.
    assert leases.unclaim("worker-a", [unclaimed.lease]) == frozenset()
    assert row(job.pk) == claimed_row
    assert current.attempt == 1


# --------------------------------------------------------------------------- concurrency


@db
@pytest.mark.skipif(
    not ON_POSTGRESQL,
    reason="row locks and deadlocks are PostgreSQL's: SQLite serialises every writer",
)
def test_heartbeat_and_batched_writes_of_one_worker_do_not_deadlock() -> None:
    # A worker's heartbeat thread renews its leases while its database thread writes
    # batches over the same rows. Both lock rows in id order; otherwise PostgreSQL would
    # find a deadlock and abort one of them ("deadlock detected"), failing the test.
    count, rounds = 100, 50
    ids = [c.id for c in claim_batch("worker-a", count, max_attempts=10**6)]
    # Both threads start each round's statement together (the barrier), so that the
    # renewal and the batched write overlap as often as possible.
    together = threading.Barrier(2, timeout=THREAD_TIMEOUT)
    tally = {"renewed": 0, "completed": 0, "failed": 0, "unclaimed": 0}

    def current_leases() -> list[Lease]:
        return list(Job.objects.filter(pk__in=ids).values_list("id", "attempt"))

    def in_step(body: Callable[[int], None]) -> Callable[[], int]:
        def run() -> int:
            try:
                for loop in range(rounds):
                    together.wait()  # the previous round is over in both threads
                    body(loop)
            except threading.BrokenBarrierError:
                return -1  # the other thread failed: its error is the one reported
            except BaseException:
                together.abort()
                raise
            return rounds

        return run

    def heartbeat(loop: int) -> None:
        asked = current_leases()
        random.Random(loop).shuffle(asked)
        progress: dict[Lease, Progress | None] = {
            lease: Progress(0.5, f"loop {loop}") for lease in asked
        }
        together.wait()
        result = leases.renew("worker-a", progress, lease_duration=LEASE)
        # A row the writer holds locked right now is skipped, never waited for.
        assert result.held | result.lost | result.skipped == set(asked)
        tally["renewed"] += len(result.held)

    def writer(loop: int) -> None:
        held = current_leases()
        random.Random(-loop).shuffle(held)
        # Three quarters of the rows, named in descending id order: a statement that
        # locked rows in the order they are named would lock them in the opposite order
        # to the renewal.
        chosen = sorted(held[: count * 3 // 4], reverse=True)
        together.wait()
        if loop % 3 == 0:
            batch = [Completion(*lease, {"loop": loop}) for lease in chosen]
            written = leases.complete_many("worker-a", batch)
            tally["completed"] += len(written.written) + len(written.skipped)
        elif loop % 3 == 1:
            failures = [
                Failure(*lease, ERROR, None if i % 2 else 0.0) for i, lease in enumerate(chosen)
            ]
            written = leases.fail_many("worker-a", failures)
            tally["failed"] += len(written.written) + len(written.skipped)
        else:
            tally["unclaimed"] += len(leases.unclaim("worker-a", chosen))
        # Back to running for the next round, the rows locked in id order first (as the
        # lease functions lock them) so that the reset itself cannot deadlock.
        with transaction.atomic():
            jobs = Job.objects.filter(pk__in=[job_id for job_id, _ in chosen])
            assert len(jobs.select_for_update().order_by("id").values_list("id")) == len(chosen)
            jobs.update(
                status=JobStatus.RUNNING,
                attempt=F("attempt") + 1,
                locked_by="worker-a",
                locked_until=Now() + timedelta(seconds=LEASE),
                finished_at=None,
                cancel_requested=False,
            )

    loops = run_in_threads([in_step(heartbeat), in_step(writer)])

    assert loops == [rounds, rounds]
    # Every batch wrote every lease it named, or skipped the rows the renewal held locked at
    # that moment (never waiting for them): a renewal never takes a lease away.
    per_round = count * 3 // 4
    assert tally["completed"] == per_round * len(range(0, rounds, 3))
    assert tally["failed"] == per_round * len(range(1, rounds, 3))
    assert tally["unclaimed"] == per_round * len(range(2, rounds, 3))
    assert tally["renewed"] >= count * rounds // 2
    assert Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).count() == count


@db
@pytest.mark.skipif(not ON_POSTGRESQL, reason="the batched path's plan on PostgreSQL")
def test_a_batched_write_reaches_its_rows_by_primary_key_even_with_stale_statistics(
    lease_path: str,
) -> None:
    """Issue 27: statistics taken while no job ran made the planner read every running
    row of every worker for each row a renewal or completion wrote (seconds for a few
    hundred leases, so a renewal could commit after the lease it extended had expired).
    The UPDATE must reach the job rows through the primary key whatever the statistics."""
    if lease_path != "batched":
        pytest.skip("the plan of the batched path")
    make_jobs(20_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leasejobs_job")  # no job is running now
    for worker in range(16):
        leases.claim(f"other-{worker}", limit=450, lease_duration=LEASE)
    mine = leases.claim("w", limit=300, lease_duration=LEASE)
    with CaptureQueriesContext(connection) as captured:
        result = leases.renew("w", [job.lease for job in mine], lease_duration=LEASE)
    assert len(result.held) == 300
    [statement] = [q["sql"] for q in captured.captured_queries if "UPDATE" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}")
        [[plan]] = cursor.fetchall()
    scans = job_table_scans(plan[0]["Plan"], alias="j")
    assert scans == [("Index Scan", "leasejobs_job_pkey")], scans
