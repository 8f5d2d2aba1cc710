"""Admin dashboard on a big job table: server time of the admin pages on PostgreSQL.

Run from the repository root, inside the project's virtualenv::

    python bench/dashboard.py [--finished 1000000] [--ready 10000] [--repeat 20] [--explain]

The PostgreSQL server comes from ``DATABASE_URL`` (its database is used only as the
admin connection that creates the bench database) or, when ``DATABASE_URL`` is unset,
the demo's embedded server in ``.demo/pgdata`` (``testproject.settings``). The bench
creates its own database (``--db-name``, default ``leasejobs_bench``), recreates it on
every run (``--reuse`` keeps one already filled with the same sizes) and refuses to
touch a database it did not create. See bench/README.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 250.0
METRICS_TARGET_MS = 100.0  # issue 13: a Prometheus scrape answers within 100 ms
SLOW_SHARE = 0.1  # --explain also explains queries taking this share of the target
MARKER = "leasejobs-bench"  # database comment prefix: this database belongs to the bench

# Weighted choices: an entry repeated k times is picked k times as often.
QUEUES = ["default"] * 10 + ["high"] * 3 + ["low"] * 3 + ["emails"] * 3 + ["reports"]
TASKS = [
    "shop.tasks.send_receipt",
    "shop.tasks.sync_inventory",
    "shop.tasks.charge_card",
    "mail.tasks.send_newsletter",
    "mail.tasks.bounce_check",
    "reports.tasks.daily_sales",
    "reports.tasks.export_csv",
    "media.tasks.make_thumbnails",
]


# -- arguments -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Server time of the leasejobs admin dashboard and job list on a big table.",
    )
    size = parser.add_argument_group("table size")
    size.add_argument("--finished", type=int, default=1_000_000, help="finished jobs (1,000,000)")
    size.add_argument("--ready", type=int, default=10_000, help="ready pending jobs (10,000)")
    size.add_argument(
        "--scheduled", type=int, default=None, help="pending jobs due later (ready / 10)"
    )
    size.add_argument("--running", type=int, default=50, help="running jobs, leased (50)")
    size.add_argument("--workers", type=int, default=4, help="live workers holding them (4)")
    size.add_argument(
        "--last-hour-share",
        type=float,
        default=0.01,
        help="share of the finished jobs that finished in the last hour, the rest over "
        "30 days (0.01)",
    )
    run = parser.add_argument_group("measuring")
    run.add_argument("--repeat", type=int, default=20, help="timed runs per scenario (20)")
    run.add_argument("--warmup", type=int, default=3, help="untimed runs first (3)")
    run.add_argument(
        "--target-ms", type=float, default=TARGET_MS, help="target for every p95 (250)"
    )
    run.add_argument(
        "--explain",
        nargs="?",
        const="missed",
        choices=["missed", "always"],
        help="print EXPLAIN (ANALYZE, BUFFERS) of the slowest query (and of any query "
        "taking 10%% of the target) of each scenario that missed the target "
        "(or of every scenario: --explain always)",
    )
    run.add_argument(
        "--show-queries", action="store_true", help="list every query of every scenario"
    )
    run.add_argument(
        "--fail-on-miss", action="store_true", help="exit 1 when a scenario misses the target"
    )
    db = parser.add_argument_group("database")
    db.add_argument(
        "--db-name", default="leasejobs_bench", help="the bench's own database (leasejobs_bench)"
    )
    db.add_argument(
        "--reuse",
        action="store_true",
        help="keep the bench database when it was filled with the same sizes "
        "(its timestamps are then as old as that fill)",
    )
    db.add_argument("--drop-after", action="store_true", help="drop the bench database at exit")
    args = parser.parse_args(argv)
    if args.scheduled is None:
        args.scheduled = args.ready // 10
    for name in ("finished", "ready", "scheduled", "running", "workers"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0")
    if args.workers < 1 and args.running:
        parser.error("--running needs at least one --workers")
    if not 0 <= args.last_hour_share <= 1:
        parser.error("--last-hour-share must be between 0 and 1")
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be >= 1 and --warmup >= 0")
    return args


# -- the bench database ----------------------------------------------------------------


def server_url() -> str:
    """DATABASE_URL, or the demo's embedded PostgreSQL (started like testproject.settings)."""
    from testproject.embedded_db import ensure_database_url

    data = os.environ.get("LEASEJOBS_DEMO_DATA", str(REPO_ROOT / ".demo" / "pgdata"))
    return ensure_database_url(data, throwaway=False)


