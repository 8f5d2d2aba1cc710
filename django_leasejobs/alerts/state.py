"""The alert rules' fenced writes: at most one alert per rule per interval, across workers.

There is no leader. Every worker evaluates every rule, and delivers an alert only when
its write below moved the rule's row, like the lease protocol's transitions: ONE
conditional UPDATE whose WHERE re-checks what it assumes, with its row count checked.

* create: a resolved row that never fired; the unique (backend, name) decides a race,
  and the loser's insert is ignored;
* fire: WHERE ``last_fired_at IS NULL OR last_fired_at <= now - interval``; SET
  ``state = firing``, ``last_fired_at = now``, ``firing_until = now + interval``, the
  alert's value and message;
* resolve: WHERE ``state = firing``; SET ``state = resolved``, ``resolved_at = now``.

Of N workers firing the same rule at once, one moves ``last_fired_at`` and the others
match no row: on PostgreSQL and MySQL/MariaDB they wait on its row lock and then re-read
the row it committed (READ COMMITTED; InnoDB's UPDATE reads the latest version); SQLite
runs one writer at a time. Times are the database's clock (``DatabaseNow``), in
autocommit: each write is its own transaction, holding the row lock only for itself.
Portable ORM, no vendor SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import DateTimeField, ExpressionWrapper, Q, QuerySet, Value

from ..alert_spec import AlertRule
from ..functions import DatabaseNow
from ..models import AlertState, AlertStatus


@dataclass(frozen=True, slots=True)
class Change:
    """A rule's row as this caller's write left it."""

    fired_at: datetime
    """The alert's time (the last one, for a resolve)."""
    resolved_at: datetime | None


def _shifted(seconds: float) -> ExpressionWrapper:
    """The database's time plus ``seconds`` (minus, for a negative number)."""
    return ExpressionWrapper(
        DatabaseNow() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def _row(backend: str, rule: AlertRule, using: str) -> QuerySet[AlertState]:
    return AlertState.objects.using(using).filter(backend=backend, name=rule.name)


def ensure_rows(backend: str, rules: Sequence[AlertRule], using: str) -> None:
    """Create the rows of rules that have none; another worker's insert of the same row
    wins the unique constraint and this one is ignored."""
    known = {
        name.casefold()  # MySQL/MariaDB's unique (backend, name) ignores case
        for name in AlertState.objects.using(using)
        .filter(backend=backend)
        .values_list("name", flat=True)
    }
    missing = [rule for rule in rules if rule.name.casefold() not in known]
    if missing:
        AlertState.objects.using(using).bulk_create(
            [
                AlertState(
                    backend=backend,
                    name=rule.name,
                    kind=rule.kind,
                    queue=rule.queue,
                    task=rule.task,
                    threshold=rule.threshold,
                )
                for rule in missing
            ],
            ignore_conflicts=True,
        )


def _read(rows: QuerySet[AlertState]) -> Change | None:
    row = rows.values("last_fired_at", "resolved_at").first()
    if row is None or row["last_fired_at"] is None:
        return None
    return Change(fired_at=row["last_fired_at"], resolved_at=row["resolved_at"])


def fire(backend: str, rule: AlertRule, value: float, message: str, using: str) -> Change | None:
    """Take the rule's alert for this caller; None when another worker's alert of the
    rule is less than ``interval`` old (or the row is missing)."""
    rows = _row(backend, rule, using)
    moved = rows.filter(
        Q(last_fired_at__isnull=True) | Q(last_fired_at__lte=_shifted(-rule.interval))
    ).update(
        state=AlertStatus.FIRING,
        last_fired_at=DatabaseNow(),
        firing_until=_shifted(rule.interval),
        resolved_at=None,
        value=value,
        threshold=rule.threshold,
        message=message,
        kind=rule.kind,
        queue=rule.queue,
        task=rule.task,
    )
    return _read(rows) if moved == 1 else None


def resolve(backend: str, rule: AlertRule, value: float, message: str, using: str) -> Change | None:
    """Mark the rule's firing alert resolved for this caller; None when it was not
    firing (or another worker resolved it first)."""
    rows = _row(backend, rule, using)
    moved = rows.filter(state=AlertStatus.FIRING).update(
        state=AlertStatus.RESOLVED,
        resolved_at=DatabaseNow(),
        firing_until=None,
        value=value,
        message=message,
    )
    return _read(rows) if moved == 1 else None
