"""bench/workers.py's pure parts: options, medians, ratios, verdicts, table and plot.

The bench itself starts a PostgreSQL of its own and many workers (CI runs
``bench/workers.py --smoke``); this module loads the script by path (its top level
imports the standard library alone) and feeds its pure functions made-up numbers. No
server, no timing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_bench

workers = load_bench("workers")


def _point(
    rate: float | None, *, clean: bool = True, from_spawn: float | None = None
) -> dict[str, Any]:
    """A point whose drain rate is ``rate`` and whose rate from spawn is ``from_spawn``
    (default: the same)."""
    keys = dict.fromkeys(workers.MEDIAN_KEYS, 1.0)
    wall = rate if from_spawn is None else from_spawn
    return {
        **keys,
        "rate": rate,
        "wall_rate": wall,
        "clean": clean,
        "runs": 1,
        "rates": [rate],
        "problems": [],
    }


def test_full_run_defaults() -> None:
    args = workers.parse_args([])
    assert args.workers == [1, 2, 4, 8, 16, 32]
    assert args.pools == ["process", "thread"]
    assert (args.jobs, args.repeats, args.concurrency) == (20000, 3, 2)


def test_smoke_is_tiny_and_explicit_values_win() -> None:
    args = workers.parse_args(["--smoke"])
    assert (args.workers, args.pools, args.jobs, args.repeats) == ([1, 2], ["thread"], 2000, 1)
    args = workers.parse_args(["--smoke", "--jobs", "500", "--workers", "4,1,4"])
    assert (args.jobs, args.workers) == (500, [1, 4])


@pytest.mark.parametrize("text", ["0,1", "", "a"])
def test_bad_worker_counts_are_refused(text: str) -> None:
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        workers.parse_counts(text)


def test_bad_pool_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        workers.parse_pools("process,greenlet")


def test_summary_takes_medians_and_any_unclean_run_taints_the_point() -> None:
    runs = [
        {"rate": 100.0, "given_back": 0, "clean": True},
        {"rate": 300.0, "given_back": 10, "clean": True},
        {"rate": 200.0, "given_back": None, "clean": False, "problems": ["ran twice"]},
    ]
    summary = workers.summarize(runs)
    assert summary["rate"] == 200.0
    assert summary["given_back"] == 5.0  # the median of the runs that measured it
    assert summary["claim_ms"] is None  # no run measured it
    assert summary["clean"] is False
    assert summary["problems"] == ["ran twice"]


def test_ratios_are_against_one_worker_of_the_same_pool() -> None:
    points = workers.with_ratios({1: _point(4000.0), 8: _point(3600.0), 16: _point(2000.0)})
    assert [points[n]["ratio"] for n in (1, 8, 16)] == [1.0, 0.9, 0.5]
    no_base = workers.with_ratios({8: _point(3600.0)})
    assert no_base[8]["ratio"] is None


def test_verdicts_met_missed_and_not_measured() -> None:
    pools = {
        "process": workers.with_ratios({1: _point(4000.0), 8: _point(3400.0), 16: _point(2000.0)}),
        "thread": workers.with_ratios({1: _point(4000.0), 8: _point(3900.0, clean=False)}),
    }
    lines = {(v["pool"], v["workers"]): v for v in workers.verdicts(pools)}
    assert lines[("process", 8)]["verdict"] == "met"  # 0.85 exactly
    assert lines[("process", 16)]["verdict"] == "missed"  # 0.5 < 0.7
    assert lines[("process", 16)]["ratio"] == 0.5
    # Fast enough, but a job ran twice (or failed): never a met goal.
    assert lines[("thread", 8)]["verdict"] == "missed"
    assert lines[("thread", 16)]["verdict"] == "not measured"


def test_the_goals_are_judged_on_the_rate_from_spawn() -> None:
    """A scale-out pays its cold starts: a drain rate that holds up while the workers
    start slowly is a missed goal."""
    points = workers.with_ratios(
        {1: _point(4000.0, from_spawn=3500.0), 16: _point(3600.0, from_spawn=1400.0)}
    )
    [_, sixteen] = workers.verdicts({"process": points})
    assert sixteen["workers"] == 16 and sixteen["verdict"] == "missed"
    assert sixteen["ratio"] == 0.4
    assert points[16]["ratio"] == 0.9  # the drain rate alone would have met it


def test_markdown_table_has_a_row_per_point() -> None:
    pools = {"thread": workers.with_ratios({1: _point(4000.0), 2: _point(3000.0)})}
    table = workers.markdown_table(pools)
    lines = table.strip().splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| thread | 1 | 4,000 | 1.00x | 4,000 | 1.00x |")
    assert "| thread | 2 | 3,000 | 0.75x | 3,000 | 0.75x |" in lines[3]
    assert lines[3].endswith("| yes |")


def test_svg_plot_is_self_contained(tmp_path: Path) -> None:
    pools = {
        "process": workers.with_ratios({1: _point(4000.0), 16: _point(3000.0)}),
        "thread": workers.with_ratios({1: _point(4200.0), 16: _point(3500.0)}),
    }
    baseline = {"process": workers.with_ratios({1: _point(4000.0), 16: _point(1500.0)})}
    svg = workers.svg_plot(pools, baseline)
    assert svg.startswith("<svg xmlns=")
    assert svg.rstrip().endswith("</svg>")
    assert svg.count("<polyline") == 3
    assert "process (before)" in svg
    assert 'stroke-dasharray="6 4"' in svg
    assert "http" not in svg.replace("http://www.w3.org/2000/svg", "")


def test_json_points_round_trip() -> None:
    data = {"pools": {"process": {"1": _point(10.0), "8": _point(9.0)}}}
    assert sorted(workers.points_from_json(data)["process"]) == [1, 8]