class BenchDatabase:
    """Creates, checks and drops the bench's own database through an admin connection."""

    def __init__(self, url: str, name: str) -> None:
        from pgserver import connect_admin, django_url_config

        from testproject.embedded_db import settings_to_database_url

        config = django_url_config(url)
        if not config["ENGINE"].endswith("postgresql"):
            raise SystemExit(f"bench/dashboard.py needs PostgreSQL, DATABASE_URL is {url!r}")
        if config["NAME"] == name:
            raise SystemExit(
                f"DATABASE_URL names {name!r}, the bench's own database: point it at "
                "another database of the server or pick another --db-name"
            )
        self.name = name
        self.url = settings_to_database_url({**config, "NAME": name})
        self.admin = connect_admin(config)
        self.filled_at = ""

    def _comment(self) -> str | None:
        """The database's comment; None when the database does not exist."""
        row = self.admin.execute(
            "SELECT coalesce(shobj_description(oid, 'pg_database'), '') "
            "FROM pg_database WHERE datname = %s",
            [self.name],
        ).fetchone()
        return None if row is None else row[0]

    def _set_comment(self, text: str) -> None:
        from psycopg import sql

        self.admin.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(self.name), sql.Literal(text)
            )
        )

    @staticmethod
    def marker(sizes: dict[str, Any]) -> str:
        return f"{MARKER} {json.dumps(sizes, sort_keys=True)}"

    def prepare(self, sizes: dict[str, Any], reuse: bool) -> bool:
        """Create the database (empty) or keep a filled one; True when it must be filled."""
        from psycopg import sql

        comment = self._comment()
        if comment is not None:
            if not comment.startswith(MARKER):
                raise SystemExit(
                    f"database {self.name!r} exists and was not created by this bench "
                    f"(its comment does not start with {MARKER!r}); pick another --db-name"
                )
            if reuse and comment.startswith(self.marker(sizes) + " filled "):
                self.filled_at = comment.rpartition(" filled ")[2]
                return False
            self.drop()
        self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self._set_comment(f"{MARKER} (being filled)")
        return True

    def mark_filled(self, sizes: dict[str, Any]) -> None:
        self.filled_at = datetime.now(UTC).isoformat(timespec="seconds")
        self._set_comment(f"{self.marker(sizes)} filled {self.filled_at}")

    def drop(self) -> None:
        from psycopg import sql

        comment = self._comment()
        if comment is None:
            return
        if not comment.startswith(MARKER):  # never drop a database the bench did not create
            raise SystemExit(f"refusing to drop {self.name!r}: not a bench database")
        self.admin.execute(
            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(self.name))
        )

    def close(self) -> None:
        self.admin.close()


def setup_django(url: str) -> None:
    """Configure Django with the demo project's settings, on the bench database."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    os.environ["DEBUG"] = "false"  # measure what production runs (no query log)
    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test Client's host


# -- filling ---------------------------------------------------------------------------

JOB_COLUMNS = """
    backend, queue, task_path, args, kwargs, priority, run_after, status, attempt,
    max_attempts, stall_count, max_stalls, snoozes, locked_by, locked_until, heartbeat_at,
    last_worker, cancel_requested, progress, progress_message, result, last_error,
    enqueued_at, started_at, last_attempted_at, finished_at
