"""Helpers for the lease protocol and reaper tests (tests/leases/), and for the worker
tests that need a row in a given state (a row locked elsewhere, a write the database
refuses).

All times are the database's clock: rows are moved in time with UPDATEs relative to
``Now()``, never with Python's clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, connections, transaction
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.models import Job, JobAttempt

TASK_PATH = "tests.tasks.add"
LEASE = 30.0
THREAD_TIMEOUT = 60.0


def make_job(**fields: Any) -> Job:
    """A pending job of ``tests.tasks.add`` (fields override the defaults)."""
    fields.setdefault("task_path", TASK_PATH)
    fields.setdefault("args", [1, 2])
    return Job.objects.create(**fields)


def claimed_job(**fields: Any) -> leases.ClaimedJob:
    """A claimed job as the worker holds it, never in the database (job 1, attempt 1 of
    ``tests.tasks.add`` in the default queue; ``fields`` override those)."""
    values: dict[str, Any] = {
        "id": 1,
        "attempt": 1,
        "task_path": TASK_PATH,
        "queue": "default",
        "priority": 0,
        "args": [],
        "kwargs": {},
        "timeout": None,
        "max_attempts": 3,
        "checkpoint": None,
    }
    return leases.ClaimedJob(**(values | fields))


def make_jobs(count: int, **fields: Any) -> list[int]:
    """Insert ``count`` pending jobs with one multi-row INSERT; return their ids, ascending."""
    fields.setdefault("task_path", TASK_PATH)
    created = Job.objects.bulk_create(
        [Job(args=[i, i], **fields) for i in range(count)], batch_size=500
    )
    ids = [job.pk for job in created]
    assert len(ids) == count and None not in ids, "bulk_create did not return primary keys"
    return sorted(ids)


def claim_one(worker: str, job_id: int | None = None, **kwargs: Any) -> leases.ClaimedJob:
    """Claim exactly one job for ``worker`` (and check it is ``job_id`` when given)."""
    kwargs.setdefault("lease_duration", LEASE)
    claimed = leases.claim(worker, limit=1, **kwargs)
    assert len(claimed) == 1, f"{worker} claimed {claimed!r}, expected one job"
    if job_id is not None:
        assert claimed[0].id == job_id
    return claimed[0]


def expire(*job_ids: int, seconds_ago: float = 60.0) -> int:
    """Move the lease expiry of running jobs ``seconds_ago`` into the past (database clock).

    With no ids, every running job. Returns the number of rows changed.
    """
    jobs = Job.objects.filter(status="running")
    if job_ids:
        jobs = jobs.filter(pk__in=job_ids)
    return jobs.update(locked_until=Now() - timedelta(seconds=seconds_ago))


def make_ready(*job_ids: int, seconds_ago: float = 60.0) -> int:
    """Move ``run_after`` of the given jobs into the past (database clock)."""
    return Job.objects.filter(pk__in=job_ids).update(
        run_after=Now() - timedelta(seconds=seconds_ago)
    )


def row(job_id: int) -> dict[str, Any]:
    """Every column of a job row, as stored."""
    return Job.objects.filter(pk=job_id).values().get()


def attempt_rows(job_id: int) -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt"))


def db_now(using: str = "default") -> datetime:
    """The database's current time (statement time), as an aware UTC datetime."""
    conn = connections[using]
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            value = cursor.fetchone()[0]
        elif conn.vendor == "sqlite":
            cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
            value = datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)
        else:
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            value = cursor.fetchone()[0].replace(tzinfo=UTC)
    return value


def seconds_from_db_now(moment: datetime | None) -> float:
    """``moment`` minus the database's current time, in seconds."""
    assert moment is not None
    return (moment - db_now()).total_seconds()


