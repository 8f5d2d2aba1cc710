"""The write that claims rows, shared by the main lane's claim (``claim.py``) and the flow
claim (``flow.py``): the ``SET`` list of a claim, the columns it reads back, and the claim
of rows the flow claim chose."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dialect import Dialect, placeholders
from .fenced import read_back

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
    "metadata",
    "workflow_id",
    "flow_group",
)
RETURNING = (*CLAIM_COLUMNS, "run_after")
"""What a claim reads back: ``run_after`` last, to put the rows back in claim order
(RETURNING gives no order)."""


def claim_set(d: Dialect, worker_id: str, lease_duration: float) -> tuple[str, list[Any]]:
    """The SET list of a claim (and its parameters): running, attempt + 1, the lease."""
    set_list = (
        "status = 'running', attempt = j.attempt + 1, locked_by = %s, "
        f"locked_until = {d.now_plus}, heartbeat_at = {d.now}, last_worker = %s, "
        f"started_at = COALESCE(j.started_at, {d.now}), last_attempted_at = {d.now}, "
        "progress = NULL, progress_message = '', cancel_requested = FALSE"
    )
    return set_list, [worker_id, d.offset(lease_duration), worker_id]


def claim_rows(
    cursor: Any, d: Dialect, worker_id: str, ids: Sequence[int], lease_duration: float
) -> list[tuple[Any, ...]]:
    """Claim the rows ``ids`` that are still pending, inside the caller's transaction
    (the flow claim, which chose them under its lock); return them as ``RETURNING``."""
    set_list, set_params = claim_set(d, worker_id, lease_duration)
    where = f"j.status = 'pending' AND j.id IN ({placeholders(len(ids))})"
    if d.batched:
        columns = ", ".join(d.q(c) for c in RETURNING)
        cursor.execute(
            f"UPDATE {d.jobs} AS j SET {set_list} WHERE {where} RETURNING {columns}",  # noqa: S608 - identifiers quoted, values bound
            [*set_params, *ids],
        )
        return [tuple(row) for row in cursor.fetchall()]
    cursor.execute(
        f"SELECT j.id FROM {d.jobs} AS j WHERE {where} ORDER BY j.id{d.skip_locked}",  # noqa: S608 - identifiers quoted, values bound
        list(ids),
    )
    locked = [int(job_id) for (job_id,) in cursor.fetchall()]
    if not locked:
        return []
    cursor.execute(
        f"UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
        f"WHERE j.status = 'pending' AND j.id IN ({placeholders(len(locked))})",
        [*set_params, *locked],
    )
    return read_back(d, cursor, locked, RETURNING)