"""

# Finished jobs, in id order = time order (ids grow with time as in a real table):
# rows 1..old finished between 30 days and 1 hour ago, rows old+1..n in the last hour.
# Mostly succeeded; failed (attempts used up), dead (stalled) and cancelled (while pending).
FINISHED_SQL = f"""
WITH g AS (
    SELECT i, random() AS rq, random() AS rt, random() AS rs, random() AS rj, random() AS rw
    FROM generate_series(1, %(n)s) AS i
), t AS (
    SELECT
        i, rq, rt, rw,
        CASE WHEN rs < 0.93 THEN 'succeeded' WHEN rs < 0.97 THEN 'failed'
             WHEN rs < 0.98 THEN 'dead' ELSE 'cancelled' END AS status,
        CASE WHEN i > %(old)s
             THEN now() - interval '1 hour' * ((%(n)s - i + rj) / %(recent)s)
             ELSE now() - interval '1 hour' - interval '719 hours' * ((%(old)s - i + rj) / %(old)s)
        END AS finished,
        interval '1 millisecond' * (5 + rw * rw * 5000) AS run_for,
        interval '1 millisecond' * (rt * 3000) AS waited
    FROM g
)
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT
    'default',
    (%(queues)s::text[])[1 + floor(rq * %(nq)s)::int],
    (%(tasks)s::text[])[1 + floor(rt * %(nt)s)::int],
    jsonb_build_array(i),
    '{{}}'::jsonb,
    0,
    finished - run_for - waited,
    status,
    CASE status WHEN 'succeeded' THEN 1 + (rw < 0.05)::int WHEN 'cancelled' THEN 0 ELSE 3 END,
    3,
    CASE status WHEN 'dead' THEN 3 ELSE 0 END,
    3,
    0,
    NULL, NULL, NULL,
    CASE WHEN status = 'cancelled' THEN '' ELSE 'bench-worker-' || (i %% 4) END,
    status = 'cancelled',
    NULL, '',
    CASE WHEN status = 'succeeded' THEN jsonb_build_object('ok', true, 'n', i) END,
    CASE status
        WHEN 'failed' THEN 'ValueError: bench failure ' || i
        WHEN 'dead' THEN 'lease expired (stalled 3 times)'
        WHEN 'succeeded' THEN CASE WHEN rw < 0.05 THEN 'TimeoutError: first attempt' ELSE '' END
        ELSE ''
    END,
    finished - run_for - waited,
    CASE WHEN status = 'cancelled' THEN NULL ELSE finished - run_for END,
    CASE WHEN status = 'cancelled' THEN NULL ELSE finished - run_for END,
    finished
FROM t
ORDER BY i
"""

# Pending jobs: ready (due within the last 10 minutes) or scheduled (due within a day).
PENDING_SQL = f"""
WITH g AS (
    SELECT i, random() AS rq, random() AS rt, random() AS rp, random() AS rr
    FROM generate_series(1, %(n)s) AS i
), t AS (
    SELECT *,
        CASE WHEN %(scheduled)s THEN now() + interval '1 day' * rr
             ELSE now() - interval '10 minutes' * rr END AS due
    FROM g
)
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT
    'default',
    (%(queues)s::text[])[1 + floor(rq * %(nq)s)::int],
    (%(tasks)s::text[])[1 + floor(rt * %(nt)s)::int],
    jsonb_build_array(i),
    '{{}}'::jsonb,
    CASE WHEN rp < 0.1 THEN 10 WHEN rp < 0.2 THEN -10 ELSE 0 END,
    due,
    'pending',
    (rp > 0.97)::int,
    3, 0, 3, 0,
    NULL, NULL, NULL,
    CASE WHEN rp > 0.97 THEN 'bench-worker-0' ELSE '' END,
    false,
    NULL, '', NULL,
    CASE WHEN rp > 0.97 THEN 'ValueError: will retry' ELSE '' END,
    CASE WHEN %(scheduled)s THEN now() - interval '1 minute' * rr ELSE due END,
    NULL, NULL, NULL
FROM t
ORDER BY i
"""

# Running jobs, each leased by one of the live workers; every 17th lease has expired.
RUNNING_SQL = f"""
WITH g AS (
    SELECT i, random() AS rq, random() AS rt, random() AS rl, random() AS rs
    FROM generate_series(1, %(n)s) AS i
)
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT
    'default',
    (%(queues)s::text[])[1 + floor(rq * %(nq)s)::int],
    (%(tasks)s::text[])[1 + floor(rt * %(nt)s)::int],
    jsonb_build_array(i),
    '{{}}'::jsonb,
    0,
    now() - interval '2 minutes' * rs - interval '1 second',
    'running',
    1, 3, 0, 3, 0,
    'bench-worker-' || (i %% %(workers)s),
    CASE WHEN i %% 17 = 0 THEN now() - interval '5 seconds'
         ELSE now() + interval '10 seconds' + interval '20 seconds' * rl END,
    now() - interval '10 seconds' * rl,
    'bench-worker-' || (i %% %(workers)s),
    false,
    CASE WHEN i %% 3 = 0 THEN rl END,
    CASE WHEN i %% 3 = 0 THEN 'step ' || (i %% 10) || ' of 10' ELSE '' END,
    NULL, '',
    now() - interval '2 minutes' * rs - interval '1 second',
    now() - interval '2 minutes' * rs,
    now() - interval '2 minutes' * rs,
    NULL
