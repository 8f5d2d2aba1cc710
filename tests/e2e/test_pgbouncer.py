"""Behind a real PgBouncer in transaction mode (tests/pgbouncer.py starts one of our own).

Subprocesses (workers, producers, commands, the admin) get a ``DATABASE_URL`` through
the pooler, and ``LEASEJOBS_TEST_DIRECT_DATABASE_URL`` naming the test database itself:
tests/settings.py makes that the alias ``leasejobs_direct``, for ``LISTEN_DATABASE``.
Every test ends by checking PgBouncer's log for a notification that reached a server
connection no client was using (a ``LISTEN`` left on a pooled connection).

Skipped unless the test database is PostgreSQL; skipped without ``pgbouncer`` (Debian's
package), except under ``CI=true``, where that is a failure: CI installs it (.ci/run).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker.listener import listen_connection_params, pooler_in_between
from testproject.embedded_db import settings_to_database_url
from tests import tasks_worker_flow
from tests.browser import in_ci
from tests.conftest import RunManage
from tests.pgbouncer import PgBouncer, find_pgbouncer, running
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker_harness import IDLE_MAIN_LOOP, WorkerProcess, Workers, pid_alive

pytestmark = pytest.mark.django_db(transaction=True)

DIRECT_ALIAS = "leasejobs_direct"
POLLING = "not listening for new jobs"
LISTENING = "listening for new jobs on database"


@pytest.fixture(scope="module")
def binary(django_db_setup: None, django_db_blocker: Any) -> str:
    """The pgbouncer binary, when the test database is PostgreSQL (else the test skips)."""
    with django_db_blocker.unblock():
        vendor = connection.vendor
    if vendor != "postgresql":
        pytest.skip(f"PgBouncer sits in front of PostgreSQL; the test database is {vendor}")
    found = find_pgbouncer()
    if found is None:
        problem = "pgbouncer is not installed (apt-get install pgbouncer)"
        if in_ci():
            pytest.fail(f"CI=true but {problem}: CI must install it (see .ci/run)")
        pytest.skip(problem)
    return found


@pytest.fixture(scope="module")
def bouncer(binary: str, django_db_blocker: Any) -> Iterator[PgBouncer]:
    with django_db_blocker.unblock():
        settings_dict = dict(connection.settings_dict)
    with running(binary, settings_dict) as pooler:
        yield pooler


def env_through(pooler: PgBouncer, subprocess_env: dict[str, str]) -> dict[str, str]:
    """A subprocess environment whose default alias goes through ``pooler`` (and without
    the project's ``LOGGING``, so ``runworker --log-format json`` shows the extra keys)."""
    return {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "tests.settings_fresh",
        "DATABASE_URL": settings_to_database_url(pooler.settings_dict(connection.settings_dict)),
        "LEASEJOBS_TEST_DIRECT_DATABASE_URL": subprocess_env["DATABASE_URL"],
    }


@pytest.fixture
def pooled_env(bouncer: PgBouncer, subprocess_env: dict[str, str]) -> dict[str, str]:
    return env_through(bouncer, subprocess_env)


@pytest.fixture
def pooled_workers(pooled_env: dict[str, str]) -> Iterator[Workers]:
    factory = Workers(pooled_env)
    try:
        yield factory
    finally:
        factory.cleanup()


def assert_no_stray_notification(bouncer: PgBouncer) -> None:
    assert bouncer.stray_notifications() == [], bouncer.log()


def json_records(worker: WorkerProcess, message: str) -> list[dict[str, Any]]:
    """The worker's JSON log records (``--log-format json``) whose message has ``message``."""
    found = []
    for line in worker.lines:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and message in str(record.get("message", "")):
                found.append(record)
    return found


def job(pk: int | str) -> Job:
    return Job.objects.get(pk=pk)


# A producer through the pooler: enqueues out of and inside atomic() and in bulk, then
# keeps using its (pooled) connection while the workers run the jobs, and reports
# whether that connection ever received a notification.
PRODUCER = """
import json, time
from django.db import connection, transaction
from django_leasejobs.compat import task_backends
from tests import tasks_worker

marker_dir = {marker_dir!r}
high = tasks_worker.record.using(queue_name="high")
low = tasks_worker.record.using(queue_name="low")
ids = [high.enqueue(marker_dir, "plain").id for _ in range(5)]
with transaction.atomic():
    ids += [low.enqueue(marker_dir, "atomic").id for _ in range(5)]
calls = [(t, [marker_dir, f"bulk-{{t.queue_name}}"], {{}}) for t in [high, low] * 25]
ids += [r.id for r in task_backends["default"].bulk_enqueue(calls)]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM leasejobs_job WHERE id = ANY(%s) AND status = %s",
                       [[int(i) for i in ids], "succeeded"])
        if cursor.fetchone()[0] == len(ids):
            break
    tasks_worker.record.enqueue(marker_dir, "extra")  # more NOTIFYs while we query
    time.sleep(0.05)
raw = connection.connection
print(json.dumps({{
    "ids": ids,
    "notifies": [n.payload for n in raw.notifies(timeout=0)],
    "pgconn_notify": raw.pgconn.notifies() is not None,
    "pooled_port": str(connection.settings_dict["PORT"]),
}}))
"""


def test_producers_and_both_pools_poll_behind_the_pooler_without_listen_database(
    bouncer: PgBouncer,
    pooled_workers: Workers,
    pooled_env: dict[str, str],
    run_manage: RunManage,
    marker_dir: str,
) -> None:
    json_logs = ["--concurrency", "2", "--log-format", "json"]
    process_pool = pooled_workers.start(
        args=[*json_logs, "--queues", "high", "--worker-id", "pgb-process"]
    )
    thread_pool = pooled_workers.start(
        args=[*json_logs, "--pool", "thread", "--queues", "low", "--worker-id", "pgb-thread"]
    )
    for worker, worker_id in ((process_pool, "pgb-process"), (thread_pool, "pgb-thread")):
        [pooled] = worker.wait_for_event("listening_changed", listening=False, reason="pooler")
        assert pooled["error"], pooled  # why it counts as pooled
        [warning] = json_records(worker, POLLING)
        assert warning["level"] == "WARNING"
        assert (warning["worker"], warning["database"]) == (worker_id, "default")
        assert 'OPTIONS["LISTEN_DATABASE"]' in warning["message"]

    produced = run_manage(
        ["shell", "-c", PRODUCER.format(marker_dir=marker_dir)], env=pooled_env, timeout=120
    )
    assert produced.returncode == 0, produced.stderr
    report = json.loads(produced.stdout.strip().splitlines()[-1])
    assert report["pooled_port"] == str(bouncer.port)  # the producer went through the pooler
    assert len(report["ids"]) == 60
    assert report["notifies"] == []
    assert report["pgconn_notify"] is False

    assert Job.objects.filter(pk__in=report["ids"], status=JobStatus.SUCCEEDED).count() == 60
    # Each pool ran its queue, every job once: slots (children) for "high", the thread
    # pool's own process for "low".
    for name, pool, count in (
        ("plain", process_pool, 5),
        ("bulk-high", process_pool, 25),
        ("atomic", thread_pool, 5),
        ("bulk-low", thread_pool, 25),
    ):
        runs = read_lines(marker_dir, f"{name}.runs")
        assert len(runs) == count, name
        pids = {int(line.split()[1]) for line in runs}
        if pool is thread_pool:
            assert pids == {thread_pool.pid}, name
        else:
            assert thread_pool.pid not in pids and process_pool.pid not in pids, name

    for worker in (process_pool, thread_pool):
        worker.terminate()
        assert worker.wait(timeout=30) == 0, worker.output
        assert len(json_records(worker, POLLING)) == 1  # once, however long it ran
        assert json_records(worker, LISTENING) == []
        assert len(worker.events("listening_changed")) == 1
    assert_no_stray_notification(bouncer)


def idle_queries() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'idle'"
        )
        return [query for (query,) in cursor.fetchall()]


