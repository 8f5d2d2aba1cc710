"""The worker end to end, in a real subprocess: jobs run once, results land."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection

from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker.loop import BURST_PATIENCE
from tests import tasks, tasks_worker
from tests.helpers_leases import locked_elsewhere
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


row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no row lock another session could hold (it serialises writers)",
)


@row_locks
def test_a_burst_worker_waits_for_a_due_job_whose_row_another_session_holds(
    workers, marker_dir: str
) -> None:
    # A claim reads past a locked row (SKIP LOCKED): another worker's claim, the worker's
    # own renewal racing a retry's write, or an operator's select_for_update. The job
    # is due all the same: --burst must not exit on that empty claim.
    job = tasks_worker.record.enqueue(marker_dir, "locked").id
    with locked_elsewhere(int(job)):
        worker = workers.start(args=["--burst", "--concurrency", "1"])
        worker.wait_for_event("worker_idle", passed_over=True)
    assert worker.wait(timeout=60) == 0, worker.output
    assert Job.objects.get(pk=job).status == JobStatus.SUCCEEDED
    runs = (Path(marker_dir) / "locked.runs").read_text().splitlines()
    assert [run.split()[0] for run in runs] == ["1"]  # once, its first attempt


@row_locks
def test_a_burst_worker_leaves_a_row_locked_for_good_after_its_patience(workers) -> None:
    job = tasks.add.enqueue(1, 2).id
    with locked_elsewhere(int(job)):
        started = time.monotonic()
        worker = workers.start(args=["--burst", "--concurrency", "1"])
        assert worker.wait(timeout=60) == 0, worker.output
        ran = time.monotonic() - started
    # It looked again at each poll for BURST_PATIENCE, then left the job to others.
    assert ran >= BURST_PATIENCE, ran
    assert len(worker.events("worker_idle", passed_over=True)) >= 2
    assert not worker.events("worker_idle", passed_over=False)
    assert Job.objects.get(pk=job).status == JobStatus.PENDING
