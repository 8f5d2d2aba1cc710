"""Fenced writes by a lease holder to many rows at once, on both paths.

The fence: the row is this job, at this attempt, held by this worker, still running.
Rows are locked first, in id order, skipping rows another transaction holds (the order
renewals, batched writes and the reaper all use, so they never deadlock). A row that is
locked elsewhere and still names this worker as holder is *skipped*: neither written
nor lost, to be tried again. SQLite serialises writers, so nothing is skipped there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import connections, transaction

from ..exceptions import LeaseLost
from .dialect import Dialect, native_timestamps, placeholders, retry_deadlocks

HELD = "locked_by = %s AND status = 'running'"
"""The rows a worker holds (its leases), whatever the attempt: one parameter."""
FENCE = "j.id = %s AND j.attempt = %s AND j.locked_by = %s AND j.status = 'running'"
"""The fence of one lease: job id, attempt, worker."""

Lease = tuple[int, int]
Rows = list[tuple[Any, ...]]
SetList = Callable[[Callable[[str], str]], str]
"""Builds a SET list from a function giving the SQL of each per-row value by name."""


def batched(
    d: Dialect,
    worker_id: str,
    asked: Mapping[Lease, Mapping[str, Any]],
    set_sql: SetList,
    kinds: Mapping[str, str],
    returning: Sequence[str] = (),
) -> tuple[Rows, frozenset[Lease]]:
    """One statement for every row: ``UPDATE ... AS j SET ... FROM (VALUES ...) AS v``
    (``Dialect.rows_from``) with the fence and the row locks in its WHERE clause,
    ``RETURNING`` what was written; ``kinds`` names each per-row value and its type, in
    the order of ``v``'s columns (after the job id and the attempt)."""
    names = list(kinds)
    position = {name: index for index, name in enumerate(names, start=3)}
    rows = [(*lease, *(values[name] for name in names)) for lease, values in asked.items()]
    source, params = d.rows_from(rows, ("id", "int", *kinds.values()))
    update = (
        f"UPDATE {d.jobs} AS j SET {set_sql(lambda name: f'v.column{position[name]}')} "  # noqa: S608 - identifiers quoted, values bound
        f"FROM {source} "
        "WHERE j.id = v.column1 AND j.attempt = v.column2 AND j.locked_by = %s "
    )
    columns = ", ".join(d.q(c) for c in ("id", "attempt", *returning))
    with connections[d.using].cursor() as cursor:
        native_timestamps(cursor)  # (the caller reads datetimes with datetime_reader)
        if not d.row_locks:
            cursor.execute(
                f"{update}AND j.status = 'running' RETURNING {columns}", [*params, worker_id]
            )
            return [tuple(row) for row in cursor.fetchall()], frozenset()
        wanted = set(asked)
        ids = sorted({job_id for job_id, _ in wanted})
        in_ids, id_params = d.in_ids(ids)
        # ``mine`` locks the rows this worker holds (``HELD``: its id, status 'running'),
        # for the rest of the statement: the UPDATE re-checks the attempt and the holder,
        # and leaves ``status`` to ``mine``. A status test in the UPDATE lets the planner
        # read the rows through an index on ``status``: with statistics taken while few
        # jobs ran, it expects one running row and reads every running row of every
        # worker for each row it writes (seconds for a few hundred leases, so a renewal
        # could end after the lease it extends: bench/overload.py). Without it, only the
        # primary key reaches ``j``.
        sql = (
            f"WITH mine AS (SELECT id FROM {d.jobs} WHERE id {in_ids} "  # noqa: S608 - identifiers quoted, values bound
            f"AND {HELD} ORDER BY id{d.skip_locked}) "
            f"{update}AND j.id IN (SELECT id FROM mine) RETURNING {columns}"
        )
        cursor.execute(sql, [*id_params, worker_id, *params, worker_id])
        rows = [tuple(row) for row in cursor.fetchall()]
        missing = set(ids) - {int(row[0]) for row in rows}
        return rows, _skipped(cursor, d, worker_id, wanted, missing)


def portable(
    d: Dialect,
    worker_id: str,
    asked: Mapping[Lease, Mapping[str, Any]],
    set_sql: SetList,
    kinds: Mapping[str, str],
    returning: Sequence[str] = (),
) -> tuple[Rows, frozenset[Lease]]:
    """The portable path of :func:`batched`, in three statements however many rows: lock
    the rows, one fenced UPDATE whose per-row values are ``CASE j.id WHEN ... END``, then
    read the written rows back. Call inside a transaction."""
    wanted = set(asked)
    ids = sorted({job_id for job_id, _ in wanted})
    with connections[d.using].cursor() as cursor:
        cursor.execute(
            f"SELECT id, attempt FROM {d.jobs} WHERE id IN ({placeholders(len(ids))}) "  # noqa: S608 - identifiers quoted, values bound
            f"AND {HELD} ORDER BY id{d.skip_locked}",
            [*ids, worker_id],
        )
        locked = {(int(job_id), int(attempt)) for job_id, attempt in cursor.fetchall()}
        mine = sorted(locked & wanted)
        if mine:
            params: list[Any] = []

            def by_row(name: str) -> str:  # one CASE per value, in the order the SQL uses them
                whens = " ".join([f"WHEN %s THEN {d.param(kinds[name])}"] * len(mine))
                for lease in mine:
                    params.extend((lease[0], asked[lease][name]))
                return f"(CASE j.id {whens} END)"

            set_list = set_sql(by_row)
            fence = " ".join(["WHEN %s THEN %s"] * len(mine))
            cursor.execute(
                f"UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
                f"WHERE j.id IN ({placeholders(len(mine))}) "
                f"AND j.attempt = (CASE j.id {fence} END) AND {HELD}",
                [*params, *(job_id for job_id, _ in mine), *itertools.chain(*mine), worker_id],
            )
        rows = read_back(d, cursor, [job_id for job_id, _ in mine], ("id", "attempt", *returning))
        missing = set(ids) - {job_id for job_id, _ in locked}
        return rows, _skipped(cursor, d, worker_id, wanted, missing)


