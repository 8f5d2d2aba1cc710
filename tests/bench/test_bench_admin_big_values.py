"""bench/admin_big_values.py runs end to end at smoke size and prints its table.

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
        reason="bench/admin_big_values.py measures PostgreSQL only",
    ),
]

PAGES = (
    "job page: big argument",
    "job page: big everything",
    "job list, first page",
    "download of the argument",
)


def test_admin_big_values_bench_runs_at_smoke_size(subprocess_env: dict[str, str]) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) a database of its own.
    db_name = f"leasejobs_bigvalues_smoke_{os.getpid()}"
    result = run_bench(
        "admin_big_values",
        [
            *("--smoke", "--db-name", db_name),
        ],
        subprocess_env,
    )
    output = result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("page"))
    for column in ("first", "median", "p95", "max", "size", "db read"):
        assert column in header, output
    for name in PAGES:
        row = next((line for line in lines if line.startswith(name)), None)
        assert row is not None, output
        assert row.count(" ms") == 4, row
    assert "smoke run: nothing judged" in result.stdout, output
    assert f"dropped {db_name}" in result.stdout, output
