"""Faults around a real ``runworker``: poison pills, rows naming no task, a flaky database.

Each test runs real worker subprocesses and checks the database and the evidence the
jobs left in marker files (``tests/tasks_worker_shutdown.py``): lines of
``<job id> <attempt> <pid>``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import DatabaseError, connection

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus, WorkerState
from django_leasejobs.models import Worker as WorkerRow
from tests import tasks_worker
from tests.tasks_worker_shutdown import record_job, slow_job
from tests.waiting import wait_until
from tests.worker_harness import IDLE_MAIN_LOOP, MANAGE_PY, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="finds the worker's main-loop connection by its query in pg_stat_activity "
    "and needs LISTEN, which only PostgreSQL has",
)
can_cut_connections = pytest.mark.skipif(
    connection.vendor not in ("postgresql", "mysql"),
    reason="terminates the worker's server connections (pg_terminate_backend(), KILL "
    "CONNECTION); an SQLite database cannot drop a client's connection",
)


def _runs(marker_dir: str, name: str) -> list[tuple[int, int, int]]:
    path = Path(marker_dir) / f"{name}.runs"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        job_id, attempt, pid = (int(v) for v in line.split())
        rows.append((job_id, attempt, pid))
    return rows


def _runs_by_job(marker_dir: str, name: str) -> dict[int, list[int]]:
    by_job: dict[int, list[int]] = defaultdict(list)
    for job_id, attempt, _ in _runs(marker_dir, name):
        by_job[job_id].append(attempt)
    return by_job


def _statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=ids).values_list("id", "status"))


def _all_succeeded(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids)


def _assert_at_least_once(ids: list[int], marker_dir: str, name: str) -> int:
    """Every job succeeded; it ran once per attempt at most; return the re-runs seen.

    At-least-once delivery: a job may run again when an attempt's outcome was lost,
    but only as a new attempt (higher number, fenced), never the same attempt twice.
    """
    assert set(_statuses(ids).values()) == {JobStatus.SUCCEEDED}
    runs = _runs_by_job(marker_dir, name)
    assert set(runs) == set(ids), "a job succeeded without leaving evidence, or vice versa"
    final = dict(Job.objects.filter(pk__in=ids).values_list("id", "attempt"))
    results = dict(Job.objects.filter(pk__in=ids).values_list("id", "result"))
    reruns = 0
    for job_id, attempts in runs.items():
        assert len(attempts) == len(set(attempts)), f"job {job_id} ran attempt twice: {attempts}"
        assert attempts == sorted(attempts), f"job {job_id} attempts out of order: {attempts}"
        # The successful attempt is the last one that ran, and its result is stored.
        assert attempts[-1] == final[job_id] == results[job_id], (job_id, attempts)
        reruns += len(attempts) - 1
    return reruns


def _terminate_other_backends() -> int:
    """Terminate every server connection to the test database except this test's own."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            killed = 0
            for backend_id in _other_mysql_backends(cursor):
                try:
                    cursor.execute(f"KILL CONNECTION {int(backend_id)}")
                    killed += 1
                except DatabaseError:  # it closed meanwhile
                    continue
            return killed
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def _other_mysql_backends(cursor: Any) -> list[int]:
    cursor.execute(
        "SELECT ID FROM information_schema.PROCESSLIST "
        "WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND <> 'Killed'"
    )
    return [int(backend_id) for (backend_id,) in cursor.fetchall()]


def _other_backends() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            return len(_other_mysql_backends(cursor))
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def _kill_leftovers(workers, worker: WorkerProcess) -> None:
    """SIGKILL what is left of a dead worker's session (its slots, their jobs).

    Workers run in their own session, so its members are exactly the processes whose
    session id is the worker's pid. A slot child should die with its worker (lifeline),
    which tests/test_worker_process.py checks; this test is about the job rows, so it
    does not depend on that, and a survivor would keep the worker's output pipe open.
    """
    leftovers = []
    for process in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            if (
                process.pid != worker.pid
                and os.getsid(process.pid) == worker.pid
                and str(MANAGE_PY) in process.cmdline()  # forked slots keep the command
            ):
                leftovers.append(process.pid)
    workers.track(leftovers)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _worker_id(kind: str) -> str:
    return f"faults-{kind}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- poison pills


