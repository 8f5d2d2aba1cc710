"""Where one ``enqueue()`` call's time goes on PostgreSQL, layer by layer, against a bare INSERT.

Issue 32's goal: ``enqueue()`` at least 0.8x a bare ``INSERT ... RETURNING id`` with
Django's default connection settings (statements never prepared). This bench times, per
call, seven variants that each add one layer on the way from that INSERT to
``task.enqueue()``:

1. ``bare``: ``bench/compare.py``'s ``BARE_INSERT`` (the ceiling measurement's
   reference), raw psycopg 3 in autocommit, ``prepare_threshold`` None (never prepared,
   as Django's default), with the job's backend, queue, task path and JSON arguments;
2. ``statement``: the statement ``django_leasejobs.leases.insert_job`` sends, built by
   the function it calls, ``enqueue.py``'s ``insert_statement``, from the backend's
   ``_job_fields(task, args, kwargs)``, on the same raw connection;
3. ``statement, no NOTIFY``: the same without the ``pg_notify`` in its ``RETURNING``;
4. ``statement as a CTE``: ``WITH inserted AS (INSERT ... RETURNING id, enqueued_at,
   queue) SELECT id, enqueued_at, pg_notify(%s, queue) FROM inserted``, the shape enqueue
   sent before commit 52b6376 (it cost the server 20-50 us more per call on PostgreSQL
   18 and 15): kept as the record of why the statement is what it is;
5. ``insert_job``: ``leases.insert_job(row, notify=NOTIFY_CHANNEL)`` on Django's
   connection (default settings: never prepared);
6. ``backend.enqueue``: ``backend.enqueue(task, args, kwargs)``;
7. ``task.enqueue()``: the ``django.tasks`` call.

The task is the demo's ``add(a, b)`` called with ``(1, 2)``: two int arguments, its
result never run (no worker). Django runs in this process with the test project's
settings through ``bench/shim.py`` (``DEBUG`` off, logging at WARNING), migrated first.

Each round runs every variant in turn, starting one variant later than the round before
(so no variant always follows the same one); for each variant: the job table emptied
(``TRUNCATE ... CASCADE``), 50 calls of warm-up, then ``--calls`` timed calls (3,000),
their wall time (``perf_counter``) and this process's CPU (``process_time``: the
client's share) per call. ``--rounds`` rounds (5); the table shows each variant's
median over rounds and ``bare ÷ this`` (the bare INSERT's median wall time over the
variant's: the goal is ``task.enqueue()`` at 0.8 or more).

Server: ``DATABASE_URL``'s (its database is only the admin connection), or with
``--private-server`` or without ``DATABASE_URL`` a throwaway PostgreSQL of its own
(``bench/pgserver.py``, production settings: ``fsync`` and ``synchronous_commit`` on, as
on the machine's shared server; ``--fast-server``: both off, and ``full_page_writes``,
as ``bench/compare.py``'s
embedded server, so that the disk's flush of each commit, the same in every variant,
does not pull the ratios toward 1). Either way the bench creates its own database,
``--db-name`` (default ``lj_enqueue_split``), marked with a comment, refuses to drop a
database without that mark, and drops its own at exit unless ``--keep``.

Run from the repository root, in the project's virtualenv (``.venv``) or the bench one::

    python bench/enqueue_split.py                     # 3,000 calls x 5 rounds per variant
    python bench/enqueue_split.py --smoke             # 100 calls, 1 round (seconds)
    python bench/enqueue_split.py --fast-server       # the ceiling bench's kind of server
    python bench/enqueue_split.py --calls 10000 --rounds 9 --output /tmp/split.json

Output: a line per round, then the markdown table, the PostgreSQL version and the
machine; ``--output`` (``artifacts/bench/enqueue_split.json``) holds every round's
figures, the statements and the machine. Nothing is judged: the exit status is non-zero
only when something broke.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from django_leasejobs.compat import AnyTask
    from django_leasejobs.leases.values import NewJob

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
MARK = "leasejobs-bench enqueue_split.py"
SHIM = "enqueue_split_bench"
ALIAS = "default"
TASK_ARGS = (1, 2)
WARMUP_CALLS = 50
SIZES = {"calls": 3000, "rounds": 5}
SMOKE_SIZES = {"calls": 100, "rounds": 1}
SERVER_SETTINGS = ("server_version", "fsync", "synchronous_commit")


# -- options -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    from django_leasejobs.management.argtypes import positive_int  # (Django-free)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--calls", type=positive_int, help="timed calls per variant (3,000)")
    parser.add_argument("--rounds", type=positive_int, help="interleaved rounds (5)")
    parser.add_argument(
        "--smoke", action="store_true", help="100 calls, 1 round (an explicit size wins)"
    )
    add_server_options(parser, fast=True)
    parser.add_argument("--db-name", default="lj_enqueue_split")
    parser.add_argument("--keep", action="store_true", help="keep the database (and server)")
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO_ROOT / "artifacts" / "bench" / "enqueue_split.json",
        help="JSON report",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, value in (SMOKE_SIZES if args.smoke else SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


# -- the variants ------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One way to insert the job: its name, one call of it, and the SQL it sends itself
    (None: the library builds it)."""

    name: str
    call: Callable[[], object]
    sql: str | None = None


