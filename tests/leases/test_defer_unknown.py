"""``leases.defer_unknown``: a worker gives back jobs whose task it does not know.

New code can reach the web before a worker (a rolling deploy): the worker claims a new
task's job it cannot run. It gives it back, ``pending`` a little later, without using an
attempt or counting a stall, and remembers since when the job waits (``unknown_task_since``);
past the grace the job is dead-lettered with an error that says what to do. Fenced like
every write of the lease holder. Part of the contract suite: runs on every path.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.leases import CancelResult
from django_leasejobs.leases.rules import (
    UNKNOWN_TASK_FIRST_DELAY,
    UNKNOWN_TASK_MAX_DELAY,
    unknown_task_delay,
    unknown_task_stand_aside,
)
from django_leasejobs.limits import FlowRules, key_group
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests.helpers_leases import (
    attempt_rows,
    claim_one,
    make_job,
    make_ready,
    row,
    seconds_from_db_now,
)

pytestmark = [pytest.mark.usefixtures("lease_path"), pytest.mark.django_db(transaction=True)]

WHY = "'app.tasks.new' is not a registered task."
SLACK = 5.0


def test_a_job_of_an_unknown_task_goes_back_without_using_an_attempt() -> None:
    job = make_job(stall_count=1, task_path="app.tasks.new")
    claimed = claim_one("old-worker", job.pk)

    done = leases.defer_unknown("old-worker", {claimed.lease: WHY}, grace=3600)

    assert done.delays == {claimed.lease: UNKNOWN_TASK_FIRST_DELAY}
    assert done.waited == {claimed.lease: 0.0} and not done.dead.written
    assert done.stand_aside == {claimed.lease: UNKNOWN_TASK_MAX_DELAY}
    stored = row(job.pk)
    assert stored["status"] == JobStatus.PENDING
    assert (stored["attempt"], stored["stall_count"]) == (0, 1)
    assert (stored["locked_by"], stored["locked_until"], stored["started_at"]) == (None, None, None)
    assert abs(seconds_from_db_now(stored["run_after"]) - UNKNOWN_TASK_FIRST_DELAY) < SLACK
    assert abs(seconds_from_db_now(stored["unknown_task_since"])) < SLACK
    assert JobAttempt.objects.count() == 0
    # Not claimable before its delay; then attempt 1 again, for whichever worker.
    assert leases.claim("new-worker", limit=5, lease_duration=30) == []
    make_ready(job.pk)
    assert claim_one("new-worker", job.pk).lease == (job.pk, 1)


def test_the_wait_is_counted_from_the_first_time_and_the_delay_grows() -> None:
    job = make_job(task_path="app.tasks.new")
    leases.defer_unknown("old-worker", {claim_one("old-worker", job.pk).lease: WHY}, grace=3600)
    first_seen = row(job.pk)["unknown_task_since"]
    # It has waited ten minutes by now.
    Job.objects.filter(pk=job.pk).update(unknown_task_since=Now() - timedelta(minutes=10))
    make_ready(job.pk)
    claimed = claim_one("old-worker", job.pk)

    done = leases.defer_unknown("old-worker", {claimed.lease: WHY}, grace=3600)

    assert 600 - SLACK < done.waited[claimed.lease] < 600 + SLACK
    assert done.delays[claimed.lease] == UNKNOWN_TASK_MAX_DELAY
    stored = row(job.pk)
    assert stored["unknown_task_since"] < first_seen  # kept, not reset
    assert abs(seconds_from_db_now(stored["run_after"]) - UNKNOWN_TASK_MAX_DELAY) < SLACK


def test_the_delay_rule() -> None:
    assert unknown_task_delay(0) == UNKNOWN_TASK_FIRST_DELAY == 2.0
    assert unknown_task_delay(40) == 10.0
    assert unknown_task_delay(3600) == UNKNOWN_TASK_MAX_DELAY == 60.0


def test_the_stand_aside_rule() -> None:
    """A minute, never past the grace's end, never shorter than the give-back's delay."""
    assert unknown_task_stand_aside(2.0, 0.0, grace=3600) == UNKNOWN_TASK_MAX_DELAY
    assert unknown_task_stand_aside(15.0, 3570.0, grace=3600) == 30.0
    assert unknown_task_stand_aside(2.0, 0.0, grace=1) == 2.0


# The claims of a worker that stands aside from a task (``skip_tasks``): every lane, every path.


@pytest.mark.parametrize(
    "queues", [None, ("default",), ("default", "other")], ids=["all", "one", "several"]
)
def test_a_claim_leaves_the_jobs_of_skipped_tasks_alone(queues: tuple[str, ...] | None) -> None:
    unknown = [make_job(task_path="app.tasks.new", priority=9).pk for _ in range(2)]
    known = [make_job().pk, make_job(queue="other").pk]
    wanted = [pk for pk, queue in zip(known, ("default", "other"), strict=True)]
    if queues is not None:
        wanted = [pk for pk in wanted if Job.objects.get(pk=pk).queue in queues]

    claimed = leases.claim_round(
        "old-worker", limit=10, lease_duration=30, queues=queues, skip_tasks=["app.tasks.new"]
    ).jobs

    assert sorted(job.id for job in claimed) == sorted(wanted)
    assert set(Job.objects.filter(pk__in=unknown).values_list("status", flat=True)) == {
        JobStatus.PENDING
    }
    # Any other worker takes them, first (their priority).
    taken = leases.claim("new-worker", limit=2, lease_duration=30, queues=queues or None)
    assert sorted(job.id for job in taken) == sorted(unknown)


@pytest.mark.parametrize("main_lane_first", [False, True])
def test_a_flow_claim_reads_past_the_jobs_of_skipped_tasks(main_lane_first: bool) -> None:
    """More skipped jobs in front (higher priority) than the claim reads per queue and per
    group: the claim reads past them to the jobs behind, in both lanes."""
    group = key_group("k")
    new = {"task_path": "app.tasks.new", "priority": 9}
    unknown = [make_job(flow_group=group, concurrency_limit=5, **new).pk for _ in range(9)]
    unknown += [make_job(**new).pk for _ in range(3)]
    known_flow = make_job(flow_group=group, concurrency_limit=5)
    known_plain = make_job()

    claimed = leases.claim_round(
        "old-worker",
        limit=2,
        lease_duration=30,
        flow=FlowRules(queue_limits={"default": 10}),
        main_lane_first=main_lane_first,
        skip_tasks=["app.tasks.new"],
    ).jobs

    assert sorted(job.id for job in claimed) == sorted([known_flow.pk, known_plain.pk])
    assert set(Job.objects.filter(pk__in=unknown).values_list("status", flat=True)) == {
        JobStatus.PENDING
    }


def test_the_flow_lanes_group_scan_reads_past_the_jobs_of_skipped_tasks() -> None:
    """A window full of a full group's jobs sends the PostgreSQL flow lane to its scan by
    group: there too the skipped tasks' jobs are read past (elsewhere, the numbered read)."""
    rules = FlowRules(queue_limits={"default": 10})
    full, other = key_group("full"), key_group("other")
    first = make_job(flow_group=full, concurrency_limit=1, priority=10)
    [running] = leases.claim_round("w2", limit=1, lease_duration=30, flow=rules).jobs
    assert running.id == first.pk  # its group is full now
    for _ in range(4):
        make_job(flow_group=full, concurrency_limit=1, priority=5)
    for _ in range(3):
        make_job(flow_group=other, concurrency_limit=5, priority=9, task_path="app.tasks.new")
    behind = make_job(flow_group=other, concurrency_limit=5)

    claimed = leases.claim_round(
        "old-worker", limit=1, lease_duration=30, flow=rules, skip_tasks=["app.tasks.new"]
    ).jobs

    assert [job.id for job in claimed] == [behind.pk]


