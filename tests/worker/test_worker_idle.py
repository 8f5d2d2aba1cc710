"""What an idle worker costs the database, with real ``runworker`` subprocesses.

A worker whose listener is listening (PostgreSQL, direct connection) waits on NOTIFY
and looks for work only every ``IDLE_POLL_INTERVAL`` and when the next delayed job of
its queues comes due; a worker that cannot listen (SQLite, a lost listener
connection) polls every ``POLL_INTERVAL``. Every empty claim sends ``worker_idle`` with
the wait the worker chose (and logs the DEBUG line ``no job ready; next look for work in
...s (listening|polling)``): these tests count the events.
"""

from __future__ import annotations

import copy
import re
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from django_leasejobs import leases
from django_leasejobs.leases import RetryResult
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker.listener import listen_connection_params
from django_leasejobs.worker.loop import Worker, WorkerConfig
from tests import tasks_retry, tasks_worker_flow
from tests.waiting import wait_until
from tests.worker_harness import WorkerProcess, Workers

pytestmark = pytest.mark.django_db(transaction=True)

EXIT_TIMEOUT = 30.0
OPTIONS = {"POLL_INTERVAL": 0.2, "IDLE_POLL_INTERVAL": 60}
ARGS = ["--concurrency", "1", "--log-level", "DEBUG", "--no-scheduler"]
FRESH = {"DJANGO_SETTINGS_MODULE": "tests.settings_fresh"}
"""No ``LOGGING``: ``runworker`` prints its own lines, at ``--log-level DEBUG``."""


def idle_waits(worker: WorkerProcess) -> list[tuple[float, str]]:
    """Every idle wait the worker chose so far (its ``worker_idle`` events): (seconds,
    rounded as its DEBUG line prints them, listening or polling)."""
    return [
        (round(float(e["wait"]), 3), "listening" if e["listening"] else "polling")
        for e in worker.events("worker_idle")
    ]


def job(pk: int | str) -> Job:
    return Job.objects.get(pk=int(pk))


def succeeded(pk: int | str) -> Job | None:
    row = job(pk)
    return row if row.status == JobStatus.SUCCEEDED else None


def require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")


def listening_and_idle(worker: WorkerProcess) -> None:
    worker.wait_for_event("listening_changed", timeout=15, listening=True)
    worker.wait_for_event("worker_idle", timeout=15, listening=True)


