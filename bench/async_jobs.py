"""Async jobs: how fast one worker drains ``async def`` jobs that each wait half a second.

Run from the repository root::

    .venv-bench/bin/python bench/async_jobs.py    # 10,000 async jobs, 40 sync, procrastinate
    python bench/async_jobs.py --smoke            # 300 async jobs, 6 sync (CI; under a minute)
    python bench/async_jobs.py --only async --async-concurrency 250 --jobs 5000

What it does (issue 30, point 5):

1. **Server.** Without ``DATABASE_URL`` (or with ``--private-server``): a PostgreSQL of
   its own (``bench/pgserver.py``, ``production=True``: PostgreSQL's defaults, so
   ``fsync``, ``synchronous_commit``, ``full_page_writes`` and autovacuum on;
   ``pg_stat_statements`` loaded when Debian's binaries have it), deleted at exit. With
   ``DATABASE_URL``: that server (its database is only the admin connection; the bench
   prints its settings). Either way the bench creates its own databases, ``--db-name``
   (default ``async_jobs_bench``) for this project and ``<db-name>_procrastinate`` for
   procrastinate, each marked with a comment; it refuses to drop a database without
   that mark, and drops its own at exit unless ``--keep``. Django runs in this process
   on the first (the test project's settings through ``bench/shim.py``, ``DEBUG`` off,
   the tasks of ``bench/asyncsite/tasks.py``), migrated first.
2. **The jobs.** ``--jobs`` (10,000) jobs of ``nap_async(n, --sleep)``, an ``async def``
   task that does ``await asyncio.sleep(0.5)``, enqueued with ``bulk_enqueue`` (one
   ``COPY``) on an emptied table, then ``VACUUM ANALYZE``; each appends a line to a run
   file when it starts and when it ends (``bench/asyncsite/runs.py``: one ``os.write``
   each, ``O_APPEND``).
3. **Our worker.** ONE ``runworker --pool process --concurrency 2 --async-concurrency
   500 --no-scheduler`` (``--concurrency``, ``--async-concurrency``): two slots, each
   running up to 500 of the jobs at once on its event loop, so up to 1,000 in flight,
   enough for 1,000 jobs/s of half-second jobs. Spawned after the enqueue, not
   ``--burst``; stopped (SIGTERM) once every job has finished.
4. **The same work as sync jobs.** ``--sync-jobs`` (40) jobs of ``nap_sync``, which does
   ``time.sleep(0.5)``, with the same worker command: each slot runs one at a time, so
   2 slots give at most 4 jobs/s. Then ``--jobs`` of them with ``--sync-on-loop`` added
   (part ``sync-on-loop``, issue 32 point 4): each runs in a thread of its slot's event
   loop, as many at once as the async jobs.
5. **procrastinate** (when it is installed: the ``bench`` dependency group,
   ``.venv-bench``), on the same server in its own database: its schema applied, the
   same ``--jobs`` jobs of the same ``async def`` nap deferred with
   ``batch_defer_async``, then ONE ``procrastinate worker --concurrency 1000``
   (``--procrastinate-concurrency``, default ``--concurrency`` x
   ``--async-concurrency``: the in-flight count ours gets), with its other defaults
   (a psycopg pool of psycopg_pool's default size, ``LISTEN``/``NOTIFY``) and its log
   level at WARNING, as ours (the settings shim); stopped (SIGTERM) once no job is
   ``todo`` or ``doing``.
6. **Figures** per drain: the rate **from spawn**, jobs / (last job done - the worker's
   spawn: start-up and tail included); the **steady** rate, over the middle 80 % of the
   jobs: (jobs done between the 10th and the 90th percentile of the done times) / (the
   time between them); start-up (spawn -> first job started, run file); the most jobs
   in flight at once (run file: from each start to its end); the worker's CPU seconds
   (main process and slot processes apart) and the server's (private server only), read
   the moment the last job is done; with ``pg_stat_statements``, the statements that
   took the server's time, with calls and rows (rows per call = jobs per claim or per
   outcome write). "Done" is the database's record of it: this project's
   ``finished_at``, procrastinate's ``succeeded`` event (both the database's clock, on
   this machine, as the spawn's ``time.time()``).
7. **Checks** (any failure exits 1): every job ran exactly once (the run file: each index
   started once and ended once, none unknown), every job ``succeeded`` at attempt 1 (ours:
   no attempt row; procrastinate: ``attempts = 1``, one ``started`` event), the drain
   finished within ``--timeout``, the worker neither exited during it nor logged an error.
   Speed never fails the run: the goal (>= 1,000 async jobs/s from spawn) is printed as
   met or missed (``--fail-on-miss``: exit 3).

Output: a line per drain, the table and the verdict; ``--output`` (default
``artifacts/bench/async_jobs.json``) holds it all with the machine, the server and the
commit; ``--markdown`` writes the table. The work directory (settings shim, run files,
worker logs) is deleted unless a check failed or ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
MARK = "leasejobs-bench async_jobs.py"
SHIM = "async_jobs_bench"
SETTINGS_MODULE = f"{SHIM}_settings"
TASK_MODULE = "asyncsite.tasks"
PEER_APP = "asyncsite.peer.app"
GOAL_RATE = 1000.0
"""Async jobs per second from one worker, from its spawn to the last job done."""
PARTS = ("async", "sync", "sync-on-loop", "procrastinate")
LABELS = {
    "async": "django-leasejobs, async def",
    "sync": "django-leasejobs, sync",
    "sync-on-loop": "django-leasejobs, sync, --sync-on-loop",
    "procrastinate": "procrastinate, async def",
}
STEADY_TRIM = 0.1
"""The steady rate leaves out this share of the jobs at each end (start-up and tail)."""
SMOKE = {"jobs": 300, "sync_jobs": 6}
TABLES = "leasejobs_attempt, leasejobs_job, leasejobs_worker"


# -- pure parts: options, rates, verdicts, tables ----------------------------------------


def parse_parts(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"parts are {', '.join(PARTS)}; got {text!r}")
    return [p for p in PARTS if p in parts]


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=None, help="async jobs (10,000; smoke 300)")
    parser.add_argument("--sync-jobs", type=int, default=None, help="sync jobs (40; smoke 6)")
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds each job waits (0.5)")
    parser.add_argument("--concurrency", type=int, default=2, help="slots of the worker (2)")
    parser.add_argument(
        "--async-concurrency", type=int, default=500, help="async jobs per slot at once (500)"
    )
    parser.add_argument(
        "--procrastinate-concurrency",
        type=int,
        default=None,
        help="procrastinate's worker concurrency (default: concurrency x async-concurrency)",
    )
    parser.add_argument(
        "--only",
        type=parse_parts,
        default=list(PARTS),
        help="async,sync,sync-on-loop,procrastinate",
    )
    parser.add_argument("--worker-args", default="", help="more runworker arguments")
    parser.add_argument("--smoke", action="store_true", help="300 async and 6 sync jobs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain")
    add_server_options(parser)
    parser.add_argument("--db-name", default="async_jobs_bench")
    parser.add_argument("--keep", action="store_true", help="keep databases, server, work dir")
    parser.add_argument(
        "--output",
        "--json",
        dest="output",
        type=Path,
        default=REPO_ROOT / "artifacts/bench/async_jobs.json",
        help="JSON report",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 3 on a missed goal")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    full = {"jobs": 10000, "sync_jobs": 40}
    for name, value in (SMOKE if args.smoke else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.procrastinate_concurrency is None:
        args.procrastinate_concurrency = args.concurrency * args.async_concurrency
    for name in ("jobs", "sync_jobs", "concurrency", "async_concurrency"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.procrastinate_concurrency < 1:
        raise SystemExit("--procrastinate-concurrency must be at least 1")
    if args.sleep < 0:
        raise SystemExit("--sleep must not be negative")
    return args


def rate_from_spawn(jobs: int, spawned: float, last_done: float | None) -> float | None:
    """Jobs per second from the worker's spawn to the last job done."""
    if last_done is None or last_done <= spawned:
        return None
    return jobs / (last_done - spawned)


