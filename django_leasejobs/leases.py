"""The lease protocol: one function per state transition of a job.

Every transition is a single conditional UPDATE whose WHERE re-checks what the
transition assumes (status, and for the lease holder's writes ``locked_by`` AND
``attempt``), and whose row count is checked. A write by a caller that no longer
holds the lease matches no row and raises :class:`LeaseLost`; it never changes
anything. All times are the database's clock.

Vendor SQL lives here and only here:

* PostgreSQL: the claim is one statement, a CTE with ``FOR UPDATE SKIP LOCKED``
  feeding ``UPDATE ... RETURNING``; renewals and reaps use ``UPDATE ... RETURNING``.
* SQLite: the same statements without row locks (SQLite serialises writers, and a
  single UPDATE statement takes the write lock before it reads).
* Other databases (MySQL 8, MariaDB 10.6+): the ORM, with
  ``select_for_update(skip_locked=True)`` inside a transaction.

This module knows nothing of processes, threads or signals.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import (
    Case,
    DateTimeField,
    ExpressionWrapper,
    F,
    PositiveIntegerField,
    Q,
    Value,
    When,
)
from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime

from .exceptions import LeaseLost, RowLocked
from .models import AttemptOutcome, Job, JobAttempt, JobStatus
from .retry import backoff_problems

RETURNING_VENDORS = frozenset({"postgresql", "sqlite"})
MAX_ERROR_LENGTH = 2000
MAX_ERROR_CLASS_LENGTH = 512  # JobAttempt.error_class
MAX_TRACEBACK_LENGTH = 64_000
MAX_PROGRESS_MESSAGE_LENGTH = 255  # Job.progress_message


def storable_text(value: object, limit: int | None = None) -> str:
    """``value`` as text every supported database stores unchanged.

    For what a job *reports* (error messages, tracebacks, progress messages), which
    must never stop the worker from recording the attempt: a NUL character (which
    PostgreSQL text cannot hold) becomes the four characters ``\\x00``, a lone
    surrogate (which UTF-8 cannot encode) its ``\\udXXX`` escape, and text longer
    than ``limit`` is cut with a marker saying how much was dropped. Values that are
    not ``str`` are converted with ``str()``; if that raises, a description of the
    failure is stored instead. (Arguments, results and checkpoints are refused at
    the door instead: see ``serialization.py``.)
    """
    if isinstance(value, str):
        text = "".join((value,))  # a plain str, whatever a subclass overrides
    else:
        try:
            text = "".join((str(value),))
        except Exception as exc:  # a hostile __str__ must not escape
            text = f"<unprintable {type(value).__name__}: str() raised {type(exc).__name__}>"
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        kept = limit
        for _ in range(2):  # the marker's length depends on the number it gives
            marker = f"... [truncated {len(text) - kept} characters]"
            kept = max(limit - len(marker), 0)
        text = (text[:kept] + marker)[:limit]
    return text


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """What a worker needs to run one claimed attempt."""

    id: int
    attempt: int
    task_path: str
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None
    max_attempts: int
    checkpoint: Any
    retry_backoff: dict[str, float] | None = None
    """The job's own backoff policy (from ``.using(retry_backoff=...)``), if any."""
    problem: str | None = None
    """Why the row cannot run (its stored columns have the wrong JSON types), or None.
    Such an attempt fails at once, as its own attempt, and nothing is called."""
    key: str | None = None
    task_options: dict[str, Any] | None = None
    """``Job.task_options``: with the columns above, the Task exactly as enqueued."""
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    """When the job's first attempt started."""
    last_attempted_at: datetime | None = None
    """When this attempt started (the claim)."""

    @property
    def lease(self) -> tuple[int, int]:
        return (self.id, self.attempt)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Sent to a slot's process for every job: a plain tuple pickles several times
        # faster than a slotted dataclass's default state.
        return (
            ClaimedJob,
            (
                self.id,
                self.attempt,
                self.task_path,
                self.queue,
                self.priority,
                self.args,
                self.kwargs,
                self.timeout,
                self.max_attempts,
                self.checkpoint,
                self.retry_backoff,
                self.problem,
                self.key,
                self.task_options,
                self.enqueued_at,
                self.started_at,
                self.last_attempted_at,
            ),
        )


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float | None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class RenewResult:
    held: frozenset[tuple[int, int]]
    """Leases this call renewed: (job id, attempt)."""
    lost: frozenset[tuple[int, int]]
    """Leases asked for and not renewed: the worker must stop those attempts now."""
    cancel_requested: frozenset[tuple[int, int]]
    """Held leases whose job an operator asked to cancel."""
    skipped: frozenset[tuple[int, int]] = frozenset()
    """Leases not renewed this time because another transaction holds their row locked
    (PostgreSQL): still this worker's as far as the database showed; try again later."""


@dataclass(frozen=True, slots=True)
class ReapedJob:
    id: int
    attempt: int
    worker: str
    status: str
    queue: str
    task_path: str
    stall_count: int
    backend: str


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why an attempt did not succeed, as stored on its JobAttempt row.

    Always storable: each part is passed through :func:`storable_text` with its
    column's limit when the value is made, so no error a job raises can make the
    write of its own attempt fail.
    """

    exception_class_path: str
    message: str = ""
    traceback: str = ""

    def __post_init__(self) -> None:
        for name, limit in (
            ("exception_class_path", MAX_ERROR_CLASS_LENGTH),
            ("message", MAX_ERROR_LENGTH),
            ("traceback", MAX_TRACEBACK_LENGTH),
        ):
            value = getattr(self, name)
            clean = storable_text(value, limit)
            if clean is not value:
                object.__setattr__(self, name, clean)

    @property
    def last_error(self) -> str:
        """The job row's ``last_error`` for this error."""
        if self.message:
            return f"{self.exception_class_path}: {self.message}"
        return self.exception_class_path


class CancelResult(StrEnum):
    CANCELLED = "cancelled"
    """The job was pending and is now cancelled."""
    REQUESTED = "requested"
    """The job is running; its worker will stop it at its next heartbeat."""
    NOT_CANCELLABLE = "not_cancellable"
    """The job had already finished (or a cancel was already requested)."""
    NOT_FOUND = "not_found"


# --------------------------------------------------------------------------- helpers


