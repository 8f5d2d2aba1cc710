"""Enqueueing: inserting job rows, waking workers, and the database's clock."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connections

from ..models import Job, JobStatus
from .dialect import dialect, hot_cursor, placeholders
from .values import NewJob

_INSERT_COLUMNS = (
    "backend",
    "queue",
    "task_path",
    "args",
    "kwargs",
    "priority",
    "max_attempts",
    "max_stalls",
    "timeout",
    "key",
    "retry_backoff",
    "task_options",
    "trace_context",
    "flow_group",
    "concurrency_limit",
    "rate_limit",
    "status",
    "attempt",
    "stall_count",
    "snoozes",
    "last_worker",
    "cancel_requested",
    "progress_message",
    "last_error",
    "enqueued_at",
    "run_after",
)
_COPY_COLUMNS = ("id", *_INSERT_COLUMNS)
_VARIABLE_COLUMNS = _INSERT_COLUMNS.index("status")
"""The producer's columns come first; from ``status`` on, a new job's values are fixed."""


def _job_values(job: NewJob) -> list[Any]:
    """Values for ``_INSERT_COLUMNS`` but the last two (enqueued_at, run_after)."""
    return [
        job.backend,
        job.queue,
        job.task_path,
        json.dumps(job.args),
        json.dumps(job.kwargs),
        job.priority,
        job.max_attempts,
        job.max_stalls,
        job.timeout,
        job.key,
        None if job.retry_backoff is None else json.dumps(job.retry_backoff),
        None if job.task_options is None else json.dumps(job.task_options),
        None if job.trace_context is None else json.dumps(job.trace_context),
        job.flow_group,
        job.concurrency_limit,
        job.rate_limit,
        JobStatus.PENDING.value,
        0,
        0,
        0,
        "",
        False,
        "",
        "",
        None,
        None,
    ]


def can_copy(using: str) -> bool:
    """True when :func:`copy_jobs` works here: PostgreSQL through psycopg 3."""
    if dialect(using).vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def can_insert_notify(using: str) -> bool:
    """True when :func:`insert_job` works here (PostgreSQL)."""
    return dialect(using).vendor == "postgresql"


def insert_job(job: NewJob, *, notify: str, using: str = "default") -> tuple[int, datetime]:
    """Insert one pending job and ``pg_notify(notify, queue)`` in ONE statement.

    Returns the new id and its ``enqueued_at``. The notification is delivered when the
    surrounding transaction commits (at once in autocommit), like any NOTIFY. Prepared
    once the alias allows it (``dialect.hot_cursor``).
    """
    params = [*_job_values(job)[:_VARIABLE_COLUMNS], job.run_after, notify, job.queue]
    with hot_cursor(using) as cursor:
        cursor.execute(_insert_notify_sql(using), params)
        job_id, enqueued_at, _ = cursor.fetchone()
    return int(job_id), enqueued_at


@functools.cache
def _insert_notify_sql(using: str) -> str:
    """The statement of :func:`insert_job`, built once per database alias (hot path)."""
    d = dialect(using)
    columns = ", ".join(d.q(c) for c in _INSERT_COLUMNS)
    constants = "'pending', 0, 0, 0, '', FALSE, '', ''"  # status ... last_error, as in _job_values
    now = d.now
    return (
        f"WITH inserted AS (INSERT INTO {d.jobs} ({columns}) "  # noqa: S608 - identifiers quoted, values bound
        f"VALUES ({placeholders(_VARIABLE_COLUMNS)}, {constants}, {now}, COALESCE(%s, {now})) "
        f"RETURNING {d.q('id')}, {d.q('enqueued_at')}) "
        "SELECT id, enqueued_at, pg_notify(%s, %s) FROM inserted"
    )


def copy_jobs(jobs: Sequence[NewJob], *, using: str = "default") -> tuple[list[int], datetime]:
    """Insert pending jobs with PostgreSQL's ``COPY``; return their ids and the insert time.

    Two round trips whatever the number of jobs: ids (and the database's now) from
    the table's sequence, then one ``COPY ... FROM STDIN`` stream. Call it inside a
    transaction to make the batch all or nothing.
    """
    if not jobs:
        return [], database_now(using)
    d = dialect(using)
    table = d.jobs
    columns = ", ".join(d.q(c) for c in _COPY_COLUMNS)
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')), statement_timestamp() "
            "FROM generate_series(1, %s)",
            [Job._meta.db_table, len(jobs)],
        )
        fetched = cursor.fetchall()
        ids = [int(job_id) for job_id, _ in fetched]
        now: datetime = fetched[0][1]
        sql = f"COPY {table} ({columns}) FROM STDIN"
        started = time.monotonic()
        with cursor.cursor.copy(sql) as copy:
            for job_id, job in zip(ids, jobs, strict=True):
                copy.write_row((job_id, *_job_values(job)[:-2], now, job.run_after or now))
    connection = connections[using]
    if connection.queries_logged:  # Django logs execute() only: show the COPY too
        elapsed = time.monotonic() - started
        connection.queries_log.append(
            {"sql": f"{sql} -- {len(jobs)} rows", "time": f"{elapsed:.3f}"}
        )
    return ids, now


NOTIFY_CHANNEL = "leasejobs"
"""The channel of every wake-up: enqueues, reaped or given-back jobs, operator retries
(the payload is the job's queue); workers ``LISTEN`` on it (``worker/listener.py``)."""


def notify(channel: str, queues: Iterable[str], *, using: str = "default") -> None:
    """``pg_notify(channel, queue)`` once per distinct queue (PostgreSQL; elsewhere nothing:
    workers there find new jobs by polling). Inside a transaction PostgreSQL delivers the
    notifications on commit only."""
    if dialect(using).vendor != "postgresql":
        return
    with connections[using].cursor() as cursor:
        for queue in sorted(set(queues)):
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, queue])


def database_now(using: str = "default") -> datetime:
    """The database's clock, as an aware UTC datetime (the clock every lease uses)."""
    d = dialect(using)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {d.now.replace('%%', '%')}")
        (value,) = cursor.fetchone()
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
