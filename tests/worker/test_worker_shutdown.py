"""Stopping a real ``runworker`` with real signals: graceful, forced, and past the timeout.

The promises (docs, DESIGN "Shutdown"): a first SIGTERM/SIGINT stops claiming, lets the
running jobs finish, deregisters and exits 0; ``--shutdown-timeout`` bounds the wait,
after which running jobs are killed and released back to ``pending`` at once (not a
stall); a second signal does the same immediately.
"""

from __future__ import annotations

import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus, WorkerState
from django_leasejobs.models import Worker as WorkerRow
from tests import tasks_worker
from tests.tasks_worker_shutdown import record_job, wait_for_go
from tests.waiting import wait_until
from tests.worker_harness import WorkerProcess, pid_alive

pytestmark = pytest.mark.django_db(transaction=True)


def _lines(marker_dir: str, name: str) -> list[list[int]]:
    path = Path(marker_dir) / name
    if not path.exists():
        return []
    return [[int(v) for v in line.split()] for line in path.read_text().splitlines()]


def _started(marker_dir: str, name: str) -> list[list[int]]:
    """Lines ``job_id attempt pid`` of attempts of a ``wait_for_go`` job that started."""
    return wait_until(
        lambda: _lines(marker_dir, f"{name}.started"), timeout=20, what=f"{name} to start"
    )


def _new_worker_id(kind: str) -> str:
    return f"shutdown-{kind}-{uuid.uuid4().hex[:8]}"


def _wait_for_state(worker_id: str, state: str) -> None:
    wait_until(
        lambda: WorkerRow.objects.filter(pk=worker_id, state=state).exists(),
        timeout=10,
        what=f"worker row {worker_id} in state {state}",
    )


def _assert_released(job_id: int, worker_id: str) -> None:
    """The job is back to pending after its first attempt, with no stall counted."""
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.PENDING
    assert job.attempt == 1
    assert job.stall_count == 0
    assert job.locked_by is None
    assert job.locked_until is None
    assert job.finished_at is None
    attempts = list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt"))
    assert [(a.attempt, a.outcome, a.worker) for a in attempts] == [
        (1, AttemptOutcome.RELEASED, worker_id)
    ]
    assert attempts[0].error_class == "django_leasejobs.exceptions.JobReleased"
    # Runnable at once: a released job is not delayed like a retry.
    assert Job.objects.ready().filter(pk=job_id).exists()


def _assert_deregistered(worker: WorkerProcess, worker_id: str) -> None:
    row = WorkerRow.objects.get(pk=worker_id)
    assert row.state == WorkerState.STOPPED, worker.output
    assert row.stopped_at is not None
    assert row.pid == worker.pid


