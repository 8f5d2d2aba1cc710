"""Claiming ready jobs, and giving back claimed attempts that never started."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils.dateparse import parse_datetime

from ..limits import FlowRules
from ..retry import backoff_problems
from .claim_write import CLAIM_COLUMNS, RETURNING, claim_set
from .dialect import (
    Dialect,
    dialect,
    django_zone,
    native_timestamps,
    placeholders,
    retry_deadlocks,
)
from .fenced import lock_update_read
from .flow import flow_claim, flow_lane_due, paused_condition, skipping
from .rules import cancel_wins
from .values import ClaimedJob, ClaimRound
from .workflow_ops import parents_of_steps

_PRIORITY = CLAIM_COLUMNS.index("priority")
_ENQUEUED_AT = CLAIM_COLUMNS.index("enqueued_at")
_SNOOZES = CLAIM_COLUMNS.index("snoozes")
"""The claim's datetime columns: ``enqueued_at`` up to ``snoozes``, and ``run_after`` last."""
NO_RULES = FlowRules()
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
    flow: FlowRules = NO_RULES,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs for ``worker_id``: pending, ``run_after`` passed,
    in a queue that is not paused, within every flow limit (``flow``: the backend's
    queue-wide limits; the jobs' own concurrency and rate limits are on their rows).

    Order (of the claim and of the returned list): priority (high first), then
    ``run_after``, then id. Each claimed row becomes ``running`` with ``attempt + 1``
    and a lease of ``lease_duration`` seconds, in the same statement: a running row
    without a lease cannot exist. (:func:`claim_round` is the same claim, for a worker
    that also wants to know whether limits held jobs back.)
    """
    return claim_round(
        worker_id,
        limit=limit,
        lease_duration=lease_duration,
        backend=backend,
        queues=queues,
        using=using,
        flow=flow,
    ).jobs


def claims_beside_writes(using: str) -> bool:
    """Whether a worker may run a round's claim on a second connection while the same
    round's outcome writes run on the first: on PostgreSQL. There the claim waits for no
    row lock (``SKIP LOCKED``) and the writes wait for none the claim takes (they touch
    the worker's running rows, and the flow claim's lock is not theirs), so the two
    overlap without waiting on each other. MariaDB and SQLite run them one after the
    other (SQLite serialises writers anyway)."""
    return dialect(using).vendor == "postgresql"


def claim_round(
    worker_id: str,
    *,
    limit: int,
    lease_duration: float,
    backend: str = "default",
    queues: Sequence[str] | None = None,
    using: str = "default",
    flow: FlowRules = NO_RULES,
    main_lane_first: bool = False,
    skip_tasks: Collection[str] = (),
) -> ClaimRound:
    """:func:`claim`, and whether flow limits held due jobs back (``ClaimRound``).

    Jobs that obey no limit (the main lane) are claimed in one statement, which takes
    nothing while a job under flow control is due in the same queues. The flow claim of
    ``flow.py`` (one transaction under the backend's flow lock) then takes both lanes in
    claim order; so it does at once when the worker's queues have a queue-wide limit.

    ``main_lane_first``: for a worker whose last flow claim held due jobs back
    (``ClaimRound.flow_held``): first the main lane of the queues without a queue-wide
    limit, whatever is due under flow control (one statement), and the flow claim only
    for what that leaves of ``limit``. A full limit's backlog then does not make every
    claim a flow claim, at the price of the claim order between the two lanes.

    ``skip_tasks``: task paths whose jobs this claim leaves alone, in both lanes (a worker
    stands aside from a task it does not know, so that one that knows it takes its jobs).
    """
    if limit <= 0 or (queues is not None and not queues):
        return ClaimRound([])
    d = dialect(using)
    limited = flow.limited_queues
    touches_limited = bool(limited) and (queues is None or bool(limited.intersection(queues)))
    rows: list[tuple[Any, ...]] = []
    held = False
    if main_lane_first:
        open_queues = queues
        if touches_limited and queues is not None:
            open_queues = [q for q in queues if q not in limited]
        if open_queues is None or open_queues:
            rows = _claim_main_lane(
                worker_id,
                d,
                limit,
                lease_duration,
                backend,
                open_queues,
                limited,
                guard=False,
                skip_tasks=skip_tasks,
            )
        flow_claims = len(rows) < limit and (touches_limited or _flow_lane_due(d, backend, queues))
    elif touches_limited:
        flow_claims = True
    else:
        rows = _claim_main_lane(
            worker_id, d, limit, lease_duration, backend, queues, skip_tasks=skip_tasks
        )
        # Rows claimed: the statement's guard found no job under flow control due.
        flow_claims = not rows and _flow_lane_due(d, backend, queues)
    wanted = limit - len(rows)
    if flow_claims:
        more, held = flow_claim(
            worker_id,
            limit=wanted,
            lease_duration=lease_duration,
            backend=backend,
            queues=queues,
            rules=flow,
            using=using,
            skip_tasks=skip_tasks,
        )
        rows += more
    rows.sort(key=lambda row: (-row[_PRIORITY], row[-1], row[0]))
    jobs = _with_parents([claimed_job(row[:-1]) for row in rows], using)
    return ClaimRound(jobs, flow_held=held)


def _with_parents(jobs: list[ClaimedJob], using: str) -> list[ClaimedJob]:
    """``jobs`` with the parents of the workflow steps among them, in one query: the
    task then reads them without touching the database (``context.parent_results``), so
    an outage while it runs cannot fail it there. When the read fails, the steps go
    without them (the task reads them itself): the claim stands, as always."""
    steps = [job.id for job in jobs if job.workflow_id is not None]
    if not steps:
        return jobs
    try:
        parents = parents_of_steps(steps, using=using)
    except DatabaseError:
        return jobs
    return [
        replace(job, parents=tuple(parents.get(job.id, ()))) if job.workflow_id is not None else job
        for job in jobs
    ]


def _claim_main_lane(
    worker_id: str,
    d: Dialect,
    limit: int,
    lease_duration: float,
    backend: str,
    queues: Sequence[str] | None,
    excluded: Collection[str] = (),
    *,
    guard: bool = True,
    skip_tasks: Collection[str] = (),
) -> list[tuple[Any, ...]]:
    """The claim of jobs that obey no limit, in one statement (the batched path) or one
    transaction (the portable path), from ``queues`` (None: every queue but the
    ``excluded`` ones). With ``guard`` it takes nothing while a job of a flow group is
    due in the same queues: the flow claim then takes both lanes, in claim order. Jobs of
    ``skip_tasks`` are left alone."""
    skip = skipping(skip_tasks)
    ready = (
        "j.status = 'pending' AND j.flow_group IS NULL AND j.backend = %s "
        f"AND j.run_after <= {d.now}{skip}"
    )
    ready_params: list[Any] = [backend, *skip_tasks]
    if queues is not None and len(queues) == 1:
        # One queue: the pause is looked up once for the statement, not per row.
        ready += f" AND j.queue = %s AND {paused_condition(d, '%s')}"
        ready_params += [queues[0], backend, queues[0]]
    else:
        if queues is not None:
            ready += f" AND j.queue IN ({placeholders(len(queues))})"
            ready_params.extend(queues)
        elif excluded:
            ready += f" AND j.queue NOT IN ({placeholders(len(excluded))})"
            ready_params.extend(excluded)
        ready += f" AND {paused_condition(d, 'j.queue')}"
        ready_params.append(backend)
    flow_due, flow_params = flow_lane_due(d, backend, queues) if guard else ("FALSE", [])
    ready += f" AND NOT {flow_due}"
    ready_params += flow_params
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
        # (unpaused) queue in index order (locked, skipping locked ones), then the best
        # ``limit`` of those: the same order, a few index pages per queue. (Rows locked in
        # one queue but not picked are free again when the claim's statement commits.)
        one_queue = (
            f"SELECT j.id, j.priority, j.run_after FROM {d.jobs} AS j "  # noqa: S608 - identifiers quoted, values bound
            "WHERE j.status = 'pending' AND j.flow_group IS NULL AND j.backend = %s "
            f"AND j.run_after <= {d.now}{skip} AND j.queue = q.name "
            f"ORDER BY {CLAIM_ORDER} LIMIT %s{d.skip_locked}"
        )
        pick = (
            f"SELECT p.id FROM unnest(%s::text[]) AS q(name) CROSS JOIN LATERAL ({one_queue}) "  # noqa: S608 - identifiers quoted, values bound
            f"AS p WHERE {paused_condition(d, 'q.name')} AND NOT {flow_due} "
            "ORDER BY p.priority DESC, p.run_after, p.id LIMIT %s"
        )
        pick_params = [list(queues), backend, *skip_tasks, limit, backend, *flow_params, limit]
    set_list, set_params = claim_set(d, worker_id, lease_duration)
    if d.batched:
        columns = ", ".join(d.q(c) for c in RETURNING)
        with connections[d.using].cursor() as cursor:
            native_timestamps(cursor)
            cursor.execute(
                f"WITH picked AS ({pick}) UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
                "WHERE j.id IN (SELECT id FROM picked) AND j.status = 'pending' "
                f"RETURNING {columns}",
                [*pick_params, *set_params],
            )
            rows: list[tuple[Any, ...]] = cursor.fetchall()
        if d.vendor != "postgresql":
            return [tuple(row) for row in rows]
        zone = django_zone(d.using)
        if not rows or rows[0][-1].tzinfo is zone:
            # The loader gives every value the connection's zone: when it is Django's (UTC
            # with USE_TZ, the common case) the rows are already as Django reads them.
            return rows
        return [
            (
                *row[:_ENQUEUED_AT],
                *(_in_zone(v, zone) for v in row[_ENQUEUED_AT:_SNOOZES]),
                *row[_SNOOZES:-1],
                _in_zone(row[-1], zone),
            )
            for row in rows
        ]
    lock = (pick, pick_params)
    update = (set_list, "j.status = 'pending'", set_params)
    return retry_deadlocks(d.using, lambda: lock_update_read(d, lock, update, RETURNING))


def _flow_lane_due(d: Dialect, backend: str, queues: Sequence[str] | None) -> bool:
    """Whether a job of a flow group is due in ``queues`` (after an empty main-lane claim)."""
    sql, params = flow_lane_due(d, backend, queues)
    with connections[d.using].cursor() as cursor:
        cursor.execute(f"SELECT CASE WHEN {sql} THEN 1 ELSE 0 END", params)
        (due,) = cursor.fetchone()
    return bool(due)


def give_back_unused(d: Dialect, also: str = "") -> str:
    """The fenced UPDATE (parameters: job id, attempt, worker id) that gives back one
    claimed attempt that never ran: ``pending`` (``cancelled`` when a cancel was
    requested), the attempt counter back by one, no stall; ``also``: more assignments
    (``"col = expr, "``) that may read the row's old ``attempt`` and ``cancel_requested``.
    Used by :func:`unclaim` and by ``defer.defer_unknown``."""
    pending = cancel_wins("'pending'")
    # MySQL assigns from left to right: attempt and cancel_requested, read by the
    # assignments before them, are assigned last.
    return (
        f"UPDATE {d.jobs} AS j SET status = {pending}, "  # noqa: S608 - identifiers quoted, values bound
        # A first attempt that never ran leaves the job as if never started.
        "started_at = CASE WHEN j.attempt = 1 THEN NULL ELSE j.started_at END, "
        f"finished_at = CASE WHEN j.cancel_requested THEN {d.now} ELSE NULL END, "
        f"{also}locked_by = NULL, locked_until = NULL, cancel_requested = FALSE, "
        "attempt = j.attempt - 1 "
        "WHERE j.id = %s AND j.attempt = %s AND j.locked_by = %s AND j.status = 'running'"
    )


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
    sql = give_back_unused(d)

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
    """A claimed row (``CLAIM_COLUMNS``) as the worker's :class:`ClaimedJob`.

    Run for every claimed job: the row is unpacked (no dict of it) and a NULL column
    costs no call."""
    (
        job_id,
        attempt,
        task_path,
        queue,
        priority,
        args,
        kwargs,
        timeout,
        max_attempts,
        checkpoint,
        backoff,
        key,
        options,
        enqueued_at,
        started_at,
        last_attempted_at,
        snoozes,
        trace_context,
        metadata,
        workflow_id,
        flow_group,
    ) = row  # in CLAIM_COLUMNS order
    problems = []
    # Rows written by hand or by another program: a wrong JSON type must fail this job,
    # never reach the task call (or the worker's own bookkeeping).
    args = None if args is None else _json(args)
    if args is None:
        args = []
    elif not isinstance(args, list):
        problems.append(f"args is a JSON {_json_type(args)}, not an array")
        args = []
    kwargs = None if kwargs is None else _json(kwargs)
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        problems.append(f"kwargs is a JSON {_json_type(kwargs)}, not an object")
        kwargs = {}
    if backoff is not None:
        backoff = _json(backoff)
        if backoff is not None and backoff_problems(backoff):
            problems.append("retry_backoff " + "; ".join(backoff_problems(backoff)))
            backoff = None
    options = None if options is None else _json(options)
    metadata = None if metadata is None else _json(metadata)
    return ClaimedJob(
        int(job_id),
        int(attempt),
        task_path,
        queue,
        int(priority),
        args,
        kwargs,
        timeout,
        int(max_attempts),
        None if checkpoint is None else _json(checkpoint),
        backoff,
        "the job row is malformed: " + "; ".join(problems) if problems else None,
        key,
        options if isinstance(options, dict) else None,
        as_datetime(enqueued_at),
        as_datetime(started_at),
        as_datetime(last_attempted_at),
        int(snoozes),
        None if trace_context is None else _json(trace_context),
        metadata if isinstance(metadata, dict) else None,
        None if workflow_id is None else int(workflow_id),
        flow_group=flow_group,
    )


def _json(value: Any) -> Any:
    """A JSON column as read (text, or bytes, or already decoded). The empty array and
    object, the args and kwargs of many jobs, skip the decoder (a fresh one each time,
    as the decoder gives)."""
    if value == "[]":
        return []
    if value == "{}":
        return {}
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _in_zone(value: datetime | None, zone: tzinfo | None) -> datetime | None:
    """A PostgreSQL datetime read by :func:`native_timestamps`, as Django reads it."""
    return None if value is None else value.replace(tzinfo=zone)


def datetime_reader(d: Dialect) -> Callable[[Any], datetime | None]:
    """How to read a datetime column of a statement run on ``d``'s fenced path
    (``fenced.batched`` reads them with :func:`native_timestamps`)."""
    if d.vendor != "postgresql":
        return as_datetime
    zone = django_zone(d.using)
    return lambda value: _in_zone(value, zone)


def as_datetime(value: Any) -> datetime | None:
    """A datetime column read through a raw cursor (SQLite gives text, MySQL a naive
    datetime, both in UTC; PostgreSQL a datetime as Django reads it)."""
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
