"""SIGHUP to a real ``runworker``: the terminal it runs under closed.

The promises (docs/workers.md, "Shutdown"): SIGHUP is a graceful stop like a first
SIGTERM (stop claiming, let the running jobs finish, deregister, exit 0, the slots
gone); a repeated SIGHUP does not force (a closing terminal sends two: the shell
forwards one, the kernel sends another when the shell exits); a worker started with
SIGHUP ignored (``nohup``) keeps ignoring it.
"""

from __future__ import annotations

import signal
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from django_leasejobs.models import Job, JobStatus, WorkerState
from django_leasejobs.models import Worker as WorkerRow
from tests.tasks_worker_shutdown import wait_for_go
from tests.waiting import wait_until
from tests.worker_harness import pid_alive

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("terminal_signals_default"),
]


def _started(marker_dir: str, name: str) -> list[list[int]]:
    def lines() -> list[list[int]]:
        path = Path(marker_dir) / f"{name}.started"
        if not path.exists():
            return []
        return [[int(v) for v in line.split()] for line in path.read_text().splitlines()]

    return wait_until(lines, timeout=20, what=f"{name} to start")


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_sighup_stops_gracefully_and_a_second_one_does_not_force(
    workers, marker_dir: str, pool: str
) -> None:
    worker_id = f"sighup-{pool}-{uuid.uuid4().hex[:8]}"
    worker = workers.start(args=["--concurrency", "2", "--pool", pool, "--worker-id", worker_id])
    slots = worker.slot_pids()
    assert len(slots) == (2 if pool == "process" else 0)
    long = wait_for_go.enqueue(marker_dir, "long")
    [(job_id, attempt, job_pid)] = _started(marker_dir, "long")
    assert (job_id, attempt) == (int(long.id), 1)

    worker.signal(signal.SIGHUP)
    worker.wait_for_event("worker_stopping", reason="SIGHUP", forced=False)
    wait_until(
        lambda: WorkerRow.objects.filter(pk=worker_id, state=WorkerState.STOPPING).exists(),
        timeout=10,
        what="the worker row in state stopping",
    )
    # The second hang-up of a closing terminal. A second SIGTERM would kill the job
    # and release it at once; this one must not: the worker keeps heartbeating for
    # 2.5 s of database time with the job still running.
    worker.signal(signal.SIGHUP)
    signalled_at = WorkerRow.objects.get(pk=worker_id).last_seen_at
    wait_until(
        lambda: WorkerRow.objects.filter(
            pk=worker_id, last_seen_at__gte=signalled_at + timedelta(seconds=2.5)
        ).exists(),
        timeout=15,
        what="the stopping worker to heartbeat 2.5 s after the second SIGHUP",
    )
    assert worker.popen.poll() is None, worker.output
    assert Job.objects.get(pk=long.id).status == JobStatus.RUNNING

    (Path(marker_dir) / "long.go").touch()
    assert worker.wait(timeout=20) == 0, worker.output
    stops = [(e["reason"], e["forced"]) for e in worker.events("worker_stopping")]
    assert stops == [("SIGHUP", False)], worker.output
    assert "SIGHUP again" not in worker.output
    job = Job.objects.get(pk=long.id)
    assert (job.status, job.attempt, job.result) == (JobStatus.SUCCEEDED, 1, 1), worker.output
    row = WorkerRow.objects.get(pk=worker_id)
    assert row.state == WorkerState.STOPPED, worker.output
    for pid in [*slots, job_pid]:
        if pid != worker.pid:
            wait_until(lambda pid=pid: not pid_alive(pid), timeout=5, what=f"{pid} to exit")


def test_a_worker_started_with_sighup_ignored_keeps_ignoring_it(workers) -> None:
    worker_id = f"sighup-nohup-{uuid.uuid4().hex[:8]}"
    # As nohup does: the disposition "ignored" survives the exec.
    worker = workers.start(
        args=["--worker-id", worker_id],
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )

    # Python runs pending handlers in signal-number order: had runworker installed a
    # SIGHUP handler, it would log "SIGHUP: stop claiming" and then "SIGTERM again".
    worker.signal(signal.SIGHUP)
    worker.terminate()
    assert worker.wait(timeout=20) == 0, worker.output
    stops = [(e["reason"], e["forced"]) for e in worker.events("worker_stopping")]
    assert stops == [("SIGTERM", False)], worker.output
    assert "SIGTERM: stop claiming" in worker.output
    assert "SIGHUP" not in worker.output
    assert WorkerRow.objects.get(pk=worker_id).state == WorkerState.STOPPED
