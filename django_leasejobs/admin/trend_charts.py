"""The dashboard's trend charts as server-rendered SVG geometry (no JavaScript library).

Two charts per range (``trends.RANGES``): outcomes per step as stacked bars (succeeded,
retried, failed or dead), and the wait and run times' p50 and p95 as lines. Every bar
and point carries a ``<title>`` (its numbers as text, for screen readers and hovering);
the template escapes all text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trends import Trend, TrendPoint

WIDTH = 600
BARS_HEIGHT = 120
LINES_HEIGHT = 90


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    ok_y: float
    ok_h: float
    retry_y: float
    retry_h: float
    fail_y: float
    fail_h: float
    label: str


@dataclass(frozen=True, slots=True)
class Line:
    css: str
    name: str
    points: str
    """SVG ``points``: ``x,y x,y ...`` of the steps that had a value."""


@dataclass(frozen=True, slots=True)
class Hover:
    x: float
    width: float
    label: str


@dataclass(frozen=True, slots=True)
class TrendChart:
    range_name: str
    range_label: str
    width: int
    bars_height: int
    lines_height: int
    bars: list[Bar]
    peak: int
    lines: list[Line]
    hovers: list[Hover]
    slowest: str
    """The top of the time chart, as text."""
    succeeded: int
    retried: int
    failed: int
    enqueued: int
    started: int


def _ended(point: TrendPoint) -> int:
    t = point.totals
    return t.succeeded + t.retried + t.failed + t.dead


def _when(point: TrendPoint, per_minute: bool) -> str:
    return f"{point.start:%H:%M}" if per_minute else f"{point.start:%a %H:%M}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def trend_chart(trend: Trend) -> TrendChart:
    points = trend.points
    per_minute = trend.range.name == "hour"
    slot = WIDTH / max(len(points), 1)
    peak = max([*(_ended(p) for p in points), 1])
    bars, hovers = [], []
    series: dict[str, list[tuple[float, float | None]]] = {
        "wait p50": [],
        "wait p95": [],
        "run p50": [],
        "run p95": [],
    }
    for i, point in enumerate(points):
        t = point.totals
        x = round(i * slot + 0.5, 1)
        width = round(max(slot - 1, 0.5), 1)
        ok_h = t.succeeded / peak * BARS_HEIGHT
        retry_h = t.retried / peak * BARS_HEIGHT
        fail_h = (t.failed + t.dead) / peak * BARS_HEIGHT
        when = _when(point, per_minute)
        bars.append(
            Bar(
                x,
                width,
                round(BARS_HEIGHT - ok_h, 1),
                round(ok_h, 1),
                round(BARS_HEIGHT - ok_h - retry_h, 1),
                round(retry_h, 1),
                round(BARS_HEIGHT - ok_h - retry_h - fail_h, 1),
                round(fail_h, 1),
                f"{when}: enqueued {t.enqueued}, started {t.started}, succeeded {t.succeeded}, "
                f"retried {t.retried}, failed {t.failed}, dead {t.dead}",
            )
        )
        values = {
            "wait p50": t.wait_percentile(0.5),
            "wait p95": t.wait_percentile(0.95),
            "run p50": t.run_percentile(0.5),
            "run p95": t.run_percentile(0.95),
        }
        middle = i * slot + slot / 2
        for name, value in values.items():
            series[name].append((middle, value))
        hovers.append(
            Hover(
                x,
                width,
                f"{when}: wait p50 {_seconds(values['wait p50'])}, "
                f"p95 {_seconds(values['wait p95'])}; run p50 {_seconds(values['run p50'])}, "
                f"p95 {_seconds(values['run p95'])}",
            )
        )
    found = [v for line in series.values() for _, v in line if v is not None]
    slowest = max([*found, 0.001])
    lines = []
    for name, values_at in series.items():
        coords = " ".join(
            f"{x:.1f},{LINES_HEIGHT - v / slowest * (LINES_HEIGHT - 2):.1f}"
            for x, v in values_at
            if v is not None
        )
        css = "lj-line-" + name.replace(" ", "-")
        lines.append(Line(css, name, coords))
    totals = [p.totals for p in points]
    return TrendChart(
        range_name=trend.range.name,
        range_label=trend.range.label,
        width=WIDTH,
        bars_height=BARS_HEIGHT,
        lines_height=LINES_HEIGHT,
        bars=bars,
        peak=peak,
        lines=lines,
        hovers=hovers,
        slowest=_seconds(slowest),
        succeeded=sum(t.succeeded for t in totals),
        retried=sum(t.retried for t in totals),
        failed=sum(t.failed + t.dead for t in totals),
        enqueued=sum(t.enqueued for t in totals),
        started=sum(t.started for t in totals),
    )