def _vendor(using: str) -> str:
    return connections[using].vendor


def _q(using: str, name: str) -> str:
    return connections[using].ops.quote_name(name)


def _job_table(using: str) -> str:
    return _q(using, Job._meta.db_table)


def _attempt_table(using: str) -> str:
    return _q(using, JobAttempt._meta.db_table)


def _now_sql(vendor: str) -> str:
    if vendor == "postgresql":
        return "statement_timestamp()"  # what Django's Now() uses: one clock everywhere
    # Six fractional digits, as Django stores datetimes on SQLite: text comparisons
    # between the two then agree within the same millisecond.
    return "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')"


def _now_offset_sql(vendor: str) -> str:
    """SQL for now() + N seconds; takes one parameter made by :func:`_offset_param`."""
    if vendor == "postgresql":
        return "(statement_timestamp() + make_interval(secs => %s))"
    return "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')"


def _offset_param(vendor: str, seconds: float) -> Any:
    if vendor == "postgresql":
        return float(seconds)
    return f"{float(seconds):+.6f} seconds"


def _now_plus(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _fenced(job_id: int, attempt: int, worker_id: str, using: str):  # type: ignore[no-untyped-def]
    """The lease holder's fence: this job, this attempt, this worker, still running."""
    return Job.objects.using(using).filter(
        pk=job_id, attempt=attempt, locked_by=worker_id, status=JobStatus.RUNNING
    )


_CLAIM_COLUMNS = (
    "id",
    "attempt",
    "task_path",
    "queue",
    "priority",
    "args",
    "kwargs",
    "timeout",
    "max_attempts",
    "checkpoint",
    "retry_backoff",
    "key",
    "task_options",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
)


_PRIORITY = _CLAIM_COLUMNS.index("priority")


def _claimed(row: Sequence[Any]) -> ClaimedJob:
    values = dict(zip(_CLAIM_COLUMNS, row, strict=True))
    args, kwargs = _json(values["args"]), _json(values["kwargs"])
    backoff = _json(values["retry_backoff"])
    options = _json(values["task_options"])
    problems = []
    # Rows written by hand or by another program: a wrong JSON type must fail this job,
    # never reach the task call (or the worker's own bookkeeping).
    if args is None:
        args = []
    elif not isinstance(args, list):
        problems.append(f"args is a JSON {_json_type(args)}, not an array")
        args = []
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        problems.append(f"kwargs is a JSON {_json_type(kwargs)}, not an object")
        kwargs = {}
    if backoff is not None and backoff_problems(backoff):
        problems.append("retry_backoff " + "; ".join(backoff_problems(backoff)))
        backoff = None
    return ClaimedJob(
        id=int(values["id"]),
        attempt=int(values["attempt"]),
        task_path=values["task_path"],
        queue=values["queue"],
        priority=int(values["priority"]),
        args=args,
        kwargs=kwargs,
        timeout=values["timeout"],
        max_attempts=int(values["max_attempts"]),
        checkpoint=_json(values["checkpoint"]),
        retry_backoff=backoff,
        problem="the job row is malformed: " + "; ".join(problems) if problems else None,
        key=values["key"],
        task_options=options if isinstance(options, dict) else None,
        enqueued_at=_datetime(values["enqueued_at"]),
        started_at=_datetime(values["started_at"]),
        last_attempted_at=_datetime(values["last_attempted_at"]),
    )


def _datetime(value: Any) -> datetime | None:
    """A datetime column read through a raw cursor (SQLite gives text or a naive
    datetime, in UTC; PostgreSQL an aware datetime)."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is not None and parsed.tzinfo is None and settings.USE_TZ:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "number"


@dataclass(frozen=True, slots=True)
class NewJob:
    """The producer's columns of a job row about to be inserted."""

    backend: str
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    max_attempts: int
    max_stalls: int
    timeout: float | None
    key: str | None
    retry_backoff: dict[str, float] | None
    run_after: datetime | None
    """None: runnable at once (the database's now)."""
    task_options: dict[str, Any] | None = None
    """The options the enqueued Task had set that no other column keeps exactly (its own
    ``run_after``, ``max_attempts``, ``max_stalls``), so that ``get_result`` rebuilds the
    same Task; None when it set none of them."""


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
    "status",
    "attempt",
    "stall_count",
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
        JobStatus.PENDING.value,
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
    if _vendor(using) != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def can_insert_notify(using: str) -> bool:
    """True when :func:`insert_job` works here (PostgreSQL)."""
    return _vendor(using) == "postgresql"


def insert_job(job: NewJob, *, notify: str, using: str = "default") -> tuple[int, datetime]:
    """Insert one pending job and ``pg_notify(notify, queue)`` in ONE statement.

    Returns the new id and its ``enqueued_at``. The notification is delivered when the
    surrounding transaction commits (at once in autocommit), like any NOTIFY.
    """
    params = [*_job_values(job)[:_VARIABLE_COLUMNS], job.run_after, notify, job.queue]
    with connections[using].cursor() as cursor:
        cursor.execute(_insert_notify_sql(using), params)
        job_id, enqueued_at, _ = cursor.fetchone()
    return int(job_id), enqueued_at


@functools.cache
def _insert_notify_sql(using: str) -> str:
    """The statement of :func:`insert_job`, built once per database alias (hot path)."""
    columns = ", ".join(_q(using, c) for c in _INSERT_COLUMNS)
    constants = "'pending', 0, 0, '', FALSE, '', ''"  # status ... last_error, as in _job_values
    now = _now_sql("postgresql")
    return (
        f"WITH inserted AS (INSERT INTO {_job_table(using)} ({columns}) "  # noqa: S608 - identifiers quoted, values bound
        f"VALUES ({_placeholders(_VARIABLE_COLUMNS)}, {constants}, {now}, COALESCE(%s, {now})) "
        f"RETURNING {_q(using, 'id')}, {_q(using, 'enqueued_at')}) "
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
    table = _job_table(using)
    columns = ", ".join(_q(using, c) for c in _COPY_COLUMNS)
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


def notify(channel: str, queues: Iterable[str], *, using: str = "default") -> None:
    """``pg_notify(channel, queue)`` once per distinct queue (PostgreSQL; elsewhere nothing:
    workers there find new jobs by polling). Inside a transaction PostgreSQL delivers the
    notifications on commit only."""
    if _vendor(using) != "postgresql":
        return
    with connections[using].cursor() as cursor:
        for queue in sorted(set(queues)):
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, queue])