def test_listen_database_wakes_an_idle_worker_behind_the_pooler_at_once(
    bouncer: PgBouncer, pooled_workers: Workers, marker_dir: str
) -> None:
    worker = pooled_workers.start(
        options={"POLL_INTERVAL": 30, "LISTEN_DATABASE": DIRECT_ALIAS},
        args=["--concurrency", "1", "--log-format", "json", "--worker-id", "pgb-listen"],
    )
    worker.wait_for_event("listening_changed", listening=True)
    [listening] = json_records(worker, LISTENING)
    assert (listening["worker"], listening["database"]) == ("pgb-listen", DIRECT_ALIAS)
    # Idle: LISTEN done (on the direct connection), the first empty claim done (through
    # the pooler), so the main loop sleeps up to POLL_INTERVAL (30 s) unless woken.
    wait_until(
        lambda: (
            "LISTEN leasejobs" in (queries := idle_queries())
            and any(q.startswith(IDLE_MAIN_LOOP) for q in queries)
        ),
        timeout=15,
        what="the worker to listen and go idle",
    )
    result = tasks_worker_flow.record_id.enqueue(marker_dir, "woken")
    wait_until(
        lambda: job(result.id).status == JobStatus.SUCCEEDED,
        timeout=10,
        what="the job to run (woken by NOTIFY, not by the 30 s poll)",
    )
    row = job(result.id)
    assert row.started_at is not None
    assert row.started_at - row.enqueued_at < timedelta(seconds=2)  # database clock
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output
    assert json_records(worker, POLLING) == []  # a configured LISTEN_DATABASE is trusted
    assert_no_stray_notification(bouncer)