def test_an_idle_listening_worker_waits_on_notify_not_on_the_poll(
    workers: Workers, marker_dir: str
) -> None:
    require_postgresql()
    worker = workers.start(options=OPTIONS, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    assert (60.0, "listening") in idle_waits(worker), worker.output

    # A job that comes due in 3 s: the NOTIFY at enqueue wakes the worker, its claim
    # finds nothing ready, and it waits until the job is due (not 60 s, not 0.2 s).
    before = len(idle_waits(worker))
    delayed = tasks_worker_flow.record_id.using(
        run_after=timezone.now() + timedelta(seconds=3)
    ).enqueue(marker_dir, "delayed")
    row = wait_until(lambda: succeeded(delayed.id), timeout=30, what="the delayed job to run")
    assert row.started_at is not None
    late = (row.started_at - row.run_after).total_seconds()  # both by the database's clock
    assert 0 <= late < 5, f"started {late:.3f}s after its run_after\n{worker.output}"
    # While it waited 3 s for the job, the worker looked for work a handful of times, not
    # every POLL_INTERVAL (0.2 s: about 15 claims).
    during = idle_waits(worker)[before:]
    assert len(during) <= 4, during
    assert any(mode == "listening" and 1.0 < wait <= 3.1 for wait, mode in during), during

    # Idle again, waiting up to 60 s: an enqueued job wakes it at once.
    wait_until(
        lambda: idle_waits(worker)[-1] == (60.0, "listening"),
        timeout=15,
        what="the worker to wait on the safety poll again",
    )
    quiet = len(idle_waits(worker))
    now = tasks_worker_flow.record_id.enqueue(marker_dir, "now")
    row = wait_until(lambda: succeeded(now.id), timeout=10, what="the job to run (NOTIFY)")
    assert row.started_at is not None
    assert row.started_at - row.enqueued_at < timedelta(seconds=2), worker.output
    # Nothing looked for work between the quiet point and the enqueue but that NOTIFY.
    assert len(idle_waits(worker)) - quiet <= 2, idle_waits(worker)[quiet:]
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_a_snoozed_job_starts_again_when_due_on_an_idle_listening_worker(
    workers: Workers, marker_dir: str
) -> None:
    """A retry's or snooze's new ``run_after`` sends no NOTIFY: the worker that wrote it
    waits until it comes due, not for the 60 s safety poll."""
    require_postgresql()
    worker = workers.start(options=OPTIONS, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    result = tasks_retry.snoozes_once.enqueue(3.0)
    row = wait_until(lambda: succeeded(result.id), timeout=30, what="the snoozed job to succeed")
    assert row.last_attempted_at is not None and row.started_at is not None
    assert row.run_after - row.started_at >= timedelta(seconds=3)  # snoozed 3 s
    late = (row.last_attempted_at - row.run_after).total_seconds()
    assert 0 <= late < 5, f"started again {late:.3f}s after its run_after\n{worker.output}"
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_an_operator_retry_wakes_an_idle_listening_worker(
    workers: Workers, marker_dir: str
) -> None:
    """``leases.retry`` (the admin's retry action) sends a NOTIFY on commit: the retried
    job does not wait for the 60 s safety poll."""
    require_postgresql()
    result = tasks_worker_flow.record_id.enqueue(marker_dir, "retried")
    Job.objects.filter(pk=int(result.id)).update(status=JobStatus.DEAD)
    worker = workers.start(options=OPTIONS, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    wait_until(
        lambda: idle_waits(worker)[-1] == (60.0, "listening"),
        timeout=15,
        what="the worker to wait on the safety poll",
    )
    assert job(result.id).status == JobStatus.DEAD  # nothing claimed it meanwhile
    assert leases.retry(int(result.id)) == RetryResult.RETRIED
    row = wait_until(lambda: succeeded(result.id), timeout=10, what="the retried job to run")
    retried_at = row.run_after  # the retry made it runnable at once, by the database clock
    assert row.started_at is not None
    assert row.started_at - retried_at < timedelta(seconds=2), worker.output
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_a_worker_whose_listener_connection_drops_polls_at_once(
    workers: Workers, marker_dir: str
) -> None:
    require_postgresql()
    worker = workers.start(options=OPTIONS, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = 'LISTEN leasejobs'"
        )
        assert cursor.fetchall(), "no listener connection found"
    [failed] = worker.wait_for_event(
        "listening_changed", timeout=15, listening=False, reason="connection_failed"
    )
    assert set(failed) == {"event", "pid", "backend", "worker_id", "listening", "reason", "error"}
    assert failed["error"], failed
    wait_until(
        lambda: (0.2, "polling") in idle_waits(worker),
        timeout=10,
        what="the worker to poll every POLL_INTERVAL",
    )
    # It listens again after its backoff, and goes back to the slow safety poll.
    worker.wait_for_event("listening_changed", timeout=20, count=2, listening=True)
    result = tasks_worker_flow.record_id.enqueue(marker_dir, "after")
    wait_until(lambda: succeeded(result.id), timeout=15, what="the job to run")
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_a_worker_that_cannot_listen_polls_every_poll_interval(
    workers: Workers, marker_dir: str
) -> None:
    if connection.vendor == "postgresql":
        pytest.skip("polling instead of LISTEN: the databases without NOTIFY")
    worker = workers.start(options=OPTIONS, args=ARGS, env=FRESH)
    wait_until(
        lambda: len(idle_waits(worker)) >= 5,
        timeout=15,
        what="the worker to poll a few times",
    )
    assert set(idle_waits(worker)) == {(0.2, "polling")}, idle_waits(worker)
    result = tasks_worker_flow.record_id.enqueue(marker_dir, "polled")
    row = wait_until(lambda: succeeded(result.id), timeout=15, what="the job to run")
    assert row.started_at is not None
    delayed = tasks_worker_flow.record_id.using(
        run_after=timezone.now() + timedelta(seconds=2)
    ).enqueue(marker_dir, "delayed")
    row = wait_until(lambda: succeeded(delayed.id), timeout=30, what="the delayed job to run")
    assert row.started_at is not None
    late = (row.started_at - row.run_after).total_seconds()
    assert 0 <= late < 5, f"started {late:.3f}s after its run_after\n{worker.output}"
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_the_listen_database_connection_gets_the_workers_tcp_hardening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_postgresql()
    alias = "listen_direct"
    direct = copy.deepcopy(connections.settings["default"])
    direct["OPTIONS"] = {"keepalives_idle": 42}  # the site's own value wins
    monkeypatch.setitem(connections.settings, alias, direct)
    default = connections.settings["default"]  # the worker hardens it too: undone after
    # Without the values an earlier in-process worker of this run left there (the site's own
    # values win, so they would stand in for this worker's).
    hardening = {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval"}
    hardening |= {"keepalives_count", "tcp_user_timeout"}
    site_options = {k: v for k, v in default.get("OPTIONS", {}).items() if k not in hardening}
    monkeypatch.setitem(default, "OPTIONS", site_options)
    options = {"LEASE_DURATION": 12, "HEARTBEAT_INTERVAL": 4, "LISTEN_DATABASE": alias}
    backend = {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend", "OPTIONS": options}
    with override_settings(TASKS={"default": backend}):
        worker = Worker(WorkerConfig(pool="thread", concurrency=1))
        worker.inbox.close()
    params = listen_connection_params(alias)
    assert params["tcp_user_timeout"] == 12_000
    assert params["keepalives"] == 1
    assert params["keepalives_idle"] == 42
    assert params["connect_timeout"] == 10
    assert connections.settings["default"]["OPTIONS"]["tcp_user_timeout"] == 12_000


TICK_LINE = re.compile(r"housekeeping tick: (.*)")
SAFETY_POLL = "safety poll: no job due (none pending), no claim"
TICKS = {
    "POLL_INTERVAL": 0.2,
    # Five beats: a housekeeping thread held up for a second on a loaded machine does not
    # let the main loop's safety poll come first.
    "IDLE_POLL_INTERVAL": 2,
    "HEARTBEAT_INTERVAL": 0.4,
    "STALE_LOCK_INTERVAL": 0.4,
    "LEASE_DURATION": 3,
}


def ticks(worker: WorkerProcess) -> list[str]:
    return TICK_LINE.findall(worker.output)


def worker_backends() -> int:
    """Connections to the test database other than this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (count,) = cursor.fetchone()
    return int(count)


def test_an_idle_listening_worker_holds_four_connections_and_commits_once_per_tick(
    workers: Workers,
) -> None:
    """The main thread closes its connection after registering; the housekeeping thread
    runs the reap passes and, while the worker is idle and listening, the next-due lookup
    that stands in for the main loop's safety poll, all in one transaction per tick (the
    registry row touched every other beat). What stays open: the database thread, the
    heartbeat (idle: it only renews leases), the housekeeping thread and the listener."""
    require_postgresql()
    worker = workers.start(options=TICKS, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    # Settled: two ticks since the first idle wait (a start-up look may come meanwhile).
    first = len(ticks(worker))
    wait_until(lambda: len(ticks(worker)) >= first + 2, timeout=10, what="two ticks")
    looked = len(idle_waits(worker))
    seen = len(ticks(worker))
    wait_until(
        lambda: len(ticks(worker)) >= seen + 10,
        timeout=20,
        what="ten more housekeeping ticks (4 s: two IDLE_POLL_INTERVALs)",
    )
    wait_until(lambda: worker_backends() == 4, timeout=10, what="four connections")
    idle_ticks = ticks(worker)[seen:]
    # Every idle tick reaps and looks up the next due job (same interval), in one
    # transaction with the registry touch when there is one (every other tick).
    assert all(
        "reap pass (0 reaped)" in tick
        and "next-due lookup" in tick
        and tick.endswith(" in one transaction")
        for tick in idle_ticks
    ), idle_ticks
    touched = [tick for tick in idle_ticks if "registry row" in tick]
    assert len(idle_ticks) // 2 - 1 <= len(touched) <= len(idle_ticks) // 2 + 1, idle_ticks
    assert not any("renewed" in tick for tick in idle_ticks), idle_ticks
    # The housekeeping thread's lookups stood in for the main loop's safety poll (every 2 s):
    # the main loop did not look for work at all meanwhile.
    assert len(idle_waits(worker)) == looked, idle_waits(worker)[looked:]
    assert SAFETY_POLL not in worker.output
    assert worker_backends() == 4
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_a_job_made_pending_without_notify_starts_at_the_next_housekeeping_tick(
    workers: Workers, marker_dir: str
) -> None:
    """A row changed without a ``NOTIFY`` (by hand, by another program) is found by the
    next-due lookup of the idle worker's housekeeping tick, long before the 60 s safety
    poll."""
    require_postgresql()
    result = tasks_worker_flow.record_id.enqueue(marker_dir, "by hand")
    Job.objects.filter(pk=int(result.id)).update(status=JobStatus.DEAD)
    options = {**TICKS, "IDLE_POLL_INTERVAL": 60}
    worker = workers.start(options=options, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    seen = len(ticks(worker))
    wait_until(lambda: len(ticks(worker)) >= seen + 2, timeout=10, what="two idle ticks")
    assert job(result.id).status == JobStatus.DEAD
    Job.objects.filter(pk=int(result.id)).update(status=JobStatus.PENDING)  # no NOTIFY
    wait_until(lambda: succeeded(result.id), timeout=10, what="the job to run")
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def test_a_safety_poll_that_finds_nothing_due_does_not_claim(workers: Workers) -> None:
    """With ``IDLE_POLL_INTERVAL`` shorter than the heartbeat, the main loop's own safety
    poll runs: it looks up the next due job first and claims only when one is due."""
    require_postgresql()
    options = {**TICKS, "IDLE_POLL_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 2, "LEASE_DURATION": 6}
    worker = workers.start(options=options, args=ARGS, env=FRESH)
    listening_and_idle(worker)
    wait_until(
        lambda: worker.output.count(SAFETY_POLL) >= 3,
        timeout=15,
        what="three safety polls",
    )
    assert set(idle_waits(worker)[1:]) <= {(0.5, "listening")}, idle_waits(worker)
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output
