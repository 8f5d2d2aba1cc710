"""Workflow steps after a parent ends: release them, or end them without running.

Every write that ends a workflow step for good (its success, a failure with no retry
left, a dead letter, a cancel, a reap that ends it) calls :func:`settle` in the SAME
transaction, so the release is committed with the parent's outcome or not at all: a
worker killed after the commit cannot lose it, and one killed before it leaves the
parent running, to be re-run and settle then.

A waiting step counts its parents that have not finished (``waiting_on``). Settling a
batch of ended parents locks their waiting children in id order (the order every
settle takes, so two settles never deadlock), then in one statement per kind:

* a child with a parent that ended without succeeding, and no ``on_parent_failure="run"``,
  ends ``failed`` without running, with an error that names that parent; its own
  dependants are settled the same way (transitively);
* every other child's ``waiting_on`` drops by the number of its parents in the batch,
  and the child whose count reaches zero becomes ``pending``: claimable.

Two parents that end at once in two workers each take the child's row lock: the second
waits for the first's commit and reads the count the first left, so exactly one of them
makes the child pending. Nothing counts a whole group: each settle touches only the
children of the parents it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from ..models import Dependency
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
    (released, ended without running)."""
    edges = _edges(d)
    parents = sorted({step.id for step in level})
    in_parents, parent_params = d.in_ids(parents)
    lock = " FOR UPDATE" if d.row_locks else ""
    among, among_params = ("", []) if only is None else d.in_ids(sorted(only))

    def waiting_children(columns: str) -> str:
        return (
            f"SELECT c.id{columns} FROM {d.jobs} AS c "  # noqa: S608 - identifiers quoted, values bound
            f"WHERE c.status = 'waiting' AND c.id IN "
            f"(SELECT e.child_id FROM {edges} AS e WHERE e.parent_id {in_parents}) "
            f"{'AND c.id ' + among + ' ' if among else ''}ORDER BY c.id{lock}"
        )

    if d.vendor == "postgresql" and d.batched and all(step.succeeded for step in level):
        # Every parent succeeded: lock, count down and read back in one statement (the
        # children's row locks are then held for the least time, until the commit).
        return _count_down_at_once(
            d,
            cursor,
            (waiting_children(""), [*parent_params, *among_params]),
            (in_parents, parent_params),
        ), []
    cursor.execute(waiting_children(", c.on_parent_failure"), [*parent_params, *among_params])
    children = {int(child): mode for child, mode in cursor.fetchall()}
    if not children:
        return [], []
    bad_parents = sorted(step.id for step in level if not step.succeeded)
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
    released: list[tuple[int, str]] = []
    for chunk in id_chunks(counted):
        released.extend(_count_down(d, cursor, edges, (in_parents, parent_params), chunk))
    return released, ended_now


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


def _counted_down(edges: str, in_parents: str) -> str:
    """The SET list of a count-down: ``waiting_on`` minus the child's parents among
    ``in_parents``, ``pending`` at zero (``status`` first: MySQL assigns in order, and the
    status reads the old ``waiting_on``). Its parameters: the parents' twice."""
    finished = (
        f"(SELECT COUNT(*) FROM {edges} AS e WHERE e.child_id = j.id "  # noqa: S608 - identifiers quoted, values bound
        f"AND e.parent_id {in_parents})"
    )
    return (
        f"status = CASE WHEN j.waiting_on - {finished} <= 0 THEN 'pending' ELSE 'waiting' END, "
        f"waiting_on = j.waiting_on - {finished}"
    )


def _count_down_at_once(
    d: Dialect,
    cursor: Any,
    children: tuple[str, list[Any]],
    parents: tuple[str, list[Any]],
) -> list[tuple[int, str]]:
    """PostgreSQL's count-down: ``children`` (the SELECT of the waiting children,
    locked in id order) in a materialised CTE, the ``UPDATE`` of :func:`_count_down`,
    ``RETURNING`` the released ones. One statement."""
    children_sql, children_params = children
    in_parents, parent_params = parents
    cursor.execute(
        f"WITH kids AS MATERIALIZED ({children_sql}) "  # noqa: S608 - identifiers quoted, values bound
        f"UPDATE {d.jobs} AS j SET {_counted_down(_edges(d), in_parents)} "
        "WHERE j.id IN (SELECT id FROM kids) AND j.status = 'waiting' "
        "RETURNING j.id, j.queue, j.status",
        [*children_params, *parent_params, *parent_params],
    )
    rows = sorted(cursor.fetchall())
    return [(int(job_id), str(queue)) for job_id, queue, status in rows if status == "pending"]


def _count_down(
    d: Dialect,
    cursor: Any,
    edges: str,
    parents: tuple[str, list[Any]],
    children: list[int],
) -> list[tuple[int, str]]:
    """``waiting_on`` of ``children`` minus their parents among ``parents`` (an ``IN``
    clause and its parameters); a child at zero becomes ``pending``. Returns the
    children released (id, queue)."""
    in_parents, parent_params = parents
    in_children, child_params = d.in_ids(children)
    cursor.execute(
        f"UPDATE {d.jobs} AS j SET {_counted_down(edges, in_parents)} "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE j.id {in_children} AND j.status = 'waiting'",
        [*parent_params, *parent_params, *child_params],
    )
    cursor.execute(
        f"SELECT id, queue FROM {d.jobs} "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE id {in_children} AND status = 'pending' ORDER BY id",
        child_params,
    )
    return [(int(job_id), str(queue)) for job_id, queue in cursor.fetchall()]


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
