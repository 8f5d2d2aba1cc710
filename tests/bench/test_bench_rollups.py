"""bench/rollups.py's pure parts: options, the alternating order, the cost and its verdict.

The bench itself starts a PostgreSQL of its own and real workers (CI runs
``bench/rollups.py --smoke``, scripts/ci.py step ``rollups-smoke``); here its functions get
made-up numbers. No server, no timing.
"""

from __future__ import annotations

import pytest

from tests.bench.scripts import load_bench

rollups = load_bench("rollups")


def test_full_run_and_smoke_defaults() -> None:
    args = rollups.parse_args([])
    assert (args.workers, args.jobs, args.repeats, args.pool) == (4, 20000, 5, "process")
    smoke = rollups.parse_args(["--smoke", "--jobs", "300"])
    assert (smoke.workers, smoke.jobs, smoke.repeats) == (1, 300, 1)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(SystemExit):
        rollups.parse_args(["--repeats", "0"])


def test_the_order_alternates_so_drift_cancels_out() -> None:
    assert [rollups.order(r) for r in range(3)] == [
        [True, False],
        [False, True],
        [True, False],
    ]


def test_the_cost_compares_medians_and_judges_the_goal() -> None:
    cost = rollups.cost([960.0, 980.0, 1000.0], [1000.0, 1010.0, 990.0])
    assert cost == pytest.approx(1 - 980 / 1000)
    assert rollups.verdict(cost) == "met"
    assert rollups.verdict(rollups.cost([900.0], [1000.0])) == "missed"
    assert rollups.verdict(rollups.cost([], [1000.0])) == "no figure"
    assert rollups.cost([1100.0], [1000.0]) == pytest.approx(-0.1)  # faster with them: noise


def test_the_summary_keeps_each_side_and_flags_a_miscount() -> None:
    runs = [
        {"rollups": True, "rate": 950.0, "clean": True},
        {"rollups": False, "rate": 1000.0, "clean": True},
        {"rollups": True, "rate": 970.0, "clean": False},
    ]
    summary = rollups.summary(runs)
    assert (summary["on"], summary["off"]) == (960.0, 1000.0)
    assert summary["verdict"] == "met" and summary["clean"] is False