def test_job_killing_its_own_process_fails_after_its_attempts_and_others_run(
    workers, marker_dir: str
) -> None:
    worker_id = _worker_id("crash")
    # One slot: every job after the first crash runs in a replacement child.
    worker = workers.start(args=["--concurrency", "1", "--worker-id", worker_id])
    first_slot = worker.slot_pids()
    pill = tasks_worker.crash_own_process.enqueue(marker_dir, "pill")  # max_attempts=2
    others = [int(record_job.enqueue(marker_dir, "other").id) for _ in range(15)]

    wait_until(
        lambda: (
            Job.objects.filter(pk=pill.id, status=JobStatus.FAILED).exists()
            and _all_succeeded(others)
        ),
        timeout=30,
        what="the pill to fail and the other jobs to succeed",
    )

    job = Job.objects.get(pk=pill.id)
    assert (job.attempt, job.stall_count, job.locked_by) == (2, 0, None)
    attempts = list(JobAttempt.objects.filter(job_id=pill.id).order_by("attempt"))
    assert [(a.attempt, a.outcome, a.worker) for a in attempts] == [
        (1, AttemptOutcome.KILLED, worker_id),
        (2, AttemptOutcome.KILLED, worker_id),
    ]
    for attempt in attempts:
        assert attempt.error_class == "django_leasejobs.exceptions.JobKilled"
        assert "SIGKILL" in attempt.error_message, attempt.error_message
    pill_runs = (Path(marker_dir) / "pill.runs").read_text().splitlines()
    assert [line.split()[0] for line in pill_runs] == ["1", "2"]
    pill_pids = [int(line.split()[1]) for line in pill_runs]
    assert pill_pids[0] == first_slot[0], "the first attempt ran in the original slot"
    assert pill_pids[1] != pill_pids[0], "the second attempt ran in a replacement child"

    assert _assert_at_least_once(others, marker_dir, "other") == 0
    # The same worker ran everything: it survived both crashes and replaced its slot.
    assert worker.popen.poll() is None, worker.output
    assert set(
        Job.objects.filter(pk__in=[*others, pill.id]).values_list("last_worker", flat=True)
    ) == {worker_id}
    # The pill's first attempt came first (lowest run_after): every other job ran after
    # it, in a replacement child; the slot now is yet another child.
    other_pids = {pid for _, _, pid in _runs(marker_dir, "other")}
    assert pill_pids[0] not in other_pids
    [slot_now] = worker.slot_pids()
    assert slot_now not in pill_pids

    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output


def test_job_killing_its_worker_ends_dead_after_max_stalls_while_others_flow(
    workers, marker_dir: str
) -> None:
    pill = tasks_worker.kill_worker.enqueue(marker_dir, "pill")  # max_stalls=2
    others = [int(record_job.enqueue(marker_dir, "other").id) for _ in range(40)]
    started: list[WorkerProcess] = []

    def restart_and_check() -> bool:
        if not started or started[-1].popen.poll() is not None:
            if started:
                _kill_leftovers(workers, started[-1])
            started.append(workers.start(args=["--concurrency", "2"]))
        pill_done = Job.objects.filter(pk=pill.id, status=JobStatus.DEAD).exists()
        return pill_done and _all_succeeded(others)

    try:
        wait_until(
            restart_and_check,
            timeout=45,
            interval=0.1,
            what="the pill to be dead and the other jobs to succeed, restarting dead workers",
        )
    finally:
        for worker in started:
            if worker.popen.poll() is not None:
                _kill_leftovers(workers, worker)

    job = Job.objects.get(pk=pill.id)
    assert (job.status, job.stall_count, job.attempt, job.locked_by) == (
        JobStatus.DEAD,
        2,
        2,
        None,
    )
    assert list(
        JobAttempt.objects.filter(job_id=pill.id)
        .order_by("attempt")
        .values_list("attempt", "outcome", "error_class")
    ) == [
        (1, AttemptOutcome.LEASE_EXPIRED, "django_leasejobs.exceptions.LeaseExpired"),
        (2, AttemptOutcome.LEASE_EXPIRED, "django_leasejobs.exceptions.LeaseExpired"),
    ]
    pill_runs = (Path(marker_dir) / "pill.runs").read_text().splitlines()
    assert [line.split()[0] for line in pill_runs] == ["1", "2"]

    # Exactly two workers died (SIGKILLed by the pill); the third one is still running.
    assert len(started) == 3, [w.popen.returncode for w in started]
    assert [w.popen.returncode for w in started[:2]] == [-signal.SIGKILL, -signal.SIGKILL]
    assert started[2].popen.poll() is None, started[2].output

    # Jobs that ran beside the pill in a killed worker were reaped and re-run.
    _assert_at_least_once(others, marker_dir, "other")
    for row in JobAttempt.objects.filter(job_id__in=others):
        assert row.outcome == AttemptOutcome.LEASE_EXPIRED, (row.job_id, row.outcome)

    started[2].terminate()
    assert started[2].wait(timeout=15) == 0, started[2].output


