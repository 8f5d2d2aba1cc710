"""A workflow's operator writes (cancel it, retry its failed steps) and the reads a step
makes of its parents. Settling dependants after a step ends is ``dependants.py``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction

from ..models import Dependency
from . import fanin
from .dependants import give_back
from .dialect import Dialect, dialect, id_chunks, placeholders, retry_deadlocks
from .enqueue import NOTIFY_CHANNEL, notify
from .values import ParentOutcome


def parent_outcomes(job_id: int, *, using: str = "default") -> list[ParentOutcome]:
    """The parents of the step ``job_id``, in the order the workflow gave them."""
    return parents_of_steps([job_id], using=using).get(job_id, [])


def parents_of_steps(
    job_ids: Sequence[int], *, using: str = "default"
) -> dict[int, list[ParentOutcome]]:
    """The parents of each of the steps ``job_ids`` (one query), in the workflow's order;
    a step without parents is left out."""
    d = dialect(using)
    edges = d.q(Dependency._meta.db_table)
    found: dict[int, list[ParentOutcome]] = {}
    with connections[using].cursor() as cursor:
        for chunk in id_chunks(sorted(set(job_ids))):
            cursor.execute(
                "SELECT e.child_id, e.parent_id, p.task_path, p.status, p.result, "  # noqa: S608 - identifiers quoted, values bound
                f"p.last_error FROM {edges} AS e LEFT JOIN {d.jobs} AS p ON p.id = e.parent_id "
                f"WHERE e.child_id IN ({placeholders(len(chunk))}) "
                "ORDER BY e.child_id, e.position",
                chunk,
            )
            for child, parent, path, status, result, error in cursor.fetchall():
                succeeded = status == "succeeded"
                found.setdefault(int(child), []).append(
                    ParentOutcome(
                        job_id=int(parent),
                        task_path=path or "",
                        status=status or "missing",
                        result=_json(result) if succeeded else None,
                        error="" if succeeded else (error or ""),
                    )
                )
    return found


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


@dataclass(frozen=True, slots=True)
class WorkflowCancel:
    cancelled: int
    """Steps that had not started (waiting or pending): now ``cancelled``."""
    requested: int
    """Running steps: their workers stop them (as a running job is cancelled)."""


def cancel_workflow(workflow_id: int, *, using: str = "default") -> WorkflowCancel:
    """Cancel every step of a workflow that has not finished, in one transaction."""
    d = dialect(using)

    def cancel() -> WorkflowCancel:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            if d.row_locks:  # in id order, as every settle locks them: no deadlock
                cursor.execute(
                    f"SELECT id FROM {d.jobs} WHERE workflow_id = %s "  # noqa: S608 - identifiers quoted, values bound
                    "AND status IN ('waiting', 'pending') ORDER BY id FOR UPDATE",
                    [workflow_id],
                )
            cursor.execute(
                f"UPDATE {d.jobs} AS j SET status = 'cancelled', finished_at = {d.now} "  # noqa: S608 - identifiers quoted, values bound
                "WHERE j.workflow_id = %s AND j.status IN ('waiting', 'pending')",
                [workflow_id],
            )
            cancelled = int(cursor.rowcount)
            cursor.execute(
                f"UPDATE {d.jobs} AS j SET cancel_requested = TRUE "  # noqa: S608 - identifiers quoted, values bound
                "WHERE j.workflow_id = %s AND j.status = 'running' AND NOT j.cancel_requested",
                [workflow_id],
            )
            return WorkflowCancel(cancelled, int(cursor.rowcount))

    return retry_deadlocks(using, cancel)


def retry_failed_steps(workflow_id: int, *, using: str = "default") -> int:
    """Run again every step of a workflow that ended without succeeding (failed, dead,
    cancelled, or ended unrun after a parent failed): each gets a fresh budget as an
    operator's retry gives a job, and waits again for its parents that have not
    succeeded (those retried with it). The steps still waiting for them (finalisers,
    which their end counted down) get that count back (``dependants.give_back``, as a
    single retry does). Returns the number of steps retried.

    ``ValueError`` (and nothing retried) when a failed step's dedup key is held by another
    job that has not finished."""
    d = dialect(using)
    try:
        return retry_deadlocks(using, lambda: _retry_failed_steps(d, workflow_id))
    except IntegrityError:
        raise ValueError(
            f"workflow {workflow_id}: a failed step's dedup key is held by another job that "
            "has not finished; nothing was retried. Let that job finish (or cancel it), then "
            "retry the failed steps."
        ) from None


RETRIED = ("failed", "dead", "cancelled")
"""The statuses of the steps :func:`retry_failed_steps` runs again."""


def _retry_failed_steps(d: Dialect, workflow_id: int) -> int:
    edges = d.q(Dependency._meta.db_table)
    lock = " FOR UPDATE" if d.row_locks else ""
    with transaction.atomic(using=d.using), connections[d.using].cursor() as cursor:
        # Their fan-in counters and those of the waiting steps (which ``give_back`` may
        # change) first, then their rows: the order every settle takes.
        fanin.lock_of_steps(d, cursor, workflow_id, (*RETRIED, "waiting"))
        cursor.execute(
            f"SELECT id FROM {d.jobs} WHERE workflow_id = %s "  # noqa: S608 - identifiers quoted, values bound
            f"AND status IN ({placeholders(len(RETRIED))}) ORDER BY id{lock}",
            [workflow_id, *RETRIED],
        )
        steps = [int(job_id) for (job_id,) in cursor.fetchall()]
        if not steps:
            return 0
        # Their waiting finalisers were counted down by their end: they get it back, as
        # for a single retry (before the steps themselves wait again: they are not
        # touched, they are recounted below).
        give_back(d, cursor, steps)
        # A step waits for its direct parents that have not succeeded, and for its fan-in
        # counters, each reset to its parents that have not succeeded.
        waiting = fanin.recount(d, cursor, steps)
        for chunk in id_chunks(steps):
            cursor.execute(
                f"SELECT e.child_id, COUNT(*) FROM {edges} AS e "  # noqa: S608 - identifiers quoted, values bound
                f"JOIN {d.jobs} AS p ON p.id = e.parent_id "
                f"WHERE e.child_id IN ({placeholders(len(chunk))}) AND p.status <> 'succeeded' "
                "AND e.fanin_id IS NULL GROUP BY e.child_id",
                chunk,
            )
            for child, count in cursor.fetchall():
                waiting[int(child)] = waiting.get(int(child), 0) + int(count)
        by_count: dict[int, list[int]] = {}
        for job_id in steps:
            by_count.setdefault(waiting.get(job_id, 0), []).append(job_id)
        for count, ids in sorted(by_count.items()):
            for chunk in id_chunks(ids):
                cursor.execute(
                    f"UPDATE {d.jobs} AS j SET status = %s, waiting_on = %s, "  # noqa: S608 - identifiers quoted, values bound
                    f"run_after = {d.now}, finished_at = NULL, stall_count = 0, snoozes = 0, "
                    "cancel_requested = FALSE, unknown_task_since = NULL, "
                    "max_attempts = CASE WHEN j.max_attempts <= j.attempt THEN j.attempt + 1 "
                    "ELSE j.max_attempts END "
                    f"WHERE j.id IN ({placeholders(len(chunk))}) "
                    f"AND j.status IN ({placeholders(len(RETRIED))})",
                    ["waiting" if count else "pending", count or None, *chunk, *RETRIED],
                )
        cursor.execute(
            f"SELECT DISTINCT queue FROM {d.jobs} WHERE workflow_id = %s AND status = 'pending'",  # noqa: S608 - identifiers quoted, values bound
            [workflow_id],
        )
        notify(NOTIFY_CHANNEL, [queue for (queue,) in cursor.fetchall()], using=d.using)
    return len(steps)
