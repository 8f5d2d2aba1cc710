"""The lease protocol (``django_leasejobs.leases``): claim, renew, fenced writes, cancel, backoff.

The tests run with ``transaction=True``: every lease function runs in autocommit, as
it does in a worker, so the database's clock advances between statements as in
production (see ``test_jobs_enqueued_in_the_callers_transaction_are_claimable`` for
what happens inside one long transaction).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.exceptions import LeaseLost
from django_leasejobs.leases import CancelResult, ErrorInfo, Progress
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.retry import Backoff, backoff_problems
from tests import tasks
from tests.helpers_leases import (
    LEASE,
    TASK_PATH,
    attempt_rows,
    claim_one,
    db_now,
    expire,
    make_job,
    make_jobs,
    make_ready,
    row,
    run_in_threads,
    seconds_from_db_now,
)

# The contract suite: every test runs once per path of the lease protocol (conftest.py).
pytestmark = pytest.mark.usefixtures("lease_path")

# Every database test runs in autocommit (see the module docstring); Backoff tests need no database.
db = pytest.mark.django_db(transaction=True)

ON_POSTGRESQL = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
ERROR = ErrorInfo("builtins.ValueError", "bad value", "Traceback (most recent call last):\n...")
# Slack for "roughly now" comparisons on the database clock (slow CI machines).
SLACK = 5.0


# --------------------------------------------------------------------------- claim


@db
def test_claim_sets_status_attempt_and_lease() -> None:
    job = make_job(queue="high", priority=5, kwargs={"k": "v"}, timeout=12.5, max_attempts=4)

    claimed = leases.claim("worker-a", limit=5, lease_duration=LEASE)

    assert len(claimed) == 1
    got = claimed[0]
    assert (got.id, got.attempt, got.lease) == (job.pk, 1, (job.pk, 1))
    assert (got.task_path, got.queue, got.priority) == (TASK_PATH, "high", 5)
    assert (got.args, got.kwargs, got.timeout, got.max_attempts) == ([1, 2], {"k": "v"}, 12.5, 4)
    assert got.checkpoint is None
    stored = Job.objects.get(pk=job.pk)
    assert stored.status == JobStatus.RUNNING
    assert stored.attempt == 1
    assert stored.locked_by == "worker-a"
    assert stored.last_worker == "worker-a"
    assert stored.cancel_requested is False
    # locked_until is the DATABASE clock plus the lease, in the future.
    assert LEASE - SLACK < seconds_from_db_now(stored.locked_until) <= LEASE + 0.5
    assert -SLACK < seconds_from_db_now(stored.heartbeat_at) <= 0.5
    assert stored.started_at is not None
    assert stored.last_attempted_at is not None
    assert stored.started_at <= stored.locked_until
    assert stored.finished_at is None


@db
def test_claim_keeps_started_at_across_attempts() -> None:
    job = make_job()
    first = claim_one("worker-a", job.pk)
    started_at = row(job.pk)["started_at"]
    leases.release(job.pk, first.attempt, "worker-a")

    second = claim_one("worker-b", job.pk)

    stored = row(job.pk)
    assert second.attempt == 2
    assert stored["started_at"] == started_at
    assert stored["last_attempted_at"] >= started_at
    assert (stored["locked_by"], stored["last_worker"]) == ("worker-b", "worker-b")


@db
def test_claim_with_no_room_or_no_queues_claims_nothing() -> None:
    job = make_job()
    before = row(job.pk)

    assert leases.claim("worker-a", limit=0, lease_duration=LEASE) == []
    assert leases.claim("worker-a", limit=-3, lease_duration=LEASE) == []
    assert leases.claim("worker-a", limit=5, lease_duration=LEASE, queues=[]) == []

    assert row(job.pk) == before
    assert before["status"] == JobStatus.PENDING and before["attempt"] == 0


@db
def test_claim_respects_its_limit() -> None:
    ids = make_jobs(5)

    first = leases.claim("worker-a", limit=3, lease_duration=LEASE)
    second = leases.claim("worker-b", limit=10, lease_duration=LEASE)

    assert len(first) == 3 and len(second) == 2
    assert sorted(j.id for j in first + second) == ids
    assert leases.claim("worker-c", limit=10, lease_duration=LEASE) == []


@db
def test_claim_filters_by_queue() -> None:
    high = make_job(queue="high")
    low = make_job(queue="low")
    default = make_job(queue="default")

    assert [j.id for j in leases.claim("w", limit=10, lease_duration=LEASE, queues=["high"])] == [
        high.pk
    ]
    assert leases.claim("w", limit=10, lease_duration=LEASE, queues=["nowhere"]) == []
    rest = leases.claim("w", limit=10, lease_duration=LEASE, queues=["low", "default", "x"])
    assert sorted(j.id for j in rest) == sorted([low.pk, default.pk])
    assert {j.queue for j in rest} == {"low", "default"}


@db
def test_claim_without_queue_filter_takes_every_queue() -> None:
    ids = sorted(make_job(queue=q).pk for q in ("high", "low", "default"))

    claimed = leases.claim("w", limit=10, lease_duration=LEASE, queues=None)

    assert sorted(j.id for j in claimed) == ids


@db
def test_claim_filters_by_backend_alias() -> None:
    mine = make_job()
    other = make_job(backend="other")

    claimed = leases.claim("w", limit=10, lease_duration=LEASE)

    assert [j.id for j in claimed] == [mine.pk]
    assert row(other.pk)["status"] == JobStatus.PENDING
    assert [j.id for j in leases.claim("w", limit=10, lease_duration=LEASE, backend="other")] == [
        other.pk
    ]


@db
def test_job_scheduled_in_the_future_is_not_claimable_until_due() -> None:
    job = make_job()
    Job.objects.filter(pk=job.pk).update(run_after=Now() + timedelta(hours=1))

    assert leases.claim("w", limit=10, lease_duration=LEASE) == []
    assert row(job.pk)["status"] == JobStatus.PENDING

    make_ready(job.pk, seconds_ago=1)
    assert [j.id for j in leases.claim("w", limit=10, lease_duration=LEASE)] == [job.pk]


@db
def test_claim_a_job_enqueued_through_the_backend() -> None:
    plain = tasks.add.enqueue(1, 2)
    configured = tasks.configured.enqueue({"deep": [1, "two", None]})

    claimed = {j.id: j for j in leases.claim("w", limit=10, lease_duration=LEASE)}

    assert set(claimed) == {int(plain.id), int(configured.id)}
    got = claimed[int(plain.id)]
    assert (got.task_path, got.args, got.kwargs, got.attempt) == ("tests.tasks.add", [1, 2], {}, 1)
    got = claimed[int(configured.id)]
    assert got.task_path == "tests.tasks.configured"
    assert got.args == [{"deep": [1, "two", None]}]
    assert (got.max_attempts, got.timeout) == (5, 30)
    assert row(got.id)["max_stalls"] == 2


@db
def test_claim_order_is_priority_then_run_after_then_id() -> None:
    a, b, c, d, e, f, g = (make_job(priority=p).pk for p in (0, 10, 10, -5, 0, 10, 100))
    # Equal run_after values come from one UPDATE (one statement time): ties go by id.
    for ids, minutes_ago in (([a, e], 10), ([b], 1), ([c, f], 5), ([d], 20), ([g], 0)):
        Job.objects.filter(pk__in=ids).update(run_after=Now() - timedelta(minutes=minutes_ago))
    assert row(a)["run_after"] == row(e)["run_after"]
    assert row(c)["run_after"] == row(f)["run_after"]

    order = []
    while claimed := leases.claim("w", limit=1, lease_duration=LEASE):
        assert len(claimed) == 1
        order.append(claimed[0].id)

    assert order == [g, c, f, b, a, e, d]


@db
def test_concurrent_claimers_claim_every_job_exactly_once() -> None:
    total, claimers, limit = 2000, 8, 7
    ids = make_jobs(total)
    sizes: list[int] = []  # list.append is atomic: safe from several threads

    def drain(worker: str) -> Callable[[], list[leases.ClaimedJob]]:
        def run() -> list[leases.ClaimedJob]:
            mine: list[leases.ClaimedJob] = []
            while True:
                got = leases.claim(worker, limit=limit, lease_duration=300)
                sizes.append(len(got))
                if not got:
                    return mine
                mine.extend(got)

        return run

    workers = [f"claimer-{i}" for i in range(claimers)]
    results = run_in_threads([drain(w) for w in workers])

    owner: dict[int, str] = {}
    claimed_ids: list[int] = []
    for worker, mine in zip(workers, results, strict=True):
        for job in mine:
            claimed_ids.append(job.id)
            owner[job.id] = worker
            assert job.attempt == 1
    duplicates = [i for i, n in Counter(claimed_ids).items() if n > 1]
    assert not duplicates, f"claimed more than once: {duplicates[:10]}"
    assert sorted(claimed_ids) == ids, "some jobs were never claimed"
    assert max(sizes) <= limit
    assert sum(sizes) == total
    stored = {
        pk: (status, attempt, locked_by)
        for pk, status, attempt, locked_by in Job.objects.values_list(
            "id", "status", "attempt", "locked_by"
        )
    }
    assert stored == {pk: (JobStatus.RUNNING, 1, owner[pk]) for pk in ids}


@pytest.mark.django_db
def test_jobs_enqueued_in_the_callers_transaction_are_claimable() -> None:
    # A non-transactional test runs inside one transaction, like a caller that enqueues
    # and then drains jobs in an atomic block (or a TestCase running jobs in-process).
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        claimed = leases.claim("w", limit=1, lease_duration=LEASE)
        assert [j.id for j in claimed] == [int(result.id)]
        leases.release(claimed[0].id, claimed[0].attempt, "w")
        again = leases.claim("w", limit=1, lease_duration=LEASE)
        assert [j.attempt for j in again] == [2]


# --------------------------------------------------------------------------- renew


@db
def test_renew_extends_held_leases_and_reports_lost_ones() -> None:
    one, two, theirs = make_job(), make_job(), make_job()
    a1 = claim_one("worker-a", one.pk)
    a2 = claim_one("worker-a", two.pk)
    b = claim_one("worker-b", theirs.pk)
    # Nearly expired leases, to see the renewal move them.
    Job.objects.filter(pk__in=[one.pk, two.pk]).update(locked_until=Now() + timedelta(seconds=1))
    theirs_before = row(theirs.pk)
    asked = [a1.lease, a2.lease, b.lease, (one.pk, 2), (10**12, 1)]

    result = leases.renew("worker-a", asked, lease_duration=120)

    assert result.held == {a1.lease, a2.lease}
    assert result.lost == {b.lease, (one.pk, 2), (10**12, 1)}
    assert result.cancel_requested == frozenset()
    for pk in (one.pk, two.pk):
        stored = row(pk)
        assert 120 - SLACK < seconds_from_db_now(stored["locked_until"]) <= 120.5
        assert -SLACK < seconds_from_db_now(stored["heartbeat_at"]) <= 0.5
        assert stored["status"] == JobStatus.RUNNING and stored["locked_by"] == "worker-a"
    assert row(theirs.pk) == theirs_before


@db
def test_renew_with_nothing_to_renew() -> None:
    result = leases.renew("worker-a", [], lease_duration=LEASE)
    assert (result.held, result.lost, result.cancel_requested) == (set(), set(), set())
    assert leases.renew("worker-a", {}, lease_duration=LEASE).held == frozenset()


@db
def test_renew_of_an_expired_lease_not_yet_reaped_still_holds_it() -> None:
    # The fence is status + worker + attempt, never the clock: until the reaper takes
    # the job, its holder keeps it (the worker fences itself by its local deadline).
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    expire(job.pk, seconds_ago=60)

    result = leases.renew("worker-a", [claimed.lease], lease_duration=LEASE)

    assert result.held == {claimed.lease} and result.lost == frozenset()
    assert seconds_from_db_now(row(job.pk)["locked_until"]) > LEASE - SLACK


@db
def test_renew_stores_progress() -> None:
    job = make_job()
    lease = claim_one("worker-a", job.pk).lease

    leases.renew("worker-a", {lease: Progress(0.25, "a quarter")}, lease_duration=LEASE)
    assert (row(job.pk)["progress"], row(job.pk)["progress_message"]) == (0.25, "a quarter")

    # No progress: the stored progress stays.
    leases.renew("worker-a", {lease: None}, lease_duration=LEASE)
    assert (row(job.pk)["progress"], row(job.pk)["progress_message"]) == (0.25, "a quarter")

    # A fraction without a message keeps the message.
    leases.renew("worker-a", {lease: Progress(0.5)}, lease_duration=LEASE)
    assert (row(job.pk)["progress"], row(job.pk)["progress_message"]) == (0.5, "a quarter")

    # Long messages are cut to the column's 255 characters, with a marker.
    leases.renew("worker-a", {lease: Progress(0.75, "x" * 400)}, lease_duration=LEASE)
    message = row(job.pk)["progress_message"]
    assert row(job.pk)["progress"] == 0.75
    assert len(message) == 255
    assert message == "x" * 225 + "... [truncated 175 characters]"


@db
def test_renew_reports_cancel_requested() -> None:
    asked, quiet = make_job(), make_job()
    lease = claim_one("worker-a", asked.pk).lease
    other = claim_one("worker-a", quiet.pk).lease
    assert leases.cancel(asked.pk) is CancelResult.REQUESTED

    result = leases.renew("worker-a", [lease, other], lease_duration=LEASE)

    assert result.held == {lease, other}
    assert result.cancel_requested == {lease}


@db
def test_another_worker_cannot_renew() -> None:
    job = make_job()
    lease = claim_one("worker-a", job.pk).lease
    before = row(job.pk)

    result = leases.renew("worker-b", {lease: Progress(0.9, "stolen")}, lease_duration=999)

    assert result.held == frozenset() and result.lost == {lease}
    assert row(job.pk) == before


@db
def test_renew_of_a_finished_job_reports_lost() -> None:
    job = make_job()
    lease = claim_one("worker-a", job.pk).lease
    leases.complete(job.pk, lease[1], "worker-a", result=3)
    before = row(job.pk)

    result = leases.renew("worker-a", [lease], lease_duration=LEASE)

    assert result.lost == {lease} and result.held == frozenset()
    assert row(job.pk) == before


# --------------------------------------------------------------------------- fencing

FencedWrite = Callable[[int, int, str], Any]

FENCED_WRITES: dict[str, tuple[str, FencedWrite]] = {
    "complete": ("complete", lambda pk, n, w: leases.complete(pk, n, w, result={"late": True})),
    "fail-retry": ("fail", lambda pk, n, w: leases.fail(pk, n, w, error=ERROR, retry_delay=0)),
    "fail-final": ("fail", lambda pk, n, w: leases.fail(pk, n, w, error=ERROR, retry_delay=None)),
    "save_checkpoint": (
        "checkpoint",
        lambda pk, n, w: leases.save_checkpoint(pk, n, w, {"page": 99}),
    ),
    "set_progress": (
        "progress",
        lambda pk, n, w: leases.set_progress(pk, n, w, Progress(0.99, "zombie")),
    ),
    "release": ("release", lambda pk, n, w: leases.release(pk, n, w)),
    "mark_cancelled": ("cancel", lambda pk, n, w: leases.mark_cancelled(pk, n, w)),
}


def _assert_write_is_fenced(name: str, job_id: int, attempt: int, worker: str) -> None:
    """The write (or renewal) by a stale lease raises LeaseLost and changes nothing."""
    before = row(job_id)
    attempts_before = JobAttempt.objects.count()
    if name == "renew":
        result = leases.renew(
            worker, {(job_id, attempt): Progress(0.99, "zombie")}, lease_duration=999
        )
        assert result.lost == {(job_id, attempt)} and result.held == frozenset()
    else:
        transition, write = FENCED_WRITES[name]
        with pytest.raises(LeaseLost) as caught:
            write(job_id, attempt, worker)
        lost = caught.value
        assert (lost.job_id, lost.attempt, lost.worker_id) == (job_id, attempt, worker)
        assert lost.transition == transition
    assert row(job_id) == before
    assert JobAttempt.objects.count() == attempts_before


@db
@pytest.mark.parametrize("name", ["renew", *FENCED_WRITES])
def test_zombie_attempt_is_fenced_after_reap_and_reclaim(name: str) -> None:
    job = make_job()
    zombie = claim_one("worker-a", job.pk)
    expire(job.pk)
    assert [r.id for r in leases.reap().jobs] == [job.pk]
    current = claim_one("worker-b", job.pk)
    assert current.attempt == zombie.attempt + 1

    _assert_write_is_fenced(name, job.pk, zombie.attempt, "worker-a")

    stored = row(job.pk)
    assert (stored["status"], stored["locked_by"], stored["attempt"]) == (
        JobStatus.RUNNING,
        "worker-b",
        2,
    )


@db
@pytest.mark.parametrize("name", ["renew", *FENCED_WRITES])
def test_zombie_attempt_is_fenced_after_reap_before_reclaim(name: str) -> None:
    job = make_job()
    zombie = claim_one("worker-a", job.pk)
    expire(job.pk)
    assert [r.id for r in leases.reap().jobs] == [job.pk]
    assert row(job.pk)["status"] == JobStatus.PENDING

    _assert_write_is_fenced(name, job.pk, zombie.attempt, "worker-a")


@db
@pytest.mark.parametrize("name", ["renew", *FENCED_WRITES])
def test_self_zombie_is_fenced_by_the_attempt(name: str) -> None:
    # The same worker id re-claims the job: only the attempt tells the two apart.
    job = make_job()
    old = claim_one("worker-a", job.pk)
    expire(job.pk)
    leases.reap()
    new = claim_one("worker-a", job.pk)
    assert (old.attempt, new.attempt) == (1, 2)

    _assert_write_is_fenced(name, job.pk, old.attempt, "worker-a")

    # The current attempt is untouched by the zombie and still works.
    result = leases.renew("worker-a", [old.lease, new.lease], lease_duration=LEASE)
    assert (result.held, result.lost) == ({new.lease}, {old.lease})
    leases.complete(job.pk, new.attempt, "worker-a", result="fresh")
    assert (row(job.pk)["status"], row(job.pk)["result"]) == (JobStatus.SUCCEEDED, "fresh")


@db
@pytest.mark.parametrize("name", ["renew", *FENCED_WRITES])
def test_another_worker_cannot_write_a_held_lease(name: str) -> None:
    job = make_job()
    held = claim_one("worker-a", job.pk)

    _assert_write_is_fenced(name, job.pk, held.attempt, "worker-b")

    assert row(job.pk)["locked_by"] == "worker-a"


# --------------------------------------------------------------------------- complete


@db
def test_complete_records_the_result_and_clears_the_lease() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    leases.set_progress(job.pk, claimed.attempt, "worker-a", Progress(0.3, "working"))

    leases.complete(job.pk, claimed.attempt, "worker-a", result={"sum": 3, "items": [1, 2]})

    stored = Job.objects.get(pk=job.pk)
    assert stored.status == JobStatus.SUCCEEDED
    assert stored.result == {"sum": 3, "items": [1, 2]}
    assert (stored.locked_by, stored.locked_until) == (None, None)
    assert stored.cancel_requested is False
    assert stored.progress == 1.0
    assert stored.attempt == 1
    assert -SLACK < seconds_from_db_now(stored.finished_at) <= 0.5
    assert stored.last_worker == "worker-a"
    assert not JobAttempt.objects.filter(job_id=job.pk).exists()


@db
def test_complete_without_progress_leaves_progress_empty() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)

    leases.complete(job.pk, claimed.attempt, "worker-a", result=None)

    stored = row(job.pk)
    assert (stored["status"], stored["progress"], stored["result"]) == (
        JobStatus.SUCCEEDED,
        None,
        None,
    )


@db
def test_second_complete_raises_lease_lost_and_keeps_the_first_result() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    leases.complete(job.pk, claimed.attempt, "worker-a", result=3)
    before = row(job.pk)

    with pytest.raises(LeaseLost, match="complete of job"):
        leases.complete(job.pk, claimed.attempt, "worker-a", result=4)

    assert row(job.pk) == before
    assert before["result"] == 3


# --------------------------------------------------------------------------- fail


@db
def test_fail_with_retry_delay_schedules_a_retry() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    last_attempted_at = row(job.pk)["last_attempted_at"]

    status = leases.fail(job.pk, claimed.attempt, "worker-a", error=ERROR, retry_delay=120)

    assert status == JobStatus.PENDING
    stored = row(job.pk)
    assert stored["status"] == JobStatus.PENDING
    assert stored["attempt"] == 1
    assert (stored["locked_by"], stored["locked_until"], stored["finished_at"]) == (
        None,
        None,
        None,
    )
    assert 120 - SLACK < seconds_from_db_now(stored["run_after"]) <= 120.5
    assert stored["last_error"] == "builtins.ValueError: bad value"
    (attempt,) = attempt_rows(job.pk)
    assert attempt.attempt == 1
    assert attempt.outcome == AttemptOutcome.ERROR
    assert attempt.error_class == "builtins.ValueError"
    assert attempt.error_message == "bad value"
    assert attempt.traceback == ERROR.traceback
    assert attempt.worker == "worker-a"
    assert attempt.started_at == last_attempted_at
    assert attempt.finished_at is not None

    # Not claimable before run_after; claimable once run_after has passed.
    assert leases.claim("worker-b", limit=10, lease_duration=LEASE) == []
    make_ready(job.pk)
    again = claim_one("worker-b", job.pk)
    assert again.attempt == 2


@db
def test_fail_records_the_outcome_it_is_given() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    timeout = ErrorInfo("django_leasejobs.exceptions.TaskTimeout", "ran past 30s")

    leases.fail(
        job.pk,
        claimed.attempt,
        "worker-a",
        error=timeout,
        retry_delay=0,
        outcome=AttemptOutcome.TIMEOUT,
    )

    (attempt,) = attempt_rows(job.pk)
    assert (attempt.outcome, attempt.error_class, attempt.error_message, attempt.traceback) == (
        AttemptOutcome.TIMEOUT,
        "django_leasejobs.exceptions.TaskTimeout",
        "ran past 30s",
        "",
    )


@db
def test_fail_cuts_long_error_messages() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)

    leases.fail(
        job.pk,
        claimed.attempt,
        "worker-a",
        error=ErrorInfo("builtins.RuntimeError", "m" * 5000),
        retry_delay=None,
    )

    (attempt,) = attempt_rows(job.pk)
    cut = "m" * 1969 + "... [truncated 3031 characters]"
    assert len(cut) == leases.MAX_ERROR_LENGTH
    assert attempt.error_message == cut
    assert row(job.pk)["last_error"] == "builtins.RuntimeError: " + cut


@db
def test_fail_after_the_last_attempt_is_failed() -> None:
    job = make_job(max_attempts=2)
    first = claim_one("worker-a", job.pk)
    assert leases.fail(job.pk, first.attempt, "worker-a", error=ERROR, retry_delay=0) == "pending"
    make_ready(job.pk)
    second = claim_one("worker-b", job.pk)
    assert second.attempt == 2
    run_after = row(job.pk)["run_after"]

    status = leases.fail(job.pk, second.attempt, "worker-b", error=ERROR, retry_delay=5)

    assert status == JobStatus.FAILED
    stored = row(job.pk)
    assert stored["status"] == JobStatus.FAILED
    assert -SLACK < seconds_from_db_now(stored["finished_at"]) <= 0.5
    assert stored["run_after"] == run_after
    assert (stored["locked_by"], stored["locked_until"]) == (None, None)
    assert [(a.attempt, a.worker, a.outcome) for a in attempt_rows(job.pk)] == [
        (1, "worker-a", AttemptOutcome.ERROR),
        (2, "worker-b", AttemptOutcome.ERROR),
    ]
    make_ready(job.pk)
    assert leases.claim("worker-c", limit=10, lease_duration=LEASE) == []


@db
def test_fail_without_retry_delay_fails_at_once() -> None:
    job = make_job(max_attempts=5)
    claimed = claim_one("worker-a", job.pk)

    status = leases.fail(job.pk, claimed.attempt, "worker-a", error=ERROR, retry_delay=None)

    assert status == JobStatus.FAILED
    stored = row(job.pk)
    assert (stored["status"], stored["attempt"]) == (JobStatus.FAILED, 1)
    assert stored["finished_at"] is not None
    assert len(attempt_rows(job.pk)) == 1
    make_ready(job.pk)
    assert leases.claim("worker-b", limit=10, lease_duration=LEASE) == []


# --------------------------------------------------------------------------- release


@db
def test_release_puts_the_job_back_at_once_without_a_stall() -> None:
    job = make_job(stall_count=1)
    claimed = claim_one("worker-a", job.pk)

    leases.release(job.pk, claimed.attempt, "worker-a")

    stored = row(job.pk)
    assert stored["status"] == JobStatus.PENDING
    assert (stored["stall_count"], stored["attempt"]) == (1, 1)
    assert (stored["locked_by"], stored["locked_until"], stored["finished_at"]) == (
        None,
        None,
        None,
    )
    assert seconds_from_db_now(stored["run_after"]) <= 0.5
    (attempt,) = attempt_rows(job.pk)
    assert (attempt.attempt, attempt.outcome, attempt.worker) == (
        1,
        AttemptOutcome.RELEASED,
        "worker-a",
    )
    assert attempt.error_class == "django_leasejobs.exceptions.JobReleased"
    # Runnable at once, by anyone.
    assert claim_one("worker-b", job.pk).attempt == 2


# --------------------------------------------------------------------------- checkpoint / progress


@db
@pytest.mark.parametrize(
    "checkpoint",
    [{"page": 3, "seen": ["a", "b"]}, "page-3", [1, 2, 3], 7],
    ids=["dict", "str", "list", "int"],
)
def test_checkpoint_persists_across_attempts(checkpoint: Any) -> None:
    job = make_job()
    first = claim_one("worker-a", job.pk)
    assert first.checkpoint is None

    leases.save_checkpoint(job.pk, first.attempt, "worker-a", checkpoint)
    assert row(job.pk)["checkpoint"] == checkpoint
    leases.fail(job.pk, first.attempt, "worker-a", error=ERROR, retry_delay=60)
    make_ready(job.pk)
    second = claim_one("worker-b", job.pk)

    assert second.attempt == 2
    assert second.checkpoint == checkpoint


@db
def test_checkpoint_survives_a_reap_and_can_be_replaced() -> None:
    job = make_job()
    first = claim_one("worker-a", job.pk)
    leases.save_checkpoint(job.pk, first.attempt, "worker-a", {"page": 1})
    expire(job.pk)
    leases.reap()
    second = claim_one("worker-b", job.pk)
    assert second.checkpoint == {"page": 1}

    leases.save_checkpoint(job.pk, second.attempt, "worker-b", {"page": 2})

    assert row(job.pk)["checkpoint"] == {"page": 2}


@db
def test_set_progress_stores_progress_at_once() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)

    leases.set_progress(job.pk, claimed.attempt, "worker-a", Progress(0.4, "reading"))
    assert (row(job.pk)["progress"], row(job.pk)["progress_message"]) == (0.4, "reading")
    leases.set_progress(job.pk, claimed.attempt, "worker-a", Progress(0.6))
    assert (row(job.pk)["progress"], row(job.pk)["progress_message"]) == (0.6, "reading")


@db
def test_a_new_claim_resets_progress_and_cancel_flag() -> None:
    job = make_job()
    first = claim_one("worker-a", job.pk)
    leases.set_progress(job.pk, first.attempt, "worker-a", Progress(0.5, "half"))
    leases.release(job.pk, first.attempt, "worker-a")

    claim_one("worker-b", job.pk)

    stored = row(job.pk)
    assert (stored["progress"], stored["progress_message"], stored["cancel_requested"]) == (
        None,
        "",
        False,
    )


# --------------------------------------------------------------------------- cancel


@db
def test_cancel_a_pending_job() -> None:
    job = make_job()

    assert leases.cancel(job.pk) is CancelResult.CANCELLED

    stored = row(job.pk)
    assert stored["status"] == JobStatus.CANCELLED
    assert -SLACK < seconds_from_db_now(stored["finished_at"]) <= 0.5
    assert leases.claim("w", limit=10, lease_duration=LEASE) == []
    assert leases.cancel(job.pk) is CancelResult.NOT_CANCELLABLE


@db
def test_cancel_a_running_job_is_a_request_the_holder_acts_on() -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)

    assert leases.cancel(job.pk) is CancelResult.REQUESTED
    stored = row(job.pk)
    assert (stored["status"], stored["cancel_requested"], stored["locked_by"]) == (
        JobStatus.RUNNING,
        True,
        "worker-a",
    )
    assert leases.cancel(job.pk) is CancelResult.NOT_CANCELLABLE  # already requested
    renewed = leases.renew("worker-a", [claimed.lease], lease_duration=LEASE)
    assert renewed.cancel_requested == {claimed.lease}

    leases.mark_cancelled(job.pk, claimed.attempt, "worker-a")

    stored = row(job.pk)
    assert stored["status"] == JobStatus.CANCELLED
    assert (stored["locked_by"], stored["locked_until"], stored["cancel_requested"]) == (
        None,
        None,
        False,
    )
    assert stored["finished_at"] is not None
    (attempt,) = attempt_rows(job.pk)
    assert (attempt.attempt, attempt.outcome, attempt.worker, attempt.error_class) == (
        1,
        AttemptOutcome.CANCELLED,
        "worker-a",
        "django_leasejobs.exceptions.JobCancelled",
    )
    with pytest.raises(LeaseLost):
        leases.mark_cancelled(job.pk, claimed.attempt, "worker-a")
    assert leases.cancel(job.pk) is CancelResult.NOT_CANCELLABLE


@db
@pytest.mark.parametrize(
    ("end", "outcome"),
    [
        ("fail-retry", AttemptOutcome.ERROR),
        ("fail-final", AttemptOutcome.ERROR),
        ("release", AttemptOutcome.RELEASED),
    ],
)
def test_a_cancel_requested_while_running_wins_over_retry_and_release(
    end: str, outcome: str
) -> None:
    job = make_job(max_attempts=5)
    claimed = claim_one("worker-a", job.pk)
    assert leases.cancel(job.pk) is CancelResult.REQUESTED
    run_after = row(job.pk)["run_after"]

    if end == "release":
        leases.release(job.pk, claimed.attempt, "worker-a")
    else:
        retry_delay = 0 if end == "fail-retry" else None
        status = leases.fail(
            job.pk, claimed.attempt, "worker-a", error=ERROR, retry_delay=retry_delay
        )
        assert status == JobStatus.CANCELLED

    stored = row(job.pk)
    assert stored["status"] == JobStatus.CANCELLED
    assert (stored["locked_by"], stored["locked_until"], stored["cancel_requested"]) == (
        None,
        None,
        False,
    )
    assert -SLACK < seconds_from_db_now(stored["finished_at"]) <= 0.5
    assert stored["run_after"] == run_after
    (attempt,) = attempt_rows(job.pk)
    assert (attempt.attempt, attempt.outcome) == (1, outcome)
    make_ready(job.pk)
    assert leases.claim("worker-b", limit=10, lease_duration=LEASE) == []


@db
@pytest.mark.parametrize("finish", ["complete", "fail", "cancel"])
def test_cancel_a_finished_job_is_not_cancellable(finish: str) -> None:
    job = make_job()
    claimed = claim_one("worker-a", job.pk)
    if finish == "complete":
        leases.complete(job.pk, claimed.attempt, "worker-a", result=1)
    elif finish == "fail":
        leases.fail(job.pk, claimed.attempt, "worker-a", error=ERROR, retry_delay=None)
    else:
        leases.cancel(job.pk)
        leases.mark_cancelled(job.pk, claimed.attempt, "worker-a")
    before = row(job.pk)

    assert leases.cancel(job.pk) is CancelResult.NOT_CANCELLABLE

    assert row(job.pk) == before


@db
def test_cancel_a_missing_job() -> None:
    job = make_job()

    assert leases.cancel(job.pk + 1000) is CancelResult.NOT_FOUND
    assert row(job.pk)["status"] == JobStatus.PENDING


# --------------------------------------------------------------------------- Backoff


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (9, 512.0), (10, 600.0), (50, 600.0)],
)
def test_backoff_is_exponential_with_a_cap(attempt: int, expected: float) -> None:
    assert Backoff(jitter=0).delay(attempt) == expected


def test_backoff_with_custom_base_factor_and_cap() -> None:
    backoff = Backoff(base=1, factor=3, cap=60, jitter=0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 3, 9, 27, 60, 60]
    assert Backoff(base=5, factor=1, cap=600, jitter=0).delay(30) == 5


def test_backoff_of_attempt_zero_or_less_is_the_base() -> None:
    backoff = Backoff(base=3, jitter=0)
    assert backoff.delay(0) == backoff.delay(-4) == backoff.delay(1) == 3


def test_backoff_of_a_huge_attempt_is_the_cap() -> None:
    assert Backoff(jitter=0).delay(100_000) == 600.0
    assert Backoff(base=0.5, factor=10.0, cap=7.0, jitter=0).delay(10**6) == 7.0


def test_backoff_of_zero_base_is_zero() -> None:
    assert Backoff(base=0, jitter=0.5).delay(5, rng=random.Random(1)) == 0


@pytest.mark.parametrize("attempt", [1, 3, 12])
def test_backoff_jitter_stays_within_its_bounds(attempt: int) -> None:
    backoff = Backoff(jitter=0.2)
    centre = Backoff(jitter=0).delay(attempt)
    rng = random.Random(20240601)

    delays = [backoff.delay(attempt, rng=rng) for _ in range(2000)]

    assert all(centre * 0.8 <= d <= centre * 1.2 for d in delays)
    # Symmetric: both sides of the centre are used, and it is not stuck at one value.
    assert min(delays) < centre * 0.85 and max(delays) > centre * 1.15
    assert len(set(delays)) > 1000


def test_backoff_jitter_is_reproducible_with_a_seeded_rng() -> None:
    backoff = Backoff(base=2, factor=2, cap=600, jitter=0.3)
    first = [backoff.delay(n, rng=random.Random(7)) for n in range(1, 8)]
    second = [backoff.delay(n, rng=random.Random(7)) for n in range(1, 8)]
    other = [backoff.delay(n, rng=random.Random(8)) for n in range(1, 8)]
    assert first == second
    assert first != other


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jitter": 1}, "jitter must be in [0, 1)"),
        ({"jitter": -0.1}, "jitter must be in [0, 1)"),
        ({"factor": 0.5}, "factor must be >= 1"),
        ({"base": -1}, "base must be >= 0"),
        ({"cap": -0.5}, "cap must be >= 0"),
        ({"base": "2"}, "base must be a finite number"),
        ({"cap": True}, "cap must be a finite number"),
        ({"factor": None}, "factor must be a finite number"),
    ],
)
def test_backoff_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Backoff(**kwargs)
    assert any(message in problem for problem in backoff_problems(kwargs))


def test_backoff_problems_of_bad_shapes() -> None:
    assert backoff_problems({"base": 1, "factor": 2, "cap": 3, "jitter": 0}) == []
    assert backoff_problems(Backoff()) == []
    assert backoff_problems([1, 2]) == [
        "must be a dict with keys ['base', 'cap', 'factor', 'jitter'], got list"
    ]
    assert backoff_problems({"bse": 1, "jitter": 2}) == [
        "unknown keys ['bse']",
        "jitter must be in [0, 1), got 2",
    ]


def test_backoff_from_value() -> None:
    assert Backoff.from_value(None) == Backoff()
    custom = Backoff(base=1, cap=5)
    assert Backoff.from_value(custom) is custom
    parsed = Backoff.from_value({"base": 1, "factor": 3, "cap": 60, "jitter": 0})
    assert parsed == Backoff(base=1.0, factor=3.0, cap=60.0, jitter=0.0)
    assert isinstance(parsed.base, float)
    with pytest.raises(ValueError, match="jitter"):
        Backoff.from_value({"jitter": 5})


def test_default_backoff_matches_the_documented_policy() -> None:
    backoff = Backoff()
    assert (backoff.base, backoff.factor, backoff.cap, backoff.jitter) == (2.0, 2.0, 600.0, 0.2)
    rng = random.Random(3)
    assert all(1.6 <= backoff.delay(1, rng=rng) <= 2.4 for _ in range(200))
    assert all(480.0 <= backoff.delay(20, rng=rng) <= 720.0 for _ in range(200))


@db
def test_db_now_helper_matches_the_lease_clock() -> None:
    # Guards the helper the time assertions above rely on.
    job = make_job()
    claim_one("worker-a", job.pk, lease_duration=0.0)
    assert abs(seconds_from_db_now(row(job.pk)["locked_until"])) < SLACK
    assert db_now().tzinfo is not None
