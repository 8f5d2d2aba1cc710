"""bench/soak.py's pure parts: the verdict on made-up samples and the argument checks.

The soak itself needs a PostgreSQL of its own and minutes (CI runs ``bench/soak.py
--smoke``); this module loads bench/soak.py, whose top level imports the standard
library alone, and starts no server, no process and times nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.scripts import load_bench

soak = load_bench("soak")

DURATION = 1800.0
STEP = 30.0


def samples(
    rate: Any = lambda t: 200.0,
    p99: Any = lambda t: 20.0,
    size: Any = lambda t: 10_000_000,
) -> list[Any]:
    """30 s windows over a 30-minute run; each callable gets the window's start."""
    made = []
    t = 0.0
    while t < DURATION:
        finished = round(rate(t) * STEP)
        # 98 fast jobs for every two slow ones: the slow ones are the p99.
        latencies = [5.0] * 98 + [float(p99(t))] * 2
        made.append(
            soak.Sample(
                t0=t,
                t1=t + STEP,
                finished=finished,
                p50_ms=5.0,
                p99_ms=float(p99(t)),
                job_total=int(size(t)),
                job_heap=int(size(t)) // 2,
                job_indexes=int(size(t)) // 2,
                attempt_total=16384,
                attempt_heap=0,
                attempt_indexes=16384,
                live=1000,
                dead=100,
                autovacuum=int(t // 60),
                autoanalyze=int(t // 120),
                wal_bytes=finished * 1300,
                latencies_ms=latencies,
            )
        )
        t += STEP
    return made


def goals(made: list[Any], first_prune_at: float | None = 300.0) -> dict[str, Any]:
    return soak.verdict(made, DURATION, first_prune_at, smoke=False)["goals"]


def test_steady_run_meets_every_goal() -> None:
    result = goals(samples())
    assert {name: goal["met"] for name, goal in result.items()} == {
        "throughput": True,
        "p99": True,
        "table_size": True,
    }
    assert result["throughput"]["first"] == result["throughput"]["last"] == 200.0
    assert result["table_size"]["ratio"] == 1.0


def test_throughput_falling_more_than_ten_percent_misses() -> None:
    result = goals(samples(rate=lambda t: 200.0 if t < 1500 else 170.0))
    assert result["throughput"]["met"] is False
    assert result["throughput"]["change_percent"] == -15.0
    assert result["p99"]["met"] is True


def test_throughput_within_ten_percent_is_met() -> None:
    result = goals(samples(rate=lambda t: 200.0 if t < 1500 else 185.0))
    assert result["throughput"]["met"] is True


def test_p99_rising_more_than_ten_percent_misses_and_falling_is_met() -> None:
    worse = goals(samples(p99=lambda t: 20.0 if t < 1500 else 23.0))
    assert worse["p99"]["met"] is False
    assert (worse["p99"]["first"], worse["p99"]["last"]) == (20.0, 23.0)
    better = goals(samples(p99=lambda t: 20.0 if t < 1500 else 12.0))
    assert better["p99"]["met"] is True


def test_growing_table_misses_and_flat_one_with_noise_is_met() -> None:
    growing = goals(samples(size=lambda t: 10_000_000 + t * 5_000))
    assert growing["table_size"]["met"] is False
    assert growing["table_size"]["ratio"] > 1.10
    noisy = goals(samples(size=lambda t: 10_000_000 + (t % 120) * 1_000))
    assert noisy["table_size"]["met"] is True


def test_table_size_not_judged_before_pruning_starts() -> None:
    assert goals(samples(), first_prune_at=None)["table_size"]["met"] is None
    assert goals(samples(), first_prune_at=700.0)["table_size"]["met"] is None


def test_periods_full_and_smoke() -> None:
    assert soak.periods(1800.0, smoke=False) == ((0.0, 300.0), (1500.0, 1800.0))
    assert soak.periods(45.0, smoke=True) == ((0.0, 9.0), (36.0, 45.0))
    assert soak.periods(600.0, smoke=False) == ((0.0, 120.0), (480.0, 600.0))
    first = soak.period_figures(samples(), 0.0, 300.0)
    assert first["samples"] == 10


def test_percentile_nearest_rank() -> None:
    assert soak.percentile([], 0.99) is None
    assert soak.percentile([float(n) for n in range(1, 101)], 0.99) == 99.0
    assert soak.percentile([float(n) for n in range(1, 101)], 0.50) == 50.0
    assert soak.percentile([7.0], 0.99) == 7.0


def test_describe_goal_and_markdown() -> None:
    result = goals(samples(rate=lambda t: 200.0 if t < 1500 else 170.0))
    assert soak.describe_goal("throughput", result["throughput"]).startswith("throughput: MISSED")
    table = soak.markdown_table(samples(), every=4)
    lines = table.strip().splitlines()
    assert lines[0].startswith("| t (s) | jobs/s |")
    assert len(lines) == 2 + 60 // 4


def test_defaults_and_smoke_defaults() -> None:
    full = soak.parse_args([])
    assert (full.duration, full.rate, full.sample) == (1800.0, 200.0, 30.0)
    smoke = soak.parse_args(["--smoke"])
    assert smoke.duration < 60 and smoke.prune_age + smoke.sample <= smoke.duration / 3
    assert soak.parse_args(["--smoke", "--rate", "10"]).rate == 10.0


@pytest.mark.parametrize(
    "argv",
    [
        ["--duration", "0"],
        ["--rate", "-1"],
        ["--workers", "0"],
        ["--concurrency", "0"],
        ["--sample", "0.5"],
        ["--duration", "60", "--sample", "30"],
        ["--duration", "120", "--prune-every", "60", "--prune-age", "60"],
        ["--prune-age", "0"],
        ["--sample", "30", "--prune-age", "60"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        soak.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err
