"""``manage.py reap_stale_locks``: one pass, dry run, options, loop with SIGTERM, outages."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from io import StringIO
from typing import IO, Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests.conftest import MANAGE_PY, REPO_ROOT, ListHandler
from tests.tasks import add
from tests.waiting import wait_until

WORKER = "worker-reap-test"

# Claims and reaps run in autocommit, as a worker's and the reaper's statements do.
DB = pytest.mark.django_db(transaction=True)


# --------------------------------------------------------------------------- helpers


def running_jobs(count: int, worker: str = WORKER) -> list[int]:
    """``count`` jobs claimed by ``worker`` (leases of 30 s, not expired)."""
    ids = [int(add.enqueue(i, i).id) for i in range(count)]
    claimed = leases.claim(worker, limit=count, lease_duration=30)
    assert sorted(c.id for c in claimed) == sorted(ids)
    return ids


def expire(ids: list[int], seconds_ago: float = 5) -> None:
    changed = Job.objects.filter(pk__in=ids).update(
        locked_until=Now() - timedelta(seconds=seconds_ago)
    )
    assert changed == len(ids)


def reap(*args: str) -> str:
    out = StringIO()
    call_command("reap_stale_locks", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))


class LineReader:
    """Collect a pipe's lines in a thread, so a test can wait for one with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.closed = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)  # end of file: the process closed the pipe

    def wait_for(self, needle: str, timeout: float) -> str:
        line: str = wait_until(
            lambda: self._next_line_with(needle),
            timeout,
            what=lambda: f"a line containing {needle!r} in {self.lines!r}",
        )
        return line

    def _next_line_with(self, needle: str) -> str | None:
        """The first line read since the last call that contains ``needle``, else None
        (the lines before it are kept in ``lines``); fails once the pipe is closed."""
        while True:
            if self.closed:
                raise AssertionError(
                    f"pipe closed: no line containing {needle!r} in {self.lines!r}"
                )
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return None
            if line is None:
                self.closed = True
                continue
            self.lines.append(line)
            if needle in line:
                return line

    def drain(self, timeout: float = 5) -> list[str]:
        self._thread.join(timeout)
        while not self._queue.empty():
            line = self._queue.get_nowait()
            if line is not None:
                self.lines.append(line)
        return self.lines


def popen_manage(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(MANAGE_PY), *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def unreachable_database_url() -> str:
    if connection.vendor == "sqlite":
        return "sqlite:////nonexistent-leasejobs-dir/x.sqlite3"
    return "postgres://postgres@127.0.0.1:1/nope"  # nothing listens on port 1


# --------------------------------------------------------------------------- one pass


@DB
def test_one_pass_reaps_expired_leases(leasejobs_log: ListHandler) -> None:
    stale = running_jobs(3)
    expire(stale)

    output = reap()

    assert "released stale running jobs count=3" in output.splitlines()
    for job_id in stale:
        assert f"reaped job {job_id} attempt 1 -> pending" in output
    assert set(statuses(stale).values()) == {JobStatus.PENDING}
    jobs = Job.objects.filter(pk__in=stale)
    assert {(j.stall_count, j.locked_by, j.locked_until) for j in jobs} == {(1, None, None)}
    attempts = JobAttempt.objects.filter(job_id__in=stale)
    assert sorted(a.job_id for a in attempts) == sorted(stale)
    assert {(a.outcome, a.worker, a.attempt) for a in attempts} == {
        (AttemptOutcome.LEASE_EXPIRED, WORKER, 1)
    }
    summary = [
        r for r in leasejobs_log.records if r.getMessage() == "released stale running jobs count=3"
    ]
    assert len(summary) == 1
    assert summary[0].count == 3  # type: ignore[attr-defined]
    assert sorted(summary[0].job_ids) == sorted(stale)  # type: ignore[attr-defined]

    # A second pass finds nothing left to do.
    assert "released stale running jobs count=0" in reap().splitlines()


@DB
def test_one_pass_leaves_live_leases_alone() -> None:
    live = running_jobs(2)
    output = reap()
    assert "released stale running jobs count=0" in output.splitlines()
    assert set(statuses(live).values()) == {JobStatus.RUNNING}
    assert not JobAttempt.objects.exists()


@DB
def test_only_expired_ones_of_a_mix_are_reaped() -> None:
    ids = running_jobs(3)
    expire(ids[:1])
    assert "released stale running jobs count=1" in reap().splitlines()
    assert statuses(ids) == {
        ids[0]: JobStatus.PENDING,
        ids[1]: JobStatus.RUNNING,
        ids[2]: JobStatus.RUNNING,
    }


@DB
def test_dry_run_lists_and_changes_nothing() -> None:
    stale = running_jobs(2)
    live = running_jobs(1, worker="other-worker")
    expire(stale)

    output = reap("--dry-run")

    lines = output.splitlines()
    assert "dry run: would release stale running jobs count=2" in lines
    for job_id in stale:
        matching = [line for line in lines if line.startswith(f"would reap job {job_id} ")]
        assert len(matching) == 1
        assert WORKER in matching[0]
        assert "tests.tasks.add" in matching[0]
    assert not any(line.startswith(f"would reap job {live[0]} ") for line in lines)
    assert not [line for line in lines if line.startswith(("released", "reaped"))]
    assert set(statuses(stale + live).values()) == {JobStatus.RUNNING}
    assert set(Job.objects.filter(pk__in=stale).values_list("stall_count", flat=True)) == {0}
    assert not JobAttempt.objects.exists()


@DB
def test_stale_lock_age_delays_the_reap() -> None:
    stale = running_jobs(1)
    expire(stale, seconds_ago=5)

    assert "released stale running jobs count=0" in reap("--stale-lock-age", "3600").splitlines()
    assert statuses(stale) == {stale[0]: JobStatus.RUNNING}
    assert "dry run: would release stale running jobs count=0" in reap(
        "--dry-run", "--stale-lock-age", "3600"
    )

    assert "released stale running jobs count=1" in reap("--stale-lock-age", "1").splitlines()
    assert statuses(stale) == {stale[0]: JobStatus.PENDING}


@DB
def test_a_job_out_of_stalls_becomes_dead() -> None:
    job_id = int(add.using(max_stalls=1).enqueue(1, 1).id)
    leases.claim(WORKER, limit=1, lease_duration=30)
    expire([job_id])
    output = reap()
    assert f"reaped job {job_id} attempt 1 -> dead" in output
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.stall_count) == (JobStatus.DEAD, 1)
    assert job.finished_at is not None


