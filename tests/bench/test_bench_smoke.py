"""bench/dashboard.py runs end to end at smoke size and prints its table.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

from tests.bench.scripts import run_bench

pytestmark = [
    pytest.mark.slow,
    # Sets up the test database, whose URL subprocess_env hands to the bench.
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="bench/dashboard.py measures PostgreSQL only (it fills the table with "
        "generate_series and reads PostgreSQL plans)",
    ),
]

SCENARIOS = (
    "dashboard (full page)",
    "dashboard (?fragment=1)",
    "stats.collect()",
    "job list, first page",
    "job list, status=dead",
    "metrics view",
)


def test_dashboard_bench_runs_at_smoke_size(subprocess_env: dict[str, str]) -> None:
    # DATABASE_URL names the test database: the bench only uses it as the admin
    # connection that creates (and, with --drop-after, drops) its own database.
    db_name = f"leasejobs_bench_smoke_{os.getpid()}"
    result = run_bench(
        "dashboard",
        [
            *("--finished", "20000", "--ready", "500", "--repeat", "3", "--warmup", "1"),
            *("--db-name", db_name, "--drop-after"),
        ],
        subprocess_env,
    )
    output = result.stdout + result.stderr
    assert f"filling {db_name}" in result.stdout, output
    header = next(line for line in result.stdout.splitlines() if line.startswith("scenario"))
    for column in ("median", "p95", "max", "queries"):
        assert column in header, output
    rows = {
        line[:28].strip(): line
        for line in result.stdout.splitlines()
        if line.rstrip().endswith(("ok", "MISSED"))
    }
    for name in SCENARIOS:
        assert name in rows, output
        assert rows[name].count(" ms") >= 4, rows[name]
    assert f"dropped {db_name}" in result.stdout, output
