"""The prefetch back-off (``worker/dispatch.py``), on a worker object in the test's process.

A worker that has to give back prefetched jobs it could not start within
``PREFETCH_MAX_WAIT`` divides its prefetch limit by ``PREFETCH_BACKOFF``; each job it
then starts promptly raises the limit by ``PREFETCH_REGROWTH``, up to ``--prefetch``.
(bench/workers.py shows what this buys with many workers on few cores; here, the rule.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from django_leasejobs.leases import ClaimedJob
from django_leasejobs.worker import Worker, WorkerConfig
from django_leasejobs.worker.dispatch import (
    PREFETCH_BACKOFF,
    PREFETCH_MAX_WAIT,
    PREFETCH_REGROWTH,
    SLOW_ROUND_SHARE,
    Dispatcher,
)
from django_leasejobs.worker.jobs import RunningJob
from django_leasejobs.worker.pools import Room
from django_leasejobs.worker.rounds import Ending

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker() -> Iterator[Worker]:
    worker = Worker(WorkerConfig(pool="thread", concurrency=1, prefetch=64))
    worker.dispatcher.mean_duration = 1e-5  # no-op jobs: the full prefetch is allowed
    yield worker
    worker.inbox.close()


def prefetched(worker: Worker, count: int, waited: float) -> list[RunningJob]:
    """``count`` claimed jobs waiting in ``worker.book.ready`` for ``waited`` seconds."""
    now = time.monotonic()
    jobs = []
    for index in range(count):
        job = ClaimedJob(
            id=1000 + index,
            attempt=1,
            task_path="tests.tasks.add",
            queue="default",
            priority=0,
            args=[1, 2],
            kwargs={},
            timeout=None,
            max_attempts=3,
            checkpoint=None,
        )
        running = RunningJob(job=job, task=None, started=now - waited)
        worker.book.add([running], now, worker.options.lease_duration)
        worker.book.ready.append(running)
        jobs.append(running)
    return jobs


def test_a_give_back_divides_the_prefetch_limit(worker: Worker) -> None:
    assert worker.dispatcher.prefetch_now() == 64
    worker.pool.free_slots = lambda: 0  # type: ignore[method-assign]  # every slot busy
    stale = prefetched(worker, 5, waited=PREFETCH_MAX_WAIT + 0.5)
    worker.handover.give_back_stale()
    # Given back (unclaims queued for the next round), prefetch paused until a slot frees,
    # and the limit cut: the next claims hold a quarter as many jobs ahead of the slots.
    assert not worker.book.ready
    assert [running for running, what in worker.recorder.writes] == stale
    assert all(
        isinstance(what, Ending) and what.kind == "unclaim" for _, what in worker.recorder.writes
    )
    assert worker.dispatcher.prefetch_now() == 0
    worker.dispatcher.prefetch_paused = False
    assert worker.dispatcher.prefetch_now() == int(64 / PREFETCH_BACKOFF)
    # Each give-back divides it again, never below one job.
    for _ in range(10):
        prefetched(worker, 1, waited=PREFETCH_MAX_WAIT + 0.5)
        worker.handover.give_back_stale()
    worker.dispatcher.prefetch_paused = False
    assert worker.dispatcher.prefetch_now() == 1


def test_prompt_starts_regrow_the_limit_up_to_prefetch(worker: Worker) -> None:
    worker.dispatcher.prefetch_limit = 1.0
    submitted: list[int] = []
    # One slot with room for everything (the slot's batches are counted job by job).
    worker.pool.rooms = lambda depth: [Room(0, 10_000, True)]  # type: ignore[method-assign]
    worker.pool.submit = lambda slot, specs: submitted.extend(s.job.id for s in specs)  # type: ignore[method-assign]
    prefetched(worker, 16, waited=0.0)
    worker.handover.dispatch()
    assert len(submitted) == 16
    assert worker.dispatcher.prefetch_limit == pytest.approx(1.0 + 16 * PREFETCH_REGROWTH)
    # A job that waited longer than a quarter of PREFETCH_MAX_WAIT does not count.
    prefetched(worker, 1, waited=PREFETCH_MAX_WAIT / 2)
    worker.handover.dispatch()
    assert worker.dispatcher.prefetch_limit == pytest.approx(1.0 + 16 * PREFETCH_REGROWTH)
    # Never above --prefetch.
    prefetched(worker, 1000, waited=0.0)
    worker.handover.dispatch()
    assert worker.dispatcher.prefetch_limit == 64.0
    assert worker.dispatcher.prefetch_now() == 64


def test_slow_rounds_stop_prefetching_for_a_lease_after_the_last_one() -> None:
    """Back-pressure (issue 27): while its database rounds or renewals are slow, and for
    one lease after the last slow one, a worker claims for its free slots only, so it
    never holds more leases than it can run, renew and record."""
    dispatcher = Dispatcher(concurrency=2, prefetch=64, lease_duration=4.0)
    dispatcher.mean_duration = 1e-5
    assert dispatcher.claim_limit(free_slots=2, waiting=0, jobs_left=None) == 66
    slow = SLOW_ROUND_SHARE * 4.0 + 0.01
    assert dispatcher.took(slow, now=100.0) is True  # the pace changed: the worker logs it
    assert dispatcher.claim_limit(free_slots=2, waiting=0, jobs_left=None) == 2
    assert dispatcher.took(0.01, now=101.0) is False  # one quick round is not enough
    assert dispatcher.claim_limit(free_slots=0, waiting=0, jobs_left=None) == 0
    assert dispatcher.took(slow, now=102.0) is False  # slow again: a lease from now
    assert dispatcher.took(0.01, now=105.9) is False
    assert dispatcher.took(0.01, now=106.1) is True
    assert dispatcher.claim_limit(free_slots=2, waiting=0, jobs_left=None) == 66


def test_the_claim_never_exceeds_what_max_jobs_leaves() -> None:
    dispatcher = Dispatcher(concurrency=4, prefetch=0, lease_duration=30.0)
    assert dispatcher.claim_limit(free_slots=4, waiting=0, jobs_left=3) == 3
    assert dispatcher.claim_limit(free_slots=4, waiting=1, jobs_left=None) == 3
    assert dispatcher.claim_limit(free_slots=0, waiting=2, jobs_left=None) == 0