# --------------------------------------------------------------------------- bad input


def test_unknown_backend_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="nope"):
        reap("--backend", "nope")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stale-lock-age", "-1"], "argument --stale-lock-age: expected seconds >= 0, got '-1'"),
        (["--stale-lock-age", "nan"], "argument --stale-lock-age: expected seconds >= 0"),
        (["--stale-lock-age", "soon"], "expected a number of seconds, got 'soon'"),
        (["--loop", "--interval", "0"], "argument --interval: expected seconds > 0, got '0'"),
        (["--loop", "--interval", "abc"], "argument --interval: expected a number of seconds"),
        (["--loop", "--interval", "-2"], "argument --interval: expected seconds >= 0, got '-2'"),
    ],
)
def test_bad_option_values_are_rejected(args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as excinfo:
        reap(*args)
    assert message in str(excinfo.value)


def test_interval_without_loop_is_rejected() -> None:
    with pytest.raises(CommandError, match="--interval only makes sense with --loop"):
        reap("--interval", "5")


def test_bad_option_value_from_the_command_line_exits_with_usage(run_manage: Any) -> None:
    done = run_manage(["reap_stale_locks", "--interval", "abc", "--loop"])
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert "argument --interval: expected a number of seconds, got 'abc'" in done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- loop


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_loop_reaps_while_running_and_exits_on_sigterm(subprocess_env: dict[str, str]) -> None:
    job_id = running_jobs(1)[0]
    process = popen_manage(["reap_stale_locks", "--loop", "--interval", "0.2"], subprocess_env)
    try:
        assert process.stdout is not None
        out = LineReader(process.stdout)
        # The loop is running (signal handlers installed) once it printed a pass.
        out.wait_for("released stale running jobs count=0", timeout=60)
        assert statuses([job_id]) == {job_id: JobStatus.RUNNING}

        expire([job_id])

        def reaped() -> bool:
            if statuses([job_id])[job_id] == JobStatus.PENDING:
                return True
            assert process.poll() is None, "the reaper loop exited"
            return False

        wait_until(reaped, timeout=15, what="the loop to reap the expired job")
        out.wait_for("released stale running jobs count=1", timeout=10)
        assert f"reaped job {job_id} attempt 1 -> pending" in out.lines

        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()
    finally:
        stop(process)
    assert Job.objects.get(pk=job_id).stall_count == 1


# --------------------------------------------------------------------------- outages


def test_unreachable_database_fails_cleanly(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "DATABASE_URL": unreachable_database_url()}
    env["LEASEJOBS_TEST_SUBPROCESS"] = "1"

    done = run_manage(["reap_stale_locks"], env=env)

    assert done.returncode not in (0, None)
    assert "database 'default' unreachable" in done.stderr
    assert "Traceback" not in done.stderr
    assert "released stale running jobs" not in done.stdout


@pytest.mark.slow
def test_loop_survives_an_unreachable_database(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "DATABASE_URL": unreachable_database_url()}
    process = popen_manage(["reap_stale_locks", "--loop", "--interval", "0.2"], env)
    try:
        assert process.stderr is not None
        err = LineReader(process.stderr)
        err.wait_for("unreachable", timeout=30)
        err.wait_for("unreachable", timeout=10)  # a second pass: the loop kept going
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert not any("Traceback" in line for line in err.drain())
    finally:
        stop(process)