FROM g
ORDER BY i
"""

# Live workers plus the stopped ones a month of deploys leaves in the registry.
WORKERS_SQL = """
INSERT INTO leasejobs_worker
    (id, backend, host, pid, queues, pool, concurrency, state, started_at, last_seen_at,
     stopped_at)
SELECT 'bench-worker-' || k, 'default', 'bench-host-' || k, 1000 + k,
       '["default", "high", "low", "emails", "reports"]'::jsonb, 'process', %(concurrency)s,
       'running', now() - interval '1 day', now() - interval '2 seconds' * random(), NULL
FROM generate_series(0, %(workers)s - 1) AS k
UNION ALL
SELECT 'bench-old-worker-' || k, 'default', 'bench-host-' || (k %% 4), 20000 + k, '[]'::jsonb,
       'process', 4, 'stopped', now() - interval '30 days' + interval '7 hours' * k,
       now() - interval '30 days' + interval '7 hours' * k + interval '6 hours',
       now() - interval '30 days' + interval '7 hours' * k + interval '6 hours'
FROM generate_series(0, 99) AS k
"""


def fill(args: argparse.Namespace) -> dict[str, float]:
    """Fill the tables with generate_series; returns seconds per step."""
    from django.db import connection

    took: dict[str, float] = {}

    def step(name: str, sql: str, params: dict[str, Any] | None = None) -> None:
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        took[name] = time.perf_counter() - started

    common = {"queues": QUEUES, "nq": len(QUEUES), "tasks": TASKS, "nt": len(TASKS)}
    recent = round(args.finished * args.last_hour_share)
    old = args.finished - recent
    step("seed", "SELECT setseed(0.42)")  # the same rows on every run (one session)
    if args.finished:
        step(
            "insert finished",
            FINISHED_SQL,
            {**common, "n": args.finished, "old": max(old, 1), "recent": max(recent, 1)},
        )
    if args.ready:
        step("insert ready", PENDING_SQL, {**common, "n": args.ready, "scheduled": False})
    if args.scheduled:
        step("insert scheduled", PENDING_SQL, {**common, "n": args.scheduled, "scheduled": True})
    if args.running:
        step("insert running", RUNNING_SQL, {**common, "n": args.running, "workers": args.workers})
    concurrency = max(math.ceil(args.running / max(args.workers, 1)) + 2, 1)
    step("insert workers", WORKERS_SQL, {"workers": args.workers, "concurrency": concurrency})
    step("vacuum analyze", "VACUUM ANALYZE")
    return took


def migrate() -> int:
    """Apply the project's migrations; returns how many were applied."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    call_command("migrate", interactive=False, verbosity=0)
    return len(plan)


def superuser() -> Any:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    if user is None:
        user = user_model.objects.create_superuser("bench", "bench@example.invalid", None)
    return user


# -- measuring -------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    run: Callable[[], Any]
    target_ms: float | None = None
    """Its own p95 target, instead of ``--target-ms``."""
    times_ms: list[float] = field(default_factory=list)
    queries: list[tuple[float, str, Any]] = field(default_factory=list)
    """(median ms, SQL, params) of each query of one run, in order (from an instrumented pass)."""

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p95(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]

    @property
    def max(self) -> float:
        return max(self.times_ms)

    @property
    def sql_ms(self) -> float:
        return sum(query[0] for query in self.queries)

    def slowest(self) -> tuple[float, str, Any]:
        return max(self.queries, key=lambda query: query[0], default=(0.0, "", None))


def page(client: Any, url: str) -> Callable[[], Any]:
    def get() -> Any:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
        return response

    return get


