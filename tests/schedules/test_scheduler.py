"""Scheduler passes against the real database: exactly one job per tick, whatever races.

Time is simulated: a pass takes ``now`` (in production, the database's clock), so a
test walks through hours of ticks in a moment. Real threads with their own
connections race on the same ticks; a real process is killed inside the tick's
transaction.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from django_leasejobs import schedules
from django_leasejobs.models import Job, JobStatus, RunKind, Schedule, ScheduleRun
from django_leasejobs.schedule_spec import ScheduleSpec
from django_leasejobs.schedules.scheduler import lease_backend, plan, run_pass

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"
T0 = datetime(2026, 1, 1, 10, 0, 0, 500_000, tzinfo=UTC)
"""Half a second past a whole minute: ``every`` ticks fall on whole seconds."""


def tasks_with(schedules_setting: dict[str, Any]) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "high", "low"],
            "OPTIONS": {"SCHEDULES": schedules_setting},
        }
    }


@pytest.fixture
def scheduled(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The backend with the schedules of the test's ``schedules`` marker."""
    marker = request.node.get_closest_marker("schedules")
    assert marker is not None, "use @pytest.mark.schedules({...})"
    with override_settings(TASKS=tasks_with(marker.args[0])):
        yield lease_backend("default")


def ticks_of(name: str) -> list[datetime]:
    return list(
        ScheduleRun.objects.filter(schedule__name=name, kind=RunKind.TICK)
        .order_by("tick")
        .values_list("tick", flat=True)
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.schedules({"s": {"task": "tests.tasks.add", "every": 1, "args": [1, 2]}})
def test_four_racing_schedulers_enqueue_each_of_200_ticks_once(scheduled: Any) -> None:
    threads, ticks = 4, 200
    barrier = threading.Barrier(threads)
    reported: list[datetime] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def scheduler() -> None:
        try:
            for i in range(ticks + 1):
                barrier.wait(timeout=60)
                report = run_pass(scheduled, now=at(i))
                with lock:
                    reported.extend(run.tick for run in report.enqueued if run.tick)
                    errors.extend(Exception(name) for name in report.failed)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    started = [threading.Thread(target=scheduler) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=300)
    assert errors == []
    expected = [T0.replace(microsecond=0) + timedelta(seconds=i) for i in range(1, ticks + 1)]
    assert sorted(reported) == expected  # every tick reported once, by one scheduler
    assert ticks_of("s") == expected
    jobs = Job.objects.filter(task_path="tests.tasks.add")
    assert jobs.count() == ticks
    assert set(ScheduleRun.objects.values_list("job_id", flat=True)) == set(
        jobs.values_list("pk", flat=True)
    )
    assert {tuple(args) for args in jobs.values_list("args", flat=True)} == {(1, 2)}


@pytest.mark.schedules({"s": {"task": "tests.tasks.add", "every": 60, "args": [1, 2]}})
def test_a_tick_is_never_enqueued_again_after_its_job_finished(scheduled: Any) -> None:
    run_pass(scheduled, now=at(0))
    (first,) = run_pass(scheduled, now=at(60)).enqueued
    Job.objects.filter(pk=first.job_id).update(status=JobStatus.SUCCEEDED)
    for seconds in (60, 61, 90, 119):
        assert run_pass(scheduled, now=at(seconds)).enqueued == ()
    # Even a scheduler whose clock lags far behind enqueues nothing from the past.
    assert run_pass(scheduled, now=at(60.2)).enqueued == ()
    assert len(ticks_of("s")) == 1
    assert Job.objects.count() == 1


KILL_SCRIPT = """
import os, signal, sys
from datetime import datetime
import django
django.setup()
from django.test import override_settings
from django_leasejobs.schedules import scheduler, transitions
from tests.schedules.test_scheduler import tasks_with

where, now, setting = sys.argv[1], datetime.fromisoformat(sys.argv[2]), eval(sys.argv[3])

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if where == "before-job":
    transitions._enqueue_run = die  # the cursor moved and the run row is in, uncommitted
else:
    scheduler.logger.info = die  # the transaction committed; nothing after it ran
with override_settings(TASKS=tasks_with(setting)):
    scheduler.run_pass(scheduler.lease_backend("default"), now=now)
print("not killed")
"""


@pytest.mark.parametrize("where", ["before-job", "after-commit"])
@pytest.mark.schedules({"s": {"task": "tests.tasks.add", "every": 60, "args": [1, 2]}})
def test_a_scheduler_killed_around_the_insert_still_enqueues_the_tick_once(
    scheduled: Any, subprocess_env: dict[str, str], where: str
) -> None:
    setting = {"s": {"task": "tests.tasks.add", "every": 60, "args": [1, 2]}}
    run_pass(scheduled, now=at(0))
    killed = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, where, at(61).isoformat(), repr(setting)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    report = run_pass(scheduled, now=at(62))
    tick = at(60).replace(microsecond=0)
    assert [run.tick for run in report.enqueued] == ([tick] if where == "before-job" else [])
    assert ticks_of("s") == [tick]
    assert Job.objects.count() == 1
    assert Schedule.objects.get(name="s").last_tick == tick


OUTAGE = {
    "latest": {"task": "tests.tasks.add", "every": 60, "args": [0, 0]},
    "none": {"task": "tests.tasks.add", "every": 60, "args": [0, 0], "catch_up": "none"},
    "all": {"task": "tests.tasks.add", "every": 60, "args": [0, 0], "catch_up": "all"},
    "all-capped": {
        "task": "tests.tasks.add",
        "every": 60,
        "args": [0, 0],
        "catch_up": "all",
        "catch_up_limit": 4,
    },
}


@pytest.mark.schedules(OUTAGE)
def test_catch_up_after_an_outage_of_ten_periods(scheduled: Any, leasejobs_log: Any) -> None:
    run_pass(scheduled, now=at(0))
    minute = T0.replace(microsecond=0)
    # Every scheduler was down from just after 10:00:00.5 until 10:10:40: the ticks
    # 10:01 ... 10:10 were missed, and the latest one is 40 s late (more than half a period).
    report = run_pass(scheduled, now=at(640))
    by_schedule: dict[str, list[datetime]] = {}
    for run in report.enqueued:
        by_schedule.setdefault(run.schedule, []).append(run.tick)  # type: ignore[arg-type]
    ten = [minute + timedelta(minutes=m) for m in range(1, 11)]
    assert by_schedule == {"latest": [ten[-1]], "all": ten, "all-capped": ten[-4:]}
    assert ticks_of("none") == []
    assert Schedule.objects.get(name="none").last_tick == ten[-1]  # skipped to 10:10
    skipped = {r.schedule: r.count for r in leasejobs_log.records if "missed" in r.getMessage()}
    assert skipped == {"latest": 9, "none": 10, "all-capped": 6}
    # From then on, every policy runs the next tick on time, once.
    report = run_pass(scheduled, now=at(661))
    eleven = minute + timedelta(minutes=11)
    assert sorted(run.schedule for run in report.enqueued) == sorted(OUTAGE)
    assert {run.tick for run in report.enqueued} == {eleven}
    assert Job.objects.count() == 1 + 10 + 4 + 4


@pytest.mark.schedules(
    {"none": {"task": "tests.tasks.add", "every": 60, "args": [0, 0], "catch_up": "none"}}
)
def test_catch_up_none_runs_a_tick_that_is_only_a_little_late(scheduled: Any) -> None:
    run_pass(scheduled, now=at(0))
    # Down through ten ticks, back 20 s after the last one: within half a period.
    (run,) = run_pass(scheduled, now=at(619.5)).enqueued
    assert run.tick == T0.replace(microsecond=0) + timedelta(minutes=10)


def test_plan_is_where_each_policy_is_decided() -> None:
    cursor = T0
    spec = ScheduleSpec(name="s", task_path="t.t", every=60)
    assert plan(spec, cursor, at(30)).enqueue == ()
    on_time = plan(spec, cursor, at(60))
    assert (len(on_time.enqueue), on_time.missed, on_time.skip_to) == (1, 0, None)
    none = ScheduleSpec(name="s", task_path="t.t", every=60, catch_up="none")
    late = plan(none, cursor, at(60 * 3 + 50))
    assert (late.enqueue, late.missed) == ((), 3)
    assert late.skip_to == T0.replace(microsecond=0) + timedelta(minutes=3)


@pytest.mark.schedules({"s": {"task": "tests.tasks.add", "every": 10, "args": [1, 1]}})
def test_pause_stops_the_next_pass_and_resume_follows_the_catch_up_policy(
    scheduled: Any,
) -> None:
    run_pass(scheduled, now=at(0))
    assert len(run_pass(scheduled, now=at(10)).enqueued) == 1
    assert schedules.pause("s") is True
    assert schedules.pause("s") is False  # already paused
    for seconds in range(20, 100, 10):
        assert run_pass(scheduled, now=at(seconds)).enqueued == ()
    row = Schedule.objects.get(name="s")
    assert row.paused and row.paused_at is not None
    assert schedules.resume("s") is True
    (caught_up,) = run_pass(scheduled, now=at(100)).enqueued  # latest: one job
    assert caught_up.tick == T0.replace(microsecond=0) + timedelta(seconds=100)
    assert len(ticks_of("s")) == 2


@pytest.mark.schedules({"s": {"task": "tests.tasks.add", "every": 3600, "args": [2, 3]}})
def test_run_now_enqueues_exactly_one_job_outside_the_ticks(scheduled: Any) -> None:
    run_pass(scheduled, now=at(0))
    schedules.pause("s")
    run = schedules.run_now("s")
    assert run.tick is None
    job = Job.objects.get()
    assert (job.pk, job.task_path, job.args) == (run.job_id, "tests.tasks.add", [2, 3])
    assert ScheduleRun.objects.get().kind == RunKind.MANUAL
    row = Schedule.objects.get(name="s")
    assert row.last_job_id == job.pk
    assert row.last_tick == T0  # the tick sequence did not move
    with pytest.raises(schedules.UnknownSchedule):
        schedules.run_now("nope")
    assert Job.objects.count() == 1


def test_a_removed_schedule_stops_and_keeps_its_row() -> None:
    setting = {
        "kept": {"task": "tests.tasks.add", "every": 10, "args": [0, 0]},
        "gone": {"task": "tests.tasks.add", "every": 10, "args": [0, 0]},
    }
    with override_settings(TASKS=tasks_with(setting)):
        backend = lease_backend("default")
        run_pass(backend, now=at(0))
        assert len(run_pass(backend, now=at(10)).enqueued) == 2
    with override_settings(TASKS=tasks_with({"kept": setting["kept"]})):
        backend = lease_backend("default")
        report = run_pass(backend, now=at(20))
        assert [run.schedule for run in report.enqueued] == ["kept"]
        views = {view.name: view for view in schedules.overview(now=at(20))}
        assert views["gone"].state == "removed"
        assert views["gone"].next_tick is None
    gone = Schedule.objects.get(name="gone")
    assert gone.removed_at is not None
    assert len(ticks_of("gone")) == 1
    with override_settings(TASKS=tasks_with(setting)):
        # Put back: it starts again from that moment, without back-filling.
        backend = lease_backend("default")
        assert [r.schedule for r in run_pass(backend, now=at(45)).enqueued] == ["kept"]
        assert Schedule.objects.get(name="gone").removed_at is None
        names = Counter(r.schedule for r in run_pass(backend, now=at(50)).enqueued)
        assert names == {"kept": 1, "gone": 1}


@pytest.mark.schedules(
    {
        "off": {"task": "tests.tasks.add", "every": 10, "args": [0, 0], "enabled": False},
        "broken": {"task": "tests.tasks.gone_away", "every": 10},
        "fine": {"task": "tests.tasks.add", "every": 10, "args": [0, 0]},
    }
)
def test_disabled_and_broken_schedules_never_stop_the_others(
    scheduled: Any, leasejobs_log: Any
) -> None:
    run_pass(scheduled, now=at(0))
    report = run_pass(scheduled, now=at(10))
    assert [run.schedule for run in report.enqueued] == ["fine"]
    assert any("gone_away" in r.getMessage() for r in leasejobs_log.records)
    assert Schedule.objects.get(name="off").last_tick == T0
    assert ticks_of("broken") == []


@pytest.mark.schedules(
    {
        "s": {
            "task": "tests.tasks.add",
            "every": 10,
            "kwargs": {"a": 1, "b": 2},
            "queue": "high",
            "priority": 7,
        }
    }
)
def test_the_job_carries_the_schedules_arguments_queue_and_priority(scheduled: Any) -> None:
    run_pass(scheduled, now=at(0))
    (run,) = run_pass(scheduled, now=at(10)).enqueued
    job = Job.objects.get(pk=run.job_id)
    assert (job.queue, job.priority, job.args, job.kwargs) == ("high", 7, [], {"a": 1, "b": 2})
    assert run.result.task.queue_name == "high"


def test_a_schedule_renamed_by_case_alone_keeps_its_row_and_the_others_run() -> None:
    # MySQL/MariaDB compare the names without case: the row must be found there, and is
    # found the same way everywhere (keeping its cursor and runs).
    before = {
        "Nightly": {"task": "tests.tasks.add", "every": 10, "args": [0, 0]},
        "other": {"task": "tests.tasks.add", "every": 10, "args": [0, 0]},
    }
    after = {"nightly": before["Nightly"], "other": before["other"]}
    with override_settings(TASKS=tasks_with(before)):
        backend = lease_backend("default")
        run_pass(backend, now=at(0))
        assert len(run_pass(backend, now=at(10)).enqueued) == 2
    row = Schedule.objects.get(name="Nightly")
    with override_settings(TASKS=tasks_with(after)):
        backend = lease_backend("default")
        report = run_pass(backend, now=at(20))
        assert report.failed == ()
        assert sorted(run.schedule for run in report.enqueued) == ["nightly", "other"]
        assert {view.name: view.state for view in schedules.overview(now=at(20))} == {
            "nightly": "active",
            "other": "active",
        }
    renamed = Schedule.objects.get(pk=row.pk)
    assert (renamed.name, renamed.removed_at) == ("nightly", None)
    assert len(ticks_of("nightly")) == 2
