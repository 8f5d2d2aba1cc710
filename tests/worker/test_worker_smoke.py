"""The worker end to end, in a real subprocess: jobs run once, results land."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_leasejobs.models import Job, JobStatus
from tests import tasks, tasks_worker
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_burst_worker_runs_every_job_once_and_exits(workers, marker_dir: str) -> None:
    ids = [tasks_worker.record.enqueue(marker_dir, "quick").id for _ in range(30)]
    failing = tasks_worker.fail_always.enqueue("nope").id
    async_id = tasks_worker.async_add.enqueue(2, 3).id
    plain = tasks.plain_django_task.enqueue(21).id

    worker = workers.start(args=["--burst", "--concurrency", "3"])
    assert worker.wait(timeout=60) == 0, worker.output

    runs = (Path(marker_dir) / "quick.runs").read_text().splitlines()
    assert len(runs) == 30
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    assert tasks_worker.async_add.get_result(async_id).return_value == 5
    assert tasks.plain_django_task.get_result(plain).return_value == 42
    failed = tasks_worker.fail_always.get_result(failing)
    assert failed.status == "FAILED"
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"] * 3
    assert "stopped after" in worker.output


def test_idle_worker_picks_up_a_new_job_and_stops_on_sigterm(workers, marker_dir: str) -> None:
    worker = workers.start(args=["--concurrency", "1"])
    result = tasks_worker.record.enqueue(marker_dir, "later")
    wait_until(
        lambda: Job.objects.filter(pk=result.id, status=JobStatus.SUCCEEDED).exists(),
        what="the job enqueued after the worker started to succeed",
    )
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output
