"""Bulk retry on a million jobs (issue 31): the time ``django_leasejobs.bulk.retry`` takes
to retry the 100,000 dead jobs of a 1,000,000-job table on PostgreSQL, per batch size.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/bulk_actions.py                    # 1,000,000 jobs, 100,000 dead
    python bench/bulk_actions.py --smoke            # 20,000 jobs, 2,000 dead (CI, seconds)
    python bench/bulk_actions.py --batch-sizes 1000 5000 --output /tmp/b.json

What it does:

1. **Server.** Without ``DATABASE_URL`` (or with ``--private-server``): a PostgreSQL of
   its own (``bench/pgserver.py``, production settings), deleted at exit. With
   ``DATABASE_URL``: that server. Either way the bench creates its own database,
   ``--db-name`` (default ``leasejobs_bulk_bench``), marked with a comment, refuses to
   drop a database without that mark, and drops its own at exit unless ``--keep``.
   Django runs in this process on it (the demo project's settings, ``DEBUG`` off),
   migrated first.
2. **Fill.** ``--jobs`` rows in one ``INSERT ... SELECT ... FROM generate_series``: every
   ``--dead-every``-th job (10: one in ten) is dead after three stalls, one in a thousand
   of those with a dedup key of its own; of the others, 80 % succeeded, 10 % failed, 10 %
   pending; two queues, five tasks, JSON arguments. Then ``VACUUM ANALYZE``, and
   autovacuum off for the job table (so that it does not start in the middle of a timed
   run; the server's own setting is reported).
3. **Runs.** For each ``--batch-sizes`` entry: the confirmation's count
   (``bulk.count(Action.RETRY, jobs)``, timed), then ``bulk.retry(jobs, batch_size=N)``
   on ``JobFilter(state="dead").jobs()``, timed (wall clock, this process: the keyset
   reads, one ``UPDATE`` per batch in its own transaction, the ``NOTIFY``). The result is
   checked against plain SQL: every dead job is now pending with a fresh budget, no other
   row changed status. Between runs the retried jobs are made dead again and the table
   is vacuumed.

``--output`` (JSON, default ``artifacts/bench/bulk_actions.json``) holds every figure,
the machine's load before and after, and the server's settings; ``--markdown`` the
table. Any check that fails exits 1 (``--smoke`` too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench bulk_actions.py"
DEAD_ERROR = "lease expired (stalled 3 times)"
TASK_PATHS = (
    "billing.tasks.send_invoice",
    "billing.tasks.charge_card",
    "shop.tasks.ship_order",
    "crm.tasks.sync_customer",
    "mail.tasks.send_receipt",
)

JOB_COLUMNS = (
    "backend, queue, task_path, args, kwargs, priority, run_after, status, attempt, "
    "max_attempts, stall_count, max_stalls, snoozes, key, last_worker, cancel_requested, "
    "progress_message, last_error, enqueued_at, started_at, last_attempted_at, finished_at"
)

# Row i of n, in time order over the last 30 days: dead when i is a multiple of
# dead_every (a key on one dead job in a thousand), else succeeded, failed or pending by i.
FILL_SQL = f"""
WITH g AS (
    SELECT i, now() - interval '30 days' * ((%(n)s - i)::float8 / %(n)s) AS at,
        CASE WHEN i %% %(dead_every)s = 0 THEN 'dead'
             WHEN i %% 10 < 8 THEN 'succeeded'
             WHEN i %% 10 = 8 THEN 'failed'
             ELSE 'pending' END AS status
    FROM generate_series(1, %(n)s) AS i
)
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT
    'default', CASE WHEN i %% 3 = 0 THEN 'mail' ELSE 'default' END,
    (%(tasks)s::text[])[1 + i %% %(ntasks)s],
    jsonb_build_array(100000 + i / 3),
    jsonb_build_object('customer_id', 1 + i %% 5000),
    0, at, status,
    CASE status WHEN 'pending' THEN 0 ELSE 3 END,
    3,
    CASE status WHEN 'dead' THEN 3 ELSE 0 END,
    3, 0,
    CASE WHEN status = 'dead' AND i %% (1000 * %(dead_every)s) = 0 THEN 'order-' || i END,
    CASE status WHEN 'pending' THEN '' ELSE 'web-' || (i %% 4) || ':8000' END,
    FALSE, '',
    CASE status WHEN 'dead' THEN '{DEAD_ERROR}'
                WHEN 'failed' THEN 'ValueError: invoice does not add up' ELSE '' END,
    at,
    CASE status WHEN 'pending' THEN NULL ELSE at + interval '1 second' END,
    CASE status WHEN 'pending' THEN NULL ELSE at + interval '1 second' END,
    CASE status WHEN 'pending' THEN NULL ELSE at + interval '2 seconds' END
