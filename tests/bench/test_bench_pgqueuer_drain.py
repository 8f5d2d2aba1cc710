"""bench/pgqueuer_drain.py runs end to end at smoke size where PgQueuer is installed (the
bench virtualenv), and fails on a lost or twice-run job, never on speed; its pure parts
(the grid, rates, the verdict, the tables) get made-up numbers.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.bench.scripts import load_bench, run_bench

drain = load_bench("pgqueuer_drain")
drain_cpu = load_bench("cost_model")  # (its sampler's readings and its peer row)


@pytest.mark.slow
# Sets up the test database, whose URL subprocess_env hands to the bench.
@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="bench/pgqueuer_drain.py measures PostgreSQL only (PgQueuer needs it)",
)
@pytest.mark.skipif(
    drain.pgqueuer_missing() is not None,
    reason=f"{drain.pgqueuer_missing()} (scripts/ci.py's pgqueuer-smoke step runs it there)",
)
def test_pgqueuer_drain_bench_runs_at_smoke_size(subprocess_env: dict[str, str]) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) databases of its own.
    db_name = f"lj_pgq_smoke_{os.getpid()}"
    result = run_bench(
        "pgqueuer_drain",
        ["--smoke", "--db-name", db_name, "--output", os.devnull],
        subprocess_env,
        timeout=180,
    )
    output = result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| PgQueuer |")]
    rows += [line for line in result.stdout.splitlines() if line.startswith("| django-leasejobs")]
    assert len(rows) == 6, output  # PgQueuer's best and 4 in flight, our four rows
    assert all(row.endswith("| yes |") for row in rows), output  # every job once
    [goal] = [line for line in result.stdout.splitlines() if line.startswith("goal ")]
    assert ": met (" in goal or ": missed (" in goal, output  # printed, never judged here
    assert f"dropped {db_name}_pgqueuer" in result.stdout, output


def test_smoke_is_small_and_full_runs_the_grid() -> None:
    args = drain.parse_args(["--smoke"])
    assert (args.jobs, args.rounds, len(args.grid)) == (300, 1, 1)
    args = drain.parse_args([])
    assert (args.jobs, args.rounds, args.grid_rounds) == (20000, 3, 1)
    # 2 process counts x 3 manager counts x 2 batches x 2 caps.
    assert len(args.grid) == 24


def test_grid_leaves_out_caps_pgqueuer_refuses() -> None:
    """PgQueuer wants max_concurrent_tasks >= 2 x batch_size; 0 means no cap."""
    grid = drain.pgq_grid([1], [1], [32, 100], [0, 100])
    assert [(row.batch, row.cap) for row in grid] == [(32, 0), (32, 100), (100, 0)]
    assert (
        grid[1].settings == "1 QueueManager x batch_size=32, max_concurrent_tasks=100, mode=drain"
    )
    assert drain.PgqRow(2, 100, 0, processes=2).in_flight == "no limit"
    assert drain.FOUR_IN_FLIGHT.in_flight == "4"


def test_our_rows_and_what_they_hold_in_flight() -> None:
    rows = drain.our_rows([1, 2, 4], [1024])
    assert [row.settings for row in rows] == [
        "runworker --pool process --concurrency 4",
        "runworker --pool thread --concurrency 16",
        "runworker --pool process --concurrency 2, async def jobs",
        "runworker --pool process --concurrency 2 --sync-on-loop",
        "runworker --processes 2 --pool thread --concurrency 8",
        "runworker --processes 2 --pool thread --concurrency 8 --prefetch 1024",
        "runworker --processes 4 --pool thread --concurrency 8",
        "runworker --processes 4 --pool thread --concurrency 8 --prefetch 1024",
    ]
    assert [row.in_flight for row in rows] == ["4", "16", "200", "200", "16", "16", "32", "32"]
    assert len({row.key for row in rows}) == len(rows)
    assert len(drain.our_rows([2])) == 5  # no --prefetch rows unless asked
    assert rows[5].options == [  # what the worker command is given
        *("--processes", "2", "--pool", "thread", "--concurrency", "8", "--prefetch", "1024")
    ]


def test_prefetch_rows_are_asked_for_by_default() -> None:
    assert drain.parse_args([]).prefetch == [1024]
    assert drain.parse_args(["--prefetch", "512,2048"]).prefetch == [512, 2048]


def test_rates_and_rounds() -> None:
    assert drain.rate(1000, 10.0, 12.0) == 500.0
    assert drain.rate(1000, None, 12.0) is None
    assert drain.rate(1000, 12.0, 12.0) is None
    rows = ["a", "b", "c"]
    assert [drain.rotated(rows, i)[0] for i in range(4)] == ["a", "b", "c", "a"]


def _run(rate: float | None, spawn: float | None = None, *problems: str) -> dict[str, Any]:
    return {"drain_rate": rate, "spawn_rate": spawn, "problems": list(problems)}


def test_summary_is_the_median_and_range_of_clean_runs() -> None:
    summary = drain.summarize([_run(300.0, 100.0), _run(100.0, 50.0), _run(200.0, None)])
    assert summary["drain_rate"] == 200.0
    assert summary["drain_range"] == [100.0, 300.0]
    assert summary["spawn_rate"] == 75.0
    assert summary["clean"] is True
    assert drain.summarize([_run(None, None, "lost a job")])["clean"] is False


def test_verdict_takes_our_best_row_against_pgqueuers_best() -> None:
    ours = {
        "slow": drain.summarize([_run(1000.0, 800.0)]),
        "fast": drain.summarize([_run(9000.0, 6000.0)]),
    }
    line = drain.verdict(ours, drain.summarize([_run(6000.0, 5000.0)]))
    assert (line["ours_best"], line["verdict"], line["leader"]) == ("fast", "met", "ours best")
    assert line["ratio"] == pytest.approx(1.5)
    assert line["ratio_from_spawn"] == pytest.approx(1.2)
    line = drain.verdict(ours, drain.summarize([_run(8000.0, 5000.0)]))
    assert (line["verdict"], line["leader"]) == ("missed", "ours best")  # 1.125x
    line = drain.verdict(ours, drain.summarize([_run(10000.0, 5000.0)]))
    assert (line["verdict"], line["leader"]) == ("missed", "PgQueuer best")
    # Fast enough, but a job ran twice: never a met goal.
    twice = {"fast": drain.summarize([_run(9000.0, 6000.0, "a job ran twice")])}
    assert drain.verdict(twice, drain.summarize([_run(1000.0)]))["verdict"] == "missed"
    assert drain.verdict(ours, None)["verdict"] == "not measured"


def test_a_best_row_whose_drains_spread_widely_gives_no_verdict() -> None:
    """The machine's speed changed within the run: neither met nor missed."""
    steady = {"fast": drain.summarize([_run(9000.0), _run(9500.0)])}
    wobbly_peer = drain.summarize([_run(4000.0), _run(10000.0), _run(6000.0)])
    line = drain.verdict(steady, wobbly_peer)
    assert line["verdict"] == "inconclusive"
    assert line["spreads"] == [pytest.approx(9500 / 9000), pytest.approx(2.5)]
    wobbly_ours = {"fast": drain.summarize([_run(6000.0), _run(12000.0)])}
    peer = drain.summarize([_run(5000.0), _run(5200.0)])
    assert drain.verdict(wobbly_ours, peer)["verdict"] == "inconclusive"
    # Steady on both sides: the ratio decides; one run each has no spread to judge.
    assert drain.verdict(steady, peer)["verdict"] == "met"
    assert drain.verdict(steady, drain.summarize([_run(9000.0)]))["verdict"] == "missed"
    # A job that ran twice is a miss, however the rates spread.
    twice = {"fast": drain.summarize([_run(6000.0, None, "a job ran twice"), _run(12000.0)])}
    assert drain.verdict(twice, peer)["verdict"] == "missed"


