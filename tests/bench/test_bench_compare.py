"""bench/compare.py's pure parts: statistics, targets, tables, URLs, the docs section.

The comparison itself needs Python 3.12+, Django 6 and the peers (scripts/bench runs it;
CI runs ``scripts/bench --smoke``), so this module tests only what runs anywhere: it
loads bench/compare.py, whose top level imports the standard library alone. No timing
is asserted here: speed targets live in bench/, never in tests.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_bench

compare = load_bench("compare")


# -- statistics --------------------------------------------------------------------------


def test_percentile_is_the_nearest_rank() -> None:
    values = list(range(100, 0, -1))  # 1..100, unsorted
    assert compare.percentile(values, 0.50) == 50
    assert compare.percentile(values, 0.99) == 99
    assert compare.percentile(values, 1.0) == 100
    assert compare.percentile([7.5], 0.99) == 7.5
    assert compare.percentile([1, 2, 3], 0.5) == 2


@pytest.mark.parametrize(("values", "fraction"), [([], 0.5), ([1.0], 0.0), ([1.0], 1.5)])
def test_percentile_refuses_nothing_and_bad_fractions(values: list[float], fraction: float) -> None:
    with pytest.raises(ValueError):
        compare.percentile(values, fraction)


def test_median_and_ratio_treat_missing_figures_as_missing() -> None:
    assert compare.median([3.0, 1.0, 2.0]) == 2.0
    assert compare.median([]) is None
    assert compare.ratio(3000.0, 300.0) == 10.0
    assert compare.ratio(None, 300.0) is None
    assert compare.ratio(3000.0, None) is None
    assert compare.ratio(3000.0, 0.0) is None


def test_each_round_starts_with_the_next_system() -> None:
    systems = ["leasejobs", "tasksdb", "ox"]
    assert compare.rotated(systems, 0) == systems
    assert compare.rotated(systems, 1) == ["tasksdb", "ox", "leasejobs"]
    assert compare.rotated(systems, 3) == systems
    assert compare.rotated([], 2) == []


# -- targets -----------------------------------------------------------------------------


def test_target_verdicts() -> None:
    assert compare.at_least(3000.0, 3000.0) is True
    assert compare.at_least(2999.0, 3000.0) is False
    assert compare.at_least(None, 3000.0) is None
    assert compare.at_most(10.0, 10.0) is True
    assert compare.at_most(10.1, 10.0) is False
    assert compare.all_met([True, True]) is True
    assert compare.all_met([True, None, False]) is False
    assert compare.all_met([True, None]) is None
    assert compare.all_met([]) is None
    target = compare.Target("p50 ≤ 10 ms", "4.20 ms", True)
    assert target.line() == "target: p50 ≤ 10 ms: 4.20 ms — met"
    assert compare.Target("x", "y", False).verdict == "NOT MET"
    assert compare.Target("x", "—", None).verdict == "not measured"


@dataclass(frozen=True)
class FakeFleet:
    label: str
    bound: str = ""


@dataclass
class FakeSystem:
    """What the summaries read of an adapter (bench/comparesite/systems.py)."""

    key: str
    fleets: tuple[str, ...] = ("four executors",)
    bulk_path: str = "bulk path"
    claim_step: str = "claim step"
    recovery: str = "recovery"
    executors: str = "executors"

    @property
    def name(self) -> str:
        return compare.SYSTEM_NAMES[self.key]

    def drain_fleets(self) -> list[FakeFleet]:
        return [FakeFleet(label) for label in self.fleets]

    def recovery_fleets(self) -> list[FakeFleet]:
        return [FakeFleet("two workers", bound="≤ 2.5 s")]


def make_context(tmp_path: Path, **sizes: Any) -> Any:
    args = argparse.Namespace(**{**compare.FULL_SIZES, "latency_pause": 0.05, **sizes})
    systems = [
        FakeSystem("leasejobs", fleets=("process pool", "thread pool")),
        FakeSystem("tasksdb"),
        FakeSystem("ox", fleets=("threads", "processes")),
    ]
    return compare.Context(args, systems, tmp_path, tmp_path)  # type: ignore[arg-type]


def record(ctx: Any, measurement: str, key: str, row: str, *rounds: dict[str, Any]) -> None:
    for number, figures in enumerate(rounds, start=1):
        ctx.record(measurement, ctx.system(key), row, number, figures)


def verdicts(section: Any) -> list[str]:
    return [target.verdict for target in section.targets]


def test_drain_targets_use_the_process_pool_median_against_every_peer_row(
    tmp_path: Path,
) -> None:
    ctx = make_context(tmp_path)
    rate = [{"jobs_per_s": v, "seconds": 1.0} for v in (3400.0, 3600.0, 3500.0)]
    record(ctx, "drain", "leasejobs", "process pool", *rate)
    record(ctx, "drain", "leasejobs", "thread pool", {"jobs_per_s": 100.0, "seconds": 1.0})
    record(ctx, "drain", "tasksdb", "four executors", {"jobs_per_s": 300.0, "seconds": 1.0})
    record(ctx, "drain", "ox", "threads", {"jobs_per_s": 340.0, "seconds": 1.0})
    record(ctx, "drain", "ox", "processes", {"jobs_per_s": 350.0, "seconds": 1.0})
    section = compare.summarize_drain(ctx)
    assert verdicts(section) == ["met", "met"]  # 3,500 jobs/s; 11.67x, 10.29x, 10.00x
    rows = {(row[0], row[1]): row for row in section.rows}
    assert rows[("django-leasejobs", "process pool")][2:5] == ["3,500", "3,400-3,600", "reference"]
    assert rows[("django-tasks-db", "four executors")][4] == "11.67x"

    record(ctx, "drain", "ox", "processes", {"jobs_per_s": 400.0, "seconds": 1.0})
    assert verdicts(compare.summarize_drain(ctx)) == ["met", "NOT MET"]  # median 375: 9.33x


def test_targets_are_not_measured_without_the_figures(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    record(ctx, "enqueue", "leasejobs", "enqueue", {"single_per_s": 900.0, "bulk_per_s": 25e3})
    enqueue = compare.summarize_enqueue(ctx)
    assert verdicts(enqueue) == ["not measured", "met"]  # django-ox was not measured
    record(ctx, "enqueue", "ox", "enqueue", {"single_per_s": 1000.0, "bulk_per_s": 9000.0})
    assert verdicts(compare.summarize_enqueue(ctx)) == ["NOT MET", "met"]  # 0.90x django-ox
    assert verdicts(compare.summarize_drain(ctx)) == ["not measured", "not measured"]


def test_latency_claim_and_memory_targets(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    record(ctx, "latency", "leasejobs", "process pool", {"p50_ms": 4.0, "p99_ms": 60.0})
    record(ctx, "latency", "ox", "threads", {"p50_ms": 480.0, "p99_ms": 960.0})
    latency = compare.summarize_latency(ctx)
    assert verdicts(latency) == ["met", "NOT MET"]
    assert latency.rows[1][5:] == ["120.00x", "16.00x"]

    full = f"{ctx.args.finished:,} finished rows"
    record(ctx, "claim", "leasejobs", "empty table", {"p50_ms": 0.5, "p99_ms": 1.0})
    record(ctx, "claim", "leasejobs", full, {"p50_ms": 0.6, "p99_ms": 1.9})
    assert verdicts(compare.summarize_claim(ctx)) == ["met"]

    idle = {"parent": 60.0, "children_pss": 0.0}
    record(
        ctx,
        "memory",
        "leasejobs",
        "process pool, 100,000 jobs",
        {"rss_idle": idle, "rss_after": {"parent": 67.0, "children_pss": 80.0}, "growth": 7 / 60},
    )
    memory = compare.summarize_memory(ctx)
    assert verdicts(memory) == ["met", "NOT MET"]  # 60 MB idle; +11.7 %
    assert memory.rows[0][2:] == ["60.0 MB", "67.0 MB", "+11.7 %", "80.0 MB"]


def test_ceiling_ratios_against_the_floor_and_the_bare_insert(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    record(ctx, "ceiling", "leasejobs", "python floor drain", {"jobs_per_s": 30_000.0})
    record(ctx, "ceiling", "leasejobs", "bare INSERT", {"per_s": 4_000.0})
    record(ctx, "ceiling", "leasejobs", "single enqueue()", {"per_s": 3_000.0})
    record(ctx, "ceiling", "leasejobs", "drain, process pool", {"jobs_per_s": 10_500.0})
    record(ctx, "ceiling", "leasejobs", "drain, thread pool", {"jobs_per_s": 6_000.0})
    record(ctx, "ceiling", "leasejobs", compare.PREPARED_ROW, {"per_s": 3_800.0})
    record(ctx, "ceiling", "leasejobs", compare.UNPREPARED_BARE_ROW, {"per_s": 3_200.0})
    section = compare.summarize_ceiling(ctx)
    # 0.35x the floor; 0.94x the bare INSERT on Django's defaults (never prepared)
    assert verdicts(section) == ["met", "met"]
    ratios = [row[2] for row in section.rows]
    assert ratios == ["reference", "0.35x", "0.20x", "reference", "0.94x", "reference", "0.95x"]
    assert "`enqueue()` on Django's defaults does 0.75x" in section.notes[0]
    assert "the bare INSERT never prepared 0.80x" in section.notes[0]
    record(ctx, "ceiling", "leasejobs", "single enqueue()", {"per_s": 2_400.0}, {"per_s": 2_300.0})
    # median of 3,000, 2,400 and 2,300: 0.75x the never-prepared INSERT
    assert verdicts(compare.summarize_ceiling(ctx)) == ["met", "NOT MET"]


def test_ceiling_is_not_measured_without_its_references(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    record(ctx, "ceiling", "leasejobs", "drain, process pool", {"jobs_per_s": 10_500.0})
    assert verdicts(compare.summarize_ceiling(ctx)) == ["not measured", "not measured"]


def test_recovery_cells_say_when_a_job_never_ran_again() -> None:
    def row(*seconds: float | None) -> dict[str, Any]:
        return {"rounds": [{"seconds": s, "cap": 120.0} for s in seconds]}

    assert compare.recovery_cell(row(2.5, 3.1, 2.7)) == "2.7 s"
    assert compare.recovery_cell(row(None)) == "not recovered within 120 s"
    assert compare.recovery_cell(row(2.0, None, 4.0)) == "3.0 s (1 not within 120 s)"


# -- tables, URLs, arguments -------------------------------------------------------------


def test_markdown_tables_right_align_number_columns_only() -> None:
    table = compare.markdown_table(
        ["system", "jobs/s", "ratio", "note"],
        [["django-ox", "1,234", "—", "2 workers"], ["django-leasejobs", "12,345", "3.00x", "a"]],
    )
    lines = table.splitlines()
    assert lines[1] == "| ---------------- | -----: | ----: | --------- |"
    assert lines[2] == "| django-ox        |  1,234 |     — | 2 workers |"
    assert lines[3] == "| django-leasejobs | 12,345 | 3.00x | a         |"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgres://postgres@127.0.0.1:5432/postgres",
            {"NAME": "postgres", "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"},
        ),
        (
            "postgresql://bench:p%40ss%3Aw@db.example:6543/site?sslmode=require",
            {
                "NAME": "site",
                "USER": "bench",
                "PASSWORD": "p@ss:w",
                "HOST": "db.example",
                "PORT": "6543",
                "OPTIONS": {"sslmode": "require"},
            },
        ),
        (  # the embedded server's form: the socket directory in the path
            "postgres://postgres@:54321//srv/leasejobs-pg/pgdata/postgres",
            {
                "NAME": "postgres",
                "USER": "postgres",
                "HOST": "/srv/leasejobs-pg/pgdata",
                "PORT": "54321",
            },
        ),
        (
            "postgres://%2Fvar%2Frun%2Fpostgresql/app",
            {"NAME": "app", "HOST": "/var/run/postgresql"},
        ),
        (
            "postgres://u@[::1]:5433/app",
            {"NAME": "app", "USER": "u", "HOST": "::1", "PORT": "5433"},
        ),
    ],
)
def test_database_urls(url: str, expected: dict[str, Any]) -> None:
    parsed = compare.parse_database_url(url)
    defaults = {"USER": "", "PASSWORD": "", "HOST": "", "PORT": "", "OPTIONS": {}}
    assert parsed == {**defaults, **expected}


@pytest.mark.parametrize("url", ["sqlite:////tmp/x.sqlite3", "mysql://u@h/db", "postgres://h:1/"])
def test_database_urls_must_name_a_postgresql_database(url: str) -> None:
    with pytest.raises(ValueError):
        compare.parse_database_url(url)


def test_printed_commands_hide_passwords() -> None:
    assert compare.masked_url("postgres://u:secret@h:5432/db") == "postgres://u:***@h:5432/db"
    assert compare.masked_url("postgres://u@h/db") == "postgres://u@h/db"


def test_smoke_sizes_yield_to_explicit_options() -> None:
    args = compare.parse_args(["--smoke", "--jobs", "500", "--systems", "ox,leasejobs"])
    assert args.rounds == compare.SMOKE_SIZES["rounds"]
    assert args.finished == compare.SMOKE_SIZES["finished"]
    assert args.jobs == 500
    assert args.systems == ["leasejobs", "ox"]  # in the bench's order
    full = compare.parse_args([])
    assert (full.rounds, full.jobs, full.finished) == (3, 10_000, 1_000_000)
    assert full.only == list(compare.MEASUREMENTS)


@pytest.mark.parametrize(
    "argv",
    [
        ["--write-docs", "--smoke"],
        ["--write-docs", "--systems", "leasejobs"],
        ["--write-docs", "--only", "drain"],
        ["--systems", "celery"],
        ["--rounds", "0"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        compare.parse_args(argv)
    assert exit_info.value.code == 2
    capsys.readouterr()


# -- the docs section --------------------------------------------------------------------


def test_replace_section_changes_only_the_generated_part() -> None:
    start, end = compare.DOCS_START, compare.DOCS_END
    text = f"# Title\n\nhand written\n\n{start}\nold\n{end}\n\n## Next\nkept\n"
    once = compare.replace_section(text, "\nnew table\n")
    assert once == f"# Title\n\nhand written\n\n{start}\nnew table\n{end}\n\n## Next\nkept\n"
    assert compare.replace_section(once, "new table") == once


@pytest.mark.parametrize(
    "text",
    [
        "no markers at all",
        f"{compare.DOCS_START} only the start",
        f"{compare.DOCS_START}\n{compare.DOCS_END}\n{compare.DOCS_START}\n{compare.DOCS_END}",
        f"{compare.DOCS_END}\nreversed\n{compare.DOCS_START}",
    ],
)
def test_replace_section_refuses_missing_duplicate_or_reversed_markers(text: str) -> None:
    with pytest.raises(ValueError):
        compare.replace_section(text, "new")


def test_the_docs_have_one_generated_section_before_the_dashboard_section() -> None:
    text = compare.DOCS_FILE.read_text()
    compare.replace_section(text, "check")  # exactly one pair, in order
    heading = "## Side by side: django-leasejobs, django-tasks-db, django-ox"
    positions = [text.index(heading), text.index(compare.DOCS_START)]
    positions.append(text.index("## Admin dashboard on a big table"))
    assert positions == sorted(positions)
