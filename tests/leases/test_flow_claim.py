"""Flow control in the claim (``leases/flow.py``): paused queues, concurrency limits per
queue, task and key, rate limits; a slot freed by every ending; concurrent claimers.

The contract suite: every test runs once per path of the lease protocol (conftest.py),
in autocommit, as a worker's claims do.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.leases import ErrorInfo
from django_leasejobs.limits import FlowRules, key_group, parse_rate, task_group
from django_leasejobs.models import Job, JobStatus, Queue, RateStart
from tests.helpers_leases import LEASE, expire, make_job, make_jobs, run_in_threads

pytestmark = [pytest.mark.usefixtures("lease_path"), pytest.mark.django_db(transaction=True)]

ERROR = ErrorInfo("builtins.ValueError", "bad", "Traceback (most recent call last):\n...")


def claim(worker: str = "w1", limit: int = 10, **kwargs: object) -> list[leases.ClaimedJob]:
    kwargs.setdefault("lease_duration", LEASE)
    return leases.claim(worker, limit=limit, **kwargs)  # type: ignore[arg-type]


def ids(claimed: list[leases.ClaimedJob]) -> list[int]:
    return [job.id for job in claimed]


def pause(name: str) -> None:
    Queue.objects.update_or_create(backend="default", name=name, defaults={"paused": True})


def keyed(key: str, limit: int = 1, **fields: object) -> Job:
    return make_job(flow_group=key_group(key), concurrency_limit=limit, **fields)


def running_of(group: str) -> int:
    return Job.objects.filter(status=JobStatus.RUNNING, flow_group=group).count()


# --------------------------------------------------------------------------- paused queues


@pytest.mark.parametrize(
    "queues", [None, ("mail",), ("mail", "other"), ("mail", "other", "third")], ids=str
)
def test_a_paused_queue_is_not_claimed_by_any_claim_form(queues: tuple[str, ...] | None) -> None:
    paused = make_job(queue="mail", priority=10)
    other = make_job(queue="other")
    pause("mail")
    claimed = claim(queues=queues)
    assert paused.pk not in ids(claimed)
    if queues is None or "other" in queues:
        assert ids(claimed) == [other.pk]
    Queue.objects.filter(name="mail").update(paused=False)
    assert ids(claim(queues=queues or ("mail",))) == [paused.pk]


def test_a_paused_queue_holds_flow_jobs_and_queue_limited_jobs_too() -> None:
    keyed("a", queue="mail")
    limited = make_job(queue="mail")
    pause("mail")
    rules = FlowRules(queue_limits={"mail": 5})
    assert claim(queues=["mail"], flow=rules) == []
    assert claim(flow=rules) == []
    assert Job.objects.filter(status=JobStatus.PENDING).count() == 2
    Queue.objects.filter(name="mail").update(paused=False)
    assert limited.pk in ids(claim(flow=rules))


def test_pausing_keeps_running_jobs_running_and_their_writes_fenced_as_ever() -> None:
    job = make_job(queue="mail")
    (claimed,) = claim(queues=["mail"])
    pause("mail")
    leases.complete(job.pk, claimed.attempt, "w1", result=3)
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED


def test_another_backends_pause_of_the_same_queue_name_does_not_hold() -> None:
    job = make_job(queue="mail")
    Queue.objects.create(backend="other", name="mail", paused=True)
    assert ids(claim(queues=["mail"])) == [job.pk]


# --------------------------------------------------------------------------- queue limits


def test_a_queue_limit_caps_the_running_jobs_of_that_queue() -> None:
    make_jobs(5, queue="imports")
    others = make_jobs(3, queue="other")
    rules = FlowRules(queue_limits={"imports": 2})
    first = claim(limit=10, flow=rules)
    assert len([j for j in first if j.queue == "imports"]) == 2
    assert {j.id for j in first if j.queue == "other"} == set(others)
    assert claim(limit=10, flow=rules) == []
    done = next(j for j in first if j.queue == "imports")
    leases.complete(done.id, done.attempt, "w1")
    assert [j.queue for j in claim(limit=10, flow=rules)] == ["imports"]


def test_a_queue_limit_holds_across_workers_claiming_at_once() -> None:
    make_jobs(40, queue="imports")
    rules = FlowRules(queue_limits={"imports": 3})
    results = run_in_threads(
        [lambda n=n: claim(f"w{n}", limit=5, flow=rules) for n in range(6)]  # type: ignore[misc]
    )
    assert sum(len(r) for r in results) == 3
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 3


def test_a_queue_limit_applies_to_a_worker_of_every_queue() -> None:
    make_jobs(4, queue="imports")
    rules = FlowRules(queue_limits={"imports": 1})
    assert len(claim(queues=None, flow=rules)) == 1


# --------------------------------------------------------------------------- task and key limits


def test_a_task_limit_caps_the_running_jobs_of_the_task() -> None:
    group = task_group("tests.tasks.add")
    for _ in range(4):
        make_job(flow_group=group, concurrency_limit=2)
    plain = make_job()
    claimed = claim()
    assert plain.pk in ids(claimed)
    assert running_of(group) == 2


def test_a_key_limit_caps_each_key_and_keeps_the_order_within_a_key() -> None:
    low = keyed("customer-1", priority=0)
    high = keyed("customer-1", priority=5)
    other = keyed("customer-2")
    claimed = claim()
    assert sorted(ids(claimed)) == sorted([high.pk, other.pk])
    (first,) = [j for j in claimed if j.id == high.pk]
    leases.complete(first.id, first.attempt, "w1")
    assert ids(claim()) == [low.pk]


def test_keys_share_their_limit_across_tasks_and_queues() -> None:
    first = keyed("customer-1", queue="a")
    keyed("customer-1", queue="b", task_path="tests.tasks.echo")
    assert ids(claim(queues=["a", "b"])) == [first.pk]


def test_a_limit_of_two_on_one_key_lets_two_run() -> None:
    for _ in range(5):
        keyed("k", limit=2)
    assert len(claim()) == 2
    assert running_of(key_group("k")) == 2


def test_a_full_key_does_not_hold_back_other_jobs_claimed_in_the_same_claim() -> None:
    blocker = keyed("busy", priority=50)
    claim(limit=1)
    backlog = [keyed("busy", priority=50).pk for _ in range(20)]
    others = make_jobs(3)
    free_key = keyed("free")
    claimed = claim(limit=10)
    assert sorted(ids(claimed)) == sorted([*others, free_key.pk])
    assert Job.objects.filter(pk__in=backlog, status=JobStatus.PENDING).count() == 20
    assert Job.objects.get(pk=blocker.pk).status == JobStatus.RUNNING


def test_claim_order_across_lanes_follows_priority() -> None:
    plain = make_job(priority=0)
    limited = keyed("k", priority=10)
    assert ids(claim(limit=1)) == [limited.pk]
    assert ids(claim(limit=1)) == [plain.pk]


def test_a_key_limit_holds_across_workers_claiming_at_once() -> None:
    for _ in range(30):
        keyed("one-at-a-time")
    for _ in range(30):
        keyed("two-at-a-time", limit=2)
    results = run_in_threads(
        [lambda n=n: claim(f"w{n}", limit=4) for n in range(6)]  # type: ignore[misc]
    )
    assert sum(len(r) for r in results) == 3
    assert running_of(key_group("one-at-a-time")) == 1
    assert running_of(key_group("two-at-a-time")) == 2


# --------------------------------------------------------------------------- slots come back


def _run_one(key: str) -> tuple[Job, leases.ClaimedJob, Job]:
    first = keyed(key)
    second = keyed(key)
    (claimed,) = claim()
    assert claimed.id == first.pk
    assert claim() == []
    return first, claimed, second


ENDINGS = ["success", "failure", "retry", "release", "cancel", "unclaim", "lease_expired", "reap"]


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_ending_frees_the_slot(ending: str) -> None:
    _, claimed, second = _run_one("k")
    job_id, attempt = claimed.id, claimed.attempt
    if ending == "success":
        leases.complete(job_id, attempt, "w1")
    elif ending == "failure":
        leases.fail(job_id, attempt, "w1", error=ERROR, retry_delay=None)
    elif ending == "retry":
        # Back to pending with a delay: its slot is free, and the other job takes it.
        leases.fail(job_id, attempt, "w1", error=ERROR, retry_delay=600)
    elif ending == "release":
        leases.release(job_id, attempt, "w1")
        Job.objects.filter(pk=job_id).update(priority=-1)  # behind the other job
    elif ending == "cancel":
        leases.cancel(job_id)
        leases.mark_cancelled(job_id, attempt, "w1")
    elif ending == "unclaim":
        leases.unclaim("w1", [(job_id, attempt)])
        Job.objects.filter(pk=job_id).update(priority=-1)
    elif ending == "lease_expired":
        expire(job_id)  # the worker died; no reaper has run yet
    elif ending == "reap":
        expire(job_id)
        leases.reap()
        Job.objects.filter(pk=job_id).update(priority=-1)
    assert ids(claim(limit=1)) == [second.pk]


# --------------------------------------------------------------------------- rate limits


def _age_starts(seconds: float) -> None:
    RateStart.objects.update(started_at=Now() - timedelta(seconds=seconds))


def test_a_task_rate_allows_n_starts_per_period_and_no_more() -> None:
    group = task_group("tests.tasks.add")
    jobs = [make_job(flow_group=group, rate_limit="3/m").pk for _ in range(8)]
    plain = make_job()
    first = claim(limit=10)
    assert plain.pk in ids(first)
    assert len([j for j in first if j.id in jobs]) == 3
    for job in first:  # finishing does not give a start back
        leases.complete(job.id, job.attempt, "w1")
    assert claim(limit=10) == []
    _age_starts(61)
    assert len(claim(limit=10)) == 3


def test_retries_count_against_the_rate() -> None:
    group = task_group("tests.tasks.add")
    job = make_job(flow_group=group, rate_limit="2/h")
    make_job(flow_group=group, rate_limit="2/h")
    (first, _) = claim(limit=2)
    leases.fail(first.id, first.attempt, "w1", error=ERROR, retry_delay=0)
    Job.objects.filter(pk=job.pk).update(run_after=Now() - timedelta(seconds=1))
    assert claim(limit=2) == []
    assert RateStart.objects.filter(scope=group).count() == 2


def test_a_queue_rate_counts_every_job_of_the_queue() -> None:
    make_jobs(5, queue="emails")
    other = make_job(queue="other")
    rules = FlowRules(queue_rates={"emails": parse_rate("2/s")})
    claimed = claim(limit=10, flow=rules)
    assert len([j for j in claimed if j.queue == "emails"]) == 2
    assert other.pk in ids(claimed)
    assert claim(limit=10, flow=rules) == []
    _age_starts(2)
    assert len(claim(limit=10, flow=rules)) == 2


def test_starts_older_than_their_window_are_pruned() -> None:
    group = task_group("tests.tasks.add")
    for _ in range(3):
        make_job(flow_group=group, rate_limit="1/s")
    claim()
    _age_starts(5)
    claim()
    assert RateStart.objects.count() == 1


def test_a_rate_limit_and_a_key_limit_together() -> None:
    for n in range(3):
        make_job(flow_group=key_group(f"k{n}"), concurrency_limit=1, rate_limit="2/m")
    assert len(claim()) == 2


# --------------------------------------------------------------------------- hostile rows


def test_rows_with_unreadable_flow_values_still_run() -> None:
    bad_rate = make_job(flow_group=task_group("tests.tasks.add"), rate_limit="lots")
    zero = keyed("zero", limit=0)
    keyed("zero", limit=0)
    claimed = ids(claim())
    assert bad_rate.pk in claimed and zero.pk in claimed  # a limit below 1 counts as 1
    assert len(claimed) == 2


# --------------------------------------------------------------------------- held back


def test_a_claim_round_says_when_limits_held_due_jobs_back() -> None:
    keyed("k")
    keyed("k")
    first = leases.claim_round("w1", limit=5, lease_duration=LEASE)
    assert len(first.jobs) == 1
    assert first.flow_held is True
    again = leases.claim_round("w1", limit=5, lease_duration=LEASE)
    assert (again.jobs, again.flow_held) == ([], True)
    make_job()
    free = leases.claim_round("w1", limit=5, lease_duration=LEASE)
    assert len(free.jobs) == 1
    assert free.flow_held is True  # the key is still full


def test_a_claim_round_without_limits_in_the_way_is_not_held() -> None:
    keyed("k")
    make_jobs(2)
    taken = leases.claim_round("w1", limit=5, lease_duration=LEASE)
    assert (len(taken.jobs), taken.flow_held) == (3, False)


def test_a_full_queue_limit_holds_even_without_candidates_read() -> None:
    make_jobs(2, queue="imports")
    rules = FlowRules(queue_limits={"imports": 1})
    assert len(claim(flow=rules)) == 1
    held = leases.claim_round("w1", limit=5, lease_duration=LEASE, flow=rules)
    assert (held.jobs, held.flow_held) == ([], True)


def test_main_lane_first_takes_jobs_without_limits_first_and_flow_jobs_for_the_rest() -> None:
    flow_job = keyed("k", priority=10)
    limited = make_job(queue="imports", priority=10)
    plain = make_jobs(2, priority=0)
    rules = FlowRules(queue_limits={"imports": 5})
    queues = ["default", "imports"]

    def first(limit: int) -> leases.ClaimRound:
        return leases.claim_round(
            "w1", limit=limit, lease_duration=LEASE, flow=rules, queues=queues, main_lane_first=True
        )

    taken = first(2)  # the main lane fills it: no flow claim, whatever priority says
    assert sorted(ids(taken.jobs)) == plain
    assert taken.flow_held is False
    assert Job.objects.get(pk=flow_job.pk).status == JobStatus.PENDING
    rest = first(5)  # the main lane is empty: a flow claim takes the rest
    assert sorted(ids(rest.jobs)) == sorted([flow_job.pk, limited.pk])


def test_a_claim_round_is_held_when_a_full_group_is_skipped_even_if_it_fills_up() -> None:
    keyed("k", priority=10)
    claim(limit=1)
    keyed("k", priority=10)
    others = [keyed(f"other-{n}").pk for n in range(3)]
    taken = leases.claim_round("w1", limit=3, lease_duration=LEASE)
    assert sorted(ids(taken.jobs)) == others
    assert taken.flow_held is True


# --------------------------------------------------------------------------- the flow lane's reads


def test_a_full_keys_backlog_longer_than_the_window_does_not_hide_other_keys() -> None:
    keyed("busy", priority=50)
    claim(limit=1)
    for _ in range(30):  # far more than the window of a claim of 2 (leases.flow)
        keyed("busy", priority=50)
    free = keyed("free", priority=0)
    late = keyed("late", priority=-5)
    assert ids(claim(limit=2)) == [free.pk, late.pk]


def test_a_group_with_room_in_a_crowded_window_is_taken_in_order() -> None:
    first = keyed("two", limit=2, priority=9)
    second = keyed("two", limit=2, priority=8)
    for _ in range(10):
        keyed("two", limit=2, priority=7)
    other = keyed("other", priority=0)
    assert sorted(ids(claim(limit=3))) == sorted([first.pk, second.pk, other.pk])


def test_when_the_window_has_room_no_group_is_scanned() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the window and the skip scan are PostgreSQL's flow lane")
    for n in range(5):
        keyed(f"k{n}")
    statements: list[str] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert len(claim(limit=3)) == 3
    assert not [s for s in statements if s.startswith("WITH RECURSIVE g(")]  # no group scan