def test_tables_mark_the_best_rows() -> None:
    best = drain.PgqRow(2, 100, 0, name="best")
    ours = drain.OurRow("thread", 16)
    rows = {best.key: best, ours.key: ours}
    table = {best.key: drain.summarize([_run(5000.0)]), ours.key: drain.summarize([_run(7500.0)])}
    lines = drain.side_table(table, rows, ours.key).strip().splitlines()
    assert lines[2].startswith("| PgQueuer | 2 QueueManagers x batch_size=100, no cap, mode=drain")
    assert "(best) | no limit | 5,000 | 5,000-5,000 | - | 1.50x | - | - | - | yes |" in lines[2]
    assert lines[3].endswith("| 7,500 | 7,500-7,500 | - | reference | - | - | - | yes |")
    # CPU per job: the medians of the runs, and their sum.
    measured = {**_run(7500.0), "cpu_us_per_job": {"worker": 40.0, "backends": 30.0}}
    table[ours.key] = drain.summarize([measured])
    lines = drain.side_table(table, rows, ours.key).strip().splitlines()
    assert lines[3].endswith("| reference | 40 | 30 | 70 | yes |")
    grid = drain.grid_table({best.key: table[best.key]}, rows, best.key).strip().splitlines()
    assert grid[2] == "| 1 | 2 | 100 | no cap | 5,000 **(best)** | - | 1 |"


def test_cpu_per_job_is_the_drain_window_over_the_jobs() -> None:
    def point(at: float, parent: float, under: float, backends: float) -> object:
        cpu = {"parent": parent, "slots": under, "backends": backends, "server": None}
        return drain_cpu.Point(at, cpu)

    points = [point(10.0, 1.0, 0.0, 0.0), point(12.0, 2.0, 1.0, 0.5), point(14.0, 2.0, 1.0, 0.5)]
    # From 11 to 12: the command 0.5 s and what runs under it 0.5 s, backends 0.25 s.
    cpu = drain.cpu_per_job(points, 1000, 11.0, 12.0)
    assert cpu == {"worker": pytest.approx(1000.0), "backends": pytest.approx(250.0)}
    assert drain.cpu_per_job(points, 1000, None, 12.0) == {"worker": None, "backends": None}
    assert drain.cpu_per_job([], 1000, 11.0, 12.0) == {"worker": None, "backends": None}


def test_pgqueuers_best_row_is_written_as_the_cost_models_peer(tmp_path: Path) -> None:
    best = drain.PgqRow(2, 100, 0, processes=2, name="best")
    runs = [
        {**_run(20000.0), "cpu_us_per_job": {"worker": 50.0, "backends": 40.0}},
        {**_run(24000.0), "cpu_us_per_job": {"worker": 30.0, "backends": 20.0}},
    ]
    cost = drain.peer_cost(best, drain.summarize(runs), 40000)
    assert cost["jobs_per_s"] == 22000.0
    assert cost["worker_cpu_s"] == pytest.approx(1.6)  # 40 µs x 40,000
    assert cost["backends_cpu_s"] == pytest.approx(1.2)
    path = tmp_path / "pgq.json"
    path.write_text(json.dumps({"cost": cost}))
    peer = drain_cpu.read_peer("pgqueuer", path)
    assert peer["cpu_us_per_job"]["worker"] == pytest.approx(40.0)
    assert peer["cpu_us_per_job"]["backends"] == pytest.approx(30.0)
