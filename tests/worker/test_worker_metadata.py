"""A job's metadata through a real worker, in both pools: read by the task as
``context.metadata``, saved by the slot when the attempt ends (django/new-features#141)."""

from __future__ import annotations

import pytest

from django_leasejobs.models import Job, JobStatus
from tests import tasks_next_api
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_worker_saves_the_metadata_a_task_changed(workers, pool: str) -> None:
    workers.start(args=["--pool", pool, "--concurrency", "1"])
    result = tasks_next_api.count_runs.using(metadata={"tenant": "acme"}).enqueue(fail_first=True)
    wait_until(
        lambda: Job.objects.filter(pk=result.id, status=JobStatus.SUCCEEDED).exists(),
        timeout=30,
        what="the job to succeed on its second attempt",
    )
    done = tasks_next_api.count_runs.get_result(result.id)
    assert done.return_value == 2
    assert done.metadata == {"tenant": "acme", "runs": 2}