def steady_rate(done_times: Sequence[float], trim: float = STEADY_TRIM) -> float | None:
    """Jobs per second over the middle of a drain: the jobs done between the ``trim`` and
    the ``1 - trim`` quantiles of the done times, over the time between them."""
    times = sorted(done_times)
    first, last = int(len(times) * trim), len(times) - 1 - int(len(times) * trim)
    if last <= first or times[last] <= times[first]:
        return None
    return (last - first) / (times[last] - times[first])


def peak_in_flight(starts: Sequence[float], ends: Sequence[float]) -> int:
    """The most jobs running at once, from every start and end time (an end at the same
    time as a start counts first)."""
    events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends], key=lambda e: e)
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def verdict(drains: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The goal: at least GOAL_RATE async jobs/s from one worker, from its spawn, with
    every job run once."""
    goal = f"async def jobs from one worker >= {GOAL_RATE:,.0f}/s from spawn"
    run = drains.get("async")
    if run is None or run.get("rate_from_spawn") is None:
        return {"goal": goal, "value": None, "verdict": "not measured"}
    met = run["rate_from_spawn"] >= GOAL_RATE and not run["problems"]
    value = (
        f"{run['rate_from_spawn']:,.0f}/s from spawn, {_fmt(run['steady_rate'])}/s steady, "
        f"{run['jobs']:,} jobs, {run['in_flight_limit']:,} in flight at most"
    )
    return {"goal": goal, "value": value, "verdict": "met" if met else "missed"}


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_table(drains: dict[str, dict[str, Any]]) -> str:
    out = [
        "| system, jobs | jobs | in flight at most (peak seen) | jobs/s from spawn | "
        "jobs/s steady | start-up (s) | worker CPU (s): main + slots | server CPU (s) | "
        "every job once |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for part in PARTS:
        d = drains.get(part)
        if d is None:
            continue
        if d.get("skipped"):
            out.append(f"| {LABELS[part]} | - | - | - | - | - | - | - | not run: {d['skipped']} |")
            continue
        cpu = (
            f"{_fmt(d['cpu_main'], 1)} + {_fmt(d['cpu_slots'], 1)}"
            if d.get("cpu_slots") is not None
            else _fmt(d.get("cpu_main"), 1)
        )
        out.append(
            f"| {LABELS[part]} | {d['jobs']:,} | {d['in_flight_limit']:,} ({d['peak_in_flight']:,})"
            f" | {_fmt(d['rate_from_spawn'], 1)} | {_fmt(d['steady_rate'], 1)} | "
            f"{_fmt(d['startup_s'], 2)} | {cpu} | {_fmt(d.get('cpu_server'), 1)} | "
            f"{'yes' if not d['problems'] else 'NO'} |"
        )
    return "\n".join(out) + "\n"


# -- the measurement ----------------------------------------------------------------------


def process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process (and its reaped children) and of its live children."""
    import psutil

    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        own = times.user + times.system + times.children_user + times.children_system
        kids = 0.0
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                kids += child_times.user + child_times.system
        return own, kids
    except psutil.Error:
        return 0.0, 0.0


class Drainer:
    """Spawns one worker command, waits until a query says every job is done, stops it."""

    def __init__(self, workdir: Path, env: dict[str, str], timeout: float) -> None:
        self.workdir = workdir
        self.env = env
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.server_pid: int | None = None

    def server_cpu(self) -> float | None:
        if self.server_pid is None:
            return None
        own, kids = process_cpu(self.server_pid)
        return own + kids

    def run(self, name: str, argv: list[str], left: Any, env: dict[str, str]) -> dict[str, Any]:
        """Spawn ``argv``; poll ``left()`` (jobs not done) until 0; return the spawn time,
        the CPU figures at that moment and the problems seen."""
        from pgserver import stop_workers

        log_path = self.workdir / f"{name}.log"
        problems: list[str] = []
        server_before = self.server_cpu()
        with log_path.open("wb") as log:
            spawned = time.time()
            self.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=str(REPO_ROOT),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + self.timeout
            cpu_main = cpu_slots = None
            try:
                while True:
                    remaining = left()
                    if not remaining:
                        cpu_main, cpu_slots = process_cpu(self.proc.pid)
                        break
                    if time.monotonic() > deadline:
                        problems.append(f"{name}: {remaining} jobs left after {self.timeout:g}s")
                        break
                    if self.proc.poll() is not None:
                        problems.append(f"{name}: the worker exited during the drain")
                        break
                    time.sleep(0.05)
            finally:
                server_after = self.server_cpu()
                stop_workers([self.proc])
                self.proc = None
        text = log_path.read_text(errors="replace")
        if "Traceback" in text or " ERROR " in text or "ERROR:" in text:
            problems.append(f"{name}: an error in the worker's log ({log_path})")
        return {
            "spawned": spawned,
            "cpu_main": cpu_main,
            "cpu_slots": cpu_slots,
            "cpu_server": (
                server_after - server_before
                if server_after is not None and server_before is not None
                else None
            ),
            "problems": problems,
            "log": str(log_path),
        }

    def stop(self) -> None:
        from pgserver import stop_workers

        if self.proc is not None:
            stop_workers([self.proc])
            self.proc = None


def figures(
    part: str,
    jobs: int,
    in_flight_limit: int,
    drained: dict[str, Any],
    done_times: list[float],
    runs: Any,
) -> dict[str, Any]:
    """One drain's figures from its done times (database) and its run file."""
    spawned = drained["spawned"]
    last = max(done_times) if done_times else None
    first_start = min(runs.start_times) if runs.start_times else None
    return {
        "part": part,
        "jobs": jobs,
        "in_flight_limit": in_flight_limit,
        "rate_from_spawn": rate_from_spawn(jobs, spawned, last),
        "steady_rate": steady_rate(done_times),
        "startup_s": None if first_start is None else first_start - spawned,
        "drain_s": None if last is None else last - spawned,
        "peak_in_flight": peak_in_flight(runs.start_times, runs.end_times),
        "cpu_main": drained["cpu_main"],
        "cpu_slots": drained["cpu_slots"],
        "cpu_server": drained["cpu_server"],
        "load_before": drained.get("load_before"),
        "problems": drained["problems"] + runs.problems(jobs),
        "log": drained["log"],
    }


class Bench:
    """The measurement, with Django set up in this process on this project's database."""

    def __init__(self, args: argparse.Namespace, url: str, peer_conninfo: str | None) -> None:
        self.args = args
        self.url = url
        self.peer_conninfo = peer_conninfo
        self.workdir = Path(tempfile.mkdtemp(prefix="leasejobs-async-jobs-"))
        import shim  # (bench/, beside this script)

        settings = shim.SETTINGS.replace("[TASK_MODULE]", repr([TASK_MODULE]))
        (self.workdir / f"{SETTINGS_MODULE}.py").write_text(settings)
        paths = [str(self.workdir), str(REPO_ROOT / "testproject"), str(REPO_ROOT), str(BENCH_DIR)]
        self.env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "DEBUG": "false",
            "PYTHONPATH": os.pathsep.join(paths),
        }
        self.drainer = Drainer(self.workdir, self.env, args.timeout)
        self.statements = False
        os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE, DEBUG="false")
        for path in reversed(paths):
            sys.path.insert(0, path)

    def prepare(self) -> None:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from django_leasejobs.compat import task_backends

        self.backend = task_backends["default"]
        try:
            self.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.execute("SELECT pg_stat_statements_reset()")
            self.statements = True
        except Exception:  # not loaded on this server: no statement figures
            from django.db import connection

            connection.close()
            self.statements = False

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []

    def run_file(self, part: str) -> Path:
        path = self.workdir / f"runs-{part}.txt"
        path.unlink(missing_ok=True)
        return path

    # -- this project ----------------------------------------------------------------

    def leasejobs(self, part: str) -> dict[str, Any]:
        """Enqueue the ``part`` jobs (async or sync) and drain them with one worker."""
        import importlib

        from asyncsite import runs

        args = self.args
        tasks = importlib.import_module(TASK_MODULE)
        on_loop = part != "sync"  # (async def jobs, or sync ones with --sync-on-loop)
        task, jobs = {
            "async": (tasks.nap_async, args.jobs),
            "sync": (tasks.nap_sync, args.sync_jobs),
            "sync-on-loop": (tasks.nap_sync, args.jobs),
        }[part]
        self.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
        self.backend.bulk_enqueue([(task, (n, args.sleep), {}) for n in range(jobs)])
        self.execute("VACUUM ANALYZE leasejobs_job")
        if self.statements:
            time.sleep(0.6)  # (statistics of the enqueue reach the server)
            self.execute("SELECT pg_stat_statements_reset()")
        run_path = self.run_file(part)
        argv = [
            *(sys.executable, str(REPO_ROOT / "testproject" / "manage.py")),
            *("runworker", "--no-scheduler", "--pool", "process"),
            *("--concurrency", str(args.concurrency)),
            *("--async-concurrency", str(args.async_concurrency)),
            *("--worker-id", f"ajb-{part}"),
            *(("--sync-on-loop",) if part == "sync-on-loop" else ()),
            *args.worker_args.split(),
        ]

        def left() -> int:
            [(count,)] = self.execute(
                "SELECT count(*) FROM leasejobs_job WHERE status IN ('pending', 'running')"
            )
            return int(count)

        load = os.getloadavg()[0]
        drained = self.drainer.run(
            f"leasejobs-{part}", argv, left, {**self.env, runs.RUNS_ENV: str(run_path)}
        )
        drained["load_before"] = load
        statements = self.statement_figures() if self.statements else None
        [(total, good, attempts)] = self.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded' AND attempt = 1), "
            "(SELECT count(*) FROM leasejobs_attempt) FROM leasejobs_job"
        )
        if total != jobs or good != total or attempts:
            drained["problems"].append(
                f"{part}: {total} jobs for {jobs} enqueued, {good} succeeded at attempt 1, "
                f"{attempts} attempt rows"
            )
        done = [
            float(t)
            for (t,) in self.execute(
                "SELECT EXTRACT(EPOCH FROM finished_at) FROM leasejobs_job "
                "WHERE status = 'succeeded'"
            )
        ]
        in_flight = args.concurrency * (args.async_concurrency if on_loop else 1)
        result = figures(part, jobs, in_flight, drained, done, runs.read(run_path))
        result["statements"] = statements
        return result

    def statement_figures(self) -> list[dict[str, Any]]:
        """The statements that took the server's time during a drain (pg_stat_statements)."""
        time.sleep(0.6)  # (the worker's last statistics reach the server)
        rows = self.execute(
            "SELECT query, calls, rows, total_exec_time FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT LIKE '%%pg_stat_%%' AND query NOT LIKE '%%count(*)%%' "
            "ORDER BY total_exec_time DESC LIMIT 8"
        )
        return [
            {
                "query": " ".join(str(q).split())[:110],
                "calls": int(calls),
                "rows": int(count),
                "ms": float(total),
                "rows_per_call": int(count) / int(calls) if calls else None,
            }
            for q, calls, count, total in rows
        ]

    # -- procrastinate ---------------------------------------------------------------

    def procrastinate(self) -> dict[str, Any]:
        """The same async jobs, deferred to procrastinate and drained by its worker."""
        import psycopg
        from asyncsite import runs

        args = self.args
        assert self.peer_conninfo is not None
        env = {
            **self.env,
            "ASYNC_BENCH_PROCRASTINATE_DSN": self.peer_conninfo,
        }
        os.environ["ASYNC_BENCH_PROCRASTINATE_DSN"] = self.peer_conninfo
        asyncio.run(self._defer(args.jobs))
        run_path = self.run_file("procrastinate")
        argv = [
            *(sys.executable, "-m", "procrastinate", "--app", PEER_APP, "--log-level", "warning"),
            *("worker", "--concurrency", str(args.procrastinate_concurrency)),
        ]
        with psycopg.connect(self.peer_conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

            def left() -> int:
                row = conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
                ).fetchone()
                return int(row[0]) if row else 0

            load = os.getloadavg()[0]
            drained = self.drainer.run(
                "procrastinate", argv, left, {**env, runs.RUNS_ENV: str(run_path)}
            )
            drained["load_before"] = load
            drained["cpu_slots"] = None  # one process
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1), "
                "(SELECT count(*) FROM (SELECT job_id FROM procrastinate_events "
                "WHERE type = 'started' GROUP BY job_id HAVING count(*) <> 1) AS odd) "
                "FROM procrastinate_jobs"
            ).fetchone()
            total, good, odd = row if row else (0, 0, 0)
            if total != args.jobs or good != total or odd:
                drained["problems"].append(
                    f"procrastinate: {total} jobs for {args.jobs} deferred, {good} succeeded "
                    f"at attempt 1, {odd} jobs without exactly one 'started' event"
                )
            done = [
                float(t)
                for (t,) in conn.execute(
                    "SELECT EXTRACT(EPOCH FROM at) FROM procrastinate_events "
                    "WHERE type = 'succeeded'"
                ).fetchall()
            ]
        result = figures(
            "procrastinate",
            args.jobs,
            args.procrastinate_concurrency,
            drained,
            done,
            runs.read(run_path),
        )
        result["statements"] = None
        return result

    async def _defer(self, jobs: int) -> None:
        """Apply procrastinate's schema and defer ``jobs`` naps, 1,000 per batch."""
        from asyncsite import peer

        async with peer.app.open_async():
            await peer.app.schema_manager.apply_schema_async()
            for start in range(0, jobs, 1000):
                batch = [
                    {"n": n, "seconds": self.args.sleep}
                    for n in range(start, min(start + 1000, jobs))
                ]
                await peer.nap_async.batch_defer_async(*batch)

    def stop(self) -> None:
        self.drainer.stop()


