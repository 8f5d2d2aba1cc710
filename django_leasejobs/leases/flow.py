"""Flow control in the claim: paused queues, concurrency limits and rate limits.

The claim of ``claim.py`` takes jobs that obey no limit (the main lane: pending rows
with ``flow_group IS NULL`` in queues without a queue-wide limit), in one statement.
Everything else is claimed here, by :func:`flow_claim`, in ONE transaction that:

1. locks the backend's ``leasejobs_flow_lock`` row (an UPDATE): flow claims on every
   worker and host take turns, so each one counts what the previous ones started;
2. reads what the limits need, with statements that start after the lock was taken
   (PostgreSQL and MySQL/MariaDB run at READ COMMITTED, each statement sees every
   commit before it; SQLite's first write locks the whole database for the rest of the
   transaction): the paused queues, the running jobs per queue and flow group whose
   lease has not expired (a slot lives exactly as long as a lease: every ending, and an
   expired lease, frees it, with nothing to clean up), and the starts of each rate's
   window;
3. reads the candidates: each queue's first pending jobs in claim order (the main
   lane, as many as the queue may still start), and the flow lane's (``_flow_lane``:
   on PostgreSQL a window in claim order, then, only when full groups crowd it, each
   group that is not full by a skip scan, so a full group's backlog is never walked);
4. chooses in claim order (:func:`choose`): a candidate is skipped, never waited on,
   when a limit it obeys is used up, and every later candidate of its group with it,
   so the claim order within a group is kept;
5. claims the chosen rows (``status = 'pending'`` re-checked) and records the starts
   of rate-limited ones.

The lock is held for the few milliseconds of that transaction. Claims of the main lane
never take it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import OperationalError, connections, transaction

from ..limits import FlowRules, Rate, parse_rate, queue_scope, task_group
from ..models import FlowLock, Queue, RateStart
from .claim_write import claim_rows
from .dialect import Dialect, dialect, placeholders, retry_deadlocks

CANDIDATE_COLUMNS = (
    "id",
    "queue",
    "flow_group",
    "concurrency_limit",
    "rate_limit",
    "task_path",
    "priority",
    "run_after",
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending, due job a flow claim may take."""

    id: int
    queue: str
    flow_group: str | None
    concurrency_limit: int | None
    rate_limit: Rate | None
    task_path: str
    priority: int
    run_after: Any

    @property
    def order(self) -> tuple[int, Any, int]:
        return (-self.priority, self.run_after, self.id)


@dataclass(frozen=True, slots=True)
class Running:
    """Running jobs whose lease has not expired, as a flow claim read them."""

    by_queue: Mapping[str, int]
    by_group: Mapping[str, int]
    group_limits: Mapping[str, int]
    """Per group, the lowest ``concurrency_limit`` among its running jobs."""

    def full_groups(self) -> list[str]:
        """The groups whose running jobs fill their limit: no job of theirs can start."""
        return sorted(g for g, n in self.by_group.items() if n >= self.group_limits.get(g, n + 1))