# --------------------------------------------------------------------------- rows without a task


def test_row_naming_no_registered_task_never_runs(workers, marker_dir: str) -> None:
    """A row naming anything but a registered task is never imported or called. A
    well-formed path may be new code not deployed to this worker: it waits for
    ``UNKNOWN_TASK_GRACE`` (0 here: dead at once; tests/worker/test_unknown_tasks.py has
    the wait); a malformed one fails at once."""
    hacked = Path(marker_dir) / "hacked"
    plain_function = Path(marker_dir) / "plain-function"
    forged = {
        # A standard library function: never imported, never called.
        "os.system": [f"echo hacked > {hacked}"],
        # A plain function in an installed app's task module: not a Task, not called.
        "tests.tasks_worker._mark": [marker_dir, plain_function.name, "called"],
        # A module of an installed app that does not exist.
        "tests.no_such_module.anything": [],
    }
    rows = {
        path: Job.objects.create(task_path=path, args=args, max_attempts=3).pk
        for path, args in forged.items()
    }
    malformed = Job.objects.create(task_path="nodots", args=[], max_attempts=3).pk
    others = [int(record_job.enqueue(marker_dir, "other").id) for _ in range(5)]
    worker = workers.start(
        args=["--concurrency", "2", "--burst"], options={"UNKNOWN_TASK_GRACE": 0}
    )
    assert worker.wait(timeout=30) == 0, worker.output

    assert not hacked.exists(), "os.system ran"
    assert not plain_function.exists(), "a plain function ran"
    for path, job_id in rows.items():
        job = Job.objects.get(pk=job_id)
        # Dead letter on the first attempt, although three were allowed.
        assert (job.status, job.attempt) == (JobStatus.DEAD, 1), (path, job.status)
        assert job.finished_at is not None
        [attempt] = JobAttempt.objects.filter(job_id=job_id)
        assert attempt.outcome == AttemptOutcome.ERROR
        assert attempt.error_class == "django_leasejobs.exceptions.UnknownTask", path
        assert path in attempt.error_message
    job = Job.objects.get(pk=malformed)
    assert (job.status, job.attempt) == (JobStatus.FAILED, 1)
    [attempt] = JobAttempt.objects.filter(job_id=malformed)
    assert "is not a task path" in attempt.error_message
    assert _assert_at_least_once(others, marker_dir, "other") == 0


# ------------------------------------------------------------- the database cuts the worker off


@can_cut_connections
def test_worker_rides_out_terminated_connections_mid_stream(workers, marker_dir: str) -> None:
    worker_id = _worker_id("terminate")
    worker = workers.start(args=["--concurrency", "3", "--worker-id", worker_id])
    # Two slow jobs hold leases across the terminations: their heartbeats must recover.
    slow = [int(slow_job.enqueue(marker_dir, "slow", 3.0).id) for _ in range(2)]
    wait_until(
        lambda: (
            (Path(marker_dir) / "slow.started").exists()
            and len((Path(marker_dir) / "slow.started").read_text().splitlines()) == 2
        ),
        timeout=20,
        what="both slow jobs to start",
    )
    quick: list[int] = []
    terminated = []
    for _ in range(3):
        wave = [int(record_job.enqueue(marker_dir, "quick").id) for _ in range(70)]
        quick += wave
        # Cut the worker off while it is busy with this wave, once it has reconnected
        # from the previous cut (its database thread and heartbeat; and the listener on
        # PostgreSQL).
        wait_until(
            lambda wave=wave: (
                Job.objects.filter(pk__in=wave, status=JobStatus.SUCCEEDED).count() >= 5
                and _other_backends() >= 2
            ),
            timeout=20,
            what="the worker to be connected and processing the wave",
        )
        terminated.append(_terminate_other_backends())
    assert min(terminated) >= 2, f"connections terminated per cut: {terminated}"

    wait_until(
        lambda: _all_succeeded(quick + slow),
        timeout=40,
        what=f"every job to succeed; statuses: {set(_statuses(quick + slow).values())}",
    )
    reruns = _assert_at_least_once(quick, marker_dir, "quick")
    reruns += _assert_at_least_once(slow, marker_dir, "slow")
    print(f"connections terminated per cut: {terminated}; re-runs: {reruns}")
    # A re-run is allowed (the outcome of an attempt was lost with its connection), but
    # only after the earlier attempt's lease expired and was reaped: it left a trace.
    runs = {**_runs_by_job(marker_dir, "quick"), **_runs_by_job(marker_dir, "slow")}
    traces = set(
        JobAttempt.objects.filter(job_id__in=quick + slow).values_list("job_id", "attempt")
    )
    for job_id, attempts in runs.items():
        assert {(job_id, a) for a in attempts[:-1]} <= traces, (job_id, attempts, traces)
    assert set(
        JobAttempt.objects.filter(job_id__in=quick + slow).values_list("outcome", flat=True)
    ) <= {AttemptOutcome.LEASE_EXPIRED}
    assert worker.popen.poll() is None, worker.output
    assert "database error in the main loop" in worker.output or "heartbeat failed" in (
        worker.output
    )

    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output
    assert WorkerRow.objects.get(pk=worker_id).state == WorkerState.STOPPED