def procrastinate_missing() -> str | None:
    """Why procrastinate cannot run here, or None."""
    if importlib.util.find_spec("procrastinate") is None:
        return "procrastinate is not installed here (the bench dependency group: .venv-bench)"
    return None


def measure(bench: Bench) -> dict[str, dict[str, Any]]:
    args = bench.args
    drains: dict[str, dict[str, Any]] = {}
    for part in args.only:
        if part == "procrastinate":
            missing = procrastinate_missing()
            if missing:
                drains[part] = {"part": part, "skipped": missing, "problems": []}
                print(f"{LABELS[part]}: not run: {missing}", flush=True)
                continue
            run = bench.procrastinate()
        else:
            run = bench.leasejobs(part)
        drains[part] = run
        print(
            f"{LABELS[part]}: {run['jobs']:,} jobs, at most {run['in_flight_limit']:,} in flight "
            f"(peak seen {run['peak_in_flight']:,}): {_fmt(run['rate_from_spawn'], 1)} jobs/s "
            f"from spawn, {_fmt(run['steady_rate'], 1)} steady, start-up "
            f"{_fmt(run['startup_s'], 2)} s, drain {_fmt(run['drain_s'], 2)} s; "
            + ("ok" if not run["problems"] else "PROBLEMS: " + "; ".join(run["problems"])),
            flush=True,
        )
    return drains