def metrics_view() -> Callable[[], Any]:
    """The Prometheus view (``django_leasejobs.metrics``), called as a superuser: the
    view alone, without URL routing and middleware (the demo project does not mount it)."""
    from django.test import RequestFactory

    from django_leasejobs.metrics import leasejobs_metrics

    request = RequestFactory().get("/metrics/")
    request.user = superuser()

    def get() -> Any:
        response = leasejobs_metrics(request)
        if response.status_code != 200:
            raise RuntimeError(f"the metrics view answered {response.status_code}")
        return response

    return get


def scenarios() -> list[Scenario]:
    from django.test import Client
    from django.urls import reverse

    from django_leasejobs import stats

    client = Client()
    client.force_login(superuser())
    dashboard = reverse("admin:django_leasejobs_queuedashboard_changelist")
    changelist = reverse("admin:django_leasejobs_job_changelist")
    return [
        Scenario("dashboard (full page)", page(client, dashboard)),
        Scenario("dashboard (?fragment=1)", page(client, dashboard + "?fragment=1")),
        Scenario("stats.collect()", lambda: stats.collect(online_after=60.0)),
        Scenario("job list, first page", page(client, changelist)),
        Scenario("job list, status=dead", page(client, changelist + "?status__exact=dead")),
        Scenario(
            "job list, status=succeeded", page(client, changelist + "?status__exact=succeeded")
        ),
        Scenario("metrics view", metrics_view(), target_ms=METRICS_TARGET_MS),
    ]


