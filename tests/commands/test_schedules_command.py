"""``manage.py leasejobs_schedules``: the list (table and ``--json``), ``--run``, ``--enqueue-due``.

Schedules come from ``override_settings(TASKS=...)``; their state rows from scheduler
passes (``run_pass``) and the operations, with cursors moved into the past to simulate
missed ticks. Command-line runs check the real exit codes, so they commit their rows
(``transaction=True``) and pass the schedules in ``LEASEJOBS_TEST_OPTIONS``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.leases import database_now
from django_leasejobs.models import Job, RunKind, Schedule, ScheduleRun
from django_leasejobs.schedules import pause, run_now
from django_leasejobs.schedules.scheduler import lease_backend, run_pass

DB = pytest.mark.django_db
COMMITTED = pytest.mark.django_db(transaction=True)

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"
ADD = "tests.tasks.add"
DAILY = {"daily": {"task": ADD, "every": 86400, "args": [1, 2]}}
SCHEDULES = {
    "hourly": {"task": ADD, "every": 3600, "args": [1, 2]},
    "weekdays": {
        "task": ADD,
        "cron": "0 7 * * mon-fri",
        "timezone": "Europe/Berlin",
        "kwargs": {"a": 1, "b": 2},
    },
    "held": {"task": ADD, "every": 60, "args": [1, 2]},
    "late": {"task": ADD, "every": 60, "args": [1, 2]},
    "off": {"task": ADD, "every": 60, "args": [1, 2], "enabled": False},
}
VIEW_KEYS = {
    "name",
    "task_path",
    "expression",
    "description",
    "timezone",
    "state",
    "next_tick",
    "last_tick",
    "last_run_at",
    "last_job_id",
    "last_job_status",
    "overdue",
    "overdue_seconds",
}


def tasks_with(schedules: dict[str, Any]) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "high", "low"],
            "OPTIONS": {"SCHEDULES": schedules},
        }
    }


@pytest.fixture
def declared(request: pytest.FixtureRequest) -> Iterator[LeaseJobsBackend]:
    """The default backend with ``SCHEDULES`` (or the test's ``schedules`` parameter)."""
    schedules = getattr(request, "param", SCHEDULES)
    with override_settings(TASKS=tasks_with(schedules)):
        yield lease_backend("default")


def command(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("leasejobs_schedules", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def command_error(*args: str) -> CommandError:
    with pytest.raises(CommandError) as excinfo:
        command(*args)
    return excinfo.value


def move_cursor_back(name: str, by: timedelta) -> datetime:
    """Simulate missed ticks: the schedule's cursor ``by`` before the database's clock."""
    cursor = database_now() - by
    assert Schedule.objects.filter(name=name).update(last_tick=cursor) == 1
    return cursor


def utc(text: str | None) -> datetime | None:
    if text is None:
        return None
    value = datetime.fromisoformat(text)
    assert value.utcoffset() == timedelta(0), text
    return value


def latest_daily_tick(now: datetime) -> datetime:
    return datetime.fromtimestamp(math.floor(now.timestamp() / 86400) * 86400, UTC)


@pytest.fixture
def every_state(declared: LeaseJobsBackend) -> Iterator[int]:
    """Schedules in every state; yields the job id of a run-now of ``hourly``.

    hourly, weekdays: active; held: paused; late: active, its cursor an hour back (no
    worker ran it: overdue); off: disabled; fresh: new (no row yet); gone: removed.
    """
    with override_settings(TASKS=tasks_with({**SCHEDULES, "gone": SCHEDULES["hourly"]})):
        run_pass(lease_backend("default"))
    job_id = run_now("hourly").job_id
    pause("held")
    move_cursor_back("late", timedelta(hours=1))
    fresh = {"task": ADD, "every": 600, "args": [1, 2]}
    with override_settings(TASKS=tasks_with({**SCHEDULES, "fresh": fresh})):
        yield job_id


# --------------------------------------------------------------------------- the list


@DB
def test_json_lists_every_state(every_state: int) -> None:
    out, err = command("--json")

    data = json.loads(out)
    assert err == ""
    assert set(data) == {"backend", "now", "schedules"}
    assert data["backend"] == "default"
    now = utc(data["now"])
    assert now is not None
    views = {view["name"]: view for view in data["schedules"]}
    # Those in settings in their order, then the removed ones.
    assert list(views) == ["hourly", "weekdays", "held", "late", "off", "fresh", "gone"]
    assert all(set(view) == VIEW_KEYS for view in views.values())
    assert {name: view["state"] for name, view in views.items()} == {
        "hourly": "active",
        "weekdays": "active",
        "held": "paused",
        "late": "active",
        "off": "disabled",
        "fresh": "new",
        "gone": "removed",
    }
    assert [name for name, view in views.items() if view["overdue"]] == ["late"]
    assert 59 * 60 <= views["late"]["overdue_seconds"] < 61 * 60

    hourly = views["hourly"]
    assert (hourly["task_path"], hourly["expression"]) == (ADD, "every 3600s")
    assert hourly["description"] == "Every hour"
    assert hourly["timezone"] == "UTC"
    assert (hourly["last_job_id"], hourly["last_job_status"]) == (every_state, "pending")
    next_tick = utc(hourly["next_tick"])
    assert next_tick is not None and now < next_tick <= now + timedelta(hours=1)
    assert utc(hourly["last_run_at"]) is not None
    assert (hourly["overdue"], hourly["overdue_seconds"]) == (False, 0.0)

    weekdays = views["weekdays"]
    assert (weekdays["expression"], weekdays["timezone"]) == ("0 7 * * mon-fri", "Europe/Berlin")
    assert weekdays["description"].endswith("(Europe/Berlin)")
    assert utc(weekdays["next_tick"]) is not None
    assert weekdays["last_job_id"] is None

    fresh = views["fresh"]
    assert utc(fresh["next_tick"]) is not None
    assert [fresh[k] for k in ("last_tick", "last_run_at", "last_job_id", "last_job_status")] == [
        None,
        None,
        None,
        None,
    ]
    for name in ("held", "off", "gone"):
        assert views[name]["next_tick"] is None, name
        assert utc(views[name]["last_tick"]) is not None, name
    # A removed schedule is shown from its row: the definition it last had.
    assert (views["gone"]["expression"], views["gone"]["description"]) == ("every 3600s", "")


@DB
def test_table_lists_every_state_and_marks_the_overdue_one(every_state: int) -> None:
    out, err = command()

    lines = out.splitlines()
    assert lines[0].split()[:2] == ["name", "schedule"]
    rows = {line.split()[0]: line for line in lines[1:8]}
    assert list(rows) == ["hourly", "weekdays", "held", "late", "off", "fresh", "gone"]
    assert "every 3600s: Every hour" in rows["hourly"]
    assert f"{every_state} pending" in rows["hourly"]
    assert "0 7 * * mon-fri: At 07:00" in rows["weekdays"]
    assert "Europe/Berlin" in rows["weekdays"]
    assert " paused " in rows["held"]
    assert " disabled " in rows["off"]
    assert " new " in rows["fresh"]
    assert " removed " in rows["gone"]
    assert "active OVERDUE 59m" in rows["late"] or "active OVERDUE 60m" in rows["late"]
    assert [name for name, row in rows.items() if "OVERDUE" in row] == ["late"]
    assert "times in UTC" in out
    assert "OVERDUE: a tick is more than one period late" in out
    assert err == ""


@DB
@pytest.mark.parametrize("declared", [{}], indirect=True)
def test_no_schedules(declared: LeaseJobsBackend) -> None:
    assert command()[0].strip() == "No schedules in TASKS['default']['OPTIONS']['SCHEDULES']."
    assert json.loads(command("--json")[0])["schedules"] == []


# --------------------------------------------------------------------------- --run


@DB
def test_run_enqueues_exactly_one_job(declared: LeaseJobsBackend) -> None:
    run_pass(declared)
    cursor = Schedule.objects.get(name="weekdays").last_tick

    out, _err = command("--run", "weekdays")

    job = Job.objects.get()
    assert out.strip() == f"schedule weekdays: enqueued job {job.pk} (run now)"
    assert (job.task_path, job.args, job.kwargs) == (ADD, [], {"a": 1, "b": 2})
    run = ScheduleRun.objects.get()
    assert (run.schedule.name, run.kind, run.tick, run.job_id) == (
        "weekdays",
        RunKind.MANUAL,
        None,
        job.pk,
    )
    row = Schedule.objects.get(name="weekdays")
    assert (row.last_job_id, row.last_tick) == (job.pk, cursor)  # outside the ticks


@DB
def test_run_a_paused_schedule_as_json(declared: LeaseJobsBackend) -> None:
    pause("held")  # creates the rows first

    out, _err = command("--run", "held", "--json")

    assert json.loads(out) == {"schedule": "held", "tick": None, "job_id": Job.objects.get().pk}


@DB
def test_run_an_unknown_schedule_names_the_known_ones(declared: LeaseJobsBackend) -> None:
    error = command_error("--run", "nope")
    assert str(error) == (
        "No schedule 'nope' in TASKS['default']['OPTIONS']['SCHEDULES']. "
        "Known schedules: hourly, weekdays, held, late, off."
    )
    assert not Job.objects.exists()


@DB
@pytest.mark.parametrize("declared", [{}], indirect=True)
def test_run_without_schedules(declared: LeaseJobsBackend) -> None:
    assert str(command_error("--run", "nope")).endswith("It declares no schedules.")


@DB
def test_run_and_enqueue_due_exclude_each_other(declared: LeaseJobsBackend) -> None:
    error = command_error("--run", "hourly", "--enqueue-due")
    assert "not allowed with argument" in str(error)
    assert not Job.objects.exists()


@DB
def test_unknown_backend_is_rejected() -> None:
    assert "No task backend 'nope'" in str(command_error("--backend", "nope"))


# --------------------------------------------------------------------------- --enqueue-due


@DB
@pytest.mark.parametrize("declared", [DAILY], indirect=True)
def test_enqueue_due_records_a_new_schedule_and_enqueues_nothing(
    declared: LeaseJobsBackend,
) -> None:
    out, _err = command("--enqueue-due")

    assert out.splitlines() == ["enqueued due schedule ticks count=0"]
    assert not Job.objects.exists()
    assert Schedule.objects.get().name == "daily"  # its first tick is the next one


@DB
@pytest.mark.parametrize("declared", [DAILY], indirect=True)
def test_enqueue_due_enqueues_a_due_tick_once(declared: LeaseJobsBackend) -> None:
    run_pass(declared)
    cursor = move_cursor_back("daily", timedelta(days=3))
    tick = latest_daily_tick(database_now())
    assert cursor < tick

    first, _err = command("--enqueue-due")
    second, _err = command("--enqueue-due")

    job = Job.objects.get()  # catch_up "latest": the most recent of the missed ticks
    assert first.splitlines() == [
        f"schedule daily: enqueued job {job.pk} for tick {tick.isoformat()}",
        "enqueued due schedule ticks count=1",
    ]
    assert second.splitlines() == ["enqueued due schedule ticks count=0"]
    assert list(ScheduleRun.objects.values_list("tick", "job_id")) == [(tick, job.pk)]


@DB
@pytest.mark.parametrize("declared", [DAILY], indirect=True)
def test_enqueue_due_as_json(declared: LeaseJobsBackend) -> None:
    run_pass(declared)
    move_cursor_back("daily", timedelta(days=1, hours=1))

    data = json.loads(command("--enqueue-due", "--json")[0])

    job = Job.objects.get()
    tick = latest_daily_tick(database_now())
    assert set(data) == {"now", "enqueued", "next_due", "failed"}
    assert data["enqueued"] == [{"schedule": "daily", "tick": tick.isoformat(), "job_id": job.pk}]
    assert utc(data["next_due"]) == tick + timedelta(days=1)
    assert data["failed"] == []


@DB
@pytest.mark.parametrize("declared", [DAILY], indirect=True)
def test_enqueue_due_leaves_a_paused_schedule_alone(declared: LeaseJobsBackend) -> None:
    pause("daily")
    move_cursor_back("daily", timedelta(days=3))

    assert command("--enqueue-due")[0].splitlines() == ["enqueued due schedule ticks count=0"]
    assert not Job.objects.exists()


# --------------------------------------------------------------------------- command line


@COMMITTED
def test_from_cron_each_due_tick_once(run_manage: Any, subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps({"SCHEDULES": DAILY})}

    first = run_manage(["leasejobs_schedules", "--enqueue-due"], env=env)
    assert (first.returncode, first.stderr) == (0, "")
    assert first.stdout.splitlines() == ["enqueued due schedule ticks count=0"]

    move_cursor_back("daily", timedelta(days=2))
    runs = [run_manage(["leasejobs_schedules", "--enqueue-due"], env=env) for _ in range(2)]

    assert [done.returncode for done in runs] == [0, 0]
    job = Job.objects.get()
    assert f"schedule daily: enqueued job {job.pk} for tick" in runs[0].stdout
    assert runs[1].stdout.splitlines() == ["enqueued due schedule ticks count=0"]

    listed = run_manage(["leasejobs_schedules", "--json"], env=env)
    assert listed.returncode == 0, listed.stderr
    (view,) = json.loads(listed.stdout)["schedules"]
    assert (view["name"], view["state"], view["last_job_id"]) == ("daily", "active", job.pk)

    unknown = run_manage(["leasejobs_schedules", "--run", "nope"], env=env)
    assert unknown.returncode == 1
    assert "No schedule 'nope'" in unknown.stderr
    assert "Known schedules: daily." in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_unreachable_database_exits_2(run_manage: Any, subprocess_env: dict[str, str]) -> None:
    if connection.vendor == "sqlite":
        url = "sqlite:////nonexistent-leasejobs-dir/schedules.sqlite3"
    else:
        url = "postgres://postgres@127.0.0.1:1/nope"  # nothing listens on port 1
    env = {**subprocess_env, "DATABASE_URL": url}

    for args in (["--enqueue-due"], []):
        done = run_manage(["leasejobs_schedules", *args], env=env)
        assert done.returncode == 2
        assert "database 'default' unreachable or failing:" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert "Traceback" not in done.stderr
        assert done.stdout == ""