def machine() -> dict[str, Any]:
    import platform
    from importlib import metadata

    import django

    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    versions = {}
    for name in ("psycopg", "procrastinate"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "python": platform.python_version(),
        "django": django.get_version(),
        **versions,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _statements_library() -> bool:
    """Whether the binaries bench/pgserver.py will pick have pg_stat_statements."""
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return bool(found) and (Path(found[-1]).parent.parent / "lib/pg_stat_statements.so").exists()


@contextlib.contextmanager
def server_for(
    args: argparse.Namespace,
) -> Iterator[tuple[str, dict[str, Any], str, int | None]]:
    """The admin URL, its Django config, a label and the postmaster's pid (a private
    server's): DATABASE_URL's server, or a private one."""
    from pgserver import PrivateServer, django_url_config

    url = os.environ.get("DATABASE_URL")
    if url and not args.private_server:
        config = django_url_config(url)
        if "postgres" not in config["ENGINE"]:
            raise SystemExit(f"bench/async_jobs.py needs PostgreSQL, DATABASE_URL is {url!r}")
        yield url, config, "DATABASE_URL's server", None
        return
    settings = (
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "1000"}
        if _statements_library()
        else {}
    )
    server = PrivateServer(
        100, production=True, settings=settings, prefix="leasejobs-async-jobs-pg-"
    )
    try:
        pid = int((server.pgdata / "postmaster.pid").read_text().split()[0])
        yield server.url, django_url_config(server.url), "private (production settings)", pid
    finally:
        if args.keep:
            print(f"kept: server at {server.url} (data {server.base})")
        else:
            server.stop()


