"""The demo's own commands, as scripts/demo runs them: enqueue a mix, run workers (which
also run the demo's schedules), stop.

``demo_workers`` starts its workers with the environment it got: the tests give it an
events file (``tests/worker_events.py``) that all its workers append to, and wait on
their ``worker_started`` and ``worker_stopping`` there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.conf import settings
from django.db import connection

from django_leasejobs.compat import task_backends
from django_leasejobs.leases import database_now
from django_leasejobs.models import Job, JobStatus, RunKind, Schedule, ScheduleRun
from django_leasejobs.models import Worker as WorkerRow
from django_leasejobs.schedule_spec import parse_schedules
from django_leasejobs.schedules.scheduler import run_pass
from testproject.settings import DEMO_SCHEDULES
from tests import worker_events
from tests.waiting import wait_until
from tests.worker_harness import FAST_OPTIONS, MANAGE_PY, REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def supervisor_env(subprocess_env: dict[str, str], events: Path) -> dict[str, str]:
    return {
        **subprocess_env,
        "LEASEJOBS_TEST_OPTIONS": json.dumps(FAST_OPTIONS),
        worker_events.EVENTS_ENV: str(events),
    }


def started_pids(events: Path) -> set[int]:
    return {event["pid"] for event in worker_events.matching(events, "worker_started")}


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the demo runs on PostgreSQL (scripts/demo's embedded server): about 50 s, run "
    "in the PostgreSQL suites only",
)
def test_demo_enqueue_then_demo_workers_run_jobs_and_stop_cleanly(
    run_manage: Any, subprocess_env: dict[str, str], tmp_path: Path
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
        "demo.tasks.sync_customer",
        "demo.tasks.notify",
    } <= paths
    synced = Job.objects.filter(task_path="demo.tasks.sync_customer")
    assert set(synced.values_list("flow_group", "concurrency_limit")) == {
        ("key:customer-1", 1),
        ("key:customer-2", 1),
    }
    scheduled = Job.objects.filter(task_path="demo.tasks.add", priority=10).count()
    assert scheduled == 1  # the job scheduled 5 minutes ahead

    events = tmp_path / "events.jsonl"
    env = {
        **supervisor_env(subprocess_env, events),
        "LEASEJOBS_DEMO_SCHEDULES": "1",  # as scripts/demo sets it
    }
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
        # Both workers run the demo's schedules; the every-10-seconds one has ticked
        # by now (or soon), and each of its ticks became exactly one job.
        pings = Job.objects.filter(task_path="demo.tasks.ping")
        wait_until(
            lambda: pings.filter(status=JobStatus.SUCCEEDED).exists(),
            timeout=60,
            what="a job of the demo's every-10-seconds schedule to succeed",
        )
        runs = ScheduleRun.objects.filter(schedule__name="demo-ping", kind=RunKind.TICK)
        assert runs.count() == pings.count()
        assert runs.values("tick").distinct().count() == runs.count()
        assert set(Schedule.objects.values_list("name", flat=True)) == set(DEMO_SCHEDULES)

        def started_workers() -> list[int]:
            """The supervisor's workers, once there are two and each has started (a
            replacement for a worker the poison pill killed may still be starting)."""
            pids = [p.pid for p in psutil.Process(supervisor.pid).children()]
            return pids if len(pids) >= 2 and set(pids) <= started_pids(events) else []

        workers = wait_until(started_workers, timeout=30, what="two demo workers started")
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


def test_demo_schedules_are_declared_for_the_demo_only_pass_the_checks_and_enqueue(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    # The test suite builds on the demo's settings: without LEASEJOBS_DEMO_SCHEDULES
    # (scripts/demo sets it) no worker started by a test runs the demo's schedules.
    assert "SCHEDULES" not in settings.TASKS["default"]["OPTIONS"], (
        "LEASEJOBS_DEMO_SCHEDULES is set in the test run's environment: unset it"
    )
    checked = run_manage(["check"], env={**subprocess_env, "LEASEJOBS_DEMO_SCHEDULES": "1"})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "leasejobs.E0" not in checked.stdout + checked.stderr

    specs, problems = parse_schedules(DEMO_SCHEDULES, "UTC")
    assert problems == []
    assert {spec.name for spec in specs} == {"demo-ping", "demo-queue-report"}
    backend = task_backends["default"]
    start = database_now(backend.database)
    first = run_pass(backend, now=start, specs=specs)  # first seen: no back-fill
    assert first.enqueued == ()
    report = next(spec for spec in specs if spec.cron)
    on_its_tick = report.next_after(start)  # the cron schedule's next tick, exactly
    later = run_pass(backend, now=on_its_tick, specs=specs)
    enqueued = {run.schedule: run for run in later.enqueued}
    assert set(enqueued) == {"demo-ping", "demo-queue-report"}
    assert enqueued["demo-queue-report"].tick == on_its_tick
    ping = Job.objects.get(pk=enqueued["demo-ping"].job_id)
    assert (ping.task_path, ping.queue) == ("demo.tasks.ping", "low")
    assert ping.kwargs == {"label": "every 10 seconds"}
    assert Job.objects.get(pk=enqueued["demo-queue-report"].job_id).queue == "default"
    assert run_pass(backend, now=on_its_tick, specs=specs).enqueued == ()  # once per tick


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGKILL], ids=["sighup", "sigkill"])
def test_demo_workers_stops_its_workers_on_sighup_and_when_killed(
    subprocess_env: dict[str, str], signum: signal.Signals, tmp_path: Path
) -> None:
    # SIGHUP (its terminal closed) stops the workers like SIGTERM. SIGKILL gives the
    # supervisor no say: its workers run in sessions of their own, and stop because they
    # asked Linux for a SIGTERM when their parent dies (PR_SET_PDEATHSIG).
    if signum == signal.SIGKILL and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    events = tmp_path / "events.jsonl"
    supervisor = subprocess.Popen(
        [sys.executable, str(MANAGE_PY), "demo_workers", "--workers", "2", "--concurrency", "2"],
        cwd=REPO_ROOT,
        env=supervisor_env(subprocess_env, events),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    supervisor_process = psutil.Process(supervisor.pid)
    processes: list[psutil.Process] = []
    try:
        wait_until(lambda: len(started_pids(events)) >= 2, 60, what="two demo workers started")
        workers = supervisor_process.children()
        assert {w.pid for w in workers} == started_pids(events)
        processes = [p for w in workers for p in (w, *w.children(recursive=True))]
        assert len(processes) >= 6  # two workers, two slots each
        supervisor.send_signal(signum)
        wait_until(
            lambda: not any(_alive(p) for p in processes),
            timeout=60,
            what="the demo workers and their slots to exit",
        )
        assert supervisor.wait(timeout=30) == (0 if signum == signal.SIGHUP else -signal.SIGKILL)
        # Graceful: each worker deregistered.
        rows = WorkerRow.objects.filter(pid__in=[w.pid for w in workers])
        assert sorted(rows.values_list("state", flat=True)) == ["stopped", "stopped"]
    finally:
        for process in [supervisor_process, *processes]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        supervisor.wait(timeout=10)


def test_demo_workers_second_ctrl_c_makes_the_workers_release_their_jobs_now(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    # The first Ctrl-C asks each worker to stop gracefully (its running job may finish,
    # here within the default 30 s shutdown timeout); the second one makes the
    # supervisor send each worker a second SIGTERM: it stops the job now and releases it.
    job = Job.objects.create(task_path="demo.tasks.slow", kwargs={"seconds": 300, "steps": 300})
    events = tmp_path / "events.jsonl"
    env = supervisor_env(subprocess_env, events)
    log = tmp_path / "demo_workers.log"
    with log.open("wb") as output:
        supervisor = subprocess.Popen(
            [sys.executable, str(MANAGE_PY), "demo_workers", "--workers", "1"],
            cwd=REPO_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    supervisor_process = psutil.Process(supervisor.pid)
    processes: list[psutil.Process] = []
    try:
        wait_until(
            lambda: Job.objects.get(pk=job.pk).progress is not None,
            timeout=60,
            what="the slow job to run and report progress",
        )
        processes = [supervisor_process, *supervisor_process.children(recursive=True)]
        supervisor.send_signal(signal.SIGINT)
        wait_until(
            lambda: worker_events.matching(events, "worker_stopping", forced=False),
            timeout=30,
            what="the demo worker to stop gracefully",
        )
        assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING  # it may finish
        supervisor.send_signal(signal.SIGINT)
        assert supervisor.wait(timeout=25) == 0  # sooner than the worker's 30 s
        job.refresh_from_db()
        assert (job.status, job.locked_by) == (JobStatus.PENDING, None)  # released
        assert [e["forced"] for e in worker_events.matching(events, "worker_stopping")] == [
            False,
            True,
        ]
        assert "again: stopping running jobs now and releasing them" in log.read_text()
    finally:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        supervisor.wait(timeout=10)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_demo_enqueue_superuser_creates_admin_once(run_manage: Any) -> None:
    from django.contrib.auth import get_user_model

    first = run_manage(["demo_enqueue", "--quick", "0", "--superuser"], timeout=60)
    assert first.returncode == 0, first.stderr
    assert "created superuser admin (password: admin)" in first.stdout
    again = run_manage(["demo_enqueue", "--quick", "0", "--superuser"], timeout=60)
    assert again.returncode == 0, again.stderr
    assert "superuser admin already exists" in again.stdout
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser
    assert admin.check_password("admin")
