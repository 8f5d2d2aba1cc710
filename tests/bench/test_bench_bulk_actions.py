"""bench/bulk_actions.py runs end to end at smoke size: every dead job of its table is
retried by ``bulk.retry``, as plain SQL checks; its pure parts get made-up inputs.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.db import connection

from tests.bench.scripts import load_bench, run_bench

bulk_actions = load_bench("bulk_actions")


@pytest.mark.slow
# Sets up the test database, whose URL subprocess_env hands to the bench.
@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="bench/bulk_actions.py measures PostgreSQL only",
)
def test_bulk_actions_bench_retries_every_dead_job(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) a database of its own.
    db_name = f"leasejobs_bulk_smoke_{os.getpid()}"
    report_path = tmp_path / "bulk.json"
    result = run_bench(
        "bulk_actions",
        ["--smoke", "--db-name", db_name, "--output", str(report_path)],
        subprocess_env,
    )
    output = result.stdout + result.stderr
    assert "smoke run: every dead job retried" in result.stdout, output
    assert f"dropped {db_name}" in result.stdout, output
    report = json.loads(report_path.read_text())
    assert [run["batch_size"] for run in report["runs"]] == [500, 2000]
    for run in report["runs"]:
        assert run["problems"] == [], output
        assert run["retried"] == run["dead_before"] == 2000, output
        assert run["batches"] == -(-2000 // run["batch_size"]), output


def test_the_table_gives_each_run() -> None:
    run = bulk_actions.Run(batch_size=2000, dead_before=100_000, count_s=0.25, retry_s=8.0)
    run.retried, run.batches = 100_000, 50
    text = bulk_actions.table([run], 1_000_000)
    assert "| 100,000 retried | 2,000 | 250 ms | 8.0 s | 50 | 12,500 |" in text
    assert "dead jobs among 1,000,000" in text


def test_a_run_needs_a_sane_size() -> None:
    with pytest.raises(SystemExit, match="--jobs must be at least 1,000"):
        bulk_actions.parse_args(["--jobs", "10"])
    smoke = bulk_actions.parse_args(["--smoke"])
    assert (smoke.jobs, smoke.batch_sizes) == (20_000, [500, 2000])