@dataclass(frozen=True)
class Statements:
    """The SQL the raw variants send, and their values."""

    statement: str
    no_notify: str
    cte: str
    params: list[object]
    """The statement's values, the NOTIFY channel last (the CTE's too; without it, the
    values of ``no_notify``)."""
    bare_values: list[object]
    """``BARE_INSERT``'s: the job's backend, queue, task path, args and kwargs."""


def statements(row: NewJob) -> Statements:
    """``insert_job``'s statement for ``row`` (``leases.enqueue.insert_statement``, which
    ``insert_job`` sends) and the two variants made from it."""
    from django.db import connections

    from django_leasejobs.leases import NOTIFY_CHANNEL
    from django_leasejobs.leases.enqueue import insert_statement

    quote = connections[ALIAS].ops.quote_name
    statement = insert_statement(row, notify=NOTIFY_CHANNEL, using=ALIAS)
    returning = f"{quote('id')}, {quote('enqueued_at')}"
    notify = f"pg_notify(%s, {quote('queue')})"
    insert, _, tail = statement.sql.partition(" RETURNING ")
    # The variants below cut the NOTIFY out of this RETURNING (and its channel, the last
    # value, out of the values): a RETURNING of another shape needs them rewritten.
    if tail != f"{returning}, {notify}":
        raise SystemExit(f"insert_job's RETURNING changed, update this bench: {statement.sql}")
    return Statements(
        statement=statement.sql,
        no_notify=f"{insert} RETURNING {returning}",
        cte=(
            f"WITH inserted AS ({insert} RETURNING {returning}, {quote('queue')}) "
            f"SELECT id, enqueued_at, {notify} FROM inserted"
        ),
        params=statement.params,
        bare_values=[
            row.backend,
            row.queue,
            row.task_path,
            json.dumps(row.args),
            json.dumps(row.kwargs),
        ],
    )


def raw_variant(
    name: str, conn: psycopg.Connection[tuple[Any, ...]], sql: str, values: list[object]
) -> Variant:
    """``sql`` with ``values`` on the raw connection, its one row fetched."""

    def call() -> None:
        conn.execute(sql, values).fetchone()

    return Variant(name, call, sql)


def variants(conn: psycopg.Connection[tuple[Any, ...]], task: AnyTask) -> list[Variant]:
    """The seven variants, from the bare INSERT to ``task.enqueue()``."""
    from compare import BARE_INSERT  # (bench/, beside this script)

    from django_leasejobs import leases
    from django_leasejobs.backend import LeaseJobsBackend

    backend = task.get_backend()
    assert isinstance(backend, LeaseJobsBackend), backend
    row = backend._job_fields(task, TASK_ARGS, {})
    sql = statements(row)
    return [
        raw_variant("bare", conn, BARE_INSERT, sql.bare_values),
        raw_variant("statement", conn, sql.statement, sql.params),
        raw_variant("statement, no NOTIFY", conn, sql.no_notify, sql.params[:-1]),
        raw_variant("statement as a CTE", conn, sql.cte, sql.params),
        Variant(
            "insert_job",
            lambda: leases.insert_job(row, notify=leases.NOTIFY_CHANNEL, using=ALIAS),
        ),
        Variant("backend.enqueue", lambda: backend.enqueue(task, TASK_ARGS, {})),
        Variant("task.enqueue()", lambda: task.enqueue(*TASK_ARGS)),
    ]


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Figures:
    """A variant's per-call figures, one per round, in microseconds."""

    wall_us: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)


