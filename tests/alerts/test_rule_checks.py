"""``OPTIONS["ALERTS"]`` and ``ALERT_CHECK_INTERVAL``: each bad rule reported by its check id."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_leasejobs.alert_spec import (
    E_ALERT_DURATION,
    E_ALERT_INVALID,
    E_ALERT_QUEUE,
    AlertRule,
)
from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.conf import E_BAD_VALUE, parse_options

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"


def messages(options: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, message, hint) of every leasejobs check message for a backend with ``options``."""
    tasks = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "high"], "OPTIONS": options}}
    with override_settings(TASKS=tasks):
        found = run_checks()
    return [(str(m.id), m.msg, m.hint or "") for m in found if str(m.id).startswith("leasejobs.")]


def test_ids_are_stable() -> None:
    assert (E_ALERT_INVALID, E_ALERT_DURATION, E_ALERT_QUEUE) == (
        "leasejobs.E025",
        "leasejobs.E026",
        "leasejobs.E027",
    )


def test_every_kind_with_every_key_it_takes_is_silent_and_typed() -> None:
    rules = [
        {
            "name": "mail-failures",
            "kind": "failure_rate",
            "queue": "default",
            "task": "tests.tasks.add",
            "threshold": 0.2,
            "window": timedelta(minutes=10),
            "min_jobs": 20,
            "interval": 900,
        },
        {"name": "dead", "kind": "dead_letters", "threshold": 1, "window": 300.5},
        {"name": "backlog", "kind": "backlog", "queue": "high", "threshold": 1000},
        {"name": "waits", "kind": "oldest_ready", "task": "tests.tasks.add", "threshold": 300},
        {"name": "nobody:high", "kind": "no_worker", "queue": "high", "interval": 60},
    ]
    options = {"ALERTS": rules, "ALERT_CHECK_INTERVAL": 5}
    assert messages(options) == []
    config, problems = parse_options(options, environ={})
    assert problems == []
    assert config.alert_check_interval == 5.0
    assert config.alerts[0] == AlertRule(
        name="mail-failures",
        kind="failure_rate",
        threshold=0.2,
        queue="default",
        task="tests.tasks.add",
        window=600.0,
        min_jobs=20,
        interval=900.0,
    )
    assert [(r.window, r.interval, r.min_jobs) for r in config.alerts[1:3]] == [
        (300.5, 3600.0, 10),
        (600.0, 3600.0, 10),
    ]
    assert config.alerts[4].threshold == 0 and config.alerts[4].interval == 60


def test_defaults_have_no_rules() -> None:
    config, problems = parse_options({}, environ={})
    assert (config.alerts, config.alert_check_interval, problems) == ((), 30.0, [])


