"""Cron schedules across DST changes, walked through with frozen time and real passes.

``freezegun`` freezes this process's clock; each pass is given that clock as its
``now`` (in production, the database's clock), and the jobs land in the real database.
The rules pinned here are cronsim's, which follow Debian cron: a job at a specific time
that falls into the skipped hour runs once, at the first minute after the gap; one in
the repeated hour runs once, at its first occurrence; jobs that run more often than
hourly are scheduled in real time (they run in both occurrences of the repeated hour).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django.utils import timezone
from freezegun import freeze_time

from django_leasejobs.models import Job, ScheduleRun
from django_leasejobs.schedules.scheduler import lease_backend, run_pass

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"
TICK_MATH = ("cronsim", "django_leasejobs.schedule_spec")
"""Left with the real ``datetime`` class: freezegun's stand-in loses ``fold`` in
``astimezone``, the one bit that tells the two 02:30s of a fall-back night apart."""
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def walk(
    cron: str, zone: str, start: datetime, hours: int, step_minutes: int = 10
) -> list[datetime]:
    """Run a pass every ``step_minutes`` of frozen time from ``start`` (UTC) for ``hours``;
    return the enqueued ticks as local times of ``zone``."""
    setting = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default"],
            "OPTIONS": {
                "SCHEDULES": {
                    "s": {"task": "tests.tasks.add", "cron": cron, "timezone": zone, "args": [1, 1]}
                }
            },
        }
    }
    enqueued: list[datetime] = []
    with override_settings(TASKS=setting), freeze_time(start, ignore=list(TICK_MATH)) as frozen:
        backend = lease_backend("default")
        end = start + timedelta(hours=hours)
        while timezone.now() <= end:
            report = run_pass(backend, now=timezone.now())
            enqueued.extend(run.tick for run in report.enqueued if run.tick)
            frozen.tick(timedelta(minutes=step_minutes))
    stored = list(ScheduleRun.objects.order_by("tick").values_list("tick", flat=True))
    assert stored == enqueued  # what the passes reported is what the table holds, once each
    assert Job.objects.count() == len(enqueued)
    return [tick.astimezone(ZoneInfo(zone)) for tick in enqueued]


def local(zone: ZoneInfo, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=zone, fold=fold)  # type: ignore[misc]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_berlin_spring_forward_runs_the_skipped_time_once_after_the_gap() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    ran = walk("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12), hours=48)
    assert ran == [
        local(BERLIN, 2026, 3, 29, 3, 0),
        local(BERLIN, 2026, 3, 30, 2, 30),
    ]


def test_berlin_fall_back_runs_the_repeated_time_once() -> None:
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    ran = walk("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 12), hours=48)
    assert ran == [
        local(BERLIN, 2026, 10, 25, 2, 30, fold=0),
        local(BERLIN, 2026, 10, 26, 2, 30),
    ]
    assert ran[0].utcoffset() == timedelta(hours=2)  # the first 02:30, in summer time


def test_berlin_fall_back_hourly_job_runs_in_both_occurrences_of_the_hour() -> None:
    ran = walk("30 * * * *", "Europe/Berlin", utc(2026, 10, 24, 22, 45), hours=5)
    assert [t.astimezone(UTC) for t in ran] == [utc(2026, 10, 24, 23 + h, 30) for h in range(1)] + [
        utc(2026, 10, 25, h, 30) for h in range(0, 4)
    ]
    # Local 02:30 twice, an hour apart in real time: two ticks, each enqueued once.
    assert [(t.hour, t.utcoffset()) for t in ran].count((2, timedelta(hours=2))) == 1
    assert [(t.hour, t.utcoffset()) for t in ran].count((2, timedelta(hours=1))) == 1


def test_new_york_spring_forward_runs_the_skipped_time_once_after_the_gap() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT.
    ran = walk("30 2 * * *", "America/New_York", utc(2026, 3, 7, 12), hours=48)
    assert ran == [
        local(NEW_YORK, 2026, 3, 8, 3, 0),
        local(NEW_YORK, 2026, 3, 9, 2, 30),
    ]


def test_new_york_fall_back_runs_the_repeated_time_once() -> None:
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    ran = walk("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), hours=48)
    assert ran == [
        local(NEW_YORK, 2026, 11, 1, 1, 30, fold=0),
        local(NEW_YORK, 2026, 11, 2, 1, 30),
    ]
    assert ran[0].utcoffset() == timedelta(hours=-4)


def test_new_york_spring_forward_every_fifteen_minutes_skips_the_missing_hour() -> None:
    ran = walk("*/15 * * * *", "America/New_York", utc(2026, 3, 8, 6, 40), hours=1, step_minutes=5)
    # 01:45 EST, then 03:00 EDT: no 02:xx that morning, and no tick twice.
    assert [t.strftime("%H:%M %Z") for t in ran] == [
        "01:45 EST",
        "03:00 EDT",
        "03:15 EDT",
        "03:30 EDT",
    ]


@pytest.mark.parametrize(
    "start",
    [utc(2026, 3, 28, 12), utc(2026, 10, 24, 12), utc(2026, 3, 7, 12), utc(2026, 10, 31, 12)],
)
def test_a_utc_schedule_ignores_every_dst_change(start: datetime) -> None:
    ran = walk("30 2 * * *", "UTC", start, hours=48)
    first = start.replace(hour=2, minute=30) + timedelta(days=1)
    assert ran == [first, first + timedelta(days=1)]
