"""The demo's own commands, as scripts/demo runs them: enqueue a mix, run workers, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import psutil
import pytest

from django_leasejobs.models import Job, JobStatus
from django_leasejobs.models import Worker as WorkerRow
from tests.worker_harness import FAST_OPTIONS, MANAGE_PY, REPO_ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_enqueue_then_demo_workers_run_jobs_and_stop_cleanly(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    enqueued = run_manage(["demo_enqueue", "--quick", "5", "--seed", "1"], timeout=60)
    assert enqueued.returncode == 0, enqueued.stderr
    paths = set(Job.objects.values_list("task_path", flat=True))
    assert {
        "demo.tasks.add",
        "demo.tasks.slow",
        "demo.tasks.flaky",
        "demo.tasks.always_fails",
        "demo.tasks.crash_worker",
    } <= paths
    scheduled = Job.objects.filter(task_path="demo.tasks.add", priority=10).count()
    assert scheduled == 1  # the job scheduled 5 minutes ahead

    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps(FAST_OPTIONS)}
    supervisor = subprocess.Popen(
        [sys.executable, str(MANAGE_PY), "demo_workers", "--workers", "2", "--concurrency", "2"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        quick = Job.objects.filter(task_path="demo.tasks.add", run_after__isnull=False)
        wait_until(
            lambda: quick.filter(status=JobStatus.SUCCEEDED).count() >= 7,
            timeout=60,
            what="the demo's quick jobs to succeed on the demo workers",
        )
        # The demo's poison pill kills a worker per attempt until it is a dead letter:
        # wait for that, so that no worker listed below is killed before the SIGTERM.
        wait_until(
            lambda: Job.objects.filter(
                task_path="demo.tasks.crash_worker", status=JobStatus.DEAD
            ).exists(),
            timeout=120,
            what="the demo's crash_worker job to be dead-lettered",
        )
        wait_until(
            lambda: WorkerRow.objects.filter(state="running").count() >= 2,
            timeout=30,
            what="two demo workers registered",
        )
        workers = [p.pid for p in psutil.Process(supervisor.pid).children()]
        assert len(workers) >= 2
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=90) == 0
        wait_until(
            lambda: not any(psutil.pid_exists(pid) for pid in workers),
            timeout=30,
            what="the demo workers to exit",
        )
        # Workers alive at shutdown deregister. (The ones the demo's crash_worker job
        # SIGKILLed could not: their rows stay "running" and the dashboard shows them as
        # gone; the supervisor replaced them before the listing above.)
        live = WorkerRow.objects.filter(pid__in=workers)
        assert live.count() == len(workers)
        assert set(live.values_list("state", flat=True)) == {"stopped"}
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) == supervisor.pid:
                    process.kill()
            except (ProcessLookupError, PermissionError, psutil.Error):
                pass
