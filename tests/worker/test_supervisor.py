"""``runworker --processes N``: N real workers forked from one supervisor process.

The promises (worker/supervisor.py, docs/workers.md "Several workers from one command"):
each forked worker is a whole worker (its own id, registry row, slots); the jobs are
shared among them and each runs once; a worker that dies is started again; a stop signal
reaches every worker once, also when a process manager signals the whole group too; a
second one forces; the workers die with their supervisor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from django_leasejobs.models import Job, JobAttempt, JobStatus, WorkerState
from django_leasejobs.models import Worker as WorkerRow
from tests.helpers_leases import db_now
from tests.tasks_worker_shutdown import record_job, wait_for_go
from tests.waiting import wait_until
from tests.worker_harness import MANAGE_PY, REPO_ROOT, WorkerProcess, pid_alive

pytestmark = pytest.mark.django_db(transaction=True)


def _base_id() -> str:
    return f"sup-{uuid.uuid4().hex[:8]}"


def _running_rows(base: str, count: int) -> list[WorkerRow]:
    """Wait until ``count`` workers of this supervisor are registered and running."""
    return wait_until(
        lambda: (
            rows
            if len(
                rows := list(
                    WorkerRow.objects.filter(
                        id__startswith=f"{base}-", state=WorkerState.RUNNING
                    ).order_by("id")
                )
            )
            == count
            else None
        ),
        timeout=30,
        what=f"{count} running workers named {base}-N",
    )


def _start(workers, base: str, processes: int, *more: str) -> WorkerProcess:
    return workers.start(
        args=["--processes", str(processes), "--worker-id", base, "--concurrency", "1", *more],
        wait_started=False,
    )


def _exit_code(supervisor: WorkerProcess, timeout: float = 30) -> int:
    try:
        return supervisor.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the supervisor did not exit:\n{supervisor.output}") from None


def _group_of(pid: int) -> int:
    return os.getpgid(pid)


def test_forked_workers_share_the_queue_and_run_each_job_once(workers, marker_dir: str) -> None:
    results = [record_job.enqueue(marker_dir, "each") for _ in range(60)]
    base = _base_id()
    supervisor = _start(workers, base, 3, "--burst")
    assert _exit_code(supervisor, 60) == 0, supervisor.output

    runs = (Path(marker_dir) / "each.runs").read_text().split("\n")
    job_ids = sorted(int(line.split()[0]) for line in runs if line)
    assert job_ids == sorted(int(r.id) for r in results), "every job once"
    assert set(Job.objects.values_list("status", "attempt")) == {(JobStatus.SUCCEEDED, 1)}
    rows = WorkerRow.objects.filter(id__startswith=f"{base}-").order_by("id")
    assert [r.id for r in rows] == [f"{base}-0", f"{base}-1", f"{base}-2"]
    assert {r.state for r in rows} == {WorkerState.STOPPED}
    pids = {r.pid for r in rows}
    assert len(pids) == 3 and supervisor.pid not in pids
    ran_by = set(Job.objects.values_list("last_worker", flat=True))
    assert ran_by <= {r.id for r in rows}


def test_a_worker_that_dies_is_started_again(workers, marker_dir: str) -> None:
    base = _base_id()
    supervisor = _start(workers, base, 2)
    first = _running_rows(base, 2)
    victim = first[0]
    assert _group_of(victim.pid) == victim.pid, "each worker leads a process group of its own"
    assert psutil.Process(victim.pid).ppid() == supervisor.pid

    os.kill(victim.pid, signal.SIGKILL)
    # Started again under the same id, as a new process.
    wait_until(
        lambda: (
            WorkerRow.objects.filter(pk=victim.id, state=WorkerState.RUNNING)
            .exclude(pid=victim.pid)
            .exists()
        ),
        timeout=30,
        what=f"{victim.id} started again",
    )
    # And it works: a job enqueued now runs.
    result = record_job.enqueue(marker_dir, "after")
    wait_until(
        lambda: Job.objects.filter(pk=result.id, status=JobStatus.SUCCEEDED).exists(),
        timeout=20,
        what="a job run by the supervisor's workers",
    )
    supervisor.terminate()
    # A worker restarted after a failure does not fail the supervisor's exit.
    assert _exit_code(supervisor, 30) == 0, supervisor.output
    assert not WorkerRow.objects.filter(
        id__startswith=f"{base}-", state=WorkerState.RUNNING
    ).exists()


def test_a_stop_heard_twice_at_once_is_graceful(workers, marker_dir: str) -> None:
    """systemd's default (KillMode=control-group) sends SIGTERM to every process of the
    service at once: the workers hear it from it and from the supervisor. That is one
    request, graceful: the running job finishes on its first attempt."""
    base = _base_id()
    supervisor = _start(workers, base, 2)
    rows = _running_rows(base, 2)
    job = wait_for_go.enqueue(marker_dir, "long")
    wait_until(lambda: (Path(marker_dir) / "long.started").exists(), what="the job to start")

    signalled_at = db_now()
    for pid in (supervisor.pid, *(r.pid for r in rows)):
        os.kill(pid, signal.SIGTERM)
    # The worker running the job stays (stopping) and heartbeats; 2 s of database time
    # later, well past the window in which a repeat is the same request (1 s), the job
    # still runs: nothing forced it.
    [runner] = wait_until(
        lambda: list(
            WorkerRow.objects.filter(
                id__startswith=f"{base}-",
                state=WorkerState.STOPPING,
                last_seen_at__gte=signalled_at + timedelta(seconds=2),
            )
        ),
        timeout=15,
        what="the stopping worker to heartbeat 2 s after the signals",
    )
    assert Job.objects.get(pk=job.id).status == JobStatus.RUNNING
    assert Job.objects.get(pk=job.id).locked_by == runner.id
    (Path(marker_dir) / "long.go").touch()
    assert _exit_code(supervisor, 30) == 0, supervisor.output
    done = Job.objects.get(pk=job.id)
    assert (done.status, done.attempt) == (JobStatus.SUCCEEDED, 1)
    assert not JobAttempt.objects.filter(job_id=job.id).exists()


def test_a_second_signal_to_the_supervisor_forces_the_stop(workers, marker_dir: str) -> None:
    base = _base_id()
    supervisor = _start(workers, base, 2)
    _running_rows(base, 2)
    job = wait_for_go.enqueue(marker_dir, "long")
    wait_until(lambda: (Path(marker_dir) / "long.started").exists(), what="the job to start")

    supervisor.signal(signal.SIGINT)
    wait_until(
        lambda: Job.objects.filter(
            pk=job.id, locked_by__in=WorkerRow.objects.filter(state=WorkerState.STOPPING)
        ).exists(),
        timeout=15,
        what="the worker running the job to stop claiming",
    )
    # A human's second Ctrl-C (the kernel merges two signals sent at once into one).
    supervisor.signal(signal.SIGINT)
    assert _exit_code(supervisor, 30) == 0, supervisor.output
    released = Job.objects.get(pk=job.id)
    assert (released.status, released.attempt) == (JobStatus.PENDING, 1), supervisor.output
    assert not (Path(marker_dir) / "long.runs").exists()


def test_the_workers_stop_when_their_supervisor_is_killed(workers) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("the kernel's parent-death signal is Linux's")
    base = _base_id()
    supervisor = _start(workers, base, 2)
    pids = [r.pid for r in _running_rows(base, 2)]
    supervisor.kill()
    _exit_code(supervisor, 10)
    wait_until(
        lambda: not any(pid_alive(pid) for pid in pids),
        timeout=30,
        what="the orphaned workers to stop",
    )
    rows = WorkerRow.objects.filter(id__startswith=f"{base}-")
    assert {r.state for r in rows} == {WorkerState.STOPPED}, "they stopped gracefully"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "expected a whole number >= 1"),
        (["--processes", "2", "--reload"], "--reload works with one worker per runworker"),
        (
            ["--processes", "2", "--metrics-port", "9"],
            "--metrics-port works with one worker per runworker",
        ),
    ],
)
def test_bad_processes_options_are_refused(
    subprocess_env: dict[str, str], args: list[str], message: str
) -> None:
    proc = subprocess.run(
        [sys.executable, str(MANAGE_PY), "runworker", *args],
        cwd=REPO_ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
