"""Declared schedules: parsing, their system checks (one id per kind of mistake), tick math."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from django.test import override_settings

from django_leasejobs.conf import parse_options
from django_leasejobs.schedule_spec import (
    MAX_SCAN,
    ScheduleSpec,
    parse_schedules,
)

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"
GOOD = {"task": "tests.tasks.add", "every": 30, "args": [1, 2]}


def schedule_messages(schedules: Any, queues: list[str] | None = None) -> list[checks.CheckMessage]:
    tasks = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": queues if queues is not None else ["default", "high"],
            "OPTIONS": {"SCHEDULES": schedules},
        }
    }
    with override_settings(TASKS=tasks):
        return [m for m in checks.run_checks() if m.id and m.id.startswith("leasejobs.")]


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return sorted(m.id for m in messages if m.id)


def test_valid_schedules_pass_the_checks() -> None:
    messages = schedule_messages(
        {
            "digest": {
                "task": "tests.tasks.add",
                "cron": "0 7 * * mon-fri",
                "timezone": "Europe/Berlin",
                "kwargs": {"a": 1, "b": 2},
            },
            "sync": {"task": "tests.tasks.add", "every": 30, "queue": "high", "priority": 10},
            "nightly": {"task": "tests.tasks.configured", "cron": "@daily", "catch_up": "none"},
            "all": {
                "task": "tests.tasks.add",
                "every": timedelta(minutes=5),
                "catch_up": "all",
                "catch_up_limit": 5,
                "enabled": False,
            },
        }
    )
    assert messages == []


@pytest.mark.parametrize(
    ("entry", "check_id", "text"),
    [
        ({"task": "tests.tasks.nope", "every": 5}, "leasejobs.E013", "not a registered task"),
        ({"task": "tests.tasks.not_a_task", "every": 5}, "leasejobs.E013", "@task"),
        ({"task": "os.system", "every": 5}, "leasejobs.E013", "not a registered task"),
        ({"task": "add", "every": 5}, "leasejobs.E013", "dotted path"),
        ({"task": "tests.tasks.add", "cron": "61 * * * *"}, "leasejobs.E011", "minute"),
        ({"task": "tests.tasks.add", "cron": "* * * *"}, "leasejobs.E011", "five fields"),
        ({"task": "tests.tasks.add", "cron": "*/5 * * * * *"}, "leasejobs.E011", "five fields"),
        ({"task": "tests.tasks.add", "cron": "@reboot"}, "leasejobs.E011", "nickname"),
        (
            {"task": "tests.tasks.add", "cron": "0" + ",0" * 200 + " * * * *"},
            "leasejobs.E011",
            "255",
        ),
        ({"task": "tests." + "x" * 600 + ".add", "every": 5}, "leasejobs.E013", "dotted path"),
        ({"task": "tests.tasks.add", "cron": 5}, "leasejobs.E011", "string"),
        ({"task": "tests.tasks.add", "cron": "0 7 * * *", "every": 5}, "leasejobs.E010", "both"),
        ({"task": "tests.tasks.add"}, "leasejobs.E010", "neither"),
        (
            {"task": "tests.tasks.add", "every": 5, "timezone": "Mars/Olympus"},
            "leasejobs.E012",
            "Mars/Olympus",
        ),
        ({"task": "tests.tasks.add", "every": 5, "timezone": ""}, "leasejobs.E012", "IANA"),
        ({"task": "tests.tasks.add", "every": 5, "timezone": "US"}, "leasejobs.E012", "'US'"),
        (
            {"task": "tests.tasks.add", "every": 5, "timezone": "Europe/" + "x" * 300},
            "leasejobs.E012",
            "unknown time zone",
        ),
        ({"task": "tests.tasks.add", "every": 10**400}, "leasejobs.E009", "at most"),
        ({"task": "tests.tasks.add", "every": float("nan")}, "leasejobs.E009", "seconds"),
        ({"task": "tests.tasks.add", "every": 5, "args": [object()]}, "leasejobs.E014", "JSON"),
        (
            {"task": "tests.tasks.add", "every": 5, "kwargs": {"when": datetime(2026, 1, 1)}},
            "leasejobs.E014",
            "JSON",
        ),
        ({"task": "tests.tasks.add", "every": 5, "queue": "low"}, "leasejobs.E015", "'low'"),
        ({"task": "tests.tasks.add", "every": 0}, "leasejobs.E009", ">= 1"),
        ({"task": "tests.tasks.add", "every": 1.5}, "leasejobs.E009", "whole number"),
        ({"task": "tests.tasks.add", "every": True}, "leasejobs.E009", "number of seconds"),
        ({"task": "tests.tasks.add", "every": 5, "colour": "red"}, "leasejobs.E009", "colour"),
        ({"task": "tests.tasks.add", "every": 5, "priority": 101}, "leasejobs.E009", "priority"),
        ({"task": "tests.tasks.add", "every": 5, "enabled": "yes"}, "leasejobs.E009", "enabled"),
        ({"task": "tests.tasks.add", "every": 5, "catch_up": "some"}, "leasejobs.E009", "catch_up"),
        (
            {"task": "tests.tasks.add", "every": 5, "catch_up_limit": 3},
            "leasejobs.E009",
            "catch_up='all' only",
        ),
        (
            {"task": "tests.tasks.add", "every": 5, "catch_up": "all", "catch_up_limit": 0},
            "leasejobs.E009",
            "catch_up_limit",
        ),
        ({"task": "tests.tasks.add", "every": 5, "queue": ""}, "leasejobs.E009", "queue"),
    ],
)
def test_each_mistake_has_its_check_id(entry: dict[str, Any], check_id: str, text: str) -> None:
    messages = schedule_messages({"bad-one": entry, "good": GOOD})
    assert ids(messages) == [check_id], messages
    (message,) = messages
    assert "bad-one" in message.msg
    assert text in message.msg
    assert message.level == checks.ERROR


def test_a_queue_check_uses_the_tasks_own_queue_when_the_schedule_names_none() -> None:
    # tests.tasks.add runs on "default", which this backend does not serve.
    messages = schedule_messages({"s": GOOD}, queues=["high"])
    assert ids(messages) == ["leasejobs.E015"]
    assert schedule_messages({"s": GOOD}, queues=[]) == []  # no QUEUES: every queue


@pytest.mark.parametrize(
    ("schedules", "text"),
    [
        (["not", "a", "dict"], "SCHEDULES must be a dict"),
        ({"spaces in name": GOOD}, "not valid"),
        ({"x" * 201: GOOD}, "not valid"),
        ({"s": "every 5"}, "must be a dict"),
        ({"good": GOOD, "Good": GOOD}, "differ only in case"),
    ],
)
def test_malformed_schedules_setting(schedules: Any, text: str) -> None:
    messages = schedule_messages(schedules)
    assert ids(messages) == ["leasejobs.E009"]
    assert text in messages[0].msg


def test_a_worker_refuses_options_with_a_schedule_error() -> None:
    _, problems = parse_options({"SCHEDULES": {"s": {"task": "tests.tasks.add"}}})
    assert [p.id for p in problems] == ["leasejobs.E010"]
    options, problems = parse_options({"SCHEDULES": {"s": GOOD}})
    assert problems == []
    assert [s.name for s in options.schedules] == ["s"]


def test_default_timezone_is_time_zone_setting() -> None:
    with override_settings(TIME_ZONE="America/New_York"):
        options, _ = parse_options({"SCHEDULES": {"s": {**GOOD, "every": None, "cron": "@daily"}}})
    (spec,) = options.schedules
    assert spec.timezone == "America/New_York"
    assert spec.cron == "0 0 * * *"
    assert spec.expression == "@daily"


def test_nicknames_expand_to_their_crontab_equivalents() -> None:
    specs, problems = parse_schedules(
        {
            name.strip("@"): {"task": "tests.tasks.add", "cron": name.upper()}
            for name in ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly")
        },
        "UTC",
    )
    assert problems == []
    assert {s.name: s.cron for s in specs} == {
        "hourly": "0 * * * *",
        "daily": "0 0 * * *",
        "midnight": "0 0 * * *",
        "weekly": "0 0 * * 0",
        "monthly": "0 0 1 * *",
        "yearly": "0 0 1 1 *",
    }


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_every_ticks_at_multiples_of_the_period_since_the_epoch() -> None:
    spec = ScheduleSpec(name="s", task_path="t.t", every=30)
    assert spec.next_after(utc(2026, 1, 1, 10, 0, 0)) == utc(2026, 1, 1, 10, 0, 30)
    assert spec.next_after(utc(2026, 1, 1, 10, 0, 29)) == utc(2026, 1, 1, 10, 0, 30)
    seven = ScheduleSpec(name="s", task_path="t.t", every=7)
    tick = seven.next_after(utc(2026, 1, 1))
    assert tick.timestamp() % 7 == 0
    assert utc(2026, 1, 1) < tick <= utc(2026, 1, 1) + timedelta(seconds=7)


def test_ticks_between_counts_and_keeps_the_most_recent() -> None:
    spec = ScheduleSpec(name="s", task_path="t.t", every=60, catch_up_limit=3)
    kept, count = spec.ticks_between(utc(2026, 1, 1, 10, 0, 30), utc(2026, 1, 1, 10, 10, 0))
    assert count == 10
    assert kept == [utc(2026, 1, 1, 10, m) for m in (8, 9, 10)]
    cron = ScheduleSpec(name="c", task_path="t.t", cron="* * * * *", catch_up_limit=3)
    assert cron.ticks_between(utc(2026, 1, 1, 10, 0, 30), utc(2026, 1, 1, 10, 10, 0)) == (
        kept,
        10,
    )
    assert spec.ticks_between(utc(2026, 1, 1, 10, 0, 30), utc(2026, 1, 1, 10, 0, 59)) == ([], 0)


def test_a_very_long_outage_is_counted_up_to_a_cap_and_keeps_the_latest_ticks() -> None:
    after, until = utc(2026, 1, 1), utc(2026, 3, 1, 12, 0, 30)
    for spec in (
        ScheduleSpec(name="c", task_path="t.t", cron="* * * * *", catch_up_limit=2),
        ScheduleSpec(name="e", task_path="t.t", every=60, catch_up_limit=2),
    ):
        kept, count = spec.ticks_between(after, until)
        assert count == MAX_SCAN
        assert kept == [utc(2026, 3, 1, 11, 59), utc(2026, 3, 1, 12, 0)]


def test_readable_descriptions() -> None:
    assert ScheduleSpec(name="s", task_path="t.t", every=30).describe() == "Every 30 seconds"
    assert ScheduleSpec(name="s", task_path="t.t", every=3600).describe() == "Every hour"
    assert ScheduleSpec(name="s", task_path="t.t", every=7200).describe() == "Every 2 hours"
    weekday = ScheduleSpec(
        name="s", task_path="t.t", cron="0 7 * * mon-fri", timezone="Europe/Berlin"
    )
    assert weekday.describe() == "At 07:00 on Monday through Friday (Europe/Berlin)"


def test_schedules_need_use_tz() -> None:
    with override_settings(USE_TZ=False):
        messages = schedule_messages({"s": GOOD})
    assert ids(messages) == ["leasejobs.E017"]
    assert "USE_TZ = True" in messages[0].msg
