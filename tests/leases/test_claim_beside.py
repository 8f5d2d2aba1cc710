"""A round's claim beside its writes (``worker.rounds.run_round`` with ``beside``).

On PostgreSQL a worker's round runs its claim on a second database thread, on that
thread's connection, while the first writes the round's outcomes. These tests run rounds
in process against the real database, with real threads and connections:

* the claim runs beside plain successes, and claims what it would have claimed after them;
* it follows the writes when one of them could make room for it (a failure, a job given
  back, a success that frees a flow group's place or a queue-wide limit's, a workflow
  step's): then it still claims, in the same round, the job the write freed;
* a dead connection on either side fails the round and loses nothing: the outcomes that
  were not written are written again, the jobs the claim took are in the result;
* where the database runs the two one after the other (MariaDB, SQLite), no worker has a
  second database thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import pytest
from django.db import OperationalError, connection, connections

from django_leasejobs import leases
from django_leasejobs.leases import ClaimedJob
from django_leasejobs.limits import FlowRules, key_group
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker.execution import Outcome
from django_leasejobs.worker.jobs import RunningJob
from django_leasejobs.worker.rounds import (
    Ending,
    RoundContext,
    RoundPlan,
    claims_beside,
    run_round,
)
from tests.helpers_leases import LEASE, claimed_job, make_job, make_jobs

db = pytest.mark.django_db(transaction=True)
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="only PostgreSQL claims beside the writes (leases.claims_beside_writes)",
)
WORKER = "worker-beside"
P = ParamSpec("P")
T = TypeVar("T")


def _ctx(flow: FlowRules | None = None) -> RoundContext:
    return RoundContext(
        worker_id=WORKER,
        database="default",
        backend="default",
        queues=None,
        lease_duration=LEASE,
        flow=flow or FlowRules(),
    )


class CountingThread(ThreadPoolExecutor):
    """One database thread of its own (its own connection), counting what it was given."""

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.submitted = 0

    def submit(  # type: ignore[override]
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)

    def backend_pid(self) -> int:
        def pid() -> int:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                return int(cursor.fetchone()[0])

        return super().submit(pid).result()

    def close(self) -> None:
        super().submit(connections.close_all).result()
        self.shutdown(wait=True)


@pytest.fixture
def threads() -> Iterator[tuple[CountingThread, CountingThread]]:
    """The worker's two database threads: the round's, and the one beside it."""
    main, beside = CountingThread("test-db"), CountingThread("test-db-claim")
    try:
        yield main, beside
    finally:
        main.close()
        beside.close()


def _claim(limit: int, flow: FlowRules | None = None) -> list[ClaimedJob]:
    return leases.claim(WORKER, limit=limit, lease_duration=LEASE, flow=flow or FlowRules())


def _successes(claimed: list[ClaimedJob]) -> list[tuple[RunningJob, Outcome]]:
    return [
        (RunningJob(job=job, task=None, started=0.0), Outcome(job.lease, ok=True, result=job.id))
        for job in claimed
    ]


def _success_round(
    running: int, claim_limit: int, flow: FlowRules | None = None
) -> tuple[list[ClaimedJob], RoundPlan]:
    """Claim ``running`` jobs, and a round that writes their successes and claims."""
    claimed = _claim(running, flow)
    return claimed, RoundPlan(successes=_successes(claimed), claim_limit=claim_limit)


def _kill(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone()[0] is True


def _statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))


# -- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "flow", "beside"),
    [
        (claimed_job(), FlowRules(), True),
        (claimed_job(flow_group=key_group("k")), FlowRules(), False),
        (claimed_job(workflow_id=7), FlowRules(), False),
        (claimed_job(queue="limited"), FlowRules(queue_limits={"limited": 2}), False),
        (claimed_job(queue="other"), FlowRules(queue_limits={"limited": 2}), True),
    ],
    ids=["plain", "flow-group", "workflow-step", "limited-queue", "other-queue"],
)
def test_the_claim_runs_beside_writes_that_cannot_make_room_for_it(
    job: ClaimedJob, flow: FlowRules, beside: bool
) -> None:
    running = RunningJob(job=job, task=None, started=0.0)
    success = RoundPlan(successes=[(running, Outcome(job.lease, ok=True))], claim_limit=4)
    assert claims_beside(success, _ctx(flow)) is beside
    # Any other write may make room (a retry due at once, a job given back): none beside.
    failure = leases.Failure(*job.lease, leases.ErrorInfo("x.Y", "no"), None)
    other = RunningJob(job=claimed_job(), task=None, started=0.0)
    mixed = RoundPlan(successes=success.successes, claim_limit=4)
    mixed.failures = [(other, Outcome(other.job.lease, ok=False), failure, 0.1)]
    assert not claims_beside(mixed, _ctx(flow))
    given_back = RoundPlan(successes=success.successes, claim_limit=4)
    given_back.unclaims = [(other, Ending("unclaim", "prefetched, never started"))]
    assert not claims_beside(given_back, _ctx(flow))


def test_nothing_runs_beside_a_round_without_outcomes_or_without_a_claim() -> None:
    job = claimed_job()
    running = RunningJob(job=job, task=None, started=0.0)
    assert not claims_beside(RoundPlan(claim_limit=4), _ctx())
    assert not claims_beside(RoundPlan(successes=[(running, Outcome(job.lease, ok=True))]), _ctx())


def test_only_postgresql_has_a_second_database_thread() -> None:
    assert leases.claims_beside_writes("default") is (connection.vendor == "postgresql")


# -- rounds on the database ----------------------------------------------------------------


@postgres_only
@db
def test_a_round_claims_beside_its_writes_what_it_would_claim_after_them(
    threads: tuple[CountingThread, CountingThread],
) -> None:
    main, beside = threads
    ids = make_jobs(7)
    running, plan = _success_round(4, claim_limit=10)

    result = main.submit(run_round, plan, _ctx(), beside).result()

    assert result.error is None
    assert beside.submitted == 1
    assert result.wrote_successes
    assert set(result.statuses) == {job.lease for job in running}
    assert sorted(job.id for job in result.claimed or []) == ids[4:]
    assert main.backend_pid() != beside.backend_pid()
    statuses = _statuses(ids)
    assert [statuses[i] for i in ids] == [JobStatus.SUCCEEDED] * 4 + [JobStatus.RUNNING] * 3
    assert set(Job.objects.filter(pk__in=ids[4:]).values_list("locked_by", flat=True)) == {WORKER}


@postgres_only
@db
@pytest.mark.parametrize("limit", ["group", "queue"])
def test_after_a_write_that_frees_a_place_the_claim_follows_and_takes_it(
    threads: tuple[CountingThread, CountingThread], limit: str
) -> None:
    """One place under the limit: the running job holds it, the next job waits for it.
    Claimed beside the write, the next job would not be seen before the next round."""
    main, beside = threads
    if limit == "group":
        flow = FlowRules()
        first, second = (
            make_job(flow_group=key_group("one"), concurrency_limit=1).pk for _ in range(2)
        )
    else:
        flow = FlowRules(queue_limits={"narrow": 1})
        first, second = (make_job(queue="narrow").pk for _ in range(2))
    running, plan = _success_round(5, claim_limit=5, flow=flow)
    assert [job.id for job in running] == [first]

    result = main.submit(run_round, plan, _ctx(flow), beside).result()

    assert result.error is None
    assert beside.submitted == 0
    assert [job.id for job in result.claimed or []] == [second]
    assert _statuses([first, second]) == {first: JobStatus.SUCCEEDED, second: JobStatus.RUNNING}


@postgres_only
@db
def test_a_retry_due_at_once_is_claimed_in_the_round_that_writes_its_failure(
    threads: tuple[CountingThread, CountingThread],
) -> None:
    """(A ``--burst`` worker exits on an empty claim: it must not miss the retry.)"""
    main, beside = threads
    make_job()
    [job] = _claim(1)
    running = RunningJob(job=job, task=None, started=0.0)
    failure = leases.Failure(*job.lease, leases.ErrorInfo("x.Y", "again"), 0.0)
    plan = RoundPlan(failures=[(running, Outcome(job.lease, ok=False), failure, 0.1)])
    plan.claim_limit = 4

    result = main.submit(run_round, plan, _ctx(), beside).result()

    assert result.error is None
    assert beside.submitted == 0
    assert [claimed.lease for claimed in result.claimed or []] == [(job.id, 2)]


@postgres_only
@db
def test_a_claim_that_fails_beside_the_writes_fails_the_round_and_the_writes_stand(
    threads: tuple[CountingThread, CountingThread],
) -> None:
    main, beside = threads
    ids = make_jobs(9)
    _kill(beside.backend_pid())  # its connection is dead: the next claim there fails
    running, plan = _success_round(3, claim_limit=3)

    result = main.submit(run_round, plan, _ctx(), beside).result()

    assert beside.submitted == 1
    assert isinstance(result.error, OperationalError)
    assert result.wrote_successes
    assert set(result.statuses) == {job.lease for job in running}
    assert result.claimed is None
    assert list(_statuses(ids).values()).count(JobStatus.PENDING) == 6
    # The thread beside closed its dead connection: its next claim connects again.
    running, plan = _success_round(3, claim_limit=3)
    again = main.submit(run_round, plan, _ctx(), beside).result()
    assert again.error is None
    assert beside.submitted == 2
    assert sorted(job.id for job in again.claimed or []) == ids[6:]


@postgres_only
@db
def test_writes_that_fail_beside_a_claim_fail_the_round_and_its_claimed_jobs_are_kept(
    threads: tuple[CountingThread, CountingThread],
) -> None:
    main, beside = threads
    ids = make_jobs(6)
    _kill(main.backend_pid())  # the writes' connection is dead
    _, plan = _success_round(3, claim_limit=3)

    result = main.submit(run_round, plan, _ctx(), beside).result()

    assert isinstance(result.error, OperationalError)
    assert not result.wrote_successes  # queued again by the worker, nothing lost
    assert sorted(job.id for job in result.claimed or []) == ids[3:]
    assert list(_statuses(ids).values()).count(JobStatus.RUNNING) == 6
    # The round's thread reconnects, and writes them.
    again = main.submit(run_round, RoundPlan(successes=plan.successes), _ctx(), beside).result()
    assert again.error is None
    assert [_statuses(ids)[i] for i in ids[:3]] == [JobStatus.SUCCEEDED] * 3
