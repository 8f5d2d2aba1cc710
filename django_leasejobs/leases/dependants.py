"""Workflow steps after a parent ends: release them, or end them without running.

Every write that ends a workflow step for good (its success, a failure with no retry
left, a dead letter, a cancel, a reap that ends it) calls :func:`settle` in the SAME
transaction, so the release is committed with the parent's outcome or not at all: a
worker killed after the commit cannot lose it, and one killed before it leaves the
parent running, to be re-run and settle then.

A waiting step counts its parents that have not finished (``waiting_on``), or, with more
than ``fanin.FANIN_WIDTH`` parents, its fan-in counters that have not reached zero
(``fanin.py``). Settling a batch of ended parents first takes them from their counters
(locked in id order), then locks the waiting children it changes in id order (the order
every settle takes, counters before jobs, so two settles never deadlock), then in one
statement per kind:

* a child with a parent that ended without succeeding, and no ``on_parent_failure="run"``,
  ends ``failed`` without running, with an error that names that parent; its own
  dependants are settled the same way (transitively);
* every other child's ``waiting_on`` drops by the number of its direct parents in the
  batch and of its counters that reached zero, and the child whose count reaches zero
  becomes ``pending``: claimable.

Two parents that end at once in two workers each take the lock of what they count down
(their counter, or the child's row): the second waits for the first's commit and reads
the count the first left, so exactly one of them empties the counter, and exactly one
makes the child pending. Nothing counts a whole group: each settle touches only the
counters and children of the parents it ends, and a member of a wide chord takes the
callback's row lock only when its counter reaches zero.

A retry of a step that ended without succeeding (an operator's, a bulk one,
``retry_failed_steps``) first gives back what its end counted down
(:func:`give_back`, same lock order): its new end settles its waiting dependants once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from ..models import Dependency
from . import fanin
from .dialect import Dialect, dialect, id_chunks
from .enqueue import NOTIFY_CHANNEL, notify

PARENT_FAILED_CLASS = "django_leasejobs.exceptions.ParentFailed"


@dataclass(frozen=True, slots=True)
class EndedStep:
    """A workflow step whose status was just made final, in the transaction at hand."""

    id: int
    succeeded: bool
    task_path: str = ""
    status: str = ""


@dataclass(frozen=True, slots=True)
class Settled:
    """What :func:`settle` changed: the steps made claimable (id, queue), and those
    ended without running."""

    released: list[tuple[int, str]]
    failed: list[int]


def parent_failed_message(parent: int, task_path: str, status: str) -> str:
    return (
        f"not run: its parent step #{parent} ({task_path or 'unknown task'}) ended "
        f"{status or 'without succeeding'}"
    )


def settle_and_notify(
    d: Dialect, ended: Sequence[EndedStep], *, only: Sequence[int] | None = None
) -> Settled:
    """:func:`settle`, then wake the workers of the released steps' queues (PostgreSQL's
    ``NOTIFY``, delivered when the caller's transaction commits)."""
    if not ended:
        return Settled([], [])
    settled = settle(d, ended, only=only)
    if settled.released:
        notify(NOTIFY_CHANNEL, {queue for _, queue in settled.released}, using=d.using)
    return settled


def settle_new_steps(
    ended: Sequence[EndedStep], *, only: Sequence[int], using: str = "default"
) -> Settled:
    """Settle the new steps ``only`` of a workflow being written that wait for the jobs
    ``ended``, which had finished before (:func:`settle` with ``only``)."""
    return settle_and_notify(dialect(using), ended, only=only)


def steps_of(d: Dialect, ids: Sequence[int], *, succeeded: bool) -> list[EndedStep]:
    """The workflow steps among the jobs ``ids``, as ended steps (one read; for the
    transitions that do not read the job back themselves)."""
    if not ids:
        return []
    in_ids, params = d.in_ids(sorted(ids))
    with connections[d.using].cursor() as cursor:
        cursor.execute(
            f"SELECT id, task_path, status FROM {d.jobs} "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE id {in_ids} AND workflow_id IS NOT NULL",
            params,
        )
        return [
            EndedStep(int(job_id), succeeded, str(path), str(status))
            for job_id, path, status in cursor.fetchall()
        ]


