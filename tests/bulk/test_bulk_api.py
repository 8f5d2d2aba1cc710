"""``django_leasejobs.bulk``: every bulk action on the jobs a filter matches, in batches,
with its count, its effect on the rows, and the fences of the single actions (a running
job with a live lease is never retried, moved or deleted; its cancel is a request), on
every database of the run.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from django_leasejobs import bulk, leases
from django_leasejobs.job_search import SearchSyntaxError
from django_leasejobs.models import Job, JobAttempt, JobStatus
from django_leasejobs.workflows import chain, step
from tests import tasks_workflows as wf
from tests.helpers_leases import TASK_PATH, make_job, make_jobs

pytestmark = pytest.mark.django_db

WORKER = "host-a:1:live"
OTHER_TASK = "tests.tasks.carry"


def statuses(ids: list[int]) -> list[str]:
    found = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
    return [found.get(job_id, "deleted") for job_id in ids]


def running_job(**fields: Any) -> leases.ClaimedJob:
    """A job held by ``WORKER`` with a live lease (claimed through the protocol)."""
    job = make_job(queue=fields.pop("queue", "live"), **fields)
    claimed = leases.claim(WORKER, limit=1, lease_duration=600, queues=[job.queue])
    assert [c.id for c in claimed] == [job.pk]
    return claimed[0]


def lease_of(job_id: int) -> tuple[str, str | None, int, bool]:
    job = Job.objects.get(pk=job_id)
    return job.status, job.locked_by, job.attempt, job.cancel_requested


def every_job() -> bulk.JobFilter:
    return bulk.JobFilter()


# --------------------------------------------------------------------------- the filter


def test_the_filter_matches_task_queue_state_time_and_search() -> None:
    wanted = make_job(queue="mail", status="dead", kwargs={"customer_id": 4711}).pk
    make_job(queue="mail", status="dead", kwargs={"customer_id": 4712})
    make_job(queue="mail", status="failed", kwargs={"customer_id": 4711})
    make_job(queue="other", status="dead", kwargs={"customer_id": 4711})
    make_job(queue="mail", status="dead", task_path=OTHER_TASK, kwargs={"customer_id": 4711})
    found = bulk.JobFilter(
        task=TASK_PATH, queue="mail", state="dead", search="kwargs.customer_id:4711"
    ).jobs()
    assert list(found.values_list("pk", flat=True)) == [wanted]


def test_since_and_until_bound_the_enqueue_time() -> None:
    old, middle, new = (make_job().pk for _ in range(3))
    now = datetime.now(UTC)
    for job_id, hours in ((old, 30), (middle, 10), (new, 1)):
        Job.objects.filter(pk=job_id).update(enqueued_at=now - timedelta(hours=hours))
    window = bulk.JobFilter(since=now - timedelta(hours=20), until=now - timedelta(hours=5))
    assert list(window.jobs().values_list("pk", flat=True)) == [middle]
    assert set(
        bulk.JobFilter(since=now - timedelta(hours=20)).jobs().values_list("pk", flat=True)
    ) == {middle, new}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"state": "dying"}, "no job state 'dying'"),
        ({"since": datetime(2024, 1, 1)}, "since must be an aware datetime"),
        (
            {"since": datetime(2024, 1, 2, tzinfo=UTC), "until": datetime(2024, 1, 1, tzinfo=UTC)},
            "must be before until",
        ),
        ({"search": "args.first:1"}, "starts with a position"),
    ],
)
def test_a_bad_filter_is_refused_before_any_job_is_touched(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bulk.JobFilter(**fields)


def test_a_bad_search_is_a_search_syntax_error() -> None:
    with pytest.raises(SearchSyntaxError):
        bulk.JobFilter(search="kwargs.id:")


def test_the_filter_in_words() -> None:
    assert every_job().describe() == "every job"
    assert every_job().is_empty
    described = bulk.JobFilter(queue="mail", state="dead", search="kwargs.a:1").describe()
    assert described == "queue mail, state dead, search 'kwargs.a:1'"


# --------------------------------------------------------------------------- batches


@pytest.mark.parametrize("batch_size", [1, 3, 7, 100])
def test_id_ranges_cover_every_match_once_and_in_order(batch_size: int) -> None:
    ids = make_jobs(10, status="dead")
    make_jobs(5, status="succeeded")
    ranges = list(bulk.id_ranges(Job.objects.filter(status="dead"), batch_size))
    covered = [job_id for r in ranges for job_id in ids if r.after < job_id <= r.upto]
    assert covered == ids
    assert len(ranges) == -(-10 // batch_size)
    assert all(a.upto <= b.after for a, b in itertools.pairwise(ranges))


def test_no_match_no_range() -> None:
    make_jobs(3)
    assert list(bulk.id_ranges(Job.objects.filter(status="dead"), 10)) == []


# --------------------------------------------------------------------------- retry and requeue


def test_retry_takes_every_failed_and_dead_job_across_batches() -> None:
    dead = make_jobs(7, status="dead", attempt=3, max_attempts=3, stall_count=3)
    failed = make_jobs(4, status="failed", attempt=2, max_attempts=2)
    others = [
        *make_jobs(2, status="succeeded"),
        *make_jobs(2, status="cancelled"),
        *make_jobs(2),
    ]
    live = running_job()
    result = bulk.retry(every_job().jobs(), batch_size=3)
    assert (result.count, result.key_held) == (11, 0)
    assert result.batches == 4
    assert result.summary() == "11 jobs retried"
    assert set(statuses(dead + failed)) == {"pending"}
    assert statuses(others) == ["succeeded"] * 2 + ["cancelled"] * 2 + ["pending"] * 2
    retried = Job.objects.get(pk=dead[0])
    assert (retried.max_attempts, retried.stall_count, retried.finished_at) == (4, 0, None)
    assert lease_of(live.id) == ("running", WORKER, live.attempt, False)


def test_requeue_dead_takes_dead_letters_only() -> None:
    dead = make_jobs(3, status="dead")
    failed = make_jobs(2, status="failed")
    result = bulk.requeue_dead(every_job().jobs(), batch_size=2)
    assert (result.count, result.summary()) == (3, "3 jobs requeued")
    assert statuses(dead) == ["pending"] * 3
    assert statuses(failed) == ["failed"] * 2


def test_a_retry_never_touches_a_job_that_changed_since_it_matched() -> None:
    """The job matched as dead, was retried alone and claimed: its live lease stays."""
    job = make_job(queue="live", status="dead")
    jobs = bulk.JobFilter(queue="live").jobs()
    assert bulk.count(bulk.Action.RETRY, jobs) == 1
    assert leases.retry(job.pk) == leases.RetryResult.RETRIED
    (claimed,) = leases.claim(WORKER, limit=1, lease_duration=600, queues=["live"])
    assert bulk.retry(jobs).count == 0
    assert lease_of(job.pk) == ("running", WORKER, claimed.attempt, False)


def test_a_retry_leaves_jobs_whose_dedup_key_is_held() -> None:
    """A key held by an active job, and a key two dead jobs share (one in this batch, one
    in the next): the first of each free key is retried, the others stay, no error."""
    holder = make_job(key="held").pk
    blocked = make_job(key="held", status="dead").pk
    first = make_job(key="shared", status="dead").pk
    filler = make_jobs(2, status="dead")
    second = make_job(key="shared", status="dead").pk
    third = make_job(key="shared", status="dead").pk
    free = make_job(key="free", status="dead").pk
    result = bulk.retry(bulk.JobFilter(state="dead").jobs(), batch_size=3)
    assert (result.count, result.key_held) == (4, 3)
    assert "3 left as they were: another active job holds their dedup key" in result.summary()
    assert statuses([holder, blocked, first, *filler, second, third, free]) == [
        "pending",
        "dead",
        "pending",
        "pending",
        "pending",
        "dead",
        "dead",
        "pending",
    ]


# --------------------------------------------------------------------------- cancel


def test_cancel_ends_jobs_not_started_and_asks_running_ones() -> None:
    pending = make_jobs(5)
    scheduled = make_job(run_after=datetime.now(UTC) + timedelta(hours=1)).pk
    finished = make_jobs(2, status="succeeded")
    live = running_job()
    asked = running_job()
    assert leases.cancel(asked.id) == leases.CancelResult.REQUESTED
    result = bulk.cancel(every_job().jobs(), batch_size=2)
    assert (result.count, result.cancel_requested) == (7, 1)
    assert result.summary() == (
        "7 jobs cancelled (1 of them running: cancel requested, their workers stop them)"
    )
    assert set(statuses([*pending, scheduled])) == {"cancelled"}
    assert statuses(finished) == ["succeeded"] * 2
    # The running job keeps its lease: its worker sees the request at its next renewal.
    assert lease_of(live.id) == ("running", WORKER, live.attempt, True)
    renewed = leases.renew(WORKER, [(live.id, live.attempt)], lease_duration=600)
    assert (live.id, live.attempt) in renewed.cancel_requested


def test_cancelling_a_workflow_step_ends_its_dependants_like_a_single_cancel() -> None:
    result = chain(step(wf.value, 1), step(wf.value, 2), step(wf.value, 3)).enqueue()
    first, second, third = (int(s.id) for s in result.steps)
    done = bulk.cancel(bulk.JobFilter(search=f"#{first}").jobs())
    assert done.count == 1
    assert statuses([first, second, third]) == ["cancelled", "failed", "failed"]
    assert "ended cancelled" in Job.objects.get(pk=second).last_error


# --------------------------------------------------------------------------- queue and priority


def test_queue_and_priority_change_only_jobs_not_started() -> None:
    live = running_job(queue="mail")
    pending = make_jobs(4, queue="mail")
    waiting = make_job(queue="mail").pk
    Job.objects.filter(pk=waiting).update(status=JobStatus.WAITING, waiting_on=1)
    done = make_jobs(2, queue="mail", status="failed")
    mail = bulk.JobFilter(queue="mail").jobs()
    moved = bulk.set_queue(mail, "slow", batch_size=2)
    assert (moved.count, moved.summary()) == (5, "5 jobs moved")
    assert set(Job.objects.filter(pk__in=[*pending, waiting]).values_list("queue", flat=True)) == {
        "slow"
    }
    assert set(Job.objects.filter(pk__in=[*done, live.id]).values_list("queue", flat=True)) == {
        "mail"
    }
    prioritised = bulk.set_priority(bulk.JobFilter(queue="slow").jobs(), -40, batch_size=3)
    assert prioritised.count == 5
    assert set(Job.objects.filter(queue="slow").values_list("priority", flat=True)) == {-40}
    assert lease_of(live.id) == ("running", WORKER, live.attempt, False)
    assert Job.objects.get(pk=live.id).priority == 0


@pytest.mark.parametrize("queue", ["", "q" * 129])
def test_a_queue_name_out_of_bounds_is_refused(queue: str) -> None:
    with pytest.raises(ValueError, match="a queue name has 1 to 128 characters"):
        bulk.set_queue(every_job().jobs(), queue)


@pytest.mark.parametrize("priority", [101, -101, True])
def test_a_priority_out_of_bounds_is_refused(priority: int) -> None:
    with pytest.raises(ValueError, match="a priority is"):
        bulk.set_priority(every_job().jobs(), priority)


# --------------------------------------------------------------------------- delete


def test_delete_finished_deletes_finished_jobs_and_their_attempts_only() -> None:
    finished = [
        *make_jobs(3, status="succeeded"),
        *make_jobs(2, status="dead"),
        *make_jobs(1, status="cancelled"),
    ]
    JobAttempt.objects.create(
        job_id=finished[3], attempt=1, worker="w", outcome="lease_expired", error_class="E"
    )
    pending = make_jobs(2)
    live = running_job()
    result = bulk.delete_finished(every_job().jobs(), batch_size=4)
    assert (result.count, result.summary()) == (6, "6 jobs deleted")
    assert statuses(finished) == ["deleted"] * 6
    assert not JobAttempt.objects.filter(job_id=finished[3]).exists()
    assert statuses(pending) == ["pending", "pending"]
    assert lease_of(live.id) == ("running", WORKER, live.attempt, False)


# --------------------------------------------------------------------------- counts and act


def test_count_is_what_the_action_would_take() -> None:
    make_jobs(3, status="dead")
    make_jobs(2, status="failed")
    make_jobs(4)
    running_job()
    jobs = every_job().jobs()
    counts = {action: bulk.count(action, jobs) for action in bulk.Action}
    assert counts == {
        bulk.Action.RETRY: 5,
        bulk.Action.REQUEUE_DEAD: 3,
        bulk.Action.CANCEL: 5,
        bulk.Action.SET_QUEUE: 4,
        bulk.Action.SET_PRIORITY: 4,
        bulk.Action.DELETE_FINISHED: 5,
    }


def test_act_needs_the_value_of_a_change() -> None:
    with pytest.raises(ValueError, match="set-queue needs the new queue"):
        bulk.act(bulk.Action.SET_QUEUE, every_job().jobs())
    make_jobs(2)
    result = bulk.act(bulk.Action.SET_PRIORITY, every_job().jobs(), bulk.Change(priority=9))
    assert result.count == 2


def test_each_action_logs_its_count(leasejobs_log: Any) -> None:
    make_jobs(2, status="dead")
    bulk.retry(every_job().jobs())
    (record,) = [r for r in leasejobs_log.records if getattr(r, "bulk_action", None)]
    assert (record.bulk_action, record.count, record.batches) == ("retry", 2, 1)
    assert (record.key_held, record.database) == (0, connection.alias)
