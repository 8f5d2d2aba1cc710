"""Trends read from the rollup table (``JobRollup``), never from the job table.

For the dashboard's charts (:func:`series`: the last hour per minute, the last day per
hour, the last week per 6 hours) and the metrics view (:func:`per_task`: per queue and
task over a window). Each is one aggregate query through the rollup's index on
``minute`` (or its unique index, led by backend and minute); the percentiles come from
the summed histogram buckets (``histograms.py``, within a factor of sqrt(2)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import F, Sum
from django.db.models.functions import TruncHour

from .histograms import BUCKETS, percentile
from .models import ROLLUP_COUNTERS, RUN_COLUMNS, WAIT_COLUMNS, JobRollup


@dataclass(frozen=True, slots=True)
class TrendRange:
    name: str
    label: str
    span: timedelta
    step: timedelta


RANGES = {
    "hour": TrendRange("hour", "last hour, per minute", timedelta(hours=1), timedelta(minutes=1)),
    "day": TrendRange("day", "last day, per hour", timedelta(days=1), timedelta(hours=1)),
    "week": TrendRange("week", "last week, per 6 hours", timedelta(days=7), timedelta(hours=6)),
}
DEFAULT_RANGE = "hour"


@dataclass(slots=True)
class Totals:
    """Counts and histograms summed over some rollup rows."""

    enqueued: int = 0
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    wait: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    run: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, row: Mapping[str, Any]) -> None:
        """Add a row of sums (``_SUMS``' names; a NULL sum is 0)."""
        for name in ROLLUP_COUNTERS:
            setattr(self, name, getattr(self, name) + (row[name] or 0))
        self.wait = [n + (row[c] or 0) for n, c in zip(self.wait, WAIT_COLUMNS, strict=True)]
        self.run = [n + (row[c] or 0) for n, c in zip(self.run, RUN_COLUMNS, strict=True)]

    def wait_percentile(self, fraction: float) -> float | None:
        return percentile(self.wait, fraction)

    def run_percentile(self, fraction: float) -> float | None:
        return percentile(self.run, fraction)


@dataclass(slots=True)
class TrendPoint:
    start: datetime
    totals: Totals = field(default_factory=Totals)


@dataclass(slots=True)
class Trend:
    range: TrendRange
    points: list[TrendPoint]


_SUMS = {name: Sum(name) for name in (*ROLLUP_COUNTERS, *WAIT_COLUMNS, *RUN_COLUMNS)}


def minute_start(moment: datetime) -> datetime:
    """The start of the minute ``moment`` falls in."""
    return moment.replace(second=0, microsecond=0)


def _floor(moment: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + (moment - epoch) // step * step


def series(range_name: str, *, now: datetime, using: str, backend: str | None = None) -> Trend:
    """The points of ``range_name`` (a key of :data:`RANGES`) up to ``now`` (the database's
    clock), oldest first, each the sums of its step's rows (all queues and tasks)."""
    trend_range = RANGES[range_name]
    last = _floor(now, trend_range.step)
    count = round(trend_range.span / trend_range.step)
    first = last - (count - 1) * trend_range.step
    starts = [first + i * trend_range.step for i in range(count)]
    points = {start: TrendPoint(start) for start in starts}
    rows = JobRollup.objects.using(using).filter(minute__gte=first)
    if backend is not None:
        rows = rows.filter(backend=backend)
    if trend_range.step == timedelta(minutes=1):
        grouped = rows.values(at=F("minute"))
    else:
        # Hours in UTC (MySQL/MariaDB would otherwise need the server's time zone tables).
        grouped = rows.annotate(at=TruncHour("minute", tzinfo=UTC)).values("at")
    for row in grouped.annotate(**_SUMS).order_by():
        at = row["at"]
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        point = points.get(_floor(at, trend_range.step))
        if point is not None:
            point.totals.add(row)
    return Trend(trend_range, [points[start] for start in sorted(points)])


@dataclass(frozen=True, slots=True)
class TaskTotals:
    backend: str
    queue: str
    task_path: str
    totals: Totals


def per_task(*, since: datetime, until: datetime, using: str) -> list[TaskTotals]:
    """Sums per backend, queue and task of the minutes in ``[since, until)``."""
    rows = (
        JobRollup.objects.using(using)
        .filter(minute__gte=since, minute__lt=until)
        .values("backend", "queue", "task_path")
        .annotate(**_SUMS)
        .order_by("backend", "queue", "task_path")
    )
    found = []
    for row in rows:
        totals = Totals()
        totals.add(row)
        found.append(TaskTotals(row["backend"], row["queue"], row["task_path"], totals))
    return found