@can_cut_connections
def test_idle_worker_reconnects_after_the_database_was_unreachable(
    workers, marker_dir: str
) -> None:
    worker_id = _worker_id("reconnect")
    worker = workers.start(args=["--concurrency", "1", "--worker-id", worker_id])
    wait_until(lambda: _other_backends() >= 2, timeout=10, what="the worker's connections")

    # For two seconds every connection the worker opens is terminated right away.
    cut_off_until = time.monotonic() + 2.0
    terminated: list[int] = []

    def hammer() -> bool:
        terminated.append(_terminate_other_backends())
        return time.monotonic() >= cut_off_until

    wait_until(hammer, timeout=10, interval=0.02, what="two seconds of terminations")
    assert sum(terminated) >= 3, terminated
    assert worker.popen.poll() is None, worker.output

    back = time.monotonic()
    job = record_job.enqueue(marker_dir, "after")
    wait_until(
        lambda: Job.objects.filter(pk=job.id, status=JobStatus.SUCCEEDED).exists(),
        timeout=20,
        what="the job enqueued after the outage to run",
    )
    latency = time.monotonic() - back
    print(
        f"terminations: {len(terminated)} ({sum(terminated)} connections); "
        f"job picked up {latency:.2f}s after the outage"
    )
    assert latency < 15, f"took {latency:.1f}s to pick up a job after the outage"
    assert [(job_id, attempt) for job_id, attempt, _ in _runs(marker_dir, "after")] == [
        (int(job.id), 1)
    ]
    # The heartbeat reconnected too: the registry row is being touched again.
    seen = WorkerRow.objects.get(pk=worker_id).last_seen_at
    wait_until(
        lambda: WorkerRow.objects.get(pk=worker_id).last_seen_at > seen,
        timeout=10,
        what="a heartbeat after the outage",
    )

    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output
    assert WorkerRow.objects.get(pk=worker_id).state == WorkerState.STOPPED


def _quiet_main_loop_backend() -> int | None:
    """The worker main loop's connection once the worker has been idle for half a second.

    Its last statement is one of ``IDLE_MAIN_LOOP`` (the claim, the flow check after an
    empty claim, the next-due lookup when its listener listens). The listener wakes the
    loop once after its LISTEN, so wait until both have been quiet for a while: after
    that, nothing but a signal wakes a worker whose POLL_INTERVAL is 30 s.
    """
    main_loop = "(" + " OR ".join(f"query LIKE '{start}%%'" for start in IDLE_MAIN_LOOP) + ")"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT "
            f"max(pid) FILTER (WHERE {main_loop}), "
            "bool_and(state = 'idle' AND state_change < now() - interval '0.5 seconds'), "
            "bool_or(query LIKE 'LISTEN%%') "
            "FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            f"AND ({main_loop} OR query LIKE 'LISTEN%%')"
        )
        pid, quiet, listening = cursor.fetchone()
    return pid if pid and quiet and listening else None


@postgresql_only
def test_worker_deregisters_after_its_idle_connection_was_dropped(workers) -> None:
    worker_id = _worker_id("dereg")
    worker = workers.start(
        options={"POLL_INTERVAL": 30}, args=["--concurrency", "1", "--worker-id", worker_id]
    )
    main_pid = wait_until(_quiet_main_loop_backend, timeout=15, what="an idle worker")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [main_pid])
        assert cursor.fetchone()[0] is True

    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output
    row = WorkerRow.objects.get(pk=worker_id)
    assert row.state == WorkerState.STOPPED, worker.output
    assert row.stopped_at is not None