def run_in_threads(
    functions: Sequence[Callable[[], Any]], *, timeout: float = THREAD_TIMEOUT
) -> list[Any]:
    """Run each function in its own thread (its own DB connection), started together.

    A barrier releases all threads at once to maximise overlap. Each thread closes its
    database connection when it ends. Returns the functions' results in order; re-raises
    the first exception a thread raised.
    """
    barrier = threading.Barrier(len(functions))
    results: list[Any] = [None] * len(functions)
    errors: list[BaseException] = []

    def runner(index: int, function: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout)
            results[index] = function()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [
        threading.Thread(target=runner, args=(i, f), name=f"lease-test-{i}", daemon=True)
        for i, f in enumerate(functions)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {timeout}s: {stuck}"
    if errors:
        raise errors[0]
    return results


@contextmanager
def refusing_to_finish(job_id: int, *, as_connection_error: bool = False) -> Iterator[None]:
    """The database refuses every write that finishes ``job_id`` (succeeded, failed,
    cancelled), through a trigger, while letting the reaper put it back or end it dead:
    an outcome no fallback can record. Dropped on exit.

    ``as_connection_error``: with an error the worker takes for the moment, not the row
    (PostgreSQL's ``query_canceled``, MySQL's ``ER_QUERY_INTERRUPTED``), so the whole round
    fails and is retried: a value that breaks the connection. Not on SQLite."""
    if as_connection_error and connection.vendor == "sqlite":
        raise ValueError("SQLite triggers raise constraint errors only")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE OR REPLACE FUNCTION leasejobs_test_refuse() RETURNS trigger AS $$ "
                "BEGIN RAISE EXCEPTION 'refused by the test trigger'"
                + (" USING ERRCODE = '57014'" if as_connection_error else "")
                + "; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER leasejobs_test_refuse BEFORE UPDATE ON leasejobs_job "
                f"FOR EACH ROW WHEN (OLD.id = {int(job_id)} "
                "AND NEW.status IN ('succeeded', 'failed', 'cancelled')) "
                "EXECUTE FUNCTION leasejobs_test_refuse()"
            )
        elif connection.vendor == "mysql":
            # MySQL/MariaDB: no WHEN clause; SIGNAL raises error 1644 (ER_SIGNAL_EXCEPTION),
            # which the drivers report as an OperationalError although it is about the row.
            cursor.execute(
                "CREATE TRIGGER leasejobs_test_refuse BEFORE UPDATE ON leasejobs_job "
                f"FOR EACH ROW BEGIN IF OLD.id = {int(job_id)} "
                "AND NEW.status IN ('succeeded', 'failed', 'cancelled') THEN "
                + (
                    "SIGNAL SQLSTATE '70100' SET MYSQL_ERRNO = 1317, "
                    if as_connection_error
                    else "SIGNAL SQLSTATE '45000' SET "
                )
                + "MESSAGE_TEXT = 'refused by the test trigger'; "
                "END IF; END"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER leasejobs_test_refuse BEFORE UPDATE ON leasejobs_job "
                f"FOR EACH ROW WHEN OLD.id = {int(job_id)} "
                "AND NEW.status IN ('succeeded', 'failed', 'cancelled') "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("DROP TRIGGER IF EXISTS leasejobs_test_refuse ON leasejobs_job")
                cursor.execute("DROP FUNCTION IF EXISTS leasejobs_test_refuse()")
            else:
                cursor.execute("DROP TRIGGER IF EXISTS leasejobs_test_refuse")


@contextmanager
def locked_elsewhere(job_id: int) -> Iterator[None]:
    """Hold ``job_id``'s row locked from another connection (``SELECT ... FOR UPDATE``)."""
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=job_id)
                holding.set()
                release.wait(60)
        except BaseException as exc:
            failures.append(exc)
            holding.set()
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(30) and not failures, failures
    try:
        yield
    finally:
        release.set()
        holder.join(30)


def job_table_scans(plan: dict[str, Any], alias: str | None = None) -> list[tuple[str, str]]:
    """(node type, index name) of every scan of ``leasejobs_job`` in an ``EXPLAIN (FORMAT
    JSON)`` plan node and its children (PostgreSQL); with ``alias``, only scans under that
    alias. The UPDATE itself (``ModifyTable``) is no scan."""
    found = []
    if (
        plan.get("Relation Name") == "leasejobs_job"
        and plan.get("Node Type") != "ModifyTable"
        and (alias is None or plan.get("Alias") == alias)
    ):
        found.append((plan["Node Type"], plan.get("Index Name", "")))
    for child in plan.get("Plans", []):
        found += job_table_scans(child, alias)
    return found
