"""Fan-in counters: a workflow step with many parents counts them down in several rows.

A step with more than :data:`FANIN_WIDTH` parents gets ``ceil(parents / FANIN_WIDTH)``
rows in ``leasejobs_fanin``, each counting one contiguous run of its parents by position
(a chord's members in their order, so in id order: one completion batch of consecutive
members touches one or two counters, and workers that claimed different ranges touch
different ones). Its edges name their counter (``leasejobs_dependency.fanin_id``), and
its ``waiting_on`` counts its counters that have not reached zero. A step with fewer
parents has no counter: each edge counts it down directly.

Settling ended parents (``dependants.py``) first locks their counters in id order and
takes from each the number of its parents among them; only a counter that reaches zero
in that write counts its child down, so a member's settle takes the child's row lock
about ``parents / FANIN_WIDTH`` times in all, and never while its counter has parents
left. Lock order, in every write that takes both: counters (id order), then jobs (id
order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections

from ..models import Dependency, FanIn
from .dialect import Dialect, id_chunks

FANIN_WIDTH = 64
"""Parents per counter. A settle of one counter's members waits only for the other
writers of that counter; the child's row lock is taken once per counter. 64 keeps the
counters of a 10,000-member chord to 157 rows, while a worker's completion batch (up to
a few dozen consecutive members) mostly falls in one counter."""


def waits_for(parents: int) -> int:
    """The ``waiting_on`` of a new step with ``parents`` edges: its parents, or its
    counters when it has more than :data:`FANIN_WIDTH`."""
    if parents <= FANIN_WIDTH:
        return parents
    return -(-parents // FANIN_WIDTH)


def runs(parents: int) -> list[int]:
    """The sizes of the counters of a step with ``parents`` edges, in position order (as
    even as they can be); empty when it has none."""
    count = waits_for(parents)
    if count == parents:
        return []
    return [len(range(n * parents // count, (n + 1) * parents // count)) for n in range(count)]


def insert_counters(counters: Sequence[tuple[int, int]], *, using: str) -> list[int]:
    """Insert counters ``(child, remaining)``; their ids, in order. One multi-row INSERT
    returning the ids where the database can (PostgreSQL, SQLite, MariaDB), else one
    INSERT per counter (MySQL, as ``LeaseJobsBackend`` inserts jobs there)."""
    rows = [FanIn(child_id=child, remaining=remaining) for child, remaining in counters]
    if not rows:
        return []
    manager = FanIn.objects.using(using)
    if connections[using].features.can_return_rows_from_bulk_insert:
        manager.bulk_create(rows)
    else:
        for row in rows:
            row.save(using=using)
    return [int(row.pk) for row in rows]


def table(d: Dialect) -> str:
    return d.q(FanIn._meta.db_table)


def _edges(d: Dialect) -> str:
    return d.q(Dependency._meta.db_table)


def drops_sql(
    d: Dialect, parents: tuple[str, list[Any]], among: tuple[str, list[Any]]
) -> tuple[str, list[Any]]:
    """PostgreSQL: the CTEs (``WITH`` list items) that take the ended ``parents`` (an
    ``IN`` clause and its parameters) from their counters, locked in id order, and name
    ``drops``: (child_id, n), what each child's ``waiting_on`` loses: its counters that
    reached zero here, and its direct edges from ``parents``. ``among`` (``IN`` and
    parameters, or ``("", [])``): only these children."""
    in_parents, parent_params = parents
    in_among, among_params = among
    only = f" AND e.child_id {in_among}" if in_among else ""
    edges, counters = _edges(d), table(d)
    sql = (
        f"hits AS (SELECT e.fanin_id AS id, COUNT(*) AS n FROM {edges} AS e "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE e.parent_id {in_parents} AND e.fanin_id IS NOT NULL{only} GROUP BY e.fanin_id), "
        f"locked AS MATERIALIZED (SELECT f.id FROM {counters} AS f "
        "WHERE f.id IN (SELECT id FROM hits) ORDER BY f.id FOR UPDATE), "
        f"dropped AS (UPDATE {counters} AS f SET remaining = f.remaining - h.n FROM hits AS h "
        "WHERE f.id = h.id AND f.id IN (SELECT id FROM locked) "
        "RETURNING f.child_id, f.remaining, h.n AS hit), "
        "drops AS (SELECT child_id, COUNT(*) AS n FROM ("
        "SELECT child_id FROM dropped WHERE remaining <= 0 AND remaining + hit > 0 "
        f"UNION ALL SELECT e.child_id FROM {edges} AS e "
        f"WHERE e.parent_id {in_parents} AND e.fanin_id IS NULL{only}"
        ") AS counted GROUP BY child_id)"
    )
    return sql, [*parent_params, *among_params, *parent_params, *among_params]


def drop(
    d: Dialect, cursor: Any, parents: tuple[str, list[Any]], among: tuple[str, list[Any]]
) -> dict[int, list[int]]:
    """Take the ended ``parents`` from their counters (``among``: only the counters of
    these children). Returns, per child, its counters that reached zero in this write:
    each counts the child down by one.

    The counters are found from the edges first, then locked by id in id order: a
    locking read that joins the edges could lock more than it returns (InnoDB locks the
    rows it examines)."""
    in_parents, parent_params = parents
    in_among, among_params = among
    only = f" AND e.child_id {in_among}" if in_among else ""
    edges, counters = _edges(d), table(d)
    cursor.execute(
        f"SELECT e.fanin_id, COUNT(*) FROM {edges} AS e "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE e.parent_id {in_parents} AND e.fanin_id IS NOT NULL{only} GROUP BY e.fanin_id",
        [*parent_params, *among_params],
    )
    hits = {int(counter): int(n) for counter, n in cursor.fetchall()}
    lock = " FOR UPDATE" if d.row_locks else ""
    emptied: dict[int, list[int]] = {}
    for chunk in id_chunks(sorted(hits)):
        in_chunk, chunk_params = d.in_ids(chunk)
        cursor.execute(
            f"SELECT id, child_id, remaining FROM {counters} "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE id {in_chunk} ORDER BY id{lock}",
            chunk_params,
        )
        found = [(int(i), int(child), int(left)) for i, child, left in cursor.fetchall()]
        by_hits: dict[int, list[int]] = {}
        for counter, child, left in found:
            by_hits.setdefault(hits[counter], []).append(counter)
            if left > 0 >= left - hits[counter]:
                emptied.setdefault(child, []).append(counter)
        for n, ids in sorted(by_hits.items()):
            in_ids, ids_params = d.in_ids(ids)
            cursor.execute(
                f"UPDATE {counters} SET remaining = remaining - %s WHERE id {in_ids}",  # noqa: S608 - identifiers quoted, values bound
                [n, *ids_params],
            )
    return emptied


def give_back(d: Dialect, cursor: Any, hits: dict[int, int]) -> dict[int, int]:
    """Add back to the counters ``hits`` (counter -> parents) the parents being run again
    (``dependants.give_back``), locked in id order. Returns, per child, its counters
    that come back above zero: each had counted the child down when it reached zero."""
    lock = " FOR UPDATE" if d.row_locks else ""
    reopened: dict[int, int] = {}
    by_hits: dict[int, list[int]] = {}
    for chunk in id_chunks(sorted(hits)):
        in_chunk, chunk_params = d.in_ids(chunk)
        cursor.execute(
            f"SELECT id, child_id, remaining FROM {table(d)} "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE id {in_chunk} ORDER BY id{lock}",
            chunk_params,
        )
        for counter, child, left in cursor.fetchall():
            n = hits[int(counter)]
            by_hits.setdefault(n, []).append(int(counter))
            if int(left) <= 0 < int(left) + n:
                reopened[int(child)] = reopened.get(int(child), 0) + 1
    for n, ids in sorted(by_hits.items()):
        for chunk in id_chunks(ids):
            in_ids, ids_params = d.in_ids(chunk)
            cursor.execute(
                f"UPDATE {table(d)} SET remaining = remaining + %s WHERE id {in_ids}",  # noqa: S608 - identifiers quoted, values bound
                [n, *ids_params],
            )
    return reopened


def lock_of_steps(d: Dialect, cursor: Any, workflow_id: int, statuses: Sequence[str]) -> None:
    """Lock the counters of the steps of a workflow in ``statuses``, in id order: before
    those steps' rows, as every settle takes them (no-op without row locks)."""
    if not d.row_locks:
        return
    marks = ", ".join(["%s"] * len(statuses))
    cursor.execute(
        f"SELECT f.id FROM {table(d)} AS f WHERE f.child_id IN (SELECT id FROM {d.jobs} "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE workflow_id = %s AND status IN ({marks})) ORDER BY f.id FOR UPDATE",
        [workflow_id, *statuses],
    )


def recount(d: Dialect, cursor: Any, children: Sequence[int]) -> dict[int, int]:
    """Reset the counters of ``children`` (steps being retried) to their parents that have
    not succeeded (a missing parent counts as finished); returns, per child, its counters
    left above zero."""
    edges, counters = _edges(d), table(d)
    open_counters: dict[int, int] = {}
    for chunk in id_chunks(sorted(children)):
        in_chunk, chunk_params = d.in_ids(chunk)
        cursor.execute(
            f"UPDATE {counters} AS f SET remaining = (SELECT COUNT(*) FROM {edges} AS e "  # noqa: S608 - identifiers quoted, values bound
            f"JOIN {d.jobs} AS p ON p.id = e.parent_id WHERE e.child_id = f.child_id "
            "AND e.fanin_id = f.id AND p.status <> 'succeeded') "
            f"WHERE f.child_id {in_chunk}",
            chunk_params,
        )
        cursor.execute(
            f"SELECT child_id, COUNT(*) FROM {counters} "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE child_id {in_chunk} AND remaining > 0 GROUP BY child_id",
            chunk_params,
        )
        open_counters.update((int(child), int(count)) for child, count in cursor.fetchall())
    return open_counters
