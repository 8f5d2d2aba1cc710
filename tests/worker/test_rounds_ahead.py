"""A round that claims ahead (``driver.MAX_IN_FLIGHT``): while a drain's round is in
flight, the next one waits in the database thread behind it, so that the thread never
idles while the main loop takes a round's result.

The rule, on the dispatch policy alone; and a real worker (this process, real threads, a
real database) that drains a backlog: it claims ahead, holds no more leases than its
free slots and two prefetches, runs every job once, and claims nothing ahead without a
prefetch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from django_leasejobs.compat import task_backends
from django_leasejobs.models import Job, JobAttempt, JobStatus
from django_leasejobs.worker import Worker, WorkerConfig
from django_leasejobs.worker.dispatch import SLOW_ROUND_SHARE, Dispatcher
from django_leasejobs.worker.driver import MAX_IN_FLIGHT
from django_leasejobs.worker.rounds import RoundPlan

from .. import tasks

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 1500
CONCURRENCY = 4
PREFETCH = 64


def test_a_round_behind_another_may_hold_a_second_prefetch_and_none_while_slow() -> None:
    dispatcher = Dispatcher(concurrency=2, prefetch=PREFETCH, lease_duration=4.0)
    dispatcher.mean_duration = 1e-5  # no-op jobs: the full prefetch
    first = dispatcher.claim_limit(free_slots=2, waiting=0, jobs_left=None)
    assert first == 2 + PREFETCH
    # The round in flight may bring ``first`` jobs: they count as waiting.
    assert dispatcher.claim_limit(free_slots=2, waiting=first, jobs_left=None) == 0
    behind = MAX_IN_FLIGHT  # the rounds in flight once the one behind starts
    assert dispatcher.claim_limit(
        free_slots=2, waiting=first, jobs_left=None, rounds=behind
    ) == PREFETCH * (behind - 1)
    assert dispatcher.claim_limit(free_slots=2, waiting=first, jobs_left=40, rounds=behind) == 40
    # Less than half a prefetch is not worth a round of its own.
    assert dispatcher.claim_limit(free_slots=2, waiting=first, jobs_left=10, rounds=behind) == 0
    dispatcher.took(SLOW_ROUND_SHARE * 4.0 + 0.01, now=100.0)  # a slow round: no prefetch
    assert dispatcher.claim_limit(free_slots=2, waiting=2, jobs_left=None, rounds=behind) == 0


@dataclass(frozen=True)
class Start:
    """A round as the main loop handed it to the database thread."""

    behind: int
    """Rounds in flight when it started."""
    claim_limit: int
    writes: int
    running: int
    """Jobs in the slots then."""
    waiting: int
    """Claimed jobs waiting for a slot then."""
    claiming: int
    """Jobs the rounds in flight before it could still bring."""


def drain(prefetch: int) -> list[Start]:
    """A burst worker (thread pool) drains ``JOBS`` no-op jobs; the rounds it started."""
    task_backends["default"].bulk_enqueue([(tasks.add, [i, 1], {}) for i in range(JOBS)])
    worker = Worker(
        WorkerConfig(burst=True, concurrency=CONCURRENCY, pool="thread", prefetch=prefetch)
    )
    starts: list[Start] = []
    start = worker.rounds.start

    def noting(plan: RoundPlan, *, listening: bool, burst: bool) -> None:
        rounds = worker.rounds
        starts.append(
            Start(
                rounds.in_flight,
                plan.claim_limit,
                plan.writes,
                CONCURRENCY - worker.pool.free_slots(),
                len(worker.book.ready),
                rounds.claiming,
            )
        )
        start(plan, listening=listening, burst=burst)

    worker.rounds.start = noting  # type: ignore[method-assign]
    assert worker.run() == 0
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == JOBS
    # Every job ran once: one attempt, none ended otherwise (a success writes no attempt row).
    assert not Job.objects.filter(attempt__gt=1).exists()
    assert not JobAttempt.objects.exists()
    return starts


def test_a_drain_claims_ahead_within_two_prefetches_and_runs_every_job_once() -> None:
    starts = drain(PREFETCH)
    ahead = [s for s in starts if s.behind and s.claim_limit]
    assert ahead, starts  # a round waited behind another, claiming
    assert max(s.behind for s in starts) == MAX_IN_FLIGHT - 1
    bound = CONCURRENCY + 2 * PREFETCH
    for s in starts:
        # Leases of jobs not done yet, coming and asked for: never more than the slots
        # and two prefetches (a job done keeps its lease only until its outcome's round).
        assert s.running + s.waiting + s.claiming + s.claim_limit <= bound, s
        if s.behind:
            assert s.claim_limit >= PREFETCH // 2, s  # only full-size claims wait behind


def test_without_a_prefetch_no_round_waits_behind_another() -> None:
    starts = drain(0)
    assert not [s for s in starts if s.behind], starts
