"""The firing alerts the admin shows above the queue dashboard and the job list.

An alert is shown from the moment it fires until its rule resolves or its interval
passes (``firing_until``, database clock); the rule fires again after that if its
condition still holds. One query on the small state table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..functions import DatabaseNow
from ..models import AlertState, AlertStatus

SHOWN = 20
"""At most this many alerts are shown, the latest first."""


@dataclass(frozen=True, slots=True)
class FiringAlert:
    rule: str
    kind: str
    backend: str
    message: str
    fired_at: datetime


def firing(using: str) -> list[FiringAlert]:
    """The alerts shown now, the latest first."""
    rows = (
        AlertState.objects.using(using)
        .filter(
            state=AlertStatus.FIRING,
            last_fired_at__isnull=False,
            firing_until__gt=DatabaseNow(),  # (NULL is never greater)
        )
        .order_by("-last_fired_at", "name")
        .values("name", "kind", "backend", "message", "last_fired_at")[:SHOWN]
    )
    return [
        FiringAlert(
            rule=row["name"],
            kind=row["kind"],
            backend=row["backend"],
            message=row["message"],
            fired_at=row["last_fired_at"],
        )
        for row in rows
        if row["last_fired_at"] is not None  # (the filter)
    ]