@dataclass(frozen=True, slots=True)
class Usage:
    """What the limits have used, as the flow claim read it under the lock."""

    running_by_queue: Mapping[str, int]
    running_by_group: Mapping[str, int]
    starts: Mapping[tuple[str, float], int]
    """(rate scope, period) -> starts in the last period."""


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`choose` decided."""

    taken: list[Candidate]
    held: bool
    """A candidate was skipped because a limit was used up (before the claim was full)."""


def choose(candidates: Sequence[Candidate], usage: Usage, rules: FlowRules, limit: int) -> Choice:
    """The candidates one claim takes, in claim order: every limit decided here, once.

    A candidate is skipped when its queue's limit or rate, its group's concurrency
    limit or its task's rate is used up (counting what this claim took already); once a
    group has a skipped candidate, its later candidates are skipped too.
    """
    held = False
    taken: list[Candidate] = []
    by_queue: Counter[str] = Counter()
    by_group: Counter[str] = Counter()
    by_scope: Counter[tuple[str, float]] = Counter()
    blocked: set[str] = set()
    for job in sorted(candidates, key=lambda c: c.order):
        if len(taken) >= limit:
            break
        group = job.flow_group
        if group is not None and group in blocked:
            held = True
            continue
        scopes = _rate_scopes(job, rules)
        if _fits(job, usage, rules, by_queue, by_group, by_scope, scopes):
            taken.append(job)
            by_queue[job.queue] += 1
            if group is not None:
                by_group[group] += 1
            for scope in scopes:
                by_scope[scope[0], scope[1].period] += 1
        else:
            held = True
            if group is not None:
                blocked.add(group)
    return Choice(taken, held)


def _fits(
    job: Candidate,
    usage: Usage,
    rules: FlowRules,
    by_queue: Counter[str],
    by_group: Counter[str],
    by_scope: Counter[tuple[str, float]],
    scopes: Sequence[tuple[str, Rate]],
) -> bool:
    queue_limit = rules.queue_limits.get(job.queue)
    queue_running = usage.running_by_queue.get(job.queue, 0) + by_queue[job.queue]
    if queue_limit is not None and queue_running >= queue_limit:
        return False
    if job.flow_group is not None and job.concurrency_limit is not None:
        running = usage.running_by_group.get(job.flow_group, 0) + by_group[job.flow_group]
        if running >= job.concurrency_limit:
            return False
    for scope, rate in scopes:
        key = (scope, rate.period)
        if usage.starts.get(key, 0) + by_scope[key] >= rate.count:
            return False
    return True


def _rate_scopes(job: Candidate, rules: FlowRules) -> list[tuple[str, Rate]]:
    """The rate limits a start of ``job`` counts against: its task's, its queue's."""
    scopes = []
    if job.rate_limit is not None:
        scopes.append((task_group(job.task_path), job.rate_limit))
    queue_rate = rules.queue_rates.get(job.queue)
    if queue_rate is not None:
        scopes.append((queue_scope(job.queue), queue_rate))
    return scopes


def paused_condition(d: Dialect, queue_sql: str) -> str:
    """SQL true when the queue ``queue_sql`` of backend ``%s`` (one parameter) is not paused."""
    table = d.q(Queue._meta.db_table)
    return (
        f"NOT EXISTS (SELECT 1 FROM {table} AS qs WHERE qs.backend = %s "  # noqa: S608 - identifiers quoted, values bound
        f"AND qs.name = {queue_sql} AND qs.paused = TRUE)"
    )


def flow_lane_due(d: Dialect, backend: str, queues: Sequence[str] | None) -> tuple[str, list[Any]]:
    """SQL (and parameters) true when a pending, due job of a flow group waits in
    ``queues`` (None: any queue) of an unpaused queue: the main-lane claim then leaves
    the claim to :func:`flow_claim`, which takes both lanes in claim order."""
    where = (
        "f.status = 'pending' AND f.flow_group IS NOT NULL AND f.backend = %s "
        f"AND f.run_after <= {d.now} AND {paused_condition(d, 'f.queue')}"
    )
    params: list[Any] = [backend, backend]
    if queues is not None:
        where += f" AND f.queue IN ({placeholders(len(queues))})"
        params.extend(queues)
    return f"EXISTS (SELECT 1 FROM {d.jobs} AS f WHERE {where})", params  # noqa: S608 - identifiers quoted, values bound


def seconds_to_next_due(
    backend: str,
    queues: Sequence[str] | None,
    *,
    skip_tasks: Collection[str] = (),
    using: str = "default",
) -> float | None:
    """Seconds until the earliest pending ``run_after`` in the unpaused ``queues`` (None:
    every queue) of ``backend``, by the database's clock (0: due already); None when
    nothing is pending there. PostgreSQL only (elsewhere 0.0: workers there poll).
    ``skip_tasks``: the jobs of these tasks do not count (a worker that stands aside from
    them would not claim them: ``skipping``).

    A job held back by a full limit counts as due: its worker looks again after
    ``POLL_INTERVAL``, when a slot may have come free. Whether a job is due is asked
    first (each lane's index gives its first due row at once); only when none is, the
    earliest ``run_after`` is read. Paused queues are left out of the list before
    either lane is read, so a paused queue's backlog is not walked.
    """
    d = dialect(using)
    if d.vendor != "postgresql":
        return 0.0
    if queues is not None and not queues:
        return None
    pending, params = _pending(d, backend, queues, skip_tasks)
    earliest = [
        f"(SELECT MIN(j.run_after) FROM {d.jobs} AS j WHERE {lane})"  # noqa: S608 - identifiers quoted, values bound
        for lane in pending
    ]
    sql = (
        f"SELECT CASE WHEN {_any_due(d, pending)} THEN 0 ELSE "  # noqa: S608 - identifiers quoted, values bound
        f"EXTRACT(EPOCH FROM LEAST({', '.join(earliest)}) - statement_timestamp()) END"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params * 4)
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


def due_now(
    backend: str,
    queues: Sequence[str] | None,
    *,
    skip_tasks: Collection[str] = (),
    using: str = "default",
) -> bool:
    """Whether a pending job of the unpaused ``queues`` (None: every queue) of ``backend``
    is due, the jobs of ``skip_tasks`` left out; read without a lock, on every database.

    A claim reads past rows another transaction holds locked (``SKIP LOCKED``: another
    worker's claim, this worker's own renewal, an operator's ``select_for_update``), so
    an empty claim alone does not say that no job is due: a ``--burst`` worker asks this
    before it exits on one.
    """
    if queues is not None and not queues:
        return False
    d = dialect(using)
    pending, params = _pending(d, backend, queues, skip_tasks)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT CASE WHEN {_any_due(d, pending)} THEN 1 ELSE 0 END", params * 2)
        row = cursor.fetchone()
    return bool(row and row[0])


def _pending(
    d: Dialect, backend: str, queues: Sequence[str] | None, skip_tasks: Collection[str]
) -> tuple[list[str], list[Any]]:
    """The conditions (on ``j``) of the pending jobs of ``backend`` in the unpaused
    ``queues`` (None: every queue), one per lane (each lane has its partial index), and
    the parameters of each."""
    if queues is None:
        in_queues = f"AND {paused_condition(d, 'j.queue')}"
        params: list[Any] = [backend, backend]
    elif d.vendor == "postgresql":
        # The paused queues are left out of the list before the lane is read.
        table = d.q(Queue._meta.db_table)
        in_queues = (
            "AND j.queue = ANY(ARRAY(SELECT q.name FROM unnest(%s::text[]) AS q(name) "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE NOT EXISTS (SELECT 1 FROM {table} AS qs WHERE qs.backend = %s "
            "AND qs.name = q.name AND qs.paused = TRUE)))"
        )
        params = [backend, list(queues), backend]
    else:
        in_queues = (
            f"AND j.queue IN ({placeholders(len(queues))}) AND {paused_condition(d, 'j.queue')}"
        )
        params = [backend, *queues, backend]
    params.extend(skip_tasks)
    in_queues += skipping(skip_tasks)
    lanes = [
        f"j.status = 'pending' AND j.flow_group {lane} AND j.backend = %s {in_queues}"
        for lane in ("IS NULL", "IS NOT NULL")
    ]
    return lanes, params


def _any_due(d: Dialect, pending: list[str]) -> str:
    """SQL true when a row of one of the ``pending`` lanes is due (their parameters, in
    order)."""
    return " OR ".join(
        f"EXISTS (SELECT 1 FROM {d.jobs} AS j WHERE {lane} AND j.run_after <= {d.now})"  # noqa: S608 - identifiers quoted, values bound
        for lane in pending
    )


def flow_claim(
    worker_id: str,
    *,
    limit: int,
    lease_duration: float,
    backend: str,
    queues: Sequence[str] | None,
    rules: FlowRules,
    using: str,
    skip_tasks: Collection[str] = (),
) -> tuple[list[tuple[Any, ...]], bool]:
    """Claim up to ``limit`` jobs of both lanes under the flow lock (see the module
    docstring); return the claimed rows (``claim_write.RETURNING``) and whether a limit
    held a due job back (a candidate skipped, or a queue at its limit). The reads pass
    over the jobs of ``skip_tasks`` (``skipping``)."""
    d = dialect(using)

    def work() -> tuple[list[tuple[Any, ...]], bool]:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            _lock(cursor, d, backend)
            serve = _queues_to_serve(cursor, d, backend, queues)
            if not serve:
                return [], False
            running = _running(cursor, d, backend)
            skip = tuple(skip_tasks)
            candidates = _main_lane(cursor, d, backend, serve, rules, limit, running, skip)
            candidates += _flow_lane(cursor, d, backend, serve, limit, running, skip)
            # A queue at its limit was not even read: it holds its jobs back all the same.
            held = any(
                running.by_queue.get(q, 0) >= rules.queue_limits[q]
                for q in serve
                if q in rules.queue_limits
            )
            if not candidates:
                return [], held
            windows = _windows(candidates, rules)
            usage = Usage(
                running_by_queue=running.by_queue,
                running_by_group=running.by_group,
                starts=_starts(cursor, d, backend, windows),
            )
            choice = choose(candidates, usage, rules, limit)
            held = held or choice.held
            chosen = choice.taken
            if not chosen:
                return [], held
            rows = claim_rows(cursor, d, worker_id, [c.id for c in chosen], lease_duration)
            claimed = {int(row[0]) for row in rows}
            _record_starts(
                cursor,
                d,
                backend,
                [s for c in chosen if c.id in claimed for s, _ in _rate_scopes(c, rules)],
            )
            _prune_starts(cursor, d, backend, windows)
            return rows, held

    return retry_deadlocks(using, work)


def _lock(cursor: Any, d: Dialect, backend: str) -> None:
    """Take the backend's flow lock (its row created the first time)."""
    table = d.q(FlowLock._meta.db_table)
    update = f"UPDATE {table} SET claims = claims + 1 WHERE backend = %s"  # noqa: S608 - identifiers quoted, values bound
    cursor.execute(update, [backend])
    if cursor.rowcount == 1:
        return
    if d.vendor == "postgresql":
        insert = f"INSERT INTO {table} (backend, claims) VALUES (%s, 1) ON CONFLICT DO NOTHING"  # noqa: S608 - identifiers quoted, values bound
    elif d.vendor == "sqlite":
        insert = f"INSERT OR IGNORE INTO {table} (backend, claims) VALUES (%s, 1)"  # noqa: S608 - identifiers quoted, values bound
    else:
        insert = f"INSERT IGNORE INTO {table} (backend, claims) VALUES (%s, 1)"  # noqa: S608 - identifiers quoted, values bound
    cursor.execute(insert, [backend])
    if cursor.rowcount != 1:  # another worker created it first: wait for its lock
        cursor.execute(update, [backend])
        if cursor.rowcount != 1:
            # Only a snapshot older than the row can miss it (REPEATABLE READ or stricter):
            # the limits cannot be counted safely without the lock.
            raise OperationalError(
                f"could not lock the flow-control row of backend {backend!r}: flow control "
                "needs the READ COMMITTED isolation level (Django's default)"
            )


def _queues_to_serve(
    cursor: Any, d: Dialect, backend: str, queues: Sequence[str] | None
) -> list[str]:
    """``queues`` without the paused ones; for a worker of every queue, the queues that
    hold pending jobs (a skip scan of the pending indexes on PostgreSQL)."""
    cursor.execute(
        f"SELECT name FROM {d.q(Queue._meta.db_table)} WHERE backend = %s AND paused = TRUE",  # noqa: S608 - identifiers quoted, values bound
        [backend],
    )
    paused = {name for (name,) in cursor.fetchall()}
    if queues is None:
        queues = _pending_queues(cursor, d, backend)
    return [q for q in dict.fromkeys(queues) if q not in paused]


def _pending_queues(cursor: Any, d: Dialect, backend: str) -> list[str]:
    found: set[str] = set()
    for lane in ("IS NULL", "IS NOT NULL"):
        where = f"f.status = 'pending' AND f.flow_group {lane} AND f.backend = %s"
        if d.vendor == "postgresql":
            sql = (
                "WITH RECURSIVE qs(name) AS ("  # noqa: S608 - identifiers quoted, values bound
                f"(SELECT f.queue FROM {d.jobs} AS f WHERE {where} ORDER BY f.queue LIMIT 1) "
                f"UNION ALL SELECT (SELECT f.queue FROM {d.jobs} AS f WHERE {where} "
                "AND f.queue > qs.name ORDER BY f.queue LIMIT 1) FROM qs WHERE qs.name IS NOT NULL"
                ") SELECT name FROM qs WHERE name IS NOT NULL"
            )
            cursor.execute(sql, [backend, backend])
        else:
            cursor.execute(f"SELECT DISTINCT f.queue FROM {d.jobs} AS f WHERE {where}", [backend])  # noqa: S608 - identifiers quoted, values bound
        found.update(name for (name,) in cursor.fetchall())
    return sorted(found)


def _running(cursor: Any, d: Dialect, backend: str) -> Running:
    """Running jobs whose lease has not expired, per queue and per flow group."""
    cursor.execute(
        f"SELECT j.queue, j.flow_group, COUNT(*), MIN(j.concurrency_limit) FROM {d.jobs} AS j "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE j.status = 'running' AND j.backend = %s AND j.locked_until > {d.now} "
        "GROUP BY j.queue, j.flow_group",
        [backend],
    )
    by_queue: Counter[str] = Counter()
    by_group: Counter[str] = Counter()
    limits: dict[str, int] = {}
    for queue, group, count, lowest in cursor.fetchall():
        by_queue[queue] += int(count)
        if group is not None:
            by_group[group] += int(count)
            if lowest is not None:
                lowest = max(int(lowest), 1)
                limits[group] = min(limits.get(group, lowest), lowest)
    return Running(dict(by_queue), dict(by_group), limits)


def skipping(skip_tasks: Collection[str]) -> str:
    """The condition that leaves the jobs of ``skip_tasks`` alone, to append to a claim's
    WHERE with the task paths as its parameters ('' when there are none): the claim reads
    past them, as it reads past locked rows."""
    if not skip_tasks:
        return ""
    return f" AND j.task_path NOT IN ({placeholders(len(skip_tasks))})"


def _select_candidates(d: Dialect) -> str:
    return ", ".join(f"j.{d.q(c)}" for c in CANDIDATE_COLUMNS)


def _main_lane(
    cursor: Any,
    d: Dialect,
    backend: str,
    queues: Sequence[str],
    rules: FlowRules,
    limit: int,
    running: Running,
    skip: tuple[str, ...],
) -> list[Candidate]:
    """Each queue's first due jobs outside flow groups (none of ``skip``'s tasks): as many
    as the queue may start."""
    parts: list[str] = []
    params: list[Any] = []
    for queue in queues:
        wanted = limit
        if queue in rules.queue_limits:
            wanted = min(wanted, rules.queue_limits[queue] - running.by_queue.get(queue, 0))
        if wanted <= 0:
            continue
        parts.append(
            f"SELECT * FROM (SELECT {_select_candidates(d)} FROM {d.jobs} AS j "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE j.status = 'pending' AND j.flow_group IS NULL AND j.backend = %s "
            f"AND j.queue = %s AND j.run_after <= {d.now}{skipping(skip)} "
            f"ORDER BY j.priority DESC, j.run_after, j.id LIMIT %s) AS q{len(parts)}"
        )
        params += [backend, queue, *skip, wanted]
    if not parts:
        return []
    cursor.execute(" UNION ALL ".join(parts), params)
    return [_candidate(row) for row in cursor.fetchall()]


WINDOW_PER_CLAIM = 4
"""The flow lane's window: the first ``WINDOW_PER_CLAIM * limit`` due jobs of each queue
in claim order, read first (``_flow_lane``)."""


def _flow_lane(
    cursor: Any,
    d: Dialect,
    backend: str,
    queues: Sequence[str],
    limit: int,
    running: Running,
    skip: tuple[str, ...],
) -> list[Candidate]:
    """The first due jobs of the flow groups in ``queues`` (none of ``skip``'s tasks): at
    least each group's first ones that may start, never a held-back group's backlog (on
    PostgreSQL).

    PostgreSQL: first the window, each queue's first ``WINDOW_PER_CLAIM * limit`` due
    flow jobs in claim order (``leasejobs_job_flow_order_idx``): the earliest candidates
    there are, read in a few index pages when nothing in front is held back. When the
    window is full and its groups that may start cannot fill the claim, a skip scan of
    ``leasejobs_job_flow_idx`` finds every group with pending jobs in the queue (one
    index probe per group) and reads the first due jobs of each group that is not full:
    a full group's backlog is never read. Elsewhere: the due flow jobs of the queues,
    numbered per group by a window function, each group's first ``limit``.
    """
    if d.vendor != "postgresql":
        return _flow_lane_numbered(cursor, d, backend, queues, limit, skip)
    lane = "j.status = 'pending' AND j.flow_group IS NOT NULL AND j.backend = %s"
    columns = _select_candidates(d)
    window = WINDOW_PER_CLAIM * limit
    parts = [
        f"SELECT * FROM (SELECT {columns} FROM {d.jobs} AS j WHERE {lane} AND j.queue = %s "  # noqa: S608 - identifiers quoted, values bound
        f"AND j.run_after <= {d.now}{skipping(skip)} "
        f"ORDER BY j.priority DESC, j.run_after, j.id LIMIT %s) AS w{n}"
        for n in range(len(queues))
    ]
    cursor.execute(
        " UNION ALL ".join(parts),
        [value for queue in queues for value in (backend, queue, *skip, window)],
    )
    found = [_candidate(row) for row in cursor.fetchall()]
    full = set(running.full_groups())
    per_queue = Counter(c.queue for c in found)
    crowded = [q for q in queues if per_queue[q] >= window]
    if not crowded or _room(found, running, full) >= limit:
        return found
    seen = {c.id for c in found}
    # The recursive scan's estimated cost can pass jit_above_cost: compiling it would
    # cost more (tens of milliseconds) than running it. For this transaction only.
    cursor.execute("SET LOCAL jit = off")
    more = _flow_lane_by_group(cursor, d, backend, crowded, limit, sorted(full), skip)
    return found + [c for c in more if c.id not in seen]


def _room(found: Sequence[Candidate], running: Running, full: set[str]) -> int:
    """How many of ``found`` their groups' limits could let start (rates aside)."""
    counts = Counter(c.flow_group for c in found if c.flow_group not in full)
    limits = {c.flow_group: c.concurrency_limit for c in found}
    room = 0
    for group, count in counts.items():
        limit = limits.get(group)
        free = count if limit is None else limit - running.by_group.get(group or "", 0)
        room += max(0, min(count, free))
    return room


def _flow_lane_by_group(
    cursor: Any,
    d: Dialect,
    backend: str,
    queues: Sequence[str],
    limit: int,
    full: Sequence[str],
    skip: tuple[str, ...],
) -> list[Candidate]:
    """PostgreSQL: every flow group of ``queues`` by a skip scan, and the first ``limit``
    due jobs (none of ``skip``'s tasks) of each group not in ``full``."""
    lane = "j.status = 'pending' AND j.flow_group IS NOT NULL AND j.backend = %s"
    probe = lane.replace("j.", "f.")
    sql = (
        "WITH RECURSIVE g(queue, name) AS ("  # noqa: S608 - identifiers quoted, values bound
        f"SELECT q.name, (SELECT f.flow_group FROM {d.jobs} AS f WHERE {probe} "
        "AND f.queue = q.name ORDER BY f.flow_group LIMIT 1) "
        "FROM unnest(%s::text[]) AS q(name) "
        f"UNION ALL SELECT g.queue, (SELECT f.flow_group FROM {d.jobs} AS f WHERE {probe} "
        "AND f.queue = g.queue AND f.flow_group > g.name ORDER BY f.flow_group LIMIT 1) "
        "FROM g WHERE g.name IS NOT NULL) "
        f"SELECT p.* FROM g CROSS JOIN LATERAL (SELECT {_select_candidates(d)} "
        f"FROM {d.jobs} AS j WHERE {lane} AND j.queue = g.queue AND j.flow_group = g.name "
        f"AND j.run_after <= {d.now}{skipping(skip)} "
        "ORDER BY j.priority DESC, j.run_after, j.id LIMIT %s) "
        "AS p WHERE g.name IS NOT NULL AND NOT g.name = ANY(%s::text[])"
    )
    params = [backend, list(queues), backend, backend, *skip, limit, list(full)]
    cursor.execute(sql, params)
    return [_candidate(row) for row in cursor.fetchall()]


def _flow_lane_numbered(
    cursor: Any, d: Dialect, backend: str, queues: Sequence[str], limit: int, skip: tuple[str, ...]
) -> list[Candidate]:
    """SQLite, MySQL/MariaDB: each group's first ``limit`` due jobs in ``queues`` (none of
    ``skip``'s tasks)."""
    lane = "j.status = 'pending' AND j.flow_group IS NOT NULL AND j.backend = %s"
    sql = (
        f"SELECT {', '.join(d.q(c) for c in CANDIDATE_COLUMNS)} FROM (SELECT "  # noqa: S608 - identifiers quoted, values bound
        f"{_select_candidates(d)}, ROW_NUMBER() OVER (PARTITION BY j.flow_group "
        "ORDER BY j.priority DESC, j.run_after, j.id) AS rn "
        f"FROM {d.jobs} AS j WHERE {lane} AND j.run_after <= {d.now}{skipping(skip)} "
        f"AND j.queue IN ({placeholders(len(queues))})) AS c WHERE c.rn <= %s"
    )
    cursor.execute(sql, [backend, *skip, *queues, limit])
    return [_candidate(row) for row in cursor.fetchall()]


def _candidate(row: Sequence[Any]) -> Candidate:
    values = dict(zip(CANDIDATE_COLUMNS, row, strict=True))
    rate = None
    if values["rate_limit"]:
        try:
            rate = parse_rate(values["rate_limit"])
        except ValueError:  # a row written by hand: a rate that cannot be read limits nothing
            rate = None
    limit = values["concurrency_limit"]
    return Candidate(
        id=int(values["id"]),
        queue=values["queue"],
        flow_group=values["flow_group"],
        concurrency_limit=None if limit is None else max(int(limit), 1),
        rate_limit=rate,
        task_path=values["task_path"],
        priority=int(values["priority"]),
        run_after=_comparable(values["run_after"]),
    )


def _comparable(value: Any) -> Any:
    """``run_after`` as read (SQLite gives text): one kind for every row, for sorting."""
    return value if isinstance(value, datetime) else str(value)


def _windows(candidates: Sequence[Candidate], rules: FlowRules) -> dict[str, float]:
    """Rate scope -> the longest period any candidate's rate of it names."""
    windows: dict[str, float] = {}
    for job in candidates:
        for scope, rate in _rate_scopes(job, rules):
            windows[scope] = max(windows.get(scope, 0.0), rate.period)
    return windows


def _starts(
    cursor: Any, d: Dialect, backend: str, windows: Mapping[str, float]
) -> dict[tuple[str, float], int]:
    """Starts per (scope, period) within the last period, for every period up to the
    scope's window (a scope's candidates may name different rates after a deploy)."""
    if not windows:
        return {}
    from ..limits import PERIODS

    counts, params = [], []
    keys = []
    for scope, window in windows.items():
        for period in sorted({p for p in PERIODS.values() if p <= window}):
            counts.append(
                f"SUM(CASE WHEN scope = %s AND started_at > {d.now_plus} THEN 1 ELSE 0 END)"
            )
            params += [scope, d.offset(-period)]
            keys.append((scope, period))
    longest = max(windows.values())
    table = d.q(RateStart._meta.db_table)
    cursor.execute(
        f"SELECT {', '.join(counts)} FROM {table} WHERE backend = %s "  # noqa: S608 - identifiers quoted, values bound
        f"AND scope IN ({placeholders(len(windows))}) AND started_at > {d.now_plus}",
        [*params, backend, *windows, d.offset(-longest)],
    )
    row = cursor.fetchone()
    return {key: int(value or 0) for key, value in zip(keys, row, strict=True)}


def _record_starts(cursor: Any, d: Dialect, backend: str, scopes: Sequence[str]) -> None:
    if not scopes:
        return
    table = d.q(RateStart._meta.db_table)
    rows = ", ".join([f"(%s, %s, {d.now})"] * len(scopes))
    params = [value for scope in scopes for value in (backend, scope)]
    cursor.execute(f"INSERT INTO {table} (backend, scope, started_at) VALUES {rows}", params)  # noqa: S608 - identifiers quoted, values bound


def _prune_starts(cursor: Any, d: Dialect, backend: str, windows: Mapping[str, float]) -> None:
    """Forget the starts of the scopes this claim read that are older than their window."""
    if not windows:
        return
    table = d.q(RateStart._meta.db_table)
    conditions = " OR ".join([f"(scope = %s AND started_at <= {d.now_plus})"] * len(windows))
    params: list[Any] = [backend]
    for scope, window in windows.items():
        params += [scope, d.offset(-window)]
    cursor.execute(f"DELETE FROM {table} WHERE backend = %s AND ({conditions})", params)  # noqa: S608 - identifiers quoted, values bound