def test_recovery_after_sigkill_reaper_status_and_admin_through_the_pooler(
    bouncer: PgBouncer,
    pooled_workers: Workers,
    pooled_env: dict[str, str],
    run_manage: RunManage,
    marker_dir: str,
) -> None:
    options = {"LISTEN_DATABASE": DIRECT_ALIAS, "STALE_LOCK_INTERVAL": 0}  # no reap pass
    first = pooled_workers.start(options=options, args=["--concurrency", "1"])
    result = tasks_worker_flow.wait_for_gate.enqueue(marker_dir, "gate")
    wait_until(lambda: read_lines(marker_dir, "gate.started"), what="attempt 1 to start")
    [started] = read_lines(marker_dir, "gate.started")
    slot_pid = int(started.split()[1])

    # SIGKILL the worker and its slot: only the lease's expiry can recover the job.
    first.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(slot_pid, signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    wait_until(lambda: not pid_alive(slot_pid), timeout=10, what="the slot to die")
    assert job(result.id).status == JobStatus.RUNNING

    # reap_stale_locks through the pooler, once the lease (2 s) has expired.
    def reaped() -> bool:
        done = run_manage(["reap_stale_locks"], env=pooled_env)
        assert done.returncode == 0, done.stderr
        return "released stale running jobs count=1" in done.stdout

    wait_until(reaped, timeout=20, interval=0.5, what="reap_stale_locks to release the job")
    row = job(result.id)
    assert (row.status, row.stall_count) == (JobStatus.PENDING, 1)

    # Another worker runs attempt 2.
    (Path(marker_dir) / "gate.gate").touch()
    second = pooled_workers.start(options=options, args=["--concurrency", "1"])
    wait_until(lambda: job(result.id).status == JobStatus.SUCCEEDED, what="attempt 2 to succeed")
    assert job(result.id).attempt == 2
    assert len(read_lines(marker_dir, "gate.started")) == 2

    status = run_manage(["leasejobs_status", "--json"], env=pooled_env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)

    admin = run_manage(["shell", "-c", ADMIN.format(job_id=result.id)], env=pooled_env)
    assert admin.returncode == 0, admin.stderr
    assert json.loads(admin.stdout.strip().splitlines()[-1]) == {
        "/admin/django_leasejobs/job/": 200,
        "/admin/django_leasejobs/job/dashboard/": 200,
        "/admin/django_leasejobs/worker/": 200,
        f"/admin/django_leasejobs/job/{result.id}/change/": 200,
    }
    second.terminate()
    assert second.wait(timeout=30) == 0, second.output
    assert_no_stray_notification(bouncer)


# The admin, through the pooler: a superuser and Django's test client in one process.
ADMIN = """
import json
from django.contrib.auth import get_user_model
from django.test import Client

user, _ = get_user_model().objects.get_or_create(
    username="pgbouncer-admin", defaults={{"is_staff": True, "is_superuser": True}}
)
client = Client(HTTP_HOST="localhost")
client.force_login(user)
pages = ["/admin/django_leasejobs/job/", "/admin/django_leasejobs/job/dashboard/",
         "/admin/django_leasejobs/worker/", "/admin/django_leasejobs/job/{job_id}/change/"]
print(json.dumps({{page: client.get(page).status_code for page in pages}}))
"""


# Enqueues through its (pooled) connection, then reports the notifications it collected.
ENQUEUE_AND_COLLECT = """
import json
from django.db import connection
from tests import tasks_worker

for _ in range(5):
    tasks_worker.record.enqueue({marker_dir!r}, "leak")
print(json.dumps([n.payload for n in connection.connection.notifies(timeout=0)]))
"""


def test_the_checks_catch_a_listen_left_on_a_pooled_connection(
    binary: str, subprocess_env: dict[str, str], run_manage: RunManage, marker_dir: str
) -> None:
    """The control for the checks above: trusting the pooled alias itself as
    LISTEN_DATABASE leaves the LISTEN on a pooled server connection, and what the other
    tests assert never happens does. (A pooler of its own, one server connection, so
    the LISTEN cannot outlive the test and every transaction shares that connection.)"""
    with running(binary, dict(connection.settings_dict), pool_size=1) as pooler:
        env = env_through(pooler, subprocess_env)
        factory = Workers(env)
        try:
            worker = factory.start(
                options={"LISTEN_DATABASE": "default", "POLL_INTERVAL": 30},
                args=["--concurrency", "1", "--queues", "high"],
            )
            worker.wait_for_event("listening_changed", listening=True)
            produced = run_manage(
                ["shell", "-c", ENQUEUE_AND_COLLECT.format(marker_dir=marker_dir)], env=env
            )
            assert produced.returncode == 0, produced.stderr
            collected = json.loads(produced.stdout.strip().splitlines()[-1])
            # The producer's own NOTIFYs came back to it: its transactions ran on the
            # server connection that LISTENs. (And PgBouncer may log stray ones.)
            assert collected, pooler.log()
            assert set(collected) == {"default"}
            worker.terminate()
            assert worker.wait(timeout=30) == 0, worker.output
        finally:
            factory.cleanup()


def test_the_listener_sees_the_pooler_between_it_and_the_server(bouncer: PgBouncer) -> None:
    """The decision itself: through the pooler, the server's session serves PgBouncer's
    socket, not ours (one query, no NOTIFY)."""
    params = {**listen_connection_params("default"), "host": "127.0.0.1", "port": bouncer.port}
    with psycopg.connect(**params, autocommit=True) as conn:
        why = pooler_in_between(conn)
    # "this connection is 127.0.0.1:<ours> -> port <pooler's>, but the server serves
    # 127.0.0.1:<the pooler's> -> port 5432" (or "a Unix-socket client", embedded).
    assert f" -> port {bouncer.port}), but the server serves a Unix-socket client" in why or (
        f" -> port {bouncer.port}, but the server serves 127.0.0.1:" in why
    ), why
    assert_no_stray_notification(bouncer)