def settle(d: Dialect, ended: Sequence[EndedStep], *, only: Sequence[int] | None = None) -> Settled:
    """Release or end the waiting dependants of ``ended`` (call inside the transaction
    that ended them). Returns what it changed; the caller wakes workers (``NOTIFY``)
    for the released steps' queues.

    ``only``: settle only these children of ``ended`` (their own dependants as ever): the
    new steps of a workflow that wait for a job that had already finished when they were
    written (a step deduplicated by its key against a finished job).
    """
    released: list[tuple[int, str]] = []
    failed: list[int] = []
    level = list(ended)
    with connections[d.using].cursor() as cursor:
        while level:
            level_released, level_failed = _settle_level(d, cursor, level, only)
            only = None
            released.extend(level_released)
            failed.extend(step.id for step in level_failed)
            level = level_failed
    return Settled(released, failed)


def _settle_level(
    d: Dialect, cursor: Any, level: list[EndedStep], only: Sequence[int] | None
) -> tuple[list[tuple[int, str]], list[EndedStep]]:
    """Settle the children of one level of ended steps (``only`` these, when given):
    (released, ended without running). Their fan-in counters first (locked in id order),
    then the children's rows (in id order)."""
    edges = _edges(d)
    parents = sorted({step.id for step in level})
    in_parents, parent_params = d.in_ids(parents)
    among, among_params = ("", []) if only is None else d.in_ids(sorted(only))
    if d.vendor == "postgresql" and d.batched and all(step.succeeded for step in level):
        # Every parent succeeded: counters, count-down and read-back in one statement (the
        # children's row locks are then held for the least time, until the commit).
        return _count_down_at_once(
            d, cursor, (in_parents, parent_params), (among, among_params)
        ), []
    emptied = fanin.drop(d, cursor, (in_parents, parent_params), (among, among_params))
    bad_parents = sorted(step.id for step in level if not step.succeeded)
    children = _lock_children(
        d, cursor, (in_parents, parent_params), (among, among_params), emptied, bad_parents
    )
    if not children:
        return [], []
    strict = sorted(child for child, mode in children.items() if mode != "run")
    doomed: dict[int, int] = {}  # child -> the first failed parent among its parents
    if bad_parents and strict:
        in_bad, bad_params = d.in_ids(bad_parents)
        for chunk in id_chunks(strict):
            in_chunk, chunk_params = d.in_ids(chunk)
            cursor.execute(
                f"SELECT e.child_id, MIN(e.parent_id) FROM {edges} AS e "  # noqa: S608 - identifiers quoted, values bound
                f"WHERE e.parent_id {in_bad} AND e.child_id {in_chunk} GROUP BY e.child_id",
                [*bad_params, *chunk_params],
            )
            doomed.update((int(child), int(parent)) for child, parent in cursor.fetchall())
    ended_now = _end_unrun(d, cursor, {step.id: step for step in level}, doomed)
    counted = sorted(set(children) - set(doomed))
    counters = sorted(c for child in counted for c in emptied.get(child, []))
    released: list[tuple[int, str]] = []
    for chunk in id_chunks(counted):
        released.extend(_count_down(d, cursor, (in_parents, parent_params), counters, chunk))
    return released, ended_now


