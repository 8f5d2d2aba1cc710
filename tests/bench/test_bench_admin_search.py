"""bench/admin_search.py runs end to end at smoke size: every search the job list is given
finds the jobs plain SQL finds, with the same count (exact for a search by argument);
its pure parts get made-up inputs.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.db import connection

from tests.bench.scripts import load_bench, run_bench

admin_search = load_bench("admin_search")


@pytest.mark.slow
# Sets up the test database, whose URL subprocess_env hands to the bench.
@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="bench/admin_search.py measures PostgreSQL only (GIN indexes)",
)
def test_admin_search_bench_finds_what_sql_finds(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) a database of its own.
    db_name = f"leasejobs_search_smoke_{os.getpid()}"
    report_path = tmp_path / "search.json"
    result = run_bench(
        "admin_search",
        ["--smoke", "--db-name", db_name, "--output", str(report_path)],
        subprocess_env,
    )
    output = result.stdout + result.stderr
    assert "smoke run: counts and listings checked" in result.stdout, output
    assert f"dropped {db_name}" in result.stdout, output
    report = json.loads(report_path.read_text())
    assert report["problems"] == [], output
    searches = [s for s in report["searches"] if s["q"]]
    assert len(searches) == 10, output
    for search in searches:
        assert search["expected"] > 0, search["label"]  # every search finds something
        assert search["ids_ok"], search["label"]  # the page lists what SQL lists
        if search["by_arguments"]:
            assert search["shown"] == search["expected"], search["label"]  # exact
            assert search["plans"], search["label"]  # its queries were explained
    for name in admin_search.GIN_INDEXES:
        assert report["sizes"][name] > 0, name
    enqueue = report["enqueue"]
    for key in ("with_gin", "without_gin"):
        assert len(enqueue[key]["bulk_s"]) == 1, key
        assert len(enqueue[key]["single_ms"]) == 50, key


def test_plain_sql_matches_a_number_and_its_digits_as_text() -> None:
    where, params = admin_search.json_equals("kwargs #> '{customer_id}'", 4711)
    assert where == "kwargs #> '{customer_id}' IN (%s::jsonb, %s::jsonb)"
    assert params == ["4711", '"4711"']
    where, params = admin_search.json_equals("kwargs #> '{invoice,lines,0,sku}'", "SKU-1")
    assert params == ['"SKU-1"']


def test_free_words_are_counted_up_to_the_cap() -> None:
    search = admin_search.Search("w", "gateway", "true", [], by_arguments=False)
    search.expected = 25_000
    assert admin_search.expected_shown(search, 10_000) == 10_001
    search.expected = 42
    assert admin_search.expected_shown(search, 10_000) == 42
    by_argument = admin_search.Search("a", "args.0:1", "true", [])
    by_argument.expected = 25_000
    assert admin_search.expected_shown(by_argument, 10_000) == 25_000


def test_page_facts_read_the_paginator_and_the_listed_ids() -> None:
    html = (
        '<input type="checkbox" name="_selected_action" value="12" class="action-select">'
        '<input type="checkbox" name="_selected_action" value="7" class="action-select">'
        '<p class="paginator">\n<a href="?p=2">2</a>\n15625 jobs\n</p>'
    )
    assert admin_search.page_facts(html) == (15625, [12, 7])
    assert admin_search.page_facts('<p class="paginator">\n1 job\n</p>') == (1, [])


def test_plan_summary_names_the_indexes_and_the_scan() -> None:
    plan = (
        "Limit  (cost=1..2 rows=50 width=8) (actual time=0.1..0.2 rows=50 loops=1)\n"
        "  Buffers: shared hit=120 read=3\n"
        "  ->  Index Scan Backward using leasejobs_job_pkey on leasejobs_job\n"
        "        ->  Bitmap Index Scan on leasejobs_job_kwargs_gin\n"
        "Execution Time: 12.5 ms"
    )
    summary = admin_search.plan_summary(plan)
    assert summary["indexes"] == ["leasejobs_job_kwargs_gin", "leasejobs_job_pkey"]
    assert summary["gin"] and not summary["seq_scan"]
    assert summary["execution_ms"] == 12.5
    assert summary["buffers"] == "shared hit=120 read=3"
    scan = admin_search.plan_summary("Seq Scan on leasejobs_job\nExecution Time: 900.0 ms")
    assert scan["seq_scan"] and not scan["gin"]


def test_verdicts_judge_argument_searches_only() -> None:
    fast = admin_search.Search("a", "args.0:1", "true", [], times_ms=[10.0, 20.0])
    slow = admin_search.Search("b", "kwargs.a:1", "true", [], times_ms=[900.0, 1500.0])
    word = admin_search.Search("w", "gateway", "true", [], by_arguments=False)
    word.times_ms = [3000.0]
    plain = admin_search.Search("list", "", "true", [], times_ms=[5.0])
    lines = admin_search.verdicts([fast, slow, word, plain], 1000.0)
    assert [line["verdict"] for line in lines] == [
        "met",
        "missed",
        "information (reads the whole table)",
    ]
