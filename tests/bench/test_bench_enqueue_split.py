"""bench/enqueue_split.py runs end to end at smoke size: its table has a row per variant
and its JSON every variant's figures.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.db import connection

from tests.bench.scripts import run_bench

VARIANTS = (
    "bare",
    "statement",
    "statement, no NOTIFY",
    "statement as a CTE",
    "insert_job",
    "backend.enqueue",
    "task.enqueue()",
)


@pytest.mark.slow
# Sets up the test database, whose URL subprocess_env hands to the bench.
@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="bench/enqueue_split.py measures PostgreSQL only (NOTIFY in the INSERT)",
)
@pytest.mark.parametrize("server", [[], ["--fast-server"]], ids=["database_url", "fast"])
def test_enqueue_split_bench_runs_at_smoke_size(
    server: list[str], subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) a database of its own. --fast-server: a private one, fsync off.
    db_name = f"enqueue_split_smoke_{os.getpid()}"
    output = tmp_path / "enqueue_split.json"
    result = run_bench(
        "enqueue_split",
        ["--smoke", *server, "--db-name", db_name, "--output", str(output)],
        subprocess_env,
    )
    printed = result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[2:]] == list(VARIANTS), printed
    assert f"dropped {db_name}" in result.stdout, printed
    report = json.loads(output.read_text())
    assert [row["variant"] for row in report["variants"]] == list(VARIANTS)
    for row in report["variants"]:
        assert row["wall_us"] > 0 and row["cpu_us"] > 0 and row["bare_over_this"] > 0, row
        assert len(row["rounds_wall_us"]) == len(row["rounds_cpu_us"]) == 1, row
    assert report["server"]["server_version"], report["server"]
    if server:  # (DATABASE_URL's server is the suite's, fsync off or on)
        assert report["server"]["fsync"] == "off", report["server"]
        assert report["server"]["kind"] == "private (fsync off)", report["server"]
