"""Enqueueing: inserting job rows, waking workers, and the database's clock."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connections

from ..hot_values import hot_value
from ..models import Dependency, Job, JobStatus
from . import fanin
from .dialect import dialect, django_zone, fetch_one, placeholders
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
    "metadata",
    "result_ttl",
    "workflow_id",
    "waiting_on",
    "on_parent_failure",
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


def _json(value: Any) -> str | None:
    """``value`` as JSON text (None stays SQL NULL). Most calls pass no arguments: the
    empty list and dict skip the encoder, whose set-up costs more than their text."""
    if value is None:
        return None
    if not value and type(value) in _EMPTY_JSON:
        return _EMPTY_JSON[type(value)]
    return json.dumps(value)


_EMPTY_JSON: dict[type, str] = {list: "[]", dict: "{}"}


def _producer_values(job: NewJob) -> list[Any]:
    """Values for ``_INSERT_COLUMNS`` up to ``status`` (the producer's columns)."""
    return [
        job.backend,
        job.queue,
        job.task_path,
        _json(job.args),
        _json(job.kwargs),
        job.priority,
        job.max_attempts,
        job.max_stalls,
        job.timeout,
        job.key,
        _json(job.retry_backoff),
        _json(job.task_options),
        _json(job.trace_context),
        job.flow_group,
        job.concurrency_limit,
        job.rate_limit,
        _json(job.metadata),
        job.result_ttl,
        job.workflow_id,
        job.waiting_on,
        job.on_parent_failure,
    ]


def _job_values(job: NewJob) -> list[Any]:
    """Values for ``_INSERT_COLUMNS`` but the last two (enqueued_at, run_after)."""
    return [
        *_producer_values(job),
        JobStatus.WAITING.value if job.waiting_on else JobStatus.PENDING.value,
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
    """Insert one pending job and ``pg_notify(notify, queue)`` in ONE statement
    (:func:`insert_statement`'s).

    Returns the new id and its ``enqueued_at``. The notification is delivered when the
    surrounding transaction commits (at once in autocommit), like any NOTIFY. Prepared
    once the alias allows it, and past Django's cursor wrapper when nothing hooks it
    (``dialect.fetch_one``).
    """
    statement = insert_statement(job, notify=notify, using=using)
    job_id, enqueued_at, _ = fetch_one(using, statement.sql, statement.params)
    return int(job_id), enqueued_at.replace(tzinfo=django_zone(using))


@hot_value
class InsertStatement:
    """The one statement :func:`insert_job` sends: its SQL and its values (hot path: a
    slotted value, built once per enqueue)."""

    sql: str
    """``INSERT INTO ... VALUES (...) RETURNING id, enqueued_at, pg_notify(%s, queue)``."""
    params: list[object]
    """The values of the producer's columns that are not None, then ``run_after`` when not
    None, then the channel of the ``pg_notify`` (always the last)."""


def insert_statement(job: NewJob, *, notify: str, using: str) -> InsertStatement:
    """The statement of :func:`insert_job` for ``job`` on ``using`` (PostgreSQL), which
    wakes workers on the channel ``notify``; bench/enqueue_split.py sends it raw.

    A column whose value is None is left out of the statement: it gets NULL (``run_after``
    the database's now) all the same, and most of a job's optional columns are None,
    each a parameter less for the driver to adapt and the server to bind.
    """
    values = _producer_values(job)
    values.append(job.run_after)
    unset = tuple([value is None for value in values])
    params: list[object] = [value for value in values if value is not None]
    params.append(notify)
    return InsertStatement(_insert_notify_sql(using, unset), params)


@functools.lru_cache(maxsize=256)
def _insert_notify_sql(using: str, unset: tuple[bool, ...]) -> str:
    """The SQL of :func:`insert_statement`, built once per database alias and set of None
    values (``unset``: the producer's columns', then ``run_after``'s); hot path."""
    d = dialect(using)
    producer = _INSERT_COLUMNS[:_VARIABLE_COLUMNS]
    given = [c for c, none in zip(producer, unset[:-1], strict=True) if not none]
    columns = ", ".join(d.q(c) for c in [*given, *_INSERT_COLUMNS[_VARIABLE_COLUMNS:]])
    constants = "'pending', 0, 0, 0, '', FALSE, '', ''"  # status ... last_error, as in _job_values
    now = d.now
    run_after = now if unset[-1] else "%s"
    # The wake-up rides in RETURNING: the same statement wrapped as a data-modifying
    # CTE (``WITH inserted AS (INSERT ...) SELECT pg_notify(...) FROM inserted``) costs
    # the server 20-40 us more of parse and plan per call when not prepared
    # (bench/enqueue_split.py; docs/benchmarks.md, issue 32).
    return (
        f"INSERT INTO {d.jobs} ({columns}) "  # noqa: S608 - identifiers quoted, values bound
        f"VALUES ({placeholders(len(given))}, {constants}, {now}, {run_after}) "
        f"RETURNING {d.q('id')}, {d.q('enqueued_at')}, pg_notify(%s, {d.q('queue')})"
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


def insert_edges(edges: Sequence[tuple[int, int, int]], *, using: str = "default") -> None:
    """Insert workflow edges, ``(parent, child, position)`` each, and the fan-in counters of
    the children with more than ``FANIN_WIDTH`` parents (``fanin.py``: each counts a
    contiguous run of positions; write those children's ``waiting_on`` with
    ``fanin.waits_for``). Edges: ``COPY`` on PostgreSQL with psycopg 3, else multi-row
    INSERTs; counters: one multi-row INSERT (``fanin.insert_counters``). Call inside the
    transaction that inserted the steps."""
    if not edges:
        return
    rows = _with_counters(edges, using)
    d = dialect(using)
    table = d.q(Dependency._meta.db_table)
    columns = ", ".join(d.q(c) for c in ("parent_id", "child_id", "position", "fanin_id"))
    if can_copy(using):
        sql = f"COPY {table} ({columns}) FROM STDIN"
        with connections[using].cursor() as cursor, cursor.cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)
        return
    Dependency.objects.using(using).bulk_create(
        [Dependency(parent_id=p, child_id=c, position=n, fanin_id=f) for p, c, n, f in rows],
        batch_size=2000,
    )


def _with_counters(
    edges: Sequence[tuple[int, int, int]], using: str
) -> list[tuple[int, int, int, int | None]]:
    """``edges`` with the id of their fan-in counter (None: none), the counters inserted."""
    by_child: dict[int, list[tuple[int, int, int]]] = {}
    for edge in edges:
        by_child.setdefault(edge[1], []).append(edge)
    plans: list[tuple[list[tuple[int, int, int]], list[int]]] = []
    for child_edges in by_child.values():
        child_edges.sort(key=lambda edge: edge[2])
        plans.append((child_edges, fanin.runs(len(child_edges))))
    ids = iter(
        fanin.insert_counters(
            [(child_edges[0][1], size) for child_edges, sizes in plans for size in sizes],
            using=using,
        )
    )
    rows: list[tuple[int, int, int, int | None]] = []
    for child_edges, sizes in plans:
        if not sizes:
            rows.extend((*edge, None) for edge in child_edges)
            continue
        start = 0
        for size in sizes:
            counter = next(ids)
            rows.extend((*edge, counter) for edge in child_edges[start : start + size])
            start += size
    return rows


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
    now: datetime = value.astimezone(UTC)
    return now