def _lock_children(
    d: Dialect,
    cursor: Any,
    parents: tuple[str, list[Any]],
    among: tuple[str, list[Any]],
    emptied: dict[int, list[int]],
    bad_parents: list[int],
) -> dict[int, str | None]:
    """Lock, in id order, the waiting children the level changes: those with a direct
    edge from ``parents``, those with a counter ``emptied`` here, and those without
    ``on_parent_failure = 'run'`` that have a parent among ``bad_parents`` (they end
    unrun); child -> its ``on_parent_failure``.

    The children are found from the edges first, then locked by id: a locking read that
    joins the edges could lock more than it returns (InnoDB locks the rows it examines,
    such as every waiting step, or a wide chord's callback)."""
    edges = _edges(d)
    in_parents, parent_params = parents
    in_among, among_params = among
    which, params = "e.fanin_id IS NULL", [*parent_params]
    if bad_parents:
        in_bad, bad_params = d.in_ids(bad_parents)
        which = (
            f"(e.fanin_id IS NULL OR (e.parent_id {in_bad} AND EXISTS (SELECT 1 FROM {d.jobs} "  # noqa: S608 - identifiers quoted, values bound
            "AS s WHERE s.id = e.child_id AND s.on_parent_failure IS NULL)))"
        )
        params.extend(bad_params)
    cursor.execute(
        f"SELECT DISTINCT e.child_id FROM {edges} AS e WHERE e.parent_id {in_parents} "  # noqa: S608 - identifiers quoted, values bound
        f"AND {which}{' AND e.child_id ' + in_among if in_among else ''}",
        [*params, *among_params],
    )
    candidates = sorted({int(child) for (child,) in cursor.fetchall()} | set(emptied))
    lock = " FOR UPDATE" if d.row_locks else ""
    children: dict[int, str | None] = {}
    for chunk in id_chunks(candidates):
        in_chunk, chunk_params = d.in_ids(chunk)
        cursor.execute(
            f"SELECT id, on_parent_failure FROM {d.jobs} "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE id {in_chunk} AND status = 'waiting' ORDER BY id{lock}",
            chunk_params,
        )
        children.update((int(child), mode) for child, mode in cursor.fetchall())
    return children


def _end_unrun(
    d: Dialect, cursor: Any, parents: dict[int, EndedStep], doomed: dict[int, int]
) -> list[EndedStep]:
    """End the ``doomed`` children (child -> the failed parent it names) as ``failed``
    without running; returns them as ended steps, for the next level."""
    by_parent: dict[int, list[int]] = {}
    for child, parent in doomed.items():
        by_parent.setdefault(parent, []).append(child)
    ended: list[EndedStep] = []
    for parent, kids in sorted(by_parent.items()):
        step = parents[parent]
        error = f"{PARENT_FAILED_CLASS}: " + parent_failed_message(
            parent, step.task_path, step.status
        )
        for chunk in id_chunks(sorted(kids)):
            in_chunk, chunk_params = d.in_ids(chunk)
            cursor.execute(
                f"UPDATE {d.jobs} AS j SET status = 'failed', finished_at = {d.now}, "  # noqa: S608 - identifiers quoted, values bound
                f"last_error = %s WHERE j.id {in_chunk} AND j.status = 'waiting'",
                [error, *chunk_params],
            )
            cursor.execute(
                f"SELECT id, task_path FROM {d.jobs} WHERE id {in_chunk}",  # noqa: S608 - identifiers quoted, values bound
                chunk_params,
            )
            ended.extend(
                EndedStep(int(job_id), False, str(path), "failed")
                for job_id, path in cursor.fetchall()
            )
    return ended


def _counted_down(d: Dialect, in_parents: str, counters: list[int]) -> tuple[str, list[Any]]:
    """The SET list of a count-down and its parameters after the parents' (given once):
    ``waiting_on`` minus the child's direct edges from ``in_parents`` and its fan-in
    ``counters`` that reached zero, ``pending`` at zero (``status`` first: MySQL assigns in
    order, and the status reads the old ``waiting_on``)."""
    finished = (
        f"(SELECT COUNT(*) FROM {_edges(d)} AS e WHERE e.child_id = j.id "  # noqa: S608 - identifiers quoted, values bound
        f"AND e.parent_id {in_parents} AND e.fanin_id IS NULL)"
    )
    params: list[Any] = []
    if counters:
        in_counters, params = d.in_ids(counters)
        finished += (
            f" + (SELECT COUNT(*) FROM {fanin.table(d)} AS f "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE f.child_id = j.id AND f.id {in_counters})"
        )
    return (
        f"status = CASE WHEN j.waiting_on - ({finished}) <= 0 THEN 'pending' ELSE 'waiting' END, "
        f"waiting_on = j.waiting_on - ({finished})"
    ), params


