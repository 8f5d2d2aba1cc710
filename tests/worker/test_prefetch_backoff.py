"""The prefetch back-off of ``worker/loop.py``, on a worker object in the test's process.

A worker that has to give back prefetched jobs it could not start within
``PREFETCH_MAX_WAIT`` divides its prefetch limit by ``PREFETCH_BACKOFF``; each job it
then starts promptly raises the limit by ``PREFETCH_REGROWTH``, up to ``--prefetch``.
(bench/workers.py shows what this buys with many workers on few cores; here, the rule.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from django_leasejobs.leases import ClaimedJob
from django_leasejobs.worker.loop import (
    PREFETCH_BACKOFF,
    PREFETCH_MAX_WAIT,
    PREFETCH_REGROWTH,
    RunningJob,
    Worker,
    WorkerConfig,
)
from django_leasejobs.worker.pools import Room
from django_leasejobs.worker.rounds import Ending

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker() -> Iterator[Worker]:
    worker = Worker(WorkerConfig(pool="thread", concurrency=1, prefetch=64))
    worker._mean_duration = 1e-5  # no-op jobs: the full prefetch is allowed
    yield worker
    os.close(worker._wake_r)
    os.close(worker._wake_w)


def prefetched(worker: Worker, count: int, waited: float) -> list[RunningJob]:
    """``count`` claimed jobs waiting in ``worker.ready`` for ``waited`` seconds."""
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
        running = RunningJob(job=job, task=None, started=now - waited, last_renewed=now)
        worker.running[job.lease] = running
        worker.ready.append(running)
        jobs.append(running)
    return jobs


def test_a_give_back_divides_the_prefetch_limit(worker: Worker) -> None:
    assert worker._prefetch_now() == 64
    worker.pool.free_slots = lambda: 0  # type: ignore[method-assign]  # every slot busy
    stale = prefetched(worker, 5, waited=PREFETCH_MAX_WAIT + 0.5)
    worker._give_back_stale_ready()
    # Given back (unclaims queued for the next round), prefetch paused until a slot frees,
    # and the limit cut: the next claims hold a quarter as many jobs ahead of the slots.
    assert not worker.ready
    assert [running for running, what in worker._writes] == stale
    assert all(isinstance(what, Ending) and what.kind == "unclaim" for _, what in worker._writes)
    assert worker._prefetch_now() == 0
    worker._prefetch_paused = False
    assert worker._prefetch_now() == int(64 / PREFETCH_BACKOFF)
    # Each give-back divides it again, never below one job.
    for _ in range(10):
        prefetched(worker, 1, waited=PREFETCH_MAX_WAIT + 0.5)
        worker._give_back_stale_ready()
    worker._prefetch_paused = False
    assert worker._prefetch_now() == 1


def test_prompt_starts_regrow_the_limit_up_to_prefetch(worker: Worker) -> None:
    worker._prefetch_limit = 1.0
    submitted: list[int] = []
    # One slot with room for everything (the slot's batches are counted job by job).
    worker.pool.rooms = lambda depth: [Room(0, 10_000, True)]  # type: ignore[method-assign]
    worker.pool.submit = lambda slot, specs: submitted.extend(s.job.id for s in specs)  # type: ignore[method-assign]
    prefetched(worker, 16, waited=0.0)
    worker._dispatch_ready()
    assert len(submitted) == 16
    assert worker._prefetch_limit == pytest.approx(1.0 + 16 * PREFETCH_REGROWTH)
    # A job that waited longer than a quarter of PREFETCH_MAX_WAIT does not count.
    prefetched(worker, 1, waited=PREFETCH_MAX_WAIT / 2)
    worker._dispatch_ready()
    assert worker._prefetch_limit == pytest.approx(1.0 + 16 * PREFETCH_REGROWTH)
    # Never above --prefetch.
    prefetched(worker, 1000, waited=0.0)
    worker._dispatch_ready()
    assert worker._prefetch_limit == 64.0
    assert worker._prefetch_now() == 64