def timed(call: Callable[[], object], calls: int) -> tuple[float, float]:
    """Wall time and this process's CPU per call of ``calls`` calls, in microseconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / calls * 1e6, cpu / calls * 1e6


def measure(
    conn: psycopg.Connection[tuple[Any, ...]],
    chosen: Sequence[Variant],
    calls: int,
    rounds: int,
) -> dict[str, Figures]:
    """``rounds`` rounds over ``chosen``, each round starting one variant later."""
    from compare import rotated  # (bench/, beside this script)

    figures = {variant.name: Figures() for variant in chosen}
    for index in range(rounds):
        for variant in rotated(chosen, index):
            conn.execute("TRUNCATE leasejobs_job CASCADE")
            for _ in range(WARMUP_CALLS):
                variant.call()
            wall_us, cpu_us = timed(variant.call, calls)
            figures[variant.name].wall_us.append(wall_us)
            figures[variant.name].cpu_us.append(cpu_us)
        done = ", ".join(f"{name} {f.wall_us[-1]:.0f}" for name, f in figures.items())
        print(f"round {index + 1}/{rounds}, wall us per call: {done}", flush=True)
    return figures


# -- the report --------------------------------------------------------------------------


def summary(chosen: Sequence[Variant], figures: dict[str, Figures]) -> list[dict[str, Any]]:
    """Per variant: its medians, ``bare ÷ this`` (wall), its SQL and every round's figures."""
    from compare import median, ratio  # (bench/, beside this script)

    bare = median(figures["bare"].wall_us)
    rows: list[dict[str, Any]] = []
    for variant in chosen:
        wall = median(figures[variant.name].wall_us)
        rows.append(
            {
                "variant": variant.name,
                "wall_us": wall,
                "cpu_us": median(figures[variant.name].cpu_us),
                "bare_over_this": ratio(bare, wall),
                "sql": variant.sql,
                "rounds_wall_us": figures[variant.name].wall_us,
                "rounds_cpu_us": figures[variant.name].cpu_us,
            }
        )
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    from compare import fmt_ratio, markdown_table  # (bench/, beside this script)

    return markdown_table(
        ["variant", "wall µs", "client CPU µs", "bare ÷ this"],
        [
            [
                row["variant"],
                f"{row['wall_us']:.1f}",
                f"{row['cpu_us']:.1f}",
                fmt_ratio(row["bare_over_this"]),
            ]
            for row in rows
        ],
    )


def show(admin: psycopg.Connection[tuple[Any, ...]], name: str) -> str:
    """A server setting's value (``SHOW``)."""
    row = admin.execute(f"SHOW {name}").fetchone()
    assert row is not None, name
    return str(row[0])


def server_line(server: dict[str, str], label: str) -> str:
    return (
        f"PostgreSQL {server['server_version']}, {label}: fsync {server['fsync']}, "
        f"synchronous_commit {server['synchronous_commit']}"
    )


def machine_line(facts: dict[str, Any]) -> str:
    return (
        f"machine: {facts['machine']}, load {facts['load_at_start']} at start; Python "
        f"{facts['python']}, Django {facts['django']}, commit {facts['commit']}, {facts['date']}"
    )


# -- the run -----------------------------------------------------------------------------


def setup_django(url: str, shim_dir: Path) -> None:
    """The test project's settings through the shim (``DEBUG`` off, quiet logging) on the
    bench database, migrated."""
    import shim  # (bench/, beside this script)

    settings_module, _ = shim.write(shim_dir, SHIM)
    sys.path.insert(0, str(shim_dir))
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE=settings_module, DEBUG="false")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def run(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    """Django set up on the bench database at ``url``, the variants measured."""
    from pgserver import connect_admin, django_url_config

    shim_dir = Path(tempfile.mkdtemp(prefix="leasejobs-enqueue-split-"))
    try:
        setup_django(url, shim_dir)
        from demo.tasks import add

        with connect_admin(django_url_config(url)) as conn:
            conn.prepare_threshold = None  # never prepared: Django's default
            chosen = variants(conn, add)
            figures = measure(conn, chosen, args.calls, args.rounds)
        return summary(chosen, figures)
    finally:
        shutil.rmtree(shim_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    # Before the options: their validators too come from this checkout's django_leasejobs.
    for path in (BENCH_DIR, REPO_ROOT / "testproject", REPO_ROOT):
        sys.path.insert(0, str(path))
    args = parse_args(argv)
    from pgserver import bench_database, connect_admin, machine

    with bench_database(
        args,
        bench="bench/enqueue_split.py",
        prefix="leasejobs-enqueue-split-pg-",
        mark=MARK,
        production=not args.fast_server,
    ) as (url, config, label):
        with connect_admin(config) as admin:
            server = {name: show(admin, name) for name in SERVER_SETTINGS}
        print(
            f"{server_line(server, label)}; database {args.db_name}; per variant: --calls "
            f"{args.calls:,} --rounds {args.rounds}",
            flush=True,
        )
        facts = machine(REPO_ROOT)
        rows = run(args, url)
    print()
    print(table(rows))
    print()
    print(server_line(server, label))
    print(machine_line(facts))
    report = {
        "machine": facts,
        "load_at_end": [round(load, 2) for load in os.getloadavg()],
        "server": {**server, "kind": label},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "warmup_calls": WARMUP_CALLS,
        "variants": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
