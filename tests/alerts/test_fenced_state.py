"""The alert state's fenced writes: at most one alert per rule per interval, whoever asks."""

from __future__ import annotations

import pytest
from django.db import connection

from django_leasejobs.alerts import state
from django_leasejobs.models import AlertState, AlertStatus
from tests.alerts.helpers import ago, rule
from tests.helpers_leases import run_in_threads

RULE = rule(name="mail-dead", kind="dead_letters", queue="default", threshold=1, interval=600)


def row() -> AlertState:
    return AlertState.objects.get(backend="default", name=RULE.name)


@pytest.mark.django_db
def test_a_rule_fires_once_per_interval_and_resolves_once() -> None:
    state.ensure_rows("default", [RULE], "default")
    state.ensure_rows("default", [RULE], "default")  # a second worker: nothing new
    assert AlertState.objects.count() == 1
    assert row().state == AlertStatus.RESOLVED and row().last_fired_at is None
    assert state.resolve("default", RULE, 0, "clear", "default") is None  # never fired

    fired = state.fire("default", RULE, 3, "three dead", "default")
    assert fired is not None and fired.resolved_at is None
    stored = row()
    assert (stored.state, stored.value, stored.message) == (AlertStatus.FIRING, 3, "three dead")
    assert stored.last_fired_at == fired.fired_at
    assert stored.firing_until is not None
    assert (stored.firing_until - fired.fired_at).total_seconds() == pytest.approx(600)
    assert state.fire("default", RULE, 4, "four dead", "default") is None  # within the interval
    assert row().message == "three dead"

    resolved = state.resolve("default", RULE, 0, "clear", "default")
    assert resolved is not None and resolved.fired_at == fired.fired_at
    assert resolved.resolved_at is not None
    assert state.resolve("default", RULE, 0, "clear", "default") is None  # resolved already
    assert (row().state, row().firing_until) == (AlertStatus.RESOLVED, None)
    # Resolved or not, the interval since the last alert holds.
    assert state.fire("default", RULE, 5, "five dead", "default") is None

    AlertState.objects.filter(pk=row().pk).update(last_fired_at=ago(601))
    again = state.fire("default", RULE, 5, "five dead", "default")
    assert again is not None and again.fired_at > fired.fired_at
    assert row().state == AlertStatus.FIRING


@pytest.mark.django_db
def test_a_missing_row_fires_nothing() -> None:
    assert state.fire("default", RULE, 3, "three dead", "default") is None
    assert AlertState.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_of_concurrent_firers_exactly_one_takes_the_alert(round_: int) -> None:
    """Eight connections create the row and fire at once: one alert, one row."""

    def create_and_fire() -> state.Change | None:
        state.ensure_rows("default", [RULE], "default")
        return state.fire("default", RULE, 3, f"from {connection.vendor}", "default")

    results = run_in_threads([create_and_fire] * 8)
    assert len([r for r in results if r is not None]) == 1
    assert AlertState.objects.count() == 1
