"""One evaluation pass over a backend's alert rules, as every worker's alert thread runs it.

For each rule: measure it (``measures.py``), then, when the measure reaches the
threshold, try to take the rule's alert (``state.fire``), else try to resolve a firing
one (``state.resolve``). Only the caller whose fenced write moved the row delivers
(``delivery.py``), so N workers deliver at most one alert per rule per interval between
them. A measure without a verdict changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..leases import database_now
from ..stats import online_window
from . import state
from .delivery import deliver
from .measures import measure
from .values import Alert

if TYPE_CHECKING:
    from ..backend import LeaseJobsBackend


@dataclass(frozen=True, slots=True)
class PassReport:
    delivered: tuple[Alert, ...]
    """The alerts this pass delivered (fired and resolved), in the rules' order."""


def run_pass(backend: LeaseJobsBackend, *, worker_id: str) -> PassReport:
    """Evaluate every rule of ``backend``'s ``ALERTS`` once, on its ``DATABASE``."""
    options = backend.config
    rules = options.alerts
    using = backend.database
    alias = backend.alias
    if not rules:
        return PassReport(delivered=())
    state.ensure_rows(alias, rules, using)
    now = database_now(using)
    online_after = online_window(options.heartbeat_interval)
    delivered: list[Alert] = []
    for rule in rules:
        found = measure(
            rule,
            backend=alias,
            now=now,
            online_after=online_after,
            using=using,
            from_rollups=options.rollups,
        )
        if found.value is None:
            continue
        firing = rule.reached(found.value)
        message = found.detail
        change = (state.fire if firing else state.resolve)(alias, rule, found.value, message, using)
        if change is None:
            continue
        alert = Alert(
            rule=rule.name,
            kind=rule.kind,
            backend=alias,
            state="firing" if firing else "resolved",
            value=found.value,
            threshold=rule.threshold,
            queue=rule.queue,
            task=rule.task,
            message=message,
            fired_at=change.fired_at,
            interval=rule.interval,
            resolved_at=change.resolved_at,
        )
        deliver(alert, sender=type(backend), worker_id=worker_id)
        delivered.append(alert)
    return PassReport(delivered=tuple(delivered))