@pytest.mark.parametrize(
    ("alerts", "check_id", "says"),
    [
        ({"name": "x"}, E_ALERT_INVALID, "ALERTS must be a list of rules, got dict"),
        (["x"], E_ALERT_INVALID, "ALERTS[0] must be a dict, got str"),
        ([{"kind": "backlog", "threshold": 1}], E_ALERT_INVALID, "ALERTS[0]: name None"),
        ([{"name": "a b", "kind": "backlog", "threshold": 1}], E_ALERT_INVALID, "name 'a b'"),
        (
            [
                {"name": "Backlog", "kind": "backlog", "threshold": 1},
                {"name": "backlog", "kind": "backlog", "threshold": 2},
            ],
            E_ALERT_INVALID,
            "the name is used twice",
        ),
        ([{"name": "a", "kind": "latency", "threshold": 1}], E_ALERT_INVALID, "kind must be"),
        ([{"name": "a", "kind": "backlog"}], E_ALERT_INVALID, "a backlog rule needs a threshold"),
        (
            [{"name": "a", "kind": "backlog", "threshold": 1, "treshold": 2}],
            E_ALERT_INVALID,
            "unknown key(s) 'treshold'",
        ),
        (
            [{"name": "a", "kind": "failure_rate", "threshold": 20}],
            E_ALERT_INVALID,
            "above 0 and at most 1",
        ),
        (
            [{"name": "a", "kind": "dead_letters", "threshold": 0.5}],
            E_ALERT_INVALID,
            "whole number of jobs >= 1",
        ),
        ([{"name": "a", "kind": "oldest_ready", "threshold": 0}], E_ALERT_INVALID, "seconds > 0"),
        ([{"name": "a", "kind": "backlog", "threshold": True}], E_ALERT_INVALID, "finite number"),
        (
            [{"name": "a", "kind": "no_worker", "queue": "high", "threshold": 1}],
            E_ALERT_INVALID,
            "takes no threshold",
        ),
        ([{"name": "a", "kind": "no_worker"}], E_ALERT_INVALID, "a no_worker rule needs a queue"),
        (
            [{"name": "a", "kind": "no_worker", "queue": "high", "task": "t.t"}],
            E_ALERT_INVALID,
            "takes no task",
        ),
        (
            [{"name": "a", "kind": "backlog", "threshold": 1, "window": 60}],
            E_ALERT_INVALID,
            "a backlog rule takes no window",
        ),
        (
            [{"name": "a", "kind": "dead_letters", "threshold": 1, "min_jobs": 5}],
            E_ALERT_INVALID,
            "takes no min_jobs",
        ),
        (
            [{"name": "a", "kind": "failure_rate", "threshold": 0.1, "min_jobs": 0}],
            E_ALERT_INVALID,
            "min_jobs must be a whole number >= 1",
        ),
        ([{"name": "a", "kind": "backlog", "threshold": 1, "queue": ""}], E_ALERT_INVALID, "queue"),
        (
            [{"name": "a", "kind": "backlog", "threshold": 1, "interval": "15m"}],
            E_ALERT_DURATION,
            "interval must be a number of seconds or a datetime.timedelta, got '15m'",
        ),
        (
            [{"name": "a", "kind": "dead_letters", "threshold": 1, "window": -1}],
            E_ALERT_DURATION,
            "window must be more than 0 seconds",
        ),
        (
            [{"name": "a", "kind": "dead_letters", "threshold": 1, "window": 2 * 86400}],
            E_ALERT_DURATION,
            "window must be at most 86,400 seconds",
        ),
        (
            [{"name": "a", "kind": "backlog", "threshold": 1, "queue": "low"}],
            E_ALERT_QUEUE,
            "watches the queue 'low', which this backend does not serve",
        ),
    ],
)
def test_a_bad_rule_is_reported(alerts: Any, check_id: str, says: str) -> None:
    found = messages({"ALERTS": alerts})
    assert [(i, says in msg) for i, msg, _ in found] == [(check_id, True)], found
    [(_, _, hint)] = found
    assert hint  # every message names the fix


def test_a_string_duration_is_told_how_to_write_it() -> None:
    [(_, _, hint)] = messages(
        {"ALERTS": [{"name": "a", "kind": "backlog", "threshold": 1, "interval": "15m"}]}
    )
    assert "timedelta(minutes=10)" in hint and "'10m' are not durations here" in hint


def test_a_bad_check_interval_is_a_bad_value() -> None:
    assert [i for i, _, _ in messages({"ALERT_CHECK_INTERVAL": 0})] == [E_BAD_VALUE]


def test_a_bad_rule_is_left_out_and_the_backend_refuses_to_run() -> None:
    alerts = [
        {"name": "good", "kind": "backlog", "threshold": 5},
        {"name": "bad", "kind": "backlog"},
    ]
    config, problems = parse_options({"ALERTS": alerts}, environ={})
    assert [r.name for r in config.alerts] == ["good"]
    assert [p.id for p in problems] == [E_ALERT_INVALID]
    backend = LeaseJobsBackend("default", {"BACKEND": BACKEND, "OPTIONS": {"ALERTS": alerts}})
    with pytest.raises(ImproperlyConfigured, match=r"E025.*'bad': a backlog rule needs"):
        backend.require_valid_config()  # what runworker and enqueue() call first
