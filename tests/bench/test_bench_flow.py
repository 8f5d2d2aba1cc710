"""bench/flow.py's pure parts: options, claim figures, slowdowns, verdicts, plans, table.

The bench itself starts a PostgreSQL of its own, fills a 100,000-job backlog and runs
workers (CI runs ``bench/flow.py --smoke``); this module loads the script by path (its
top level imports the standard library alone) and feeds its pure functions made-up
numbers. No server, no timing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.scripts import load_bench

flow = load_bench("flow")


def _figures(
    p50: float | None,
    p99: float | None,
    per_s: float | None,
    rate: float | None,
    problems: list[str] | None = None,
    next_due: float | None = None,
) -> dict[str, Any]:
    return {
        "direct": {"p50_ms": p50, "p99_ms": p99, "jobs_per_s": per_s},
        "workers": None if rate is None else {"rate": rate},
        "next_due": None if next_due is None else {"p50_ms": next_due},
        "explain": [],
        "problems": problems or [],
    }


def _lines(results: dict[str, dict[str, Any]], goal: float = 2.0) -> dict[tuple[str, ...], Any]:
    return {(v["situation"], v["kind"], v["measure"]): v for v in flow.verdicts(results, goal)}


def test_full_run_defaults() -> None:
    args = flow.parse_args([])
    assert (args.backlog, args.spread_keys, args.other_jobs, args.repeats) == (
        100_000,
        1000,
        2000,
        3,
    )
    assert (args.workers, args.batch, args.goal) == (2, 10, 2.0)
    assert flow.situations(args) == ["none", "one_key", "spread"]


def test_smoke_is_small_and_explicit_values_win() -> None:
    args = flow.parse_args(["--smoke"])
    assert (args.backlog, args.other_jobs, args.repeats, args.workers) == (5000, 200, 1, 1)
    args = flow.parse_args(["--smoke", "--backlog", "800", "--spread-keys", "0", "--workers", "0"])
    assert (args.backlog, args.workers) == (800, 0)
    assert flow.situations(args) == ["none", "one_key"]  # no spread situation


def test_backlog_keys_per_situation() -> None:
    args = flow.parse_args(["--spread-keys", "250"])
    assert [flow.backlog_keys(s, args) for s in flow.SITUATIONS] == [0, 1, 250]


@pytest.mark.parametrize(
    "argv",
    [
        ["--backlog", "0"],
        ["--spread-keys", "10", "--backlog", "5"],
        ["--batch", "0"],
        ["--other-limit", "0"],
        ["--workers", "-1"],
        ["--goal", "0.5"],
    ],
)
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        flow.parse_args(argv)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert flow.percentile(values, 0.50) == 50.0
    assert flow.percentile(values, 0.99) == 99.0
    assert flow.percentile([7.0], 0.99) == 7.0
    assert flow.percentile([], 0.5) is None


def test_claim_summary_counts_empty_claims_in_the_rate_only() -> None:
    summary = flow.claim_summary([2.0] * 99 + [20.0], 1000, empty_ms=[82.0], held=1)
    assert summary["claims"] == 100
    assert summary["p50_ms"] == 2.0
    assert summary["p99_ms"] == 2.0  # the 99th of 100: one slow claim is the max only
    assert summary["max_ms"] == 20.0
    assert summary["jobs_per_claim"] == 10.0
    # 1,000 jobs over 198 + 20 + 82 = 300 ms of claim calls (the empty one included).
    assert summary["jobs_per_s"] == pytest.approx(1000 / 0.3)
    assert (summary["empty_claims"], summary["held"], summary["main_lane_only"]) == (1, 1, 0)
    nothing = flow.claim_summary([], 0)
    assert nothing["p50_ms"] is None and nothing["jobs_per_s"] is None


def test_slowdown_is_a_factor_the_right_way_round() -> None:
    assert flow.slowdown(2.0, 5.0, higher_is_better=False) == 2.5  # latency grew
    assert flow.slowdown(1000.0, 400.0, higher_is_better=True) == 2.5  # rate fell
    assert flow.slowdown(1000.0, 2000.0, higher_is_better=True) == 0.5  # faster
    assert flow.slowdown(None, 5.0, higher_is_better=False) is None
    assert flow.slowdown(0.0, 5.0, higher_is_better=False) is None


def test_verdicts_judge_the_one_key_backlog_against_no_backlog() -> None:
    results = {
        "none": {
            "unlimited": _figures(2.0, 4.0, 4000.0, 3000.0),
            "keyed": _figures(5.0, 9.0, 1800.0, 200.0),
        },
        "one_key": {
            # 2x exactly is met; the p99 is 2.5x: missed.
            "unlimited": _figures(4.0, 10.0, 2100.0, 1600.0),
            "keyed": _figures(5.5, 9.0, 1700.0, None),
        },
    }
    lines = _lines(results)
    assert lines[("one_key", "unlimited", "claim p50")]["verdict"] == "met"
    assert lines[("one_key", "unlimited", "claim p50")]["slowdown"] == 2.0
    assert lines[("one_key", "unlimited", "claim p99")]["verdict"] == "missed"
    assert lines[("one_key", "unlimited", "claim p99")]["slowdown"] == 2.5
    assert lines[("one_key", "unlimited", "claim jobs/s")]["verdict"] == "met"
    assert lines[("one_key", "unlimited", "workers drain jobs/s")]["slowdown"] == 1.875
    # No workers in the backlog situation: not measured, never met by default.
    assert lines[("one_key", "keyed", "workers drain jobs/s")]["verdict"] == "not measured"
    assert not any(s == "none" for s, *_ in lines)  # the baseline is not judged
    assert flow.overall(list(lines.values())) == "missed"


def test_the_next_due_lookup_is_reported_never_judged() -> None:
    results = {
        "none": {"unlimited": _figures(2.0, 4.0, 4000.0, None, next_due=0.5)},
        "one_key": {"unlimited": _figures(2.0, 4.0, 4000.0, None, next_due=20.0)},
    }
    lines = _lines(results)
    due = lines[("one_key", "unlimited", "next-due lookup p50")]
    assert (due["slowdown"], due["verdict"], due["goal"]) == (40.0, "informative", None)
    assert flow.overall(list(lines.values())) == "met"


def test_latency_summary() -> None:
    summary = flow.latency_summary([1.0, 2.0, 3.0, 40.0])
    assert summary == {"calls": 4, "p50_ms": 2.0, "p99_ms": 40.0, "max_ms": 40.0}
    assert flow.latency_summary([]) is None


def test_a_failed_check_never_meets_the_goal() -> None:
    results = {
        "none": {"unlimited": _figures(2.0, 4.0, 4000.0, None)},
        "one_key": {
            "unlimited": _figures(2.0, 4.0, 4000.0, None, problems=["3 backlog jobs were claimed"])
        },
    }
    lines = _lines(results)
    assert lines[("one_key", "unlimited", "claim p50")]["slowdown"] == 1.0
    assert lines[("one_key", "unlimited", "claim p50")]["verdict"] == "missed"


def test_the_spread_backlog_is_reported_not_judged() -> None:
    results = {
        "none": {"unlimited": _figures(2.0, 4.0, 4000.0, 3000.0, next_due=0.5)},
        "one_key": {"unlimited": _figures(2.2, 4.1, 3900.0, 2900.0, next_due=0.5)},
        "spread": {"unlimited": _figures(20.0, 90.0, 400.0, 300.0, next_due=9.0)},
    }
    lines = _lines(results)
    spread = [v for k, v in lines.items() if k[0] == "spread"]
    assert {v["verdict"] for v in spread} == {"informative"}
    assert all(v["goal"] is None for v in spread)
    assert lines[("spread", "unlimited", "claim p50")]["slowdown"] == 10.0
    assert flow.overall(list(lines.values())) == "met"


def test_overall_without_a_judged_line_is_not_measured() -> None:
    assert flow.overall([]) == "not measured"
    assert flow.overall([{"verdict": "informative"}, {"verdict": "not measured"}]) == (
        "not measured"
    )


@pytest.mark.parametrize(
    ("sql", "label"),
    [
        ("WITH picked AS (SELECT j.id FROM ...) UPDATE ...", "main-lane claim"),
        ("SELECT CASE WHEN EXISTS (SELECT 1 FROM ...) THEN 1 ELSE 0 END", "flow-lane due?"),
        ('UPDATE "leasejobs_flow_lock" SET claims = claims + 1 WHERE backend = %s', "flow lock"),
        ('SELECT name FROM "leasejobs_queue" WHERE backend = %s AND paused', "paused queues"),
        (
            "SELECT j.queue, j.flow_group, COUNT(*) ... GROUP BY j.queue, j.flow_group",
            "running per queue/group",
        ),
        ("WITH RECURSIVE g(queue, name) AS (...) SELECT p.* FROM g", "flow-lane candidates"),
        ("SELECT * FROM (...) AS q0 UNION ALL SELECT * FROM (...) AS q1", "main-lane candidates"),
        ('UPDATE "leasejobs_job" AS j SET status = \'running\' ... RETURNING "id"', "claim rows"),
    ],
)
def test_statement_labels(sql: str, label: str) -> None:
    assert flow.statement_label(sql) == label


PLAN = [
    {
        "Plan": {
            "Node Type": "Nested Loop",
            "Actual Rows": 10,
            "Actual Loops": 1,
            "Shared Hit Blocks": 600,
            "Shared Read Blocks": 4,
            "Plans": [
                {
                    "Node Type": "CTE Scan",
                    "Actual Rows": 50,
                    "Actual Loops": 1,
                    "Shared Hit Blocks": 120,
                },
                {
                    "Node Type": "Index Scan",
                    "Index Name": "leasejobs_job_flow_idx",
                    "Relation Name": "leasejobs_job",
                    "Actual Rows": 10,
                    "Actual Loops": 50,
                    "Shared Hit Blocks": 480,
                    "Shared Read Blocks": 4,
                },
                {"Node Type": "Hash", "Actual Rows": 3, "Actual Loops": 1},
            ],
        },
        "Execution Time": 0.92,
    }
]


def test_plan_summary_keeps_buffers_and_scans() -> None:
    summary = flow.plan_summary("WITH RECURSIVE g(queue, name) AS (...)", PLAN)
    assert summary["statement"] == "flow-lane candidates"
    assert (summary["shared_hit"], summary["shared_read"], summary["buffers"]) == (600, 4, 604)
    assert summary["execution_ms"] == 0.92
    assert summary["rows"] == 10
    assert summary["scans"] == [
        "CTE Scan: 50 rows x 1 loops, 120 buffers",
        "Index Scan using leasejobs_job_flow_idx: 10 rows x 50 loops, 484 buffers",
    ]
    assert [n["depth"] for n in flow.plan_nodes(PLAN[0]["Plan"])] == [0, 1, 1, 1]


def test_markdown_table_has_a_row_per_situation_and_kind() -> None:
    explained = [
        {"claim": "full claim", "buffers": 100},
        {"claim": "full claim", "buffers": 21},
        {"claim": "main lane only", "buffers": 7},
        {"claim": "next-due lookup", "buffers": 900},
    ]
    results = {
        "none": {
            "unlimited": {**_figures(2.0, 4.0, 4000.0, 3000.0, next_due=0.25), "explain": explained}
        },
        "one_key": {"unlimited": _figures(2.5, 5.0, 3500.0, None)},
    }
    results["none"]["unlimited"]["direct"].update(claims=200, jobs_per_claim=10.0)
    table = flow.markdown_table(results)
    lines = table.strip().splitlines()
    assert len(lines) == 4
    assert lines[2] == (
        "| none | unlimited | 200 | 2.00 | 4.00 | 10.0 | 4,000 | 3,000 | 121 | 0.25 | 900 |"
    )
    assert lines[3].startswith("| one_key | unlimited | - | 2.50 | 5.00 |")
    assert lines[3].endswith("| - | - | - | - |")


def test_explain_buffers_sum_one_claim_kind() -> None:
    explained = [
        {"claim": "full claim", "buffers": 3},
        {"buffers": 4},  # (an older JSON without the claim kind: the full claim)
        {"claim": "next-due lookup", "buffers": 50},
    ]
    assert flow.explain_buffers(explained) == 7.0
    assert flow.explain_buffers(explained, "next-due lookup") == 50.0
    assert flow.explain_buffers(explained, "main lane only") is None
    assert flow.explain_buffers(None) is None


def test_describe_line_shouts_a_miss() -> None:
    line = {
        "situation": "one_key",
        "kind": "unlimited",
        "measure": "claim p50",
        "baseline": 2.0,
        "value": 5.0,
        "slowdown": 2.5,
        "goal": 2.0,
        "verdict": "missed",
    }
    text = flow.describe_line(line)
    assert "slowdown 2.50x (goal <= 2x) MISSED" in text
    assert "2.00 ->      5.00" in text