FROM g
ORDER BY i
"""

# The jobs a run retried, dead again (their last_error says they were dead letters).
REDEAD_SQL = f"""
UPDATE leasejobs_job SET status = 'dead', stall_count = 3, max_attempts = 3,
    finished_at = run_after
WHERE status = 'pending' AND last_error = '{DEAD_ERROR}'
"""


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=None, help="jobs in the table (1,000,000)")
    parser.add_argument("--dead-every", type=int, default=10, help="one job in N is dead (10)")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, help="runs (1000 2000 5000)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="20,000 jobs, batch sizes 500 and 2000 (CI)"
    )
    add_server_options(parser)
    parser.add_argument("--db-name", default="leasejobs_bulk_bench")
    parser.add_argument("--keep", action="store_true", help="keep the database (and server)")
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO_ROOT / "artifacts/bench/bulk_actions.json",
        help="JSON report",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.jobs is None:
        args.jobs = 20_000 if args.smoke else 1_000_000
    if args.batch_sizes is None:
        args.batch_sizes = [500, 2000] if args.smoke else [1000, 2000, 5000]
    if args.jobs < 1000 or args.dead_every < 2 or min(args.batch_sizes) < 1:
        raise SystemExit("--jobs must be at least 1,000, --dead-every 2, batch sizes 1")
    return args


@dataclass
class Run:
    batch_size: int
    dead_before: int
    count_s: float = 0.0
    counted: int = 0
    retry_s: float = 0.0
    retried: int = 0
    batches: int = 0
    key_held: int = 0
    problems: list[str] | None = None

    @property
    def per_second(self) -> float:
        return self.retried / self.retry_s if self.retry_s else 0.0


def table(runs: Sequence[Run], jobs: int) -> str:
    rows = [
        f"| bulk retry of the dead jobs among {jobs:,} | batch size | confirmation count | "
        "retry | batches | jobs/s |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    rows += [
        f"| {run.retried:,} retried | {run.batch_size:,} | {run.count_s * 1000:,.0f} ms | "
        f"{run.retry_s:,.1f} s | {run.batches:,} | {run.per_second:,.0f} |"
        for run in runs
    ]
    return "\n".join(rows)


# -- the database ------------------------------------------------------------------------


def execute(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def by_status() -> dict[str, int]:
    return {
        status: int(n)
        for status, n in execute("SELECT status, count(*) FROM leasejobs_job GROUP BY status")
    }


def fill(jobs: int, dead_every: int) -> float:
    started = time.perf_counter()
    execute(
        FILL_SQL,
        {"n": jobs, "dead_every": dead_every, "tasks": list(TASK_PATHS), "ntasks": len(TASK_PATHS)},
    )
    return time.perf_counter() - started


def vacuum_analyze() -> float:
    started = time.perf_counter()
    execute("VACUUM ANALYZE leasejobs_job")
    return time.perf_counter() - started


def run_once(batch_size: int) -> Run:
    """One timed bulk retry of every dead job, checked against plain SQL."""
    from django_leasejobs import bulk

    before = by_status()
    run = Run(batch_size=batch_size, dead_before=before.get("dead", 0), problems=[])
    jobs = bulk.JobFilter(state="dead").jobs()
    started = time.perf_counter()
    run.counted = bulk.count(bulk.Action.RETRY, jobs)
    run.count_s = time.perf_counter() - started
    started = time.perf_counter()
    result = bulk.retry(jobs, batch_size=batch_size)
    run.retry_s = time.perf_counter() - started
    run.retried, run.batches, run.key_held = result.count, result.batches, result.key_held
    after = by_status()
    expected = dict(before)
    expected["pending"] = before.get("pending", 0) + run.dead_before
    expected.pop("dead", None)
    problems = run.problems or []
    if run.counted != run.dead_before:
        problems.append(f"the count said {run.counted}, SQL {run.dead_before}")
    if run.retried != run.dead_before or run.key_held:
        problems.append(f"retried {run.retried} (keys held {run.key_held}) of {run.dead_before}")
    if after != expected:
        problems.append(f"statuses after: {after}, expected {expected}")
    [(fresh,)] = execute(
        "SELECT count(*) FROM leasejobs_job WHERE status = 'pending' AND last_error = %s "
        "AND stall_count = 0 AND finished_at IS NULL AND max_attempts = 4",
        [DEAD_ERROR],
    )
    if fresh != run.dead_before:
        problems.append(f"{fresh} retried jobs have a fresh budget, not {run.dead_before}")
    return run


# -- running it --------------------------------------------------------------------------


def setup_django(url: str) -> None:
    """The demo project's settings on the bench database, DEBUG off, migrated."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    os.environ["DEBUG"] = "false"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def step(message: str) -> None:
    load = os.getloadavg()[0]
    print(f"[{time.strftime('%H:%M:%S')} load {load:.2f}] {message}", flush=True)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    step(f"filling {args.jobs:,} jobs, one in {args.dead_every} dead")
    fill_s = fill(args.jobs, args.dead_every)
    vacuum_s = vacuum_analyze()
    execute("ALTER TABLE leasejobs_job SET (autovacuum_enabled = off)")
    step(f"filled in {fill_s:.1f}s, vacuumed in {vacuum_s:.1f}s: {by_status()}")
    runs: list[Run] = []
    for number, batch_size in enumerate(args.batch_sizes):
        if number:
            execute(REDEAD_SQL)
            vacuum_analyze()
        run = run_once(batch_size)
        runs.append(run)
        step(
            f"batch size {batch_size:,}: count {run.count_s * 1000:,.0f} ms; retried "
            f"{run.retried:,} in {run.retry_s:.2f}s ({run.batches:,} batches, "
            f"{run.per_second:,.0f} jobs/s)"
            + (f"; PROBLEMS {run.problems}" if run.problems else "")
        )
    return {"fill_s": fill_s, "vacuum_s": vacuum_s, "runs": runs}


