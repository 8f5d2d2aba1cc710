"""Schedules run by real ``runworker`` processes: every worker schedules, each tick runs once."""

from __future__ import annotations

import itertools
import json
import signal
from datetime import datetime
from typing import Any

import pytest
from django.db import connection

from django_leasejobs.models import Job, JobStatus, ScheduleRun
from tests.waiting import wait_until
from tests.worker.test_worker_faults import _terminate_other_backends

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EVERY_2 = {"SCHEDULES": {"two": {"task": "tests.tasks.add", "every": 2, "args": [2, 2]}}}


def tick_times() -> list[datetime]:
    return list(ScheduleRun.objects.order_by("tick").values_list("tick", flat=True))


def test_two_workers_run_an_every_two_seconds_schedule_once_per_tick(
    workers: Any, run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    first = workers.start(EVERY_2, args=["--concurrency", "1"])
    second = workers.start(EVERY_2, args=["--concurrency", "1"])
    wait_until(lambda: len(tick_times()) >= 6, timeout=60, what="six ticks enqueued")
    # Both schedulers race on every tick; the output of both says who enqueued which.
    ticks = tick_times()
    assert len(set(ticks)) == len(ticks)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    # Every 2 s; a tick is only ever missed (never doubled) when both schedulers were
    # held up for over a period, which a loaded CI machine may do now and then.
    assert all(gap >= 2 and gap % 2 == 0 for gap in gaps), gaps
    assert gaps.count(2) >= len(gaps) / 2, gaps
    jobs = Job.objects.filter(pk__in=ScheduleRun.objects.values("job_id"))
    assert jobs.count() == len(ticks)
    wait_until(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED, result=4).count() >= 5,
        timeout=30,
        what="the scheduled jobs to run",
    )
    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps(EVERY_2)}
    listed = run_manage(["leasejobs_schedules", "--json"], env=env, check=True)
    (schedule,) = json.loads(listed.stdout)["schedules"]
    assert schedule["name"] == "two"
    assert schedule["state"] == "active"
    assert schedule["next_tick"] is not None
    # A worker killed outright takes nothing with it: the other keeps the schedule going.
    first.kill()
    count = len(tick_times())
    wait_until(lambda: len(tick_times()) >= count + 3, timeout=30, what="ticks after a kill")
    ticks = tick_times()
    assert len(set(ticks)) == len(ticks)
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    for worker in (first, second):
        assert "schedules=1" in worker.output
        assert "thread failed" not in worker.output
        assert "pass failed" not in worker.output


def test_burst_and_no_scheduler_workers_do_not_schedule(workers: Any) -> None:
    quiet = workers.start(EVERY_2, args=["--no-scheduler"])
    burst = workers.start(EVERY_2, args=["--burst"])
    assert burst.wait() == 0
    # Long enough for three ticks of a scheduler, had one run.
    with pytest.raises(AssertionError, match="timed out"):
        wait_until(lambda: ScheduleRun.objects.exists(), timeout=7, what="a schedule run")
    quiet.signal(signal.SIGTERM)
    assert quiet.wait() == 0
    assert "schedules=0" in quiet.output
    assert "schedules=0" in burst.output


@pytest.mark.skipif(
    connection.vendor not in ("postgresql", "mysql"),
    reason="cuts the worker's server connections; an SQLite database cannot",
)
def test_the_scheduler_thread_survives_its_database_connection_being_cut(
    workers: Any,
) -> None:
    worker = workers.start(
        {"SCHEDULES": {"one": {"task": "tests.tasks.add", "every": 1, "args": [1, 1]}}},
        args=["--concurrency", "1"],
    )
    wait_until(lambda: len(tick_times()) >= 2, timeout=30, what="ticks before the cut")
    for _ in range(3):  # three cuts, some of them mid-pass
        assert _terminate_other_backends() > 0
        before = len(tick_times())
        wait_until(
            lambda before=before: len(tick_times()) >= before + 2,
            timeout=30,
            what="ticks after a cut",
        )
    ticks = tick_times()
    assert len(set(ticks)) == len(ticks)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