def _count_down_at_once(
    d: Dialect,
    cursor: Any,
    parents: tuple[str, list[Any]],
    among: tuple[str, list[Any]],
) -> list[tuple[int, str]]:
    """PostgreSQL's settle of parents that all succeeded, in one statement: the fan-in
    counters of ``parents`` locked in id order and counted down (``fanin.drops_sql``),
    then the waiting children that lose a count (``among`` them, when given) locked in id
    order in a materialised CTE, counted down, ``RETURNING`` the released ones."""
    drops, drops_params = fanin.drops_sql(d, parents, among)
    cursor.execute(
        f"WITH {drops}, kids AS MATERIALIZED (SELECT c.id FROM {d.jobs} AS c "  # noqa: S608 - identifiers quoted, values bound
        "WHERE c.status = 'waiting' AND c.id IN (SELECT child_id FROM drops) "
        "ORDER BY c.id FOR UPDATE) "
        f"UPDATE {d.jobs} AS j SET "
        "status = CASE WHEN j.waiting_on - d.n <= 0 THEN 'pending' ELSE 'waiting' END, "
        "waiting_on = j.waiting_on - d.n FROM drops AS d "
        "WHERE j.id = d.child_id AND j.id IN (SELECT id FROM kids) AND j.status = 'waiting' "
        "RETURNING j.id, j.queue, j.status",
        drops_params,
    )
    rows = sorted(cursor.fetchall())
    return [(int(job_id), str(queue)) for job_id, queue, status in rows if status == "pending"]


def _count_down(
    d: Dialect,
    cursor: Any,
    parents: tuple[str, list[Any]],
    counters: list[int],
    children: list[int],
) -> list[tuple[int, str]]:
    """``waiting_on`` of ``children`` minus their direct edges from ``parents`` (an ``IN``
    clause and its parameters) and their fan-in ``counters`` that reached zero; a child
    at zero becomes ``pending``. Returns the children released (id, queue)."""
    in_parents, parent_params = parents
    in_children, child_params = d.in_ids(children)
    set_list, counter_params = _counted_down(d, in_parents, counters)
    cursor.execute(
        f"UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE j.id {in_children} AND j.status = 'waiting'",
        [*parent_params, *counter_params, *parent_params, *counter_params, *child_params],
    )
    cursor.execute(
        f"SELECT id, queue FROM {d.jobs} "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE id {in_children} AND status = 'pending' ORDER BY id",
        child_params,
    )
    return [(int(job_id), str(queue)) for job_id, queue in cursor.fetchall()]


def give_back(d: Dialect, cursor: Any, parents: Sequence[int]) -> None:
    """Give back to the waiting dependants of ``parents`` the count their end took:
    call in the transaction that puts ``parents`` (workflow steps that had ended without
    succeeding) back to run, so that their new end counts those dependants down once
    more, not twice.

    A parent that ended without succeeding counted down only its children with
    ``on_parent_failure = 'run'`` (the others ended unrun): each of them still waiting
    gets back its direct edges from ``parents`` in ``waiting_on``, and ``parents`` back in
    its fan-in counters, plus one in ``waiting_on`` per counter that comes back above zero
    (it had counted the child down when it reached zero). The counters are locked first
    (id order), then the children's rows (id order): the order every settle takes.
    Children that no longer wait (released, running or ended) are not touched: they keep
    what their parents' first end gave them."""
    if not parents:
        return
    in_parents, parent_params = d.in_ids(sorted(set(parents)))
    cursor.execute(
        f"SELECT e.child_id, e.fanin_id, COUNT(*) FROM {_edges(d)} AS e "  # noqa: S608 - identifiers quoted, values bound
        f"JOIN {d.jobs} AS c ON c.id = e.child_id WHERE e.parent_id {in_parents} "
        "AND c.status = 'waiting' AND c.on_parent_failure = 'run' "
        "GROUP BY e.child_id, e.fanin_id",
        parent_params,
    )
    direct: dict[int, int] = {}
    hits: dict[int, int] = {}
    for child, counter, n in cursor.fetchall():
        if counter is None:
            direct[int(child)] = direct.get(int(child), 0) + int(n)
        else:
            hits[int(counter)] = int(n)
            direct.setdefault(int(child), 0)
    reopened = fanin.give_back(d, cursor, hits)
    lock = " FOR UPDATE" if d.row_locks else ""
    by_count: dict[int, list[int]] = {}
    for chunk in id_chunks(sorted(direct)):
        in_chunk, chunk_params = d.in_ids(chunk)
        cursor.execute(
            f"SELECT id FROM {d.jobs} WHERE id {in_chunk} AND status = 'waiting' "  # noqa: S608 - identifiers quoted, values bound
            f"ORDER BY id{lock}",
            chunk_params,
        )
        for (child,) in cursor.fetchall():
            count = direct[int(child)] + reopened.get(int(child), 0)
            if count:
                by_count.setdefault(count, []).append(int(child))
    for count, children in sorted(by_count.items()):
        for chunk in id_chunks(children):
            in_chunk, chunk_params = d.in_ids(chunk)
            cursor.execute(
                f"UPDATE {d.jobs} SET waiting_on = waiting_on + %s "  # noqa: S608 - identifiers quoted, values bound
                f"WHERE id {in_chunk} AND status = 'waiting'",
                [count, *chunk_params],
            )