def server_facts(admin: Any, label: str) -> dict[str, Any]:
    names = ("server_version", "fsync", "synchronous_commit", "autovacuum", "shared_buffers")
    facts = {name: admin.execute(f"SHOW {name}").fetchone()[0] for name in names}
    facts["kind"] = label
    return facts


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (REPO_ROOT / "testproject", REPO_ROOT, REPO_ROOT / "bench"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from pgserver import bench_database, connect_admin, machine

    with bench_database(
        args, bench="bench/bulk_actions.py", prefix="leasejobs-bulk-pg-", mark=MARK
    ) as (
        url,
        config,
        label,
    ):
        with connect_admin(config) as admin:
            server = server_facts(admin, label)
        step(
            f"PostgreSQL {server['server_version']}, {label}: fsync {server['fsync']}, "
            f"synchronous_commit {server['synchronous_commit']}, autovacuum "
            f"{server['autovacuum']}; database {args.db_name}"
        )
        setup_django(url)
        facts = machine(REPO_ROOT)
        measured = measure(args)
        facts["load_at_end"] = [round(load, 2) for load in os.getloadavg()]
    runs: list[Run] = measured["runs"]
    text = table(runs, args.jobs)
    print()
    print(text)
    report = {
        "machine": facts,
        "server": server,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "fill_s": measured["fill_s"],
        "vacuum_s": measured["vacuum_s"],
        "runs": [asdict(run) | {"per_second": run.per_second} for run in runs],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    problems = [problem for run in runs for problem in run.problems or []]
    if problems:
        print("PROBLEMS: " + "; ".join(problems))
        return 1
    if args.smoke:
        print("smoke run: every dead job retried and checked against SQL, nothing judged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
