"""The alert a worker delivers: one typed value for the signal, the log and receivers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from ..alert_spec import AlertKind

AlertPhase = Literal["firing", "resolved"]


@dataclass(frozen=True, slots=True)
class Alert:
    rule: str
    """The rule's name in ``OPTIONS["ALERTS"]``."""
    kind: AlertKind
    backend: str
    """The ``TASKS`` alias whose rule it is."""
    state: AlertPhase
    value: float
    """The measure: a share (failure_rate), a count of jobs (dead_letters, backlog),
    seconds (oldest_ready), workers online (no_worker)."""
    threshold: float
    queue: str | None
    task: str | None
    message: str
    """One line for people: what was measured, and the threshold."""
    fired_at: datetime
    """When the alert fired (database clock); for a resolve, the alert it ends."""
    interval: float
    """Seconds before the rule may fire again."""
    resolved_at: datetime | None = None