def conninfo_of(config: dict[str, Any], database: str) -> str:
    from psycopg.conninfo import make_conninfo

    parts = {
        "dbname": database,
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
        "host": config.get("HOST") or None,
        "port": config.get("PORT") or None,
    }
    return make_conninfo(**{k: str(v) for k, v in parts.items() if v is not None})


def report_statements(drains: dict[str, dict[str, Any]]) -> None:
    for part, run in drains.items():
        statements = run.get("statements")
        if not statements:
            continue
        print(f"server time by statement, {LABELS[part]} drain (pg_stat_statements):")
        for s in statements[:6]:
            print(
                f"  {s['ms']:9,.0f} ms {s['calls']:7,} calls {_fmt(s['rows_per_call'], 1):>7} "
                f"rows/call  {s['query'][:88]}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(BENCH_DIR))
    from pgserver import connect_admin, create_database, drop_database, with_database

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    peer_db = f"{args.db_name}_procrastinate"
    peer_wanted = "procrastinate" in args.only and procrastinate_missing() is None
    bench: Bench | None = None
    with server_for(args) as (admin_url, config, server_label, server_pid):
        with connect_admin(config) as admin:
            server = {
                name: admin.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in (
                    "server_version",
                    "fsync",
                    "synchronous_commit",
                    "full_page_writes",
                    "autovacuum",
                )
            }
            server["kind"] = server_label
            create_database(admin, args.db_name, MARK)
            if peer_wanted:
                create_database(admin, peer_db, MARK)
        print(
            f"PostgreSQL {server['server_version']}, {server_label}: fsync {server['fsync']}, "
            f"synchronous_commit {server['synchronous_commit']}, autovacuum "
            f"{server['autovacuum']}; {args.jobs:,} async and {args.sync_jobs:,} sync jobs of "
            f"{args.sleep:g} s; runworker --pool process --concurrency {args.concurrency} "
            f"--async-concurrency {args.async_concurrency}; procrastinate --concurrency "
            f"{args.procrastinate_concurrency}; load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        try:
            bench = Bench(
                args,
                with_database(admin_url, args.db_name),
                conninfo_of(config, peer_db) if peer_wanted else None,
            )
            bench.drainer.server_pid = server_pid
            bench.prepare()
            drains = measure(bench)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            if bench is not None:
                bench.stop()
                from django.db import connections

                connections.close_all()
            if not args.keep:
                with contextlib.suppress(Exception), connect_admin(config) as admin:
                    for name in (args.db_name, *([peer_db] if peer_wanted else [])):
                        drop_database(admin, name, MARK)
                        print(f"dropped {name}")
    line = verdict(drains)
    problems = [p for run in drains.values() for p in run["problems"]]
    table = markdown_table(drains)
    print()
    print(table)
    report_statements(drains)
    print(f"goal {line['goal']}: {line['verdict']} ({line['value'] or '-'})")
    report = {
        "machine": machine(),
        "server": server,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "drains": drains,
        "verdict": line,
        "problems": problems,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    if problems or args.keep:
        print(f"kept: the settings shim, run files and worker logs in {bench.workdir}")
    else:
        shutil.rmtree(bench.workdir, ignore_errors=True)
    if problems:
        print("PROBLEMS: " + "; ".join(problems))
        return 1
    if args.fail_on_miss and line["verdict"] == "missed":
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
