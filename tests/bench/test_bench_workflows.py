"""bench/workflows.py runs end to end at a tiny size and prints its tables; its pure
parts (verdicts, statement kinds) get made-up numbers.

No timing is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

from tests.bench.scripts import load_bench, run_bench

workflows = load_bench("workflows")


@pytest.mark.slow
# Sets up the test database, whose URL subprocess_env hands to the bench.
@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="bench/workflows.py measures PostgreSQL only (COPY, pg_stat_activity)",
)
def test_workflows_bench_runs_at_a_tiny_size(subprocess_env: dict[str, str]) -> None:
    # DATABASE_URL names the test database: the bench only uses its server, to create
    # (and drop) a database of its own.
    db_name = f"wf_bench_smoke_{os.getpid()}"
    result = run_bench(
        "workflows",
        [
            # More members than FANIN_WIDTH (64): the chord's callback gets fan-in counters.
            *("--members", "150", "--repeats", "1", "--enqueue-repeats", "1"),
            *("--db-name", db_name, "--output", os.devnull),
        ],
        subprocess_env,
    )
    output = result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for shape, steps in (("chord", 151), ("chain", 150), ("plain", 150)):
        row = next((line for line in lines if line.startswith(f"| {shape} | {steps} |")), None)
        assert row is not None, output
    for kind in ("plain", "chord"):
        assert any(line.startswith(f"| {kind} | ") and line.endswith("| yes |") for line in lines)
    goals = [line for line in lines if line.startswith("goal ")]
    assert len(goals) == 3, output
    assert not any("not measured" in line for line in goals), output
    # The callback's counters are written in one statement, like every other kind.
    assert "INSERT leasejobs_fanin x1" in result.stdout, output
    assert any(g.startswith("goal chord enqueue") and ": met (" in g for g in goals), output
    assert f"dropped {db_name}" in result.stdout, output


def test_enqueue_goal_is_one_round_trip_per_kind() -> None:
    one_each = {
        "COPY leasejobs_job": 1,
        "INSERT leasejobs_fanin": 1,
        "COPY leasejobs_dependency": 1,
        "COMMIT": 1,
    }
    per_step = {"INSERT leasejobs_dependency": 10000, "COMMIT": 1}
    enqueues = {
        "chord": {"steps": 10001, "round_trips": 3, "kinds": one_each},
        "chain": {"steps": 10000, "round_trips": 10001, "kinds": per_step},
    }
    drains = {"chord": {"fan_in_max_s": 0.4, "runs": 3, "clean": True}}
    lines = {line["goal"].split(":")[0]: line for line in workflows.verdicts(enqueues, drains)}
    assert lines["chord enqueue"]["verdict"] == "met"
    assert lines["chain enqueue"]["verdict"] == "missed"
    assert lines["fan-in delay < 1 s"]["verdict"] == "met"


def test_fan_in_goal_is_judged_on_the_worst_run_and_needs_clean_runs() -> None:
    slow = {"chord": {"fan_in_max_s": 1.2, "runs": 3, "clean": True}}
    unclean = {"chord": {"fan_in_max_s": 0.1, "runs": 1, "clean": False}}
    for drains in (slow, unclean):
        [*_, fan_in] = workflows.verdicts({}, drains)
        assert fan_in["verdict"] == "missed"
    [*_, nothing] = workflows.verdicts({}, {})
    assert nothing["verdict"] == "not measured"


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ('COPY "leasejobs_job" ("id", "queue") FROM STDIN', "COPY leasejobs_job"),
        ('INSERT INTO "leasejobs_workflow" ("backend") VALUES (%s)', "INSERT leasejobs_workflow"),
        ("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", "SELECT nextval"),
        ("SELECT pg_notify(%s, %s)", "SELECT pg_notify"),
    ],
)
def test_statement_kinds(sql: str, kind: str) -> None:
    assert workflows.statement_kind(sql) == kind