def test_past_the_grace_the_job_is_dead_lettered_with_the_fix_in_its_error() -> None:
    job = make_job(task_path="app.tasks.new", max_attempts=5)
    claimed = claim_one("old-worker", job.pk)
    Job.objects.filter(pk=job.pk).update(unknown_task_since=Now() - timedelta(hours=2))

    done = leases.defer_unknown("old-worker", {claimed.lease: WHY}, grace=3600)

    assert done.delays == {} and done.dead.written == {claimed.lease: JobStatus.DEAD}
    stored = row(job.pk)
    assert stored["status"] == JobStatus.DEAD and stored["finished_at"] is not None
    assert (stored["locked_by"], stored["attempt"]) == (None, 1)
    [attempt] = attempt_rows(job.pk)
    assert (attempt.outcome, attempt.error_class) == (
        AttemptOutcome.ERROR,
        "django_leasejobs.exceptions.UnknownTask",
    )
    assert WHY in attempt.error_message
    assert "UNKNOWN_TASK_GRACE (3600s)" in attempt.error_message
    assert "deploy the code that declares it to the workers" in attempt.error_message
    assert "UNKNOWN_TASK_GRACE" in attempt.decision
    # An operator's retry starts the wait afresh.
    assert leases.retry(job.pk) is leases.RetryResult.RETRIED
    assert row(job.pk)["unknown_task_since"] is None


def test_a_grace_of_zero_dead_letters_at_once() -> None:
    job = make_job(task_path="app.tasks.new")
    claimed = claim_one("old-worker", job.pk)
    done = leases.defer_unknown("old-worker", {claimed.lease: WHY}, grace=0)
    assert done.dead.written == {claimed.lease: JobStatus.DEAD}


def test_only_held_leases_are_given_back() -> None:
    mine = make_job(task_path="app.tasks.new")
    theirs = make_job(task_path="app.tasks.new")
    held = claim_one("old-worker", mine.pk)
    other = claim_one("other-worker", theirs.pk)
    before = row(theirs.pk)

    done = leases.defer_unknown("old-worker", {held.lease: WHY, other.lease: WHY}, grace=3600)

    assert set(done.delays) == {held.lease}
    assert row(theirs.pk) == before


def test_a_cancel_requested_meanwhile_wins() -> None:
    job = make_job(task_path="app.tasks.new")
    claimed = claim_one("old-worker", job.pk)
    assert leases.cancel(job.pk) is CancelResult.REQUESTED

    leases.defer_unknown("old-worker", {claimed.lease: WHY}, grace=3600)

    stored = row(job.pk)
    assert stored["status"] == JobStatus.CANCELLED and stored["cancel_requested"] is False
    assert stored["attempt"] == 0