def _edges(d: Dialect) -> str:
    return d.q(Dependency._meta.db_table)


REPAIR_BATCH = 1000


def repair_waiting(d: Dialect, *, backend: str | None = None) -> Settled:
    """Settle waiting steps whose parents have all finished (up to ``REPAIR_BATCH``).

    Every transition settles the steps it ends in its own transaction, so this finds
    something only after a write that did not (a row changed by hand or by another
    program, a parent deleted): the reaper runs it after each reap. A stuck step with a
    parent that ended without succeeding ends ``failed`` without running (unless
    ``on_parent_failure="run"``); any other becomes ``pending``. A parent row that no
    longer exists counts as finished.
    """
    edges = _edges(d)
    where_backend = " AND c.backend = %s" if backend is not None else ""
    lock = d.skip_locked
    with transaction.atomic(using=d.using), connections[d.using].cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, c.on_parent_failure FROM {d.jobs} AS c "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE c.status = 'waiting'{where_backend} AND NOT EXISTS ("
            f"SELECT 1 FROM {edges} AS e JOIN {d.jobs} AS p ON p.id = e.parent_id "
            "WHERE e.child_id = c.id AND p.status IN ('waiting', 'pending', 'running')) "
            f"ORDER BY c.id LIMIT {REPAIR_BATCH}{lock}",
            [backend] if backend is not None else [],
        )
        stuck = {int(child): mode for child, mode in cursor.fetchall()}
        if not stuck:
            return Settled([], [])
        strict = sorted(child for child, mode in stuck.items() if mode != "run")
        doomed: dict[int, int] = {}
        parents: dict[int, EndedStep] = {}
        if strict:
            in_strict, strict_params = d.in_ids(strict)
            cursor.execute(
                f"SELECT e.child_id, p.id, p.task_path, p.status FROM {edges} AS e "  # noqa: S608 - identifiers quoted, values bound
                f"JOIN {d.jobs} AS p ON p.id = e.parent_id WHERE e.child_id {in_strict} "
                "AND p.status IN ('failed', 'dead', 'cancelled') ORDER BY e.child_id, p.id",
                strict_params,
            )
            for child, parent, path, status in cursor.fetchall():
                parents[int(parent)] = EndedStep(int(parent), False, str(path), str(status))
                doomed.setdefault(int(child), int(parent))
        ended = _end_unrun(d, cursor, parents, doomed)
        released: list[tuple[int, str]] = []
        for chunk in id_chunks(sorted(set(stuck) - set(doomed))):
            in_chunk, chunk_params = d.in_ids(chunk)
            cursor.execute(
                f"UPDATE {d.jobs} AS j SET status = 'pending', waiting_on = 0 "  # noqa: S608 - identifiers quoted, values bound
                f"WHERE j.id {in_chunk} AND j.status = 'waiting'",
                chunk_params,
            )
            cursor.execute(
                f"SELECT id, queue FROM {d.jobs} WHERE id {in_chunk} AND status = 'pending'",  # noqa: S608 - identifiers quoted, values bound
                chunk_params,
            )
            released.extend((int(job_id), str(queue)) for job_id, queue in cursor.fetchall())
        if released:
            notify(NOTIFY_CHANNEL, {queue for _, queue in released}, using=d.using)
        more = settle_and_notify(d, ended)
        return Settled([*released, *more.released], [s.id for s in ended] + more.failed)
