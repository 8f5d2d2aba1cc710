"""bench/overload.py's pure parts: options, the run file, the verdict, log counts, tables.

The bench itself starts a PostgreSQL of its own (or uses MariaDB), CPU hogs, a database
load and many workers; this module loads the script by path (its top level imports the
standard library alone) and feeds its pure functions made-up runs. No server, no timing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.scripts import load_bench
from tests.conftest import REPO_ROOT

overload = load_bench("overload")

LOAD_RAN = {"hogs": 2, "hog_cpu": 30.0, "clients": 4, "transactions": 5000, "ended_early": 0}


def _verdict(runs: list[tuple[int, int]], **changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "jobs": 3,
        "runs": runs,
        "bad_lines": 0,
        "job_ids": [1, 2, 3],
        "succeeded_first": 3,
        "attempt_rows": 0,
        "exit_codes": {"ov-0": 0, "ov-1": 0},
        "load": LOAD_RAN,
    }
    values.update(changes)
    return overload.verdict(**values)


def _failed(result: dict[str, Any]) -> list[str]:
    return [c["name"] for c in result["checks"] if not c["ok"]]


# -- options --------------------------------------------------------------------------------


def test_full_run_defaults_postgresql() -> None:
    args = overload.parse_args([])
    assert args.database == "postgresql"
    assert (args.workers, args.concurrency, args.pool, args.jobs) == (16, 2, "process", 20000)
    assert (args.hogs, args.db_load, args.job_ms) == (2, 4, 0.0)
    assert overload.worker_options(args) == {
        "LEASE_DURATION": 4.0,
        "HEARTBEAT_INTERVAL": 1.0,
        "STALE_LOCK_INTERVAL": 1.0,
    }
    assert args.output == REPO_ROOT / "artifacts" / "bench" / "overload.json"


def test_mariadb_defaults_to_four_workers() -> None:
    args = overload.parse_args(["--database", "mariadb"])
    assert (args.workers, args.jobs, args.db_load) == (4, 20000, 4)
    assert args.mariadb_url == "mysql://root@127.0.0.1:3306"


def test_smoke_sizes_and_explicit_values_win() -> None:
    args = overload.parse_args(["--smoke"])
    assert (args.workers, args.jobs, args.hogs, args.db_load) == (16, 10000, 2, 2)
    args = overload.parse_args(["--smoke", "--database", "mariadb"])
    assert (args.workers, args.jobs) == (4, 10000)
    args = overload.parse_args(
        ["--smoke", "--jobs", "300", "--workers", "2", "--hogs", "0", "--db-load", "1"]
    )
    assert (args.workers, args.jobs, args.hogs, args.db_load) == (2, 300, 0, 1)


def test_lease_options_reach_the_workers() -> None:
    args = overload.parse_args(
        ["--lease", "10", "--heartbeat", "2", "--stale-lock-interval", "0", "--pool", "thread"]
    )
    assert overload.worker_options(args) == {
        "LEASE_DURATION": 10.0,
        "HEARTBEAT_INTERVAL": 2.0,
        "STALE_LOCK_INTERVAL": 0.0,
    }
    assert args.pool == "thread"


@pytest.mark.parametrize(
    "argv",
    [
        ["--workers", "0"],
        ["--jobs", "0"],
        ["--hogs", "-1"],
        ["--lease", "0"],
        ["--pool", "greenlet"],
        ["--database", "sqlite"],
        ["--database", "mariadb", "--db-loader", "pgbench"],
        ["--pg-setting", "fsync"],
        ["--sync-on-loop-workers", "1.5"],
        ["--pool", "thread", "--sync-on-loop-workers", "0.5"],
    ],
)
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        overload.parse_args(argv)


@pytest.mark.parametrize(
    ("share", "workers", "on_loop"),
    [(0.0, 16, 0), (0.5, 16, 8), (0.25, 16, 4), (1.0, 3, 3), (0.5, 3, 1)],
)
def test_a_share_of_the_workers_runs_sync_jobs_on_loops(
    share: float, workers: int, on_loop: int
) -> None:
    chosen = [i for i in range(workers) if overload.spread_evenly(i, share)]
    assert len(chosen) == on_loop
    note = overload.on_loop_note({"workers": workers, "sync_on_loop_workers": share})
    assert note == (f", {on_loop} with --sync-on-loop" if on_loop else "")


# -- the run file -----------------------------------------------------------------------------


def test_run_file_lines_are_parsed_and_junk_is_kept_apart() -> None:
    runs, bad = overload.parse_runs("1 1\n2 1\n\n3 2\n4 x\n12 1 extra\n")
    assert runs == [(1, 1), (2, 1), (3, 2)]
    assert bad == ["4 x", "12 1 extra"]


# -- the verdict ------------------------------------------------------------------------------


def test_every_job_once_passes() -> None:
    result = _verdict([(1, 1), (3, 1), (2, 1)])
    assert result["ok"], result["checks"]
    assert (result["runs"], result["distinct"], result["extra_runs"]) == (3, 3, 0)
    assert result["twice"] == []
    assert [c["name"] for c in result["checks"]] == [
        "jobs enqueued",
        "runs == jobs",
        "distinct jobs run == jobs",
        "jobs that ran twice",
        "succeeded at attempt 1",
        "JobAttempt rows",
        "workers exited 0",
        "load applied",
    ]


def test_a_job_run_twice_fails_and_is_named_with_its_attempts() -> None:
    # Reaped after it ran, run again at attempt 2: the database may even look clean for
    # the other jobs, the run file does not.
    result = _verdict([(1, 1), (2, 1), (3, 1), (2, 2)], succeeded_first=2, attempt_rows=1)
    assert not result["ok"]
    assert _failed(result) == [
        "runs == jobs",
        "jobs that ran twice",
        "succeeded at attempt 1",
        "JobAttempt rows",
    ]
    assert result["twice"] == [{"job": 2, "attempts": [1, 2]}]
    assert (result["extra_runs"], result["runs_after_attempt_1"]) == (1, 1)


def test_the_same_attempt_run_twice_fails_even_if_the_database_looks_clean() -> None:
    result = _verdict([(1, 1), (2, 1), (3, 1), (3, 1)])
    assert _failed(result) == ["runs == jobs", "jobs that ran twice"]
    assert result["twice"] == [{"job": 3, "attempts": [1, 1]}]


def test_a_job_that_never_ran_fails() -> None:
    result = _verdict([(1, 1), (2, 1)], succeeded_first=2)
    assert _failed(result) == [
        "runs == jobs",
        "distinct jobs run == jobs",
        "succeeded at attempt 1",
    ]


def test_a_run_of_a_job_not_enqueued_fails_even_when_counts_match() -> None:
    result = _verdict([(1, 1), (2, 1), (99, 1)])
    assert _failed(result) == ["distinct jobs run == jobs"]
    assert result["unknown_jobs"] == [99]


def test_unreadable_lines_fail() -> None:
    result = _verdict([(1, 1), (2, 1), (3, 1)], bad_lines=1)
    assert _failed(result) == ["runs == jobs"]


def test_a_lost_enqueue_fails() -> None:
    result = _verdict([(1, 1), (2, 1)], job_ids=[1, 2], succeeded_first=2)
    assert "jobs enqueued" in _failed(result)


@pytest.mark.parametrize(
    ("codes", "passed"),
    [
        ({"ov-0": 0, "ov-1": 0}, True),
        ({"ov-0": 0, "ov-1": 1}, False),
        ({"ov-0": 0, "ov-1": None}, False),  # still running at the deadline
        ({}, False),  # no worker at all
    ],
)
def test_every_worker_must_exit_0(codes: dict[str, int | None], passed: bool) -> None:
    result = _verdict([(1, 1), (2, 1), (3, 1)], exit_codes=codes)
    assert ("workers exited 0" not in _failed(result)) is passed


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"ended_early": 1}, "1 load processes ended before the drain did"),
        ({"hog_cpu": 0.0}, "the hogs used no CPU"),
        ({"transactions": 0}, "no load transaction"),
    ],
)
def test_the_load_must_have_run(changes: dict[str, Any], why: str) -> None:
    result = _verdict([(1, 1), (2, 1), (3, 1)], load={**LOAD_RAN, **changes})
    assert _failed(result) == ["load applied"]
    assert result["checks"][-1]["value"] == why


def test_no_load_asked_is_no_load_missing() -> None:
    load = {"hogs": 0, "hog_cpu": 0.0, "clients": 0, "transactions": 0, "ended_early": 0}
    assert _verdict([(1, 1), (2, 1), (3, 1)], load=load)["ok"]
    assert "load applied" not in [c["name"] for c in _verdict([], load=None)["checks"]]


# -- logs and tables --------------------------------------------------------------------------


def test_log_lines_are_counted_once_per_line() -> None:
    texts = [
        "x ERROR django_leasejobs lease lost for job 5 attempt 1: lease lost: complete ...\n"
        "x INFO django_leasejobs database round took 0.5s: claiming for free slots only\n",
        "x ERROR django_leasejobs could not record job 7 attempt 1 (...)\n"
        "x WARNING django_leasejobs released stale running jobs count=3\n"
        "Traceback (most recent call last):\n",
    ]
    counts = overload.count_log_lines(texts)
    assert counts == {
        "could_not_record": 1,
        "lease_lost": 1,
        "back_pressure": 1,
        "reaped": 1,
        "errors": 2,
        "tracebacks": 1,
    }


def test_lines_naming_a_job_do_not_match_longer_ids() -> None:
    logs = {"ov-1": "a lease lost for job 12 attempt 1\nb job 123 attempt 1 started\n"}
    assert overload.lines_naming(logs, 12) == ["ov-1: a lease lost for job 12 attempt 1"]


def _report(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "code": "abc1234",
        "settings": {
            "database": "postgresql",
            "workers": 16,
            "concurrency": 2,
            "pool": "process",
            "jobs": 3,
        },
        "verdict": result,
        "figures": {
            "wall_seconds": 12.5,
            "rate_from_spawn": 240.0,
            "log_lines": dict.fromkeys(overload.LOG_PATTERNS, 0) | {"back_pressure": 7},
            "load": {
                "clients": 4,
                "loader": "pgbench",
                "transactions": 1234,
                "hogs": 2,
                "hog_cpu": 20.0,
                "seconds": 15.0,
            },
            "db_load_rate": 82.3,
            "worker_cpu": 18.0,
            "busy_percent": 99.6,
            "statuses": {"succeeded at attempt 1": 3},
            "loadavg": [1.0, 17.5, 12.0],
            "server_waits": {
                "by_statement": {"renew": {"CPU (no wait event)": 10}, "other": {"CPU": 1}}
            },
        },
    }


def test_text_table_shows_checks_and_figures() -> None:
    text = overload.text_table(_report(_verdict([(1, 1), (2, 1), (3, 1), (3, 2)])))
    assert "jobs that ran twice                         1            0  FAILED" in text
    assert "succeeded at attempt 1" in text
    assert "log: database round took (back-pressure)   7" in text
    assert "1,234 transactions, 82/s" in text
    assert "server samples, renew" in text
    assert "server samples, other" not in text


def test_markdown_row_matches_the_head() -> None:
    row = overload.markdown_row(_report(_verdict([(1, 1), (2, 1), (3, 1)])))
    head = overload.MARKDOWN_HEAD.splitlines()[0]
    assert row.count("|") == head.count("|")
    assert row.startswith("| postgresql | abc1234 | 16 x 2 (process) | 3 | 3 | 0 | 3 | 0 | yes |")
    assert "1,234 (pgbench), 82/s" in row