def database_now(using: str = "default") -> datetime:
    """The database's clock, as an aware UTC datetime (the clock every lease uses)."""
    vendor = _vendor(using)
    sql = {
        "postgresql": "SELECT statement_timestamp()",
        "mysql": "SELECT UTC_TIMESTAMP(6)",
    }.get(vendor, "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
    with connections[using].cursor() as cursor:
        cursor.execute(sql)
        (value,) = cursor.fetchone()
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


# --------------------------------------------------------------------------- claim


def claim(
    worker_id: str,
    *,
    limit: int,
    lease_duration: float,
    backend: str = "default",
    queues: Sequence[str] | None = None,
    using: str = "default",
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs for ``worker_id``: pending, ``run_after`` passed.

    Order (of the claim and of the returned list): priority (high first), then
    ``run_after``, then id. Each claimed row becomes ``running`` with ``attempt + 1``
    and a lease of ``lease_duration`` seconds, in the same statement: a running row
    without a lease cannot exist.
    """
    if limit <= 0:
        return []
    if queues is not None and not queues:
        return []
    vendor = _vendor(using)
    if vendor not in RETURNING_VENDORS:
        return _claim_orm(worker_id, limit, lease_duration, backend, queues, using)

    table = _job_table(using)
    now = _now_sql(vendor)
    filters = ["status = 'pending'", "backend = %s", f"run_after <= {now}"]
    params: list[Any] = [backend]
    if queues is not None:
        filters.append(f"queue IN ({_placeholders(len(queues))})")
        params.extend(queues)
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "postgresql" else ""
    returning = ", ".join(_q(using, c) for c in _CLAIM_COLUMNS)
    sql = (
        f"WITH picked AS (SELECT id FROM {table} WHERE {' AND '.join(filters)} "  # noqa: S608 - identifiers quoted, values bound
        f"ORDER BY priority DESC, run_after, id LIMIT %s{lock}) "
        f"UPDATE {table} SET status = 'running', attempt = attempt + 1, locked_by = %s, "
        f"locked_until = {_now_offset_sql(vendor)}, heartbeat_at = {now}, last_worker = %s, "
        f"started_at = COALESCE(started_at, {now}), last_attempted_at = {now}, "
        "cancel_requested = %s, progress = NULL, progress_message = '' "
        f"WHERE id IN (SELECT id FROM picked) AND status = 'pending' "
        f"RETURNING {returning}, {_q(using, 'run_after')}"
    )
    params += [limit, worker_id, _offset_param(vendor, lease_duration), worker_id, False]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # RETURNING gives no order: put the batch back in claim order (run_after is last).
    rows.sort(key=lambda row: (-row[_PRIORITY], row[-1], row[0]))
    return [_claimed(row[:-1]) for row in rows]


def _claim_orm(
    worker_id: str,
    limit: int,
    lease_duration: float,
    backend: str,
    queues: Sequence[str] | None,
    using: str,
) -> list[ClaimedJob]:
    with transaction.atomic(using=using):
        ready = Job.objects.using(using).ready().filter(backend=backend)
        if queues is not None:
            ready = ready.filter(queue__in=list(queues))
        ids = list(
            ready.select_for_update(skip_locked=True)
            .order_by("-priority", "run_after", "id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return []
        Job.objects.using(using).filter(pk__in=ids, status=JobStatus.PENDING).update(
            status=JobStatus.RUNNING,
            attempt=F("attempt") + 1,
            locked_by=worker_id,
            locked_until=_now_plus(lease_duration),
            heartbeat_at=Now(),
            last_worker=worker_id,
            started_at=Case(When(started_at__isnull=True, then=Now()), default=F("started_at")),
            last_attempted_at=Now(),
            cancel_requested=False,
            progress=None,
            progress_message="",
        )
        rows = (
            Job.objects.using(using)
            .filter(pk__in=ids, locked_by=worker_id, status=JobStatus.RUNNING)
            .order_by("-priority", "run_after", "id")
            .values_list(*_CLAIM_COLUMNS)
        )
        return [_claimed(row) for row in rows]


# --------------------------------------------------------------------------- renew


def renew(
    worker_id: str,
    leases: Mapping[tuple[int, int], Progress | None] | Iterable[tuple[int, int]],
    *,
    lease_duration: float,
    using: str = "default",
) -> RenewResult:
    """Extend every lease of ``worker_id`` named in ``leases`` in one statement.

    ``leases`` maps (job id, attempt) to the attempt's latest progress (or None),
    or is a plain iterable of (job id, attempt). A lease missing from the result's
    ``held`` set is lost (the job was reaped, re-claimed or finished meanwhile),
    except those in ``skipped``: rows another transaction holds locked right now
    (an admin edit, a migration, a stray ``SELECT ... FOR UPDATE``). The renewal
    never waits for such a row; it renews the others, and the caller tries the
    skipped ones again at its next heartbeat.
    """
    wanted: dict[tuple[int, int], Progress | None] = (
        dict(leases) if isinstance(leases, Mapping) else dict.fromkeys(leases)
    )
    if not wanted:
        return RenewResult(frozenset(), frozenset(), frozenset())
    vendor = _vendor(using)
    if vendor not in RETURNING_VENDORS:
        return _renew_orm(worker_id, wanted, lease_duration, using)

    params: list[Any] = [_offset_param(vendor, lease_duration)]
    for (job_id, attempt), progress in wanted.items():
        message = None
        if progress is not None and progress.message is not None:
            message = storable_text(progress.message, MAX_PROGRESS_MESSAGE_LENGTH)
        params += [job_id, attempt, progress.fraction if progress else None, message]
    params.append(worker_id)
    now = _now_sql(vendor)
    update = (
        f"UPDATE {_job_table(using)} AS j SET locked_until = {_now_offset_sql(vendor)}, "  # noqa: S608 - identifiers quoted, values bound
        f"heartbeat_at = {now}, "
        "progress = COALESCE(v.column3, j.progress), "
        "progress_message = COALESCE(v.column4, j.progress_message) "
        f"FROM (VALUES {_values_sql(vendor, len(wanted), 'id', 'int', 'float', 'text')}) AS v "
        "WHERE j.id = v.column1 AND j.attempt = v.column2 "
        "AND j.status = 'running' AND j.locked_by = %s {mine}"
    )
    rows, skipped = _fenced_batch(using, worker_id, wanted, update, params, ("cancel_requested",))
    return _renew_result(wanted, rows, skipped)


def _fenced_batch(
    using: str,
    worker_id: str,
    asked: Iterable[tuple[int, int]],
    update: str,
    params: Sequence[Any],
    returning: Sequence[str] = (),
) -> tuple[list[tuple[Any, ...]], frozenset[tuple[int, int]]]:
    """Run a batched, fenced ``UPDATE ... AS j``; return its rows and the skipped leases.

    ``asked`` holds the leases the statement is for; ``update`` ends with its WHERE
    clause, which holds the fence and a ``{mine}`` placeholder. The rows returned are
    ``(id, attempt, *returning)`` per row written.

    On PostgreSQL the rows are first locked in id order with ``SKIP LOCKED`` (the
    order renewals, batched writes and the reaper all use, so they never deadlock),
    and only the locked ones are updated: a row another transaction holds is never
    waited for. Such a row, if it still names this worker as holder, comes back as
    *skipped* (id, attempt as stored): neither written nor lost, to be tried again.
    SQLite serialises writers, so nothing is ever skipped there.
    """
    vendor = _vendor(using)
    columns = ", ".join(("id", "attempt", *returning))
    if vendor != "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute(f"{update.format(mine='')}RETURNING {columns}", params)
            return [tuple(row) for row in cursor.fetchall()], frozenset()
    wanted = set(asked)
    ids = sorted({job_id for job_id, _ in wanted})
    table = _job_table(using)
    held_by_me = "AND locked_by = %s AND status = 'running'"
    sql = (
        f"WITH mine AS (SELECT id FROM {table} WHERE id IN ({_placeholders(len(ids))}) "  # noqa: S608 - identifiers quoted, values bound
        f"{held_by_me} ORDER BY id FOR UPDATE SKIP LOCKED) "
        f"{update.format(mine='AND j.id IN (SELECT id FROM mine) ')}"
        f"RETURNING {', '.join(f'j.{c}' for c in ('id', 'attempt', *returning))}"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*ids, worker_id, *params])
        rows = [tuple(row) for row in cursor.fetchall()]
        missing = sorted(set(ids) - {int(row[0]) for row in rows})
        if not missing:
            return rows, frozenset()
        # Rare: a lease lost, or a row another transaction holds locked. Those still
        # naming this worker as holder were skipped, not lost.
        cursor.execute(
            f"SELECT id, attempt FROM {table} WHERE id IN ({_placeholders(len(missing))}) "  # noqa: S608 - identifiers quoted, values bound
            f"{held_by_me}",
            [*missing, worker_id],
        )
        found = {(int(job_id), int(attempt)) for job_id, attempt in cursor.fetchall()}
    return rows, frozenset(found & wanted)


def _renew_result(
    wanted: Mapping[tuple[int, int], Any],
    rows: Iterable[Sequence[Any]],
    skipped: frozenset[tuple[int, int]] = frozenset(),
) -> RenewResult:
    held = set()
    cancel = set()
    for job_id, attempt, cancel_requested in rows:
        lease = (int(job_id), int(attempt))
        held.add(lease)
        if cancel_requested:
            cancel.add(lease)
    skipped = skipped & set(wanted)
    return RenewResult(
        held=frozenset(held),
        lost=frozenset(set(wanted) - held - skipped),
        cancel_requested=frozenset(cancel),
        skipped=skipped,
    )


def _renew_orm(
    worker_id: str,
    wanted: Mapping[tuple[int, int], Progress | None],
    lease_duration: float,
    using: str,
) -> RenewResult:
    match = Q()
    for job_id, attempt in wanted:
        match |= Q(pk=job_id, attempt=attempt)
    mine = Job.objects.using(using).filter(match, status=JobStatus.RUNNING, locked_by=worker_id)
    with transaction.atomic(using=using):
        mine.update(locked_until=_now_plus(lease_duration), heartbeat_at=Now())
        for (job_id, attempt), progress in wanted.items():
            if progress is not None:
                changes: dict[str, Any] = {"progress": progress.fraction}
                if progress.message is not None:
                    changes["progress_message"] = storable_text(
                        progress.message, MAX_PROGRESS_MESSAGE_LENGTH
                    )
                _fenced(job_id, attempt, worker_id, using).update(**changes)
        rows = list(mine.values_list("id", "attempt", "cancel_requested"))
    return _renew_result(wanted, rows)


# --------------------------------------------------------------------------- lease holder's writes


def complete(
    job_id: int, attempt: int, worker_id: str, *, result: Any = None, using: str = "default"
) -> None:
    """Record a successful attempt: ``succeeded``, the result, the lease cleared."""
    changed = _fenced(job_id, attempt, worker_id, using).update(
        status=JobStatus.SUCCEEDED,
        result=result,
        locked_by=None,
        locked_until=None,
        finished_at=Now(),
        cancel_requested=False,
        progress=Case(When(progress__isnull=False, then=Value(1.0)), default=Value(None)),
    )
    if changed != 1:
        raise LeaseLost(job_id, attempt, worker_id, "complete")


@dataclass(frozen=True, slots=True)
class Completion:
    """One successful attempt, for :func:`complete_many`."""

    job_id: int
    attempt: int
    result: Any = None

    @property
    def lease(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)


@dataclass(frozen=True, slots=True)
class Failure:
    """One attempt that did not succeed, for :func:`fail_many`.

    ``retry_delay=None`` fails the job for good; otherwise it is retried after that
    many seconds unless its attempts are used up.
    """

    job_id: int
    attempt: int
    error: ErrorInfo
    retry_delay: float | None
    outcome: str = AttemptOutcome.ERROR

    @property
    def lease(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)


def _sql_types(vendor: str, *kinds: str) -> tuple[str, ...]:
    """Cast targets for a VALUES list (PostgreSQL needs them; SQLite takes affinities)."""
    pg = {"id": "bigint", "int": "integer", "float": "double precision", "text": "text"}
    pg["json"] = "jsonb"
    lite = {"id": "INTEGER", "int": "INTEGER", "float": "REAL", "text": "TEXT", "json": "TEXT"}
    names = pg if vendor == "postgresql" else lite
    return tuple(names[k] for k in kinds)


def _values_sql(vendor: str, rows: int, *kinds: str) -> str:
    row = "(" + ", ".join(f"CAST(%s AS {t})" for t in _sql_types(vendor, *kinds)) + ")"
    return ", ".join([row] * rows)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a batched write (:func:`complete_many`, :func:`fail_many`) did."""

    written: dict[tuple[int, int], str]
    """Each written lease and the job's new status."""
    skipped: frozenset[tuple[int, int]] = frozenset()
    """Leases not written because another transaction holds their row locked
    (PostgreSQL): still held; write them again later. Every other lease asked for
    and missing from ``written`` was lost."""
    finished_at: dict[tuple[int, int], datetime | None] = field(default_factory=dict)
    """The job's ``finished_at`` as written (None: not finished, a retry is pending)."""


def complete_many(
    worker_id: str, completions: Sequence[Completion], *, using: str = "default"
) -> WriteResult:
    """Record many successful attempts in one fenced UPDATE.

    Each row is fenced like :func:`complete` (this job, this attempt, this worker,
    still running). A lease missing from the result was lost (nothing was written
    for it) or skipped (its row was locked by another transaction).
    """
    if not completions:
        return WriteResult({})
    vendor = _vendor(using)
    if vendor not in RETURNING_VENDORS:
        done = {}
        with transaction.atomic(using=using):
            for c in completions:
                try:
                    complete(c.job_id, c.attempt, worker_id, result=c.result, using=using)
                except LeaseLost:
                    continue
                done[c.lease] = str(JobStatus.SUCCEEDED)
        return WriteResult(done)
    params: list[Any] = []
    for c in completions:
        params += [c.job_id, c.attempt, None if c.result is None else json.dumps(c.result)]
    params.append(worker_id)
    now = _now_sql(vendor)
    update = (
        f"UPDATE {_job_table(using)} AS j SET status = 'succeeded', "  # noqa: S608 - identifiers quoted, values bound
        "result = v.column3, locked_by = NULL, locked_until = NULL, "
        f"finished_at = {now}, cancel_requested = FALSE, "
        "progress = CASE WHEN j.progress IS NULL THEN NULL ELSE 1.0 END "
        f"FROM (VALUES {_values_sql(vendor, len(completions), 'id', 'int', 'json')}) AS v "
        "WHERE j.id = v.column1 AND j.attempt = v.column2 "
        "AND j.locked_by = %s AND j.status = 'running' {mine}"
    )
    rows, skipped = _fenced_batch(
        using, worker_id, (c.lease for c in completions), update, params, ("finished_at",)
    )
    succeeded = str(JobStatus.SUCCEEDED)
    return WriteResult(
        {(int(job), int(attempt)): succeeded for job, attempt, _ in rows},
        skipped,
        {(int(job), int(attempt)): _datetime(finished) for job, attempt, finished in rows},
    )


def fail_many(
    worker_id: str, failures: Sequence[Failure], *, using: str = "default"
) -> WriteResult:
    """Record many failed attempts at once; the result maps each written lease to the
    job's new status.

    One fenced UPDATE for the job rows (each decides retry, ``failed`` or
    ``cancelled`` exactly as :func:`fail` does) and one INSERT for their attempt
    rows, in one transaction. A lease missing from the result was lost or skipped
    (see :class:`WriteResult`).
    """
    if not failures:
        return WriteResult({})
    vendor = _vendor(using)
    if vendor not in RETURNING_VENDORS:
        statuses = {}
        with transaction.atomic(using=using):
            for f in failures:
                try:
                    statuses[f.lease] = fail(
                        f.job_id,
                        f.attempt,
                        worker_id,
                        error=f.error,
                        retry_delay=f.retry_delay,
                        outcome=f.outcome,
                        using=using,
                    )
                except LeaseLost:
                    continue
        return WriteResult(statuses)
    by_lease = {f.lease: f for f in failures}
    params: list[Any] = []
    for f in failures:
        delay = None if f.retry_delay is None else _offset_param(vendor, f.retry_delay)
        params += [f.job_id, f.attempt, delay, f.error.last_error]
    params.append(worker_id)
    now = _now_sql(vendor)
    if vendor == "postgresql":
        run_later = "(statement_timestamp() + make_interval(secs => v.column3))"
    else:
        run_later = "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', v.column3) || '000')"
    retrying = "(NOT j.cancel_requested AND v.column3 IS NOT NULL AND j.attempt < j.max_attempts)"
    delay_kind = "float" if vendor == "postgresql" else "text"
    update = (
        f"UPDATE {_job_table(using)} AS j SET "  # noqa: S608 - identifiers quoted, values bound
        "status = CASE WHEN j.cancel_requested THEN 'cancelled' "
        f"WHEN {retrying} THEN 'pending' ELSE 'failed' END, "
        f"run_after = CASE WHEN {retrying} THEN {run_later} ELSE j.run_after END, "
        f"finished_at = CASE WHEN {retrying} THEN NULL ELSE {now} END, "
        "locked_by = NULL, locked_until = NULL, cancel_requested = FALSE, last_error = v.column4 "
        f"FROM (VALUES {_values_sql(vendor, len(failures), 'id', 'int', delay_kind, 'text')}) "
        "AS v WHERE j.id = v.column1 AND j.attempt = v.column2 "
        "AND j.locked_by = %s AND j.status = 'running' {mine}"
    )
    with transaction.atomic(using=using):
        rows, skipped = _fenced_batch(
            using,
            worker_id,
            (f.lease for f in failures),
            update,
            params,
            ("status", "last_attempted_at", "finished_at"),
        )
        written = [
            (int(job), int(attempt), status, began) for job, attempt, status, began, _ in rows
        ]
        if written:
            _insert_attempt_values(
                [(by_lease[(job_id, attempt)], started) for job_id, attempt, _, started in written],
                worker_id,
                using,
            )
    return WriteResult(
        {(job_id, attempt): str(status) for job_id, attempt, status, _ in written},
        skipped,
        {(int(row[0]), int(row[1])): _datetime(row[4]) for row in rows},
    )


_ATTEMPT_COLUMNS = (
    "job_id",
    "attempt",
    "worker",
    "outcome",
    "error_class",
    "error_message",
    "traceback",
    "started_at",
)


def _insert_attempt_values(
    failures: Sequence[tuple[Failure, Any]], worker_id: str, using: str
) -> None:
    """One JobAttempt row per written failure, from the values the worker already has."""
    q = lambda name: _q(using, name)  # noqa: E731
    columns = ", ".join(q(c) for c in _ATTEMPT_COLUMNS)
    params: list[Any] = []
    for failure, started in failures:
        params += [
            failure.job_id,
            failure.attempt,
            worker_id,
            failure.outcome,
            failure.error.exception_class_path,
            failure.error.message,
            failure.error.traceback,
            started,
        ]
    rows = ", ".join(["(" + _placeholders(8) + ")"] * len(failures))
    sql = f"INSERT INTO {_attempt_table(using)} ({columns}) VALUES {rows}"  # noqa: S608 - identifiers quoted, values bound
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)


def unclaim(
    worker_id: str, claimed: Iterable[tuple[int, int]], *, using: str = "default"
) -> frozenset[tuple[int, int]]:
    """Give back claimed attempts that never started: ``pending`` again, attempt not used.

    For jobs a worker prefetched and did not hand to a slot before it stopped. The
    attempt counter goes back by one, which is safe because the attempt never ran:
    nothing ever acted under that fencing token, and the fence (this worker, this
    attempt, still running) makes sure the attempt was still ours. No JobAttempt
    row and no stall are recorded. A job whose cancel was requested ends
    ``cancelled``. Returns the leases given back. ``last_attempted_at`` and
    ``last_worker`` keep the values the claim gave them.

    One fenced UPDATE per job, in id order inside one transaction (the order the
    heartbeat locks rows in); it only runs when a worker stops with prefetched jobs.
    """
    wanted = list(dict.fromkeys(claimed))
    if not wanted:
        return frozenset()
    done = set()
    with transaction.atomic(using=using):
        for job_id, attempt in sorted(wanted):
            cancelled = Q(cancel_requested=True)
            changed = _fenced(job_id, attempt, worker_id, using).update(
                status=Case(
                    When(cancelled, then=Value(JobStatus.CANCELLED)),
                    default=Value(JobStatus.PENDING),
                ),
                # A first attempt that never ran leaves the job as if never started.
                started_at=Case(When(attempt=1, then=Value(None)), default=F("started_at")),
                finished_at=Case(
                    When(cancelled, then=Now()), default=Value(None), output_field=DateTimeField()
                ),
                locked_by=None,
                locked_until=None,
                cancel_requested=False,
                # Last: MySQL evaluates SET left to right, and started_at reads the old value.
                attempt=F("attempt") - 1,
            )
            if changed == 1:
                done.add((job_id, attempt))
    return frozenset(done)


def fail(
    job_id: int,
    attempt: int,
    worker_id: str,
    *,
    error: ErrorInfo,
    retry_delay: float | None,
    outcome: str = AttemptOutcome.ERROR,
    using: str = "default",
) -> str:
    """Record a failed attempt; return the job's new status.

    With a ``retry_delay`` the job goes back to ``pending`` with ``run_after`` that
    many seconds in the future, unless its attempts are used up (``attempt >=
    max_attempts``), in which case it is ``failed``. ``retry_delay=None`` fails it
    for good (for example a job naming an unknown task). A job whose cancel was
    requested while the attempt ran ends ``cancelled`` instead.
    """
    # A cancel requested while the attempt ran wins over a retry: the job ends cancelled.
    retrying = Q(attempt__lt=F("max_attempts"), cancel_requested=False)
    if retry_delay is None:
        retrying = Q(pk__in=[])  # never
    status = Case(
        When(cancel_requested=True, then=Value(JobStatus.CANCELLED)),
        When(retrying, then=Value(JobStatus.PENDING)),
        default=Value(JobStatus.FAILED),
    )
    run_after = Case(When(retrying, then=_now_plus(retry_delay or 0.0)), default=F("run_after"))
    finished_at = Case(
        When(retrying, then=Value(None)), default=Now(), output_field=DateTimeField()
    )
    return _end_attempt(
        job_id,
        attempt,
        worker_id,
        "fail",
        using=using,
        error=error,
        outcome=outcome,
        status=status,
        run_after=run_after,
        finished_at=finished_at,
    )


def release(job_id: int, attempt: int, worker_id: str, *, using: str = "default") -> None:
    """Put a running job back to ``pending`` at once, without counting a stall.

    For a worker that shuts down before the attempt finished. The attempt is
    recorded with outcome ``released``. The job keeps its ``run_after`` and so its
    place in the claim order, as a reaped job does. A job whose cancel was requested
    ends ``cancelled`` instead.
    """
    cancelled = Q(cancel_requested=True)
    _end_attempt(
        job_id,
        attempt,
        worker_id,
        "release",
        using=using,
        error=ErrorInfo(
            "django_leasejobs.exceptions.JobReleased",
            f"worker {worker_id} shut down and released the job",
        ),
        outcome=AttemptOutcome.RELEASED,
        status=Case(
            When(cancelled, then=Value(JobStatus.CANCELLED)), default=Value(JobStatus.PENDING)
        ),
        run_after=F("run_after"),
        finished_at=Case(
            When(cancelled, then=Now()), default=Value(None), output_field=DateTimeField()
        ),
    )


def mark_cancelled(job_id: int, attempt: int, worker_id: str, *, using: str = "default") -> None:
    """Record that the worker stopped a running attempt because a cancel was requested."""
    _end_attempt(
        job_id,
        attempt,
        worker_id,
        "cancel",
        using=using,
        error=ErrorInfo("django_leasejobs.exceptions.JobCancelled", "cancelled while running"),
        outcome=AttemptOutcome.CANCELLED,
        status=Value(JobStatus.CANCELLED),
        run_after=F("run_after"),
        finished_at=Now(),
    )


def _end_attempt(
    job_id: int,
    attempt: int,
    worker_id: str,
    transition: str,
    *,
    using: str,
    error: ErrorInfo,
    outcome: str,
    status: Any,
    run_after: Any,
    finished_at: Any,
) -> str:
    """The fenced UPDATE ending an attempt that did not succeed, plus its attempt row.

    Where the database has ``SKIP LOCKED``, the row is locked first without waiting:
    :class:`RowLocked` when another transaction holds it (nothing written; try again),
    :class:`LeaseLost` when it is not this attempt's any more.
    """
    with transaction.atomic(using=using):
        _lock_without_waiting(job_id, attempt, worker_id, transition, using)
        changed = _fenced(job_id, attempt, worker_id, using).update(
            status=status,
            run_after=run_after,
            finished_at=finished_at,
            locked_by=None,
            locked_until=None,
            cancel_requested=False,
            last_error=error.last_error,
        )
        if changed != 1:
            raise LeaseLost(job_id, attempt, worker_id, transition)
        _insert_attempt_rows([job_id], outcome=outcome, error=error, worker=worker_id, using=using)
        new_status = (
            Job.objects.using(using).filter(pk=job_id).values_list("status", flat=True).get()
        )
    return str(new_status)


def _lock_without_waiting(
    job_id: int, attempt: int, worker_id: str, transition: str, using: str
) -> None:
    """Inside a transaction: lock the attempt's row, never waiting for another lock."""
    if not connections[using].features.has_select_for_update_skip_locked:
        return  # SQLite: writers are serialised, there are no row locks to wait for
    mine = _fenced(job_id, attempt, worker_id, using)
    if list(mine.select_for_update(skip_locked=True).values_list("pk", flat=True)):
        return
    if mine.exists():
        raise RowLocked(job_id, attempt, transition)
    raise LeaseLost(job_id, attempt, worker_id, transition)


def _insert_attempt_rows(
    job_ids: Sequence[int],
    *,
    outcome: str,
    error: ErrorInfo,
    worker: str | None,
    using: str,
) -> None:
    """One JobAttempt row per job for its current attempt, copied from the job row."""
    if not job_ids:
        return
    q = lambda name: _q(using, name)  # noqa: E731
    worker_sql = "%s" if worker is not None else q("last_worker")
    params: list[Any] = []
    if worker is not None:
        params.append(worker)
    params += [
        outcome,
        error.exception_class_path,
        error.message,
        error.traceback,
        *job_ids,
    ]
    columns = ", ".join(q(c) for c in _ATTEMPT_COLUMNS)
    sql = (
        f"INSERT INTO {_attempt_table(using)} ({columns}) "  # noqa: S608 - identifiers quoted, values bound
        f"SELECT {q('id')}, {q('attempt')}, {worker_sql}, %s, %s, %s, %s, {q('last_attempted_at')} "
        f"FROM {_job_table(using)} WHERE {q('id')} IN ({_placeholders(len(job_ids))})"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)


def save_checkpoint(
    job_id: int, attempt: int, worker_id: str, data: Any, *, using: str = "default"
) -> None:
    """Store the job's checkpoint (kept across attempts, so a retry can resume)."""
    if _fenced(job_id, attempt, worker_id, using).update(checkpoint=data) != 1:
        raise LeaseLost(job_id, attempt, worker_id, "checkpoint")


def set_progress(
    job_id: int,
    attempt: int,
    worker_id: str,
    progress: Progress,
    *,
    using: str = "default",
) -> None:
    """Store progress at once (workers normally send it with the next renewal instead)."""
    changes: dict[str, Any] = {"progress": progress.fraction}
    if progress.message is not None:
        changes["progress_message"] = storable_text(progress.message, MAX_PROGRESS_MESSAGE_LENGTH)
    if _fenced(job_id, attempt, worker_id, using).update(**changes) != 1:
        raise LeaseLost(job_id, attempt, worker_id, "progress")


# --------------------------------------------------------------------------- reap


_REAP_ERROR = ErrorInfo(
    "django_leasejobs.exceptions.LeaseExpired",
    "lease expired: the worker stopped renewing it (it died, froze or lost the database)",
)


def _stale(stale_lock_age: float, using: str) -> Q:
    return Q(status=JobStatus.RUNNING, locked_until__lt=_now_plus(-stale_lock_age))


def find_stale(
    *, stale_lock_age: float = 0.0, backend: str | None = None, using: str = "default"
) -> list[Job]:
    """Running jobs whose lease expired more than ``stale_lock_age`` seconds ago (read only)."""
    jobs = Job.objects.using(using).filter(_stale(stale_lock_age, using))
    if backend is not None:
        jobs = jobs.filter(backend=backend)
    return list(jobs.order_by("id"))


def reap(
    *, stale_lock_age: float = 0.0, backend: str | None = None, using: str = "default"
) -> list[ReapedJob]:
    """Recover every running job whose lease expired ``stale_lock_age`` seconds ago or more.

    Set-based and safe to run concurrently (two reapers reap a job once): the
    UPDATE re-checks ``status='running'`` and the expiry on the row it changes,
    so a completion that raced the reaper is never overwritten. Each reaped job
    gets ``stall_count + 1`` and becomes ``dead`` when that reaches
    ``max_stalls``, else ``failed`` when its attempts are used up, else
    ``pending``; a job whose cancel was requested while it ran ends ``cancelled``.
    Each reaped attempt gets a JobAttempt row with outcome ``lease_expired``.

    A job put back to ``pending`` keeps its ``run_after``, which has passed (it was
    claimed): it is runnable at once and keeps its place in the claim order
    (priority, then ``run_after``, then id), ahead of every job that became ready
    after it, instead of going to the back of a backlog.
    """
    vendor = _vendor(using)
    with transaction.atomic(using=using):
        if vendor in RETURNING_VENDORS:
            rows = _reap_returning(vendor, stale_lock_age, backend, using)
        else:
            rows = _reap_orm(stale_lock_age, backend, using)
        _insert_attempt_rows(
            [r.id for r in rows],
            outcome=AttemptOutcome.LEASE_EXPIRED,
            error=_REAP_ERROR,
            worker=None,
            using=using,
        )
    return rows


_REAP_RETURNING = (
    "id",
    "attempt",
    "last_worker",
    "status",
    "queue",
    "task_path",
    "stall_count",
    "backend",
)


def _reap_returning(
    vendor: str, stale_lock_age: float, backend: str | None, using: str
) -> list[ReapedJob]:
    table = _job_table(using)
    now = _now_sql(vendor)
    where = f"status = 'running' AND locked_until < {_now_offset_sql(vendor)}"
    where_params: list[Any] = [_offset_param(vendor, -stale_lock_age)]
    if backend is not None:
        where += " AND backend = %s"
        where_params.append(backend)
    lock_cte = ""
    params: list[Any] = []
    if vendor == "postgresql":
        # Lock in id order and skip rows another transaction holds (a racing completion,
        # renewal or reaper): no deadlocks, and each row is still reaped exactly once.
        lock_cte = (
            f"WITH stale AS (SELECT id FROM {table} WHERE {where} "  # noqa: S608 - identifiers quoted, values bound
            "ORDER BY id FOR UPDATE SKIP LOCKED) "
        )
        where += " AND id IN (SELECT id FROM stale)"
        params += where_params
    params.append(_REAP_ERROR.last_error)
    params += where_params
    terminal = "cancel_requested OR stall_count + 1 >= max_stalls OR attempt >= max_attempts"
    sql = (
        f"{lock_cte}UPDATE {table} SET "  # noqa: S608 - identifiers quoted, values bound
        "status = CASE WHEN cancel_requested THEN 'cancelled' "
        "WHEN stall_count + 1 >= max_stalls THEN 'dead' "
        "WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END, "
        "stall_count = stall_count + 1, locked_by = NULL, locked_until = NULL, "
        f"finished_at = CASE WHEN {terminal} THEN {now} ELSE NULL END, "
        "cancel_requested = FALSE, "
        "last_error = %s "
        f"WHERE {where} RETURNING {', '.join(_REAP_RETURNING)}"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [_reaped(row) for row in rows]


def _reaped(row: Sequence[Any]) -> ReapedJob:
    values = dict(zip(_REAP_RETURNING, row, strict=True))
    return ReapedJob(
        id=int(values["id"]),
        attempt=int(values["attempt"]),
        worker=values["last_worker"],
        status=values["status"],
        queue=values["queue"],
        task_path=values["task_path"],
        stall_count=int(values["stall_count"]),
        backend=values["backend"],
    )


def _reap_orm(stale_lock_age: float, backend: str | None, using: str) -> list[ReapedJob]:
    stale = Job.objects.using(using).filter(_stale(stale_lock_age, using))
    if backend is not None:
        stale = stale.filter(backend=backend)
    ids = list(stale.select_for_update(skip_locked=True).values_list("id", flat=True))
    if not ids:
        return []
    cancelled = Q(cancel_requested=True)
    dead = Q(stall_count__gte=F("max_stalls") - 1)
    exhausted = Q(attempt__gte=F("max_attempts"))
    stale.filter(pk__in=ids).update(
        status=Case(
            When(cancelled, then=Value(JobStatus.CANCELLED)),
            When(dead, then=Value(JobStatus.DEAD)),
            When(exhausted, then=Value(JobStatus.FAILED)),
            default=Value(JobStatus.PENDING),
        ),
        locked_by=None,
        locked_until=None,
        finished_at=Case(
            When(cancelled | dead | exhausted, then=Now()),
            default=Value(None),
            output_field=DateTimeField(),
        ),
        last_error=_REAP_ERROR.last_error,
        # Last: MySQL evaluates SET left to right, and the CASEs above read the old values.
        stall_count=F("stall_count") + 1,
        cancel_requested=False,
    )
    rows = Job.objects.using(using).filter(pk__in=ids).values_list(*_REAP_RETURNING)
    return [_reaped(row) for row in rows]


# --------------------------------------------------------------------------- cancel


def cancel(job_id: int, *, using: str = "default") -> CancelResult:
    """Cancel a job: a pending one at once; a running one by flagging it for its worker."""
    jobs = Job.objects.using(using).filter(pk=job_id)
    if jobs.filter(status=JobStatus.PENDING).update(status=JobStatus.CANCELLED, finished_at=Now()):
        return CancelResult.CANCELLED
    if jobs.filter(status=JobStatus.RUNNING, cancel_requested=False).update(cancel_requested=True):
        return CancelResult.REQUESTED
    if jobs.exists():
        return CancelResult.NOT_CANCELLABLE
    return CancelResult.NOT_FOUND


# --------------------------------------------------------------------------- operator retries


class RetryResult(StrEnum):
    RETRIED = "retried"
    WRONG_STATE = "wrong_state"
    """The job is not failed or dead (it is pending, running, succeeded or cancelled)."""
    KEY_TAKEN = "key_taken"
    """Another pending or running job holds the job's dedup key."""
    NOT_FOUND = "not_found"


def retry(
    job_id: int, *, statuses: Sequence[str] | None = None, using: str = "default"
) -> RetryResult:
    """Put a failed or dead job back to ``pending``, runnable at once.

    Only ``failed`` and ``dead`` jobs (or the given subset of them) are retried. The
    job gets a fresh budget: its stall count is reset and it may run at least one
    more attempt (``max_attempts`` becomes at least ``attempt + 1``). Its attempt
    history stays.
    """
    allowed = list(statuses or (JobStatus.FAILED, JobStatus.DEAD))
    if not set(allowed) <= {JobStatus.FAILED, JobStatus.DEAD}:
        raise ValueError(f"only failed or dead jobs can be retried, not {allowed}")
    jobs = Job.objects.using(using).filter(pk=job_id)
    try:
        with transaction.atomic(using=using):
            changed = jobs.filter(status__in=allowed).update(
                status=JobStatus.PENDING,
                run_after=Now(),
                finished_at=None,
                stall_count=0,
                cancel_requested=False,
                max_attempts=Case(
                    When(max_attempts__lte=F("attempt"), then=F("attempt") + 1),
                    default=F("max_attempts"),
                    output_field=PositiveIntegerField(),
                ),
            )
    except IntegrityError:
        return RetryResult.KEY_TAKEN
    if changed == 1:
        return RetryResult.RETRIED
    return RetryResult.WRONG_STATE if jobs.exists() else RetryResult.NOT_FOUND
