"""A worker freezes its start-up heap (``gc.freeze``): Django, the site and its tasks stay
out of the cyclic GC's passes for the worker's life, in every pool and in the workers
``--processes`` forks (issue 32: the GC walked that heap while jobs ran). Real
``runworker`` subprocesses."""

from __future__ import annotations

import pytest

from django_leasejobs.models import Job, JobStatus
from tests import tasks_worker
from tests.worker.test_async_jobs import BURST_BOUND

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STARTUP_OBJECTS = 20_000
"""Fewer than a Django site's start-up heap holds (about 70,000 in the test project)."""


@pytest.mark.parametrize(
    "args",
    [
        ["--pool", "thread", "--concurrency", "1"],
        ["--pool", "process", "--concurrency", "1"],
        ["--processes", "2", "--pool", "thread", "--concurrency", "1"],
    ],
    ids=["thread", "process", "forked-workers"],
)
def test_the_jobs_run_beside_a_frozen_start_up_heap(workers, args: list[str]) -> None:
    ids = [int(tasks_worker.frozen_objects.enqueue().id) for _ in range(2)]
    worker = workers.start(args=[*args, "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    for job in Job.objects.filter(pk__in=ids):
        assert job.status == JobStatus.SUCCEEDED, worker.output
        assert job.result > STARTUP_OBJECTS, job.result