class QueryTimer:
    """``connection.execute_wrapper`` that records (ms, sql, params) of every query."""

    def __init__(self) -> None:
        self.queries: list[tuple[float, str, Any]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.queries.append(((time.perf_counter() - started) * 1000, sql, params))


def measure(scenario: Scenario, repeat: int, warmup: int) -> None:
    from django.db import connection

    for _ in range(warmup):
        scenario.run()
    for _ in range(repeat):
        started = time.perf_counter()
        scenario.run()
        scenario.times_ms.append((time.perf_counter() - started) * 1000)
    # Instrumented runs, kept out of the timings: which queries ran, and how long each took.
    runs = []
    for _ in range(min(repeat, 5)):
        timer = QueryTimer()
        with connection.execute_wrapper(timer):
            scenario.run()
        runs.append(timer.queries)
    if all(len(run) == len(runs[0]) for run in runs):
        scenario.queries = [
            (statistics.median(run[i][0] for run in runs), *runs[-1][i][1:])
            for i in range(len(runs[0]))
        ]
    else:
        scenario.queries = runs[-1]


def explain(sql: str, params: Any) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def as_text(sql: str, params: Any) -> str:
    """The query with its parameters inlined (for reading; psycopg quotes them)."""
    from django.db import connection

    return connection.ops.compose_sql(sql, params) if params else sql


def explain_slow(chosen: list[Scenario], slow_ms: float) -> None:
    """EXPLAIN the slowest query of each scenario and any other taking ``slow_ms`` or more."""
    seen: set[str] = set()
    for s in chosen:
        slowest = s.slowest()
        for took, sql, params in s.queries:
            if not sql or sql in seen or (took < slow_ms and (took, sql, params) != slowest):
                continue
            seen.add(sql)
            print(f"\nEXPLAIN (ANALYZE, BUFFERS), a query of {s.name} ({took:.1f} ms):")
            print(as_text(sql, params))
            print(explain(sql, params))


# -- reporting -------------------------------------------------------------------------


def facts() -> dict[str, str]:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (version,) = cursor.fetchone()
        settings = {}
        for name in ("shared_buffers", "work_mem", "jit", "max_parallel_workers_per_gather"):
            cursor.execute(f"SHOW {name}")
            settings[name] = cursor.fetchone()[0]
        cursor.execute(
            "SELECT pg_size_pretty(pg_table_size('leasejobs_job')), "
            "pg_size_pretty(pg_indexes_size('leasejobs_job'))"
        )
        table, indexes = cursor.fetchone()
    return {
        "machine": f"{platform.machine()}, nproc {os.cpu_count()}, {platform.system()}",
        "postgresql": f"{version} ({', '.join(f'{k}={v}' for k, v in settings.items())})",
        "python / django": f"{platform.python_version()} / {django.get_version()}",
        "load average": " ".join(f"{load:.2f}" for load in os.getloadavg()),
        "database": f"{connection.settings_dict['NAME']} (job table {table}, indexes {indexes})",
    }


def counts() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, count(*), count(*) FILTER (WHERE finished_at >= now() - "
            "interval '1 hour') FROM leasejobs_job GROUP BY status ORDER BY status"
        )
        rows = cursor.fetchall()
    parts = [
        f"{status} {n:,}" + (f" ({recent:,} last hour)" if recent else "")
        for status, n, recent in rows
    ]
    return ", ".join(parts)


def one_line(sql: str, width: int = 110) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def ms(value: float) -> str:
    return f"{value:>7.1f} ms"


def report(results: list[Scenario], target: float, show_queries: bool) -> list[Scenario]:
    """Print the table; returns the scenarios that missed the target (p95 >= target)."""
    columns = ("median", "p95", "max")
    header = (
        f"{'scenario':<28}"
        + "".join(f"{name:>11}" for name in columns)
        + f"{'queries':>8}{'sql (med)':>11}  target {target:.0f} ms"
    )
    print(header)
    print("-" * len(header))
    missed = []
    for s in results:
        own = s.target_ms or target
        ok = s.p95 < own
        if not ok:
            missed.append(s)
        values = (s.median, s.p95, s.max)
        print(
            f"{s.name:<28}"
            + "".join(f"{ms(v):>11}" for v in values)
            + f"{len(s.queries):>8}{ms(s.sql_ms):>11}  "
            + (f"(its target {own:.0f} ms) " if s.target_ms else "")
            + ("ok" if ok else "MISSED")
        )
    print()
    if show_queries:
        for s in results:
            print(f"queries of {s.name} (median of the instrumented runs):")
            for took, sql, params in s.queries:
                print(f"  {ms(took)}  {one_line(as_text(sql, params), 150)}")
        return missed
    print("slowest query of each scenario (median of the instrumented runs):")
    for s in results:
        took, sql, params = s.slowest()
        print(f"  {s.name:<28}{ms(took)}  {one_line(as_text(sql, params))}")
    return missed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (REPO_ROOT / "testproject", REPO_ROOT, REPO_ROOT / "bench"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))

    sizes = {
        "finished": args.finished,
        "ready": args.ready,
        "scheduled": args.scheduled,
        "running": args.running,
        "workers": args.workers,
        "last_hour_share": args.last_hour_share,
        "version": 1,
    }
    database = BenchDatabase(server_url(), args.db_name)
    try:
        must_fill = database.prepare(sizes, reuse=args.reuse)
        setup_django(database.url)
        applied = migrate()  # on a reused database too: the code may have new migrations
        if must_fill:
            print(f"filling {args.db_name} ...", flush=True)
            took = fill(args)
            database.mark_filled(sizes)
            print("  " + ", ".join(f"{name} {sec:.1f}s" for name, sec in took.items()))
        else:
            print(f"reusing {args.db_name}, filled with the same sizes at {database.filled_at}")
            if applied:
                print(f"  applied {applied} new migration(s) to it; analyzing")
                from django.db import connection

                with connection.cursor() as cursor:
                    cursor.execute("VACUUM ANALYZE")
        print()
        for name, value in facts().items():
            print(f"{name + ':':<17}{value}")
        print(f"{'rows:':<17}{counts()}")
        print(
            f"{'repeats:':<17}{args.repeat} timed after {args.warmup} warm-up runs, "
            "per scenario; the verdict is on p95"
        )
        print(flush=True)

        results = scenarios()
        for scenario in results:
            measure(scenario, args.repeat, args.warmup)
        missed = report(results, args.target_ms, args.show_queries)

        if args.explain:
            explain_slow(
                results if args.explain == "always" else missed, args.target_ms * SLOW_SHARE
            )
        print()
        if missed:
            names = ", ".join(s.name for s in missed)
            print(f"TARGET MISSED by: {names} (p95 >= its target)")
        else:
            print("all scenarios within their targets (p95 below)")
        if args.drop_after:
            from django.db import connections

            connections.close_all()
            database.drop()
            print(f"dropped {args.db_name}")
        return 1 if missed and args.fail_on_miss else 0
    finally:
        database.close()


if __name__ == "__main__":
    sys.exit(main())