@pytest.mark.parametrize(
    ("signum", "pool"),
    [
        (signal.SIGTERM, "process"),
        (signal.SIGINT, "process"),
        (signal.SIGTERM, "thread"),
    ],
    ids=["sigterm-process", "sigint-process", "sigterm-thread"],
)
def test_first_signal_stops_claiming_and_lets_the_running_job_finish(
    workers, marker_dir: str, signum: signal.Signals, pool: str
) -> None:
    worker_id = _new_worker_id("graceful")
    worker = workers.start(
        args=["--concurrency", "2", "--pool", pool, "--worker-id", worker_id],
    )
    slots = worker.slot_pids()
    assert len(slots) == (2 if pool == "process" else 0)
    long = wait_for_go.enqueue(marker_dir, "long")
    [(job_id, attempt, job_pid)] = _started(marker_dir, "long")
    assert (job_id, attempt) == (int(long.id), 1)

    worker.signal(signum)
    worker.wait_for_event("worker_stopping", reason=signum.name, forced=False)
    _wait_for_state(worker_id, WorkerState.STOPPING)

    # A slot is free, a job is ready and announced (NOTIFY on PostgreSQL): a worker that
    # still claimed would take it at once. Let 2.5 s of database time pass, during which
    # the worker keeps heartbeating, and check it did not. That is also longer than the
    # 2 s lease the job was claimed with: a stopping worker must keep renewing it.
    late = record_job.enqueue(marker_dir, "late")
    enqueued_at = Job.objects.get(pk=late.id).enqueued_at
    wait_until(
        lambda: WorkerRow.objects.filter(
            pk=worker_id, last_seen_at__gte=enqueued_at + timedelta(seconds=2.5)
        ).exists(),
        timeout=15,
        what="the stopping worker to heartbeat 2.5 s after the late enqueue",
    )
    assert worker.popen.poll() is None, "the worker must wait for its running job"
    assert Job.objects.get(pk=long.id).status == JobStatus.RUNNING
    assert Job.objects.get(pk=late.id).status == JobStatus.PENDING

    (Path(marker_dir) / "long.go").touch()
    assert worker.wait(timeout=20) == 0, worker.output

    job = Job.objects.get(pk=long.id)
    assert job.status == JobStatus.SUCCEEDED, worker.output
    assert (job.attempt, job.result, job.stall_count) == (1, 1, 0)
    assert job.locked_by is None
    assert not JobAttempt.objects.filter(job_id=long.id).exists()
    assert _lines(marker_dir, "long.runs") == [[int(long.id), 1, job_pid]]

    untouched = Job.objects.get(pk=late.id)
    assert (untouched.status, untouched.attempt, untouched.locked_by) == (
        JobStatus.PENDING,
        0,
        None,
    )
    assert not (Path(marker_dir) / "late.runs").exists()

    _assert_deregistered(worker, worker_id)
    assert [e["attempts"] for e in worker.events("worker_stopped")] == [1]
    assert "stopped after 1 attempts" in worker.output
    for pid in [*slots, job_pid]:
        if pid != worker.pid:
            assert not pid_alive(pid), f"process {pid} outlived the worker"


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_second_signal_kills_the_running_job_and_releases_it(
    workers, marker_dir: str, pool: str
) -> None:
    worker_id = _new_worker_id("force")
    worker = workers.start(args=["--concurrency", "1", "--pool", pool, "--worker-id", worker_id])
    if pool == "process":
        # Runs for a minute and has a grandchild that must die with it.
        job = tasks_worker.spawn_and_wait.enqueue(marker_dir, "long", 60)
        [(attempt, job_pid, grandchild)] = wait_until(
            lambda: _lines(marker_dir, "long.pids"), timeout=20, what="the job to start"
        )
        workers.track([job_pid, grandchild])
        doomed = [job_pid, grandchild]
    else:
        job = wait_for_go.enqueue(marker_dir, "long")
        [(_, attempt, _)] = _started(marker_dir, "long")
        doomed = []
    assert attempt == 1

    worker.terminate()
    worker.wait_for_event("worker_stopping", reason="SIGTERM", forced=False)
    assert Job.objects.get(pk=job.id).status == JobStatus.RUNNING

    signalled = time.monotonic()
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output
    took = time.monotonic() - signalled
    assert took < 8, f"forced shutdown took {took:.1f}s"
    stops = [(e["reason"], e["forced"]) for e in worker.events("worker_stopping")]
    assert stops == [("SIGTERM", False), ("SIGTERM", True)], worker.output
    assert "SIGTERM again" in worker.output

    _assert_released(job.id, worker_id)
    _assert_deregistered(worker, worker_id)
    assert "released job" in worker.output
    for pid in doomed:
        wait_until(lambda pid=pid: not pid_alive(pid), timeout=5, what=f"process {pid} to die")
    # The job never got to its end.
    assert not (Path(marker_dir) / "long.runs").exists()


def test_shutdown_timeout_kills_and_releases_then_another_worker_reruns_it(
    workers, marker_dir: str
) -> None:
    worker_id = _new_worker_id("timeout")
    worker = workers.start(
        args=["--concurrency", "1", "--shutdown-timeout", "1", "--worker-id", worker_id]
    )
    job = wait_for_go.enqueue(marker_dir, "long")
    [(_, _, job_pid)] = _started(marker_dir, "long")

    signalled = time.monotonic()
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output
    took = time.monotonic() - signalled
    # It waited for the timeout (1 s), then stopped the job without waiting for it.
    assert 0.9 <= took < 8, f"shutdown took {took:.1f}s"
    assert "up to 1s" in worker.output

    _assert_released(job.id, worker_id)
    _assert_deregistered(worker, worker_id)
    wait_until(lambda: not pid_alive(job_pid), timeout=5, what="the job's process to die")
    assert not (Path(marker_dir) / "long.runs").exists()

    # Released means runnable now: a burst worker (which exits when nothing is ready)
    # picks it up as attempt 2.
    (Path(marker_dir) / "long.go").touch()
    rerun = workers.start(args=["--burst", "--concurrency", "1"])
    assert rerun.wait(timeout=30) == 0, rerun.output
    done = Job.objects.get(pk=job.id)
    assert (done.status, done.attempt, done.result, done.stall_count) == (
        JobStatus.SUCCEEDED,
        2,
        2,
        0,
    )
    assert [line[:2] for line in _lines(marker_dir, "long.runs")] == [[int(job.id), 2]]