def lock_update_read(
    d: Dialect,
    lock: tuple[str, Sequence[Any]],
    update: tuple[str, str, Sequence[Any]],
    returning: Sequence[str],
) -> Rows:
    """A set-based transition on the portable path (the claim, the reap), in one
    transaction: ``lock`` (a SELECT of ids ``FOR UPDATE SKIP LOCKED``, and its parameters)
    picks and locks the rows, ``update`` (SET list, WHERE condition re-checked on each
    row, their parameters) changes them, and the rows come back as ``returning``."""
    with transaction.atomic(using=d.using), connections[d.using].cursor() as cursor:
        cursor.execute(*lock)
        ids = [int(job_id) for (job_id,) in cursor.fetchall()]
        if not ids:
            return []
        set_list, where, params = update
        cursor.execute(
            f"UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE {where} AND j.id IN ({placeholders(len(ids))})",
            [*params, *ids],
        )
        return read_back(d, cursor, ids, returning)


def read_back(d: Dialect, cursor: Any, ids: Sequence[int], returning: Sequence[str]) -> Rows:
    """``returning`` of the rows ``ids``, in id order (the portable path's RETURNING)."""
    if not ids:
        return []
    columns = ", ".join(d.q(c) for c in returning)
    cursor.execute(
        f"SELECT {columns} FROM {d.jobs} WHERE id IN ({placeholders(len(ids))}) ORDER BY id",  # noqa: S608 - identifiers quoted, values bound
        list(ids),
    )
    return [tuple(row) for row in cursor.fetchall()]


def _skipped(
    cursor: Any, d: Dialect, worker_id: str, wanted: set[Lease], missing: set[int]
) -> frozenset[Lease]:
    """Of the rows not written, those that still name this worker as holder: another
    transaction held them locked (rare: an admin edit, a migration, a racing reaper)."""
    if not missing or not d.row_locks:
        return frozenset()
    in_ids, id_params = d.in_ids(sorted(missing))
    cursor.execute(
        f"SELECT id, attempt FROM {d.jobs} WHERE id {in_ids} AND {HELD}",  # noqa: S608 - identifiers quoted, values bound
        [*id_params, worker_id],
    )
    found = {(int(job_id), int(attempt)) for job_id, attempt in cursor.fetchall()}
    return frozenset(found & wanted)


def write(
    d: Dialect,
    worker_id: str,
    asked: Mapping[Lease, Mapping[str, Any]],
    set_sql: SetList,
    kinds: Mapping[str, str],
    returning: Sequence[str] = (),
) -> tuple[Rows, frozenset[Lease]]:
    """One fenced write of every lease in ``asked`` on the path ``d`` takes.

    ``set_sql(value)`` builds the SET list once for both paths; ``value(name)`` is the
    SQL of the row's value ``name`` (a column of the ``VALUES`` list, or a parameter).
    Returns ``(id, attempt, *returning)`` per written row, and the skipped leases.
    """
    if not asked:
        return [], frozenset()
    if d.batched:
        return batched(d, worker_id, asked, set_sql, kinds, returning)

    def locked_write() -> tuple[Rows, frozenset[Lease]]:
        with transaction.atomic(using=d.using):
            return portable(d, worker_id, asked, set_sql, kinds, returning)

    return retry_deadlocks(d.using, locked_write)


def bind(set_sql: SetList, values: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """``set_sql`` with each per-row value as a parameter: the SQL and its parameters."""
    params: list[Any] = []

    def value(name: str) -> str:
        params.append(values[name])  # in the order the SET list uses them
        return "%s"

    return set_sql(value), params


def update_one(
    d: Dialect,
    lease: Lease,
    worker_id: str,
    set_sql: SetList,
    values: Mapping[str, Any],
    transition: str,
) -> None:
    """One fenced UPDATE of one row that waits for a row lock held elsewhere (a job's own
    writes from inside its attempt, :func:`complete`); :class:`LeaseLost` when the lease
    is not this worker's."""
    set_list, params = bind(set_sql, values)

    def update() -> int:
        with connections[d.using].cursor() as cursor:
            cursor.execute(
                f"UPDATE {d.jobs} AS j SET {set_list} WHERE {FENCE}",  # noqa: S608 - identifiers quoted, values bound
                [*params, *lease, worker_id],
            )
            return int(cursor.rowcount)

    if retry_deadlocks(d.using, update) != 1:
        raise LeaseLost(*lease, worker_id, transition)
