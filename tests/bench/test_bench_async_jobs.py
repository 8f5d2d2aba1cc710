"""bench/async_jobs.py runs end to end at smoke size, and fails on a lost or twice-run job,
never on speed; its pure parts (rates, verdict, run-file reading) get made-up numbers.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from django.db import connection

from tests.bench.scripts import BENCH_DIR, load_bench, run_bench

async_jobs = load_bench("async_jobs")


def _load_runs() -> ModuleType:
    """``bench/asyncsite/runs.py`` by path (it imports the standard library alone)."""
    spec = importlib.util.spec_from_file_location(
        "bench_asyncsite_runs", BENCH_DIR / "asyncsite" / "runs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


runs = _load_runs()


@pytest.mark.slow
# Sets up the test database, whose URL subprocess_env hands to the bench.
@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="bench/async_jobs.py measures PostgreSQL only (COPY, and procrastinate's side)",
)
def test_async_jobs_bench_runs_at_smoke_size(subprocess_env: dict[str, str]) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) databases of its own.
    db_name = f"async_jobs_smoke_{os.getpid()}"
    result = run_bench(
        "async_jobs",
        ["--smoke", "--db-name", db_name, "--output", os.devnull],
        subprocess_env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for label, jobs in (
        ("django-leasejobs, async def", 300),
        ("django-leasejobs, sync", 6),
        ("django-leasejobs, sync, --sync-on-loop", 300),
    ):
        row = next((line for line in lines if line.startswith(f"| {label} | {jobs} |")), None)
        assert row is not None, output
        assert row.endswith("| yes |"), output  # every job ran once, at attempt 1
    peer = next(line for line in lines if line.startswith("| procrastinate, async def |"))
    assert peer.endswith("| yes |") or "not run: procrastinate is not installed" in peer, output
    [goal] = [line for line in lines if line.startswith("goal ")]
    assert ": met (" in goal or ": missed (" in goal, output  # printed, never judged here
    assert f"dropped {db_name}" in result.stdout, output


def test_smoke_is_small_and_explicit_values_win() -> None:
    args = async_jobs.parse_args(["--smoke"])
    assert (args.jobs, args.sync_jobs) == (300, 6)
    args = async_jobs.parse_args(["--smoke", "--jobs", "50"])
    assert (args.jobs, args.sync_jobs) == (50, 6)


def test_full_run_holds_a_thousand_in_flight_on_both_sides() -> None:
    args = async_jobs.parse_args([])
    assert (args.jobs, args.sync_jobs, args.concurrency) == (10000, 40, 2)
    assert args.concurrency * args.async_concurrency == 1000 >= async_jobs.GOAL_RATE * args.sleep
    assert args.procrastinate_concurrency == 1000
    args = async_jobs.parse_args(["--procrastinate-concurrency", "7"])
    assert args.procrastinate_concurrency == 7


def test_parts_are_checked_and_kept_in_order() -> None:
    assert async_jobs.parse_parts("procrastinate,async") == ["async", "procrastinate"]
    assert async_jobs.parse_parts("sync-on-loop,sync") == ["sync", "sync-on-loop"]
    with pytest.raises(Exception, match="parts are"):
        async_jobs.parse_parts("async,celery")


def test_rates_from_spawn_and_steady() -> None:
    # 100 jobs done one every 10 ms from 1 s after the spawn at 0, then a slow tail.
    done = [1.0 + 0.01 * i for i in range(99)] + [10.0]
    assert async_jobs.rate_from_spawn(100, 0.0, max(done)) == 10.0
    # The middle 80 % (the 10th to the 89th job) leaves the start-up and the tail out.
    assert async_jobs.steady_rate(done) == pytest.approx(100.0)
    assert async_jobs.steady_rate([5.0]) is None
    assert async_jobs.rate_from_spawn(10, 3.0, None) is None


def test_peak_in_flight_counts_overlapping_runs() -> None:
    starts, ends = [0.0, 0.1, 0.2, 1.0], [0.5, 0.6, 0.7, 1.5]
    assert async_jobs.peak_in_flight(starts, ends) == 3
    # An end at the very time of a start is counted first.
    assert async_jobs.peak_in_flight([0.0, 1.0], [1.0, 2.0]) == 1


def _drain(rate: float | None, problems: list[str] | None = None) -> dict[str, object]:
    return {
        "jobs": 10000,
        "in_flight_limit": 1000,
        "rate_from_spawn": rate,
        "steady_rate": rate,
        "problems": problems or [],
    }


def test_verdict_met_missed_and_not_measured() -> None:
    assert async_jobs.verdict({"async": _drain(1200.0)})["verdict"] == "met"
    assert async_jobs.verdict({"async": _drain(900.0)})["verdict"] == "missed"
    # Fast enough, but a job ran twice: never a met goal.
    twice = _drain(1500.0, ["1 jobs started more than once (e.g. [7])"])
    assert async_jobs.verdict({"async": twice})["verdict"] == "missed"
    assert async_jobs.verdict({})["verdict"] == "not measured"


def _run_file(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "runs.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_run_file_with_every_job_once_has_no_problem(tmp_path: Path) -> None:
    path = _run_file(tmp_path, ["s 0 1.0", "s 1 1.1", "e 0 1.5", "e 1 1.6"])
    read = runs.read(path)
    assert read.problems(2) == []
    assert sorted(read.start_times) == [1.0, 1.1]


def test_run_file_names_lost_twice_run_unended_and_unknown_jobs(tmp_path: Path) -> None:
    path = _run_file(
        tmp_path,
        ["s 0 1.0", "e 0 1.5", "s 0 2.0", "e 0 2.5", "s 2 1.0", "s 9 1.0", "e 9 1.5", "junk"],
    )
    problems = runs.read(path).problems(3)
    text = "; ".join(problems)
    assert "1 jobs never started (e.g. [1])" in text
    assert "1 jobs started more than once (e.g. [0])" in text
    assert "1 jobs started but never ended (e.g. [2])" in text
    assert "1 jobs not enqueued by the bench (e.g. [9])" in text
    assert "1 unreadable lines" in text


def test_a_problem_in_the_run_file_reaches_the_drain(tmp_path: Path) -> None:
    """What a drain reports (and what makes the bench exit 1) includes the run file's."""
    path = _run_file(tmp_path, ["s 0 1.0", "e 0 1.5"])
    drained = {
        "spawned": 0.5,
        "cpu_main": 0.1,
        "cpu_slots": 0.0,
        "cpu_server": None,
        "problems": [],
        "log": "x",
    }
    figures = async_jobs.figures("async", 2, 1000, drained, [1.5], runs.read(path))
    assert figures["problems"] == ["1 jobs never started (e.g. [1])"]
    assert figures["startup_s"] == 0.5
    assert figures["peak_in_flight"] == 1


def test_markdown_table_has_a_row_per_part() -> None:
    drains = {
        "async": {
            **_drain(1500.0),
            "peak_in_flight": 1000,
            "startup_s": 0.5,
            "cpu_main": 1.4,
            "cpu_slots": 1.6,
            "cpu_server": 1.2,
        },
        "procrastinate": {"part": "procrastinate", "skipped": "not installed", "problems": []},
    }
    lines = async_jobs.markdown_table(drains).strip().splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| django-leasejobs, async def | 10,000 | 1,000 (1,000) | 1,500.0 |")
    assert "| 1.4 + 1.6 | 1.2 | yes |" in lines[2]
    assert lines[3].endswith("| not run: not installed |")
