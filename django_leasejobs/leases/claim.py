"""Claiming ready jobs, and giving back claimed attempts that never started."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils.dateparse import parse_datetime

from ..retry import backoff_problems
from .dialect import dialect, placeholders, retry_deadlocks
from .fenced import lock_update_read
from .rules import cancel_wins
from .values import ClaimedJob

CLAIM_COLUMNS = (
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
    "snoozes",
    "trace_context",
)
_PRIORITY = CLAIM_COLUMNS.index("priority")
CLAIM_ORDER = "priority DESC, run_after, id"
"""The claim order: priority (high first), then ``run_after``, then id."""


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
    if limit <= 0 or (queues is not None and not queues):
        return []
    d = dialect(using)
    ready = f"j.status = 'pending' AND j.backend = %s AND j.run_after <= {d.now}"
    ready_params: list[Any] = [backend]
    if queues is not None:
        ready += f" AND j.queue IN ({placeholders(len(queues))})"
        ready_params.extend(queues)
    pick = (
        f"SELECT j.id FROM {d.jobs} AS j WHERE {ready} "  # noqa: S608 - identifiers quoted, values bound
        f"ORDER BY {CLAIM_ORDER} LIMIT %s{d.skip_locked}"
    )
    pick_params: list[Any] = [*ready_params, limit]
    if d.vendor == "postgresql" and queues is not None and len(queues) > 1:
        # The claim index leads with (backend, queue): for several queues an IN list
        # gives no order, so PostgreSQL would read and sort every pending row of them at
        # each claim (bench/workers.py: 6 ms per claim with a 20,000-job backlog, more
        # the more workers claim at once). Instead, the first ``limit`` due rows of each
        # queue in index order (locked, skipping locked ones), then the best ``limit``
        # of those: the same order, a few index pages per queue. (Rows locked in one
        # queue but not picked are free again when the claim's statement commits.)
        one_queue = (
            f"SELECT j.id, j.priority, j.run_after FROM {d.jobs} AS j "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE j.status = 'pending' AND j.backend = %s AND j.run_after <= {d.now} "
            f"AND j.queue = q.name ORDER BY {CLAIM_ORDER} LIMIT %s{d.skip_locked}"
        )
        pick = (
            f"SELECT p.id FROM unnest(%s::text[]) AS q(name) CROSS JOIN LATERAL ({one_queue}) "  # noqa: S608 - identifiers quoted, values bound
            "AS p ORDER BY p.priority DESC, p.run_after, p.id LIMIT %s"
        )
        pick_params = [list(queues), backend, limit, limit]
    set_list = (
        "status = 'running', attempt = j.attempt + 1, locked_by = %s, "
        f"locked_until = {d.now_plus}, heartbeat_at = {d.now}, last_worker = %s, "
        f"started_at = COALESCE(j.started_at, {d.now}), last_attempted_at = {d.now}, "
        "progress = NULL, progress_message = '', cancel_requested = FALSE"
    )
    set_params = [worker_id, d.offset(lease_duration), worker_id]
    # run_after last, to put the rows back in claim order (RETURNING gives no order).
    returning = (*CLAIM_COLUMNS, "run_after")
    if d.batched:
        columns = ", ".join(d.q(c) for c in returning)
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"WITH picked AS ({pick}) UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
                "WHERE j.id IN (SELECT id FROM picked) AND j.status = 'pending' "
                f"RETURNING {columns}",
                [*pick_params, *set_params],
            )
            rows = cursor.fetchall()
    else:
        lock = (pick, pick_params)
        update = (set_list, "j.status = 'pending'", set_params)
        rows = retry_deadlocks(d.using, lambda: lock_update_read(d, lock, update, returning))
    rows.sort(key=lambda row: (-row[_PRIORITY], row[-1], row[0]))
    return [claimed_job(row[:-1]) for row in rows]


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
    wanted = sorted(set(claimed))
    if not wanted:
        return frozenset()
    d = dialect(using)
    pending = cancel_wins("'pending'")
    # MySQL assigns from left to right: attempt, read by started_at, is assigned last.
    sql = (
        f"UPDATE {d.jobs} AS j SET status = {pending}, "  # noqa: S608 - identifiers quoted, values bound
        # A first attempt that never ran leaves the job as if never started.
        "started_at = CASE WHEN j.attempt = 1 THEN NULL ELSE j.started_at END, "
        f"finished_at = CASE WHEN j.cancel_requested THEN {d.now} ELSE NULL END, "
        "locked_by = NULL, locked_until = NULL, cancel_requested = FALSE, "
        "attempt = j.attempt - 1 "
        "WHERE j.id = %s AND j.attempt = %s AND j.locked_by = %s AND j.status = 'running'"
    )

    def give_back() -> frozenset[tuple[int, int]]:
        done = set()
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            for job_id, attempt in wanted:
                cursor.execute(sql, [job_id, attempt, worker_id])
                if cursor.rowcount == 1:
                    done.add((job_id, attempt))
        return frozenset(done)

    return retry_deadlocks(d.using, give_back)


def claimed_job(row: Sequence[Any]) -> ClaimedJob:
    """A claimed row (``CLAIM_COLUMNS``) as the worker's :class:`ClaimedJob`."""
    values = dict(zip(CLAIM_COLUMNS, row, strict=True))
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
        enqueued_at=as_datetime(values["enqueued_at"]),
        started_at=as_datetime(values["started_at"]),
        last_attempted_at=as_datetime(values["last_attempted_at"]),
        snoozes=int(values["snoozes"]),
        trace_context=_json(values["trace_context"]),
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def as_datetime(value: Any) -> datetime | None:
    """A datetime column read through a raw cursor (SQLite gives text, MySQL a naive
    datetime, both in UTC; PostgreSQL an aware datetime)."""
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
