"""The lease holder's renewals, and the writes a job makes from inside its attempt."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .dialect import dialect
from .fenced import update_one, write
from .rules import Value, progress_message
from .values import Progress, RenewResult


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
    d = dialect(using)
    offset = d.offset(lease_duration)
    asked = {
        lease: {
            "offset": offset,
            "fraction": None if progress is None else progress.fraction,
            "message": None if progress is None else progress_message(progress.message),
        }
        for lease, progress in wanted.items()
    }

    def set_list(value: Value) -> str:
        return (
            f"locked_until = {d.now_plus_value(value('offset'))}, heartbeat_at = {d.now}, "
            f"progress = COALESCE({value('fraction')}, j.progress), "
            f"progress_message = COALESCE({value('message')}, j.progress_message)"
        )

    kinds = {"offset": d.offset_type(), "fraction": "float", "message": "text"}
    rows, skipped = write(d, worker_id, asked, set_list, kinds, ("cancel_requested",))
    held = set()
    cancel = set()
    for job_id, attempt, cancel_requested in rows:
        lease = (int(job_id), int(attempt))
        held.add(lease)
        if cancel_requested:
            cancel.add(lease)
    return RenewResult(
        held=frozenset(held),
        lost=frozenset(set(wanted) - held - skipped),
        cancel_requested=frozenset(cancel),
        skipped=skipped,
    )


def save_checkpoint(
    job_id: int, attempt: int, worker_id: str, data: Any, *, using: str = "default"
) -> None:
    """Store the job's checkpoint (kept across attempts, so a retry can resume)."""
    encoded = None if data is None else json.dumps(data)
    update_one(
        dialect(using),
        (job_id, attempt),
        worker_id,
        lambda value: f"checkpoint = {value('checkpoint')}",
        {"checkpoint": encoded},
        "checkpoint",
    )


def save_metadata(
    job_id: int, attempt: int, worker_id: str, data: dict[str, Any], *, using: str = "default"
) -> None:
    """Store the job's metadata (a JSON object), fenced on the attempt's lease."""
    update_one(
        dialect(using),
        (job_id, attempt),
        worker_id,
        lambda value: f"metadata = {value('metadata')}",
        {"metadata": json.dumps(data)},
        "metadata",
    )


def set_progress(
    job_id: int,
    attempt: int,
    worker_id: str,
    progress: Progress,
    *,
    using: str = "default",
) -> None:
    """Store progress at once (workers normally send it with the next renewal instead)."""
    update_one(
        dialect(using),
        (job_id, attempt),
        worker_id,
        lambda value: (
            f"progress = {value('fraction')}, "
            f"progress_message = COALESCE({value('message')}, j.progress_message)"
        ),
        {"fraction": progress.fraction, "message": progress_message(progress.message)},
        "progress",
    )
