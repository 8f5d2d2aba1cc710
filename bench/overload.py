"""Overload: many workers, short leases, a busy machine and a busy database; no job twice.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/overload.py                        # PostgreSQL: 16 workers, 20,000 jobs
    python bench/overload.py --smoke                # 10,000 jobs, 30-40 s
    python bench/overload.py --database mariadb     # the machine's MariaDB: 4 workers
    python bench/overload.py --repo /tmp/before     # the same with another checkout's code

Issue 27: under load alone (no process killed, frozen or cut off) workers ran jobs twice,
because an outcome that waited too long to be written was given up and its job reaped.
This bench loads the machine and the database and checks, from a file every run appends
to and from the database, that every job ran exactly once. What it does:

1. the database: ``--database postgresql`` (default) starts a PostgreSQL of its own
   (``bench/pgserver.py``, ``production=True``: PostgreSQL's defaults, so ``fsync``,
   ``synchronous_commit``, ``full_page_writes`` and autovacuum on; ``max_connections``
   enough for every worker's connections and the load); ``--database mariadb`` uses the
   server of ``--mariadb-url`` (default ``mysql://root@127.0.0.1:3306``). In it, two
   databases of the bench's own, marked as its own (a comment starting with
   ``leasejobs-bench overload.py``; a database of that name without the mark is never
   touched): ``--db-name`` for the jobs, migrated with ``--repo``'s
   ``testproject/manage.py``, and ``<db-name>_load``, the scratch database of the load;
2. enqueues ``--jobs`` jobs of the shim's ``record`` task (``bench/shim.py``) with the
   backend's ``bulk_enqueue``: each run appends ``"<job id> <attempt>\\n"`` to the run
   file with one ``os.write`` (``O_APPEND``), then sleeps ``--job-ms``; with
   ``--async-share F``, that share of them (spread evenly) are of ``arecord``, the same as
   an ``async def`` task, which the slots run at once on their event loops; with
   ``--sync-on-loop-workers F``, that share of the workers (spread evenly) run with
   ``--sync-on-loop``: the sync jobs too ride their slots' event loops, each in a thread;
3. starts the load, each process in its own session with a deadline of its own:
   ``--hogs`` CPU hogs (pure-Python busy loops) and ``--db-load`` clients of short write
   transactions against the scratch database: ``pgbench`` (TPC-B-like, scale = clients,
   after ``pgbench -i``) when the PostgreSQL binaries have it, else (and on MariaDB) this
   script's own loader (UPDATE a random row of a 10,000-row table, INSERT a history row,
   COMMIT, in a loop). After ``--load-lead`` seconds of load,
4. spawns ``--workers`` ``runworker --burst --pool P --concurrency C`` processes at once,
   each in its own session, with ``LEASE_DURATION`` ``--lease`` (4 s),
   ``HEARTBEAT_INTERVAL`` ``--heartbeat`` (1 s) and ``STALE_LOCK_INTERVAL``
   ``--stale-lock-interval`` (1 s), logging at WARNING plus the INFO line
   ``database round took`` (back-pressure), and waits until all have exited (a burst
   worker exits once no job is ready and none runs) or ``--timeout`` passed;
5. stops the load, reads the run file, the job table, the attempt table and the logs,
   and judges (every check must hold):

   * runs == jobs; distinct jobs run == jobs (and no run of a job it did not enqueue);
   * no job ran twice (no job id twice in the run file);
   * every job ``succeeded`` at attempt 1; no ``JobAttempt`` row;
   * every worker exited 0 (within ``--timeout``);
   * the load ran: every hog and load client was still running when the drain ended,
     hogs burnt CPU, the load clients committed transactions;

6. prints the checks and the figures: wall time (first spawn -> last worker exit), the
   drain rate from spawn (jobs / (last ``finished_at`` - first spawn)), log lines that
   said ``could not record job``, ``lease lost``, ``database round took`` and
   ``released stale running jobs``, errors and tracebacks, the load applied (load
   transactions and per second, hog CPU seconds), the workers' CPU seconds, how busy
   the machine's CPUs were during the drain and the load average, and on PostgreSQL
   what the job database's busy backends waited on (``pg_stat_activity`` every 0.1 s,
   by kind of statement: renew, complete, claim, reap; "CPU" when no wait event: on a
   CPU or waiting for one); writes all of it as JSON (``--output``), with, for the
   first 50 jobs that ran twice, their runs, row, attempt rows and the log lines that
   name them.

Diagnosis: ``--log-also TEXT`` (with ``--log-level DEBUG`` for DEBUG lines such as
``heartbeat tick``) logs more of the workers' lines; ``--pg-setting NAME=VALUE`` adds
server settings (``log_min_duration_statement=500``); the server's log is copied into
the work directory.

Every process it started is stopped (SIGTERM, then SIGKILL of its session) and the
databases dropped (the private PostgreSQL deleted) at the end, also on Ctrl-C, SIGTERM or
an error. The work directory (run file, worker and load logs, the server's log) is
deleted after a passing run and kept after a failing one or with ``--keep``. Exit status:
0 when every check held, 1 when one failed, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
MARK = "leasejobs-bench overload.py"
SHIM = "overload_bench"
"""The shim (``bench/shim.py``) the workers import: settings and the ``record`` task."""
SETTINGS_MODULE, TASK_MODULE = f"{SHIM}_settings", f"{SHIM}_tasks"

DEFAULT_WORKERS = {"postgresql": 16, "mariadb": 4}
FULL = {"jobs": 20000, "hogs": 2, "db_load": 4}
SMOKE = {"jobs": 10000, "hogs": 2, "db_load": 2}
"""``--smoke``: the full run's workers (16 on PostgreSQL: 48 processes on 2 cores, whose
start-up alone takes ~7 CPU-seconds) and hogs, half the jobs and half the load clients:
30-40 s on a 2-core machine, a drain of about 15-20 s. Not fewer jobs: the trouble needs
the overload to last while workers pile up leases; the code before issue 27's fix
(25fb9a5) passed 2,000- and 5,000-job drains (10 s) here and failed a 10,000-job one."""

LOAD_ROWS = 10000
"""Rows of the Python loader's scratch table."""

LOG_PATTERNS = {
    "could_not_record": "could not record job",
    "lease_lost": "lease lost",
    "back_pressure": "database round took",
    "reaped": "released stale running jobs",
    "errors": " ERROR ",
    "tracebacks": "Traceback",
}
"""What the worker logs are searched for (one count per line that contains it)."""

INFO_LINES = ("database round took", "renewals or claims came back")
"""INFO messages the workers log besides their warnings (``LEASEJOBS_BENCH_LOG_INFO``): back
pressure, and the leases stretched for late renewals or claims (``lease_length.py``)."""

ERROR_LINES = (" ERROR ", "CRITICAL")
"""Lines of the worker logs the report keeps as its ``error_lines``."""

WHY_LINES = (*ERROR_LINES, *INFO_LINES)
"""Lines a failed run prints from the worker logs (``why_lines``), to say why a lease was
lost: the loss itself, and the back pressure and stretches that came before it."""

ENQUEUE = """\
import sys

import django

django.setup()
from django_leasejobs.compat import task_backends
from overload_bench_tasks import arecord, record

ms, async_flags = float(sys.argv[1]), sys.argv[2]  # flags: "1" for each async job
backend = task_backends["default"]
kinds = [arecord if flag == "1" else record for flag in async_flags]
for start in range(0, len(kinds), 5000):
    backend.bulk_enqueue([(kind, (), {"ms": ms}) for kind in kinds[start : start + 5000]])
"""

WHERE_FROM = "import django_leasejobs, os; print(os.path.dirname(django_leasejobs.__file__))"


# -- pure parts: options, runs, verdict, log counts, tables -------------------------------


def share(text: str) -> float:
    """An argparse type: a fraction from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--database", choices=("postgresql", "mariadb"), default="postgresql")
    parser.add_argument(
        "--mariadb-url",
        default="mysql://root@127.0.0.1:3306",
        help="the MariaDB server (mysql://user[:password]@host[:port]); a path is ignored",
    )
    parser.add_argument("--workers", type=int, default=None, help="16 (PostgreSQL), 4 (MariaDB)")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker (2)")
    parser.add_argument("--pool", choices=("process", "thread"), default="process")
    parser.add_argument("--jobs", type=int, default=None, help="jobs (20,000; smoke 10,000)")
    parser.add_argument("--job-ms", type=float, default=0.0, help="each job sleeps this long")
    parser.add_argument(
        "--async-share",
        type=share,
        default=0.0,
        help="this share of the jobs (0 to 1, spread evenly) are async def ones, run on the "
        "slots' event loops (0)",
    )
    parser.add_argument(
        "--sync-on-loop-workers",
        type=share,
        default=0.0,
        help="this share of the workers (0 to 1, spread evenly) run with --sync-on-loop: "
        "their sync jobs ride the slots' event loops too (process pool; 0)",
    )
    parser.add_argument("--lease", type=float, default=4.0, help="LEASE_DURATION (4 s)")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="HEARTBEAT_INTERVAL (1 s)")
    parser.add_argument(
        "--stale-lock-interval", type=float, default=1.0, help="STALE_LOCK_INTERVAL (1 s)"
    )
    parser.add_argument("--hogs", type=int, default=None, help="CPU hog processes (2)")
    parser.add_argument("--db-load", type=int, default=None, help="load clients (4; smoke 2)")
    parser.add_argument(
        "--db-loader",
        choices=("auto", "pgbench", "python"),
        default="auto",
        help="auto: pgbench when the PostgreSQL binaries have it, else the Python loader",
    )
    parser.add_argument(
        "--load-lead", type=float, default=3.0, help="seconds of load before the workers start"
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds for the drain")
    parser.add_argument("--smoke", action="store_true", help="10,000 jobs, 2 load clients")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="checkout whose code runs")
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument("--worker-args", default="", help="more runworker arguments")
    parser.add_argument("--db-name", default="leasejobs_overload_bench")
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "artifacts" / "bench" / "overload.json"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run file and the logs")
    parser.add_argument(
        "--log-also",
        action="append",
        default=[],
        metavar="TEXT",
        help="also log worker messages that start with TEXT (diagnosis: 'heartbeat tick')",
    )
    parser.add_argument(
        "--log-level",
        choices=("INFO", "DEBUG"),
        default="INFO",
        help="DEBUG lets DEBUG messages of --log-also through too",
    )
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting over the production defaults (log_min_duration_statement=500)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.workers is None:
        args.workers = DEFAULT_WORKERS[args.database]
    if min(args.workers, args.concurrency, args.jobs) < 1:
        parser.error("--workers, --concurrency and --jobs must be at least 1")
    if min(args.hogs, args.db_load) < 0 or args.job_ms < 0 or args.load_lead < 0:
        parser.error("--hogs, --db-load, --job-ms and --load-lead cannot be negative")
    if min(args.lease, args.heartbeat, args.timeout) <= 0 or args.stale_lock_interval < 0:
        parser.error("--lease, --heartbeat and --timeout must be positive")
    if args.db_loader == "pgbench" and args.database != "postgresql":
        parser.error("--db-loader pgbench needs --database postgresql")
    if any("=" not in setting for setting in args.pg_setting):
        parser.error("--pg-setting takes NAME=VALUE")
    if args.sync_on_loop_workers and args.pool != "process":
        parser.error("--sync-on-loop-workers needs --pool process (runworker --sync-on-loop)")
    return args


def on_loop_note(settings: dict[str, Any]) -> str:
    """``, N with --sync-on-loop`` for a run's settings, or nothing."""
    share = settings.get("sync_on_loop_workers", 0.0)
    count = sum(spread_evenly(index, share) for index in range(settings["workers"]))
    return f", {count} with --sync-on-loop" if count else ""


def spread_evenly(index: int, share: float) -> bool:
    """Whether item ``index`` is among ``share`` of the items, spread evenly: the async
    jobs (``--async-share``), the workers with ``--sync-on-loop``."""
    return int((index + 1) * share) > int(index * share)


def worker_options(args: argparse.Namespace) -> dict[str, float]:
    """The backend OPTIONS the workers get (``LEASEJOBS_BENCH_OPTIONS``)."""
    return {
        "LEASE_DURATION": args.lease,
        "HEARTBEAT_INTERVAL": args.heartbeat,
        "STALE_LOCK_INTERVAL": args.stale_lock_interval,
    }


def parse_runs(text: str) -> tuple[list[tuple[int, int]], list[str]]:
    """The run file's ``"<job id> <attempt>"`` lines as pairs, and the lines that are not."""
    runs: list[tuple[int, int]] = []
    bad: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            runs.append((int(parts[0]), int(parts[1])))
        elif line.strip():
            bad.append(line)
    return runs, bad


def _check(name: str, value: Any, expected: Any, ok: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "expected": expected, "ok": bool(ok)}


def verdict(
    *,
    jobs: int,
    runs: Sequence[tuple[int, int]],
    bad_lines: int,
    job_ids: Iterable[int],
    succeeded_first: int,
    attempt_rows: int,
    exit_codes: dict[str, int | None],
    load: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Judge one run from what the jobs wrote and what the database holds.

    ``jobs``: how many were enqueued; ``runs``: the run file's (job id, attempt) pairs;
    ``bad_lines``: its lines that were not such a pair; ``job_ids``: the ids in the job
    table; ``succeeded_first``: its rows ``succeeded`` at attempt 1; ``attempt_rows``: rows
    of the attempt table; ``exit_codes``: worker -> exit status (None: still running at
    the deadline); ``load``: ``load_ok``'s input (None: not judged).
    """
    ids = set(job_ids)
    per_job = Counter(job for job, _ in runs)
    attempts: dict[int, list[int]] = {}
    for job, attempt in runs:
        attempts.setdefault(job, []).append(attempt)
    twice = sorted(job for job, count in per_job.items() if count > 1)
    unknown = sorted(job for job in per_job if job not in ids)
    failed_workers = sorted(w for w, code in exit_codes.items() if code != 0)
    checks = [
        _check("jobs enqueued", len(ids), jobs, len(ids) == jobs),
        _check("runs == jobs", len(runs), jobs, len(runs) == jobs and not bad_lines),
        _check(
            "distinct jobs run == jobs",
            len(per_job),
            jobs,
            len(per_job) == jobs and not unknown,
        ),
        _check("jobs that ran twice", len(twice), 0, not twice),
        _check("succeeded at attempt 1", succeeded_first, jobs, succeeded_first == jobs),
        _check("JobAttempt rows", attempt_rows, 0, attempt_rows == 0),
        _check(
            "workers exited 0",
            len(exit_codes) - len(failed_workers),
            len(exit_codes),
            not failed_workers and bool(exit_codes),
        ),
    ]
    if load is not None:
        ok, why = load_ok(**load)
        checks.append(_check("load applied", why, "all ran", ok))
    return {
        "ok": all(c["ok"] for c in checks),
        "checks": checks,
        "runs": len(runs),
        "distinct": len(per_job),
        "extra_runs": len(runs) - len(per_job),
        "runs_after_attempt_1": sum(1 for _, attempt in runs if attempt != 1),
        "bad_lines": bad_lines,
        "unknown_jobs": unknown[:50],
        "twice": [{"job": job, "attempts": attempts[job]} for job in twice],
        "failed_workers": {w: exit_codes[w] for w in failed_workers},
    }


def load_ok(
    *,
    hogs: int,
    hog_cpu: float,
    clients: int,
    transactions: int,
    ended_early: int,
) -> tuple[bool, str]:
    """Whether the load ran as asked: every process until the drain ended, hogs burning
    CPU, clients committing."""
    problems = []
    if ended_early:
        problems.append(f"{ended_early} load processes ended before the drain did")
    if hogs and hog_cpu <= 0:
        problems.append("the hogs used no CPU")
    if clients and transactions <= 0:
        problems.append("no load transaction")
    return not problems, "; ".join(problems) or "all ran"


def count_log_lines(texts: Iterable[str]) -> dict[str, int]:
    """Lines of the worker logs that contain each of ``LOG_PATTERNS``."""
    counts = dict.fromkeys(LOG_PATTERNS, 0)
    for text in texts:
        for line in text.splitlines():
            for key, pattern in LOG_PATTERNS.items():
                if pattern in line:
                    counts[key] += 1
    return counts


def lines_with(texts: dict[str, str], patterns: Sequence[str], limit: int) -> list[str]:
    """The first ``limit`` log lines that contain any of ``patterns``, each with its log's
    name, the logs in name order."""
    return [
        f"{name}: {line}"
        for name, text in sorted(texts.items())
        for line in text.splitlines()
        if any(pattern in line for pattern in patterns)
    ][:limit]


def lines_naming(texts: dict[str, str], job: int, limit: int = 40) -> list[str]:
    """Log lines that name job ``job`` (``job <id> ...``), each with its log's name."""
    needle = f"job {job} "
    found = []
    for name, text in sorted(texts.items()):
        for line in text.splitlines():
            if needle in line:
                found.append(f"{name}: {line}")
    return found[:limit]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def figures_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures of a report as (name, value) pairs, in print order."""
    f = report["figures"]
    logs = f["log_lines"]
    load = f["load"]
    rate = f["db_load_rate"]
    return [
        ("wall time, first spawn -> last exit", f"{_fmt(f['wall_seconds'], 1)} s"),
        ("drain rate from spawn", f"{_fmt(f['rate_from_spawn'])} jobs/s"),
        ("log: could not record job", _fmt(logs["could_not_record"])),
        ("log: lease lost", _fmt(logs["lease_lost"])),
        ("log: database round took (back-pressure)", _fmt(logs["back_pressure"])),
        ("log: released stale running jobs", _fmt(logs["reaped"])),
        ("log: ERROR lines / tracebacks", f"{logs['errors']:,} / {logs['tracebacks']:,}"),
        (
            f"db load: {load['clients']} clients ({load['loader']})",
            f"{_fmt(load['transactions'])} transactions, {_fmt(rate)}/s",
        ),
        (
            f"hogs: {load['hogs']} processes",
            f"{_fmt(load['hog_cpu'], 1)} CPU-s over {_fmt(load['seconds'], 1)} s",
        ),
        ("workers' CPU (with their slots)", f"{_fmt(f['worker_cpu'], 1)} CPU-s"),
        ("machine CPUs busy during the drain", f"{_fmt(f['busy_percent'])} %"),
        (
            "jobs by status and attempt",
            ", ".join(f"{k}: {v:,}" for k, v in sorted(f["statuses"].items())),
        ),
        *[
            (
                f"server samples, {kind}",
                ", ".join(f"{event} {n:,}" for event, n in list(events.items())[:3]),
            )
            for kind, events in ((f.get("server_waits") or {}).get("by_statement") or {}).items()
            if kind in ("renew", "complete", "claim", "reap", "commit")
        ],
        (
            "load average before / max / after",
            " / ".join(_fmt(v, 1) for v in f["loadavg"]),
        ),
    ]


def text_table(report: dict[str, Any]) -> str:
    """The checks and the figures, as printed."""
    out = [f"{'check':<32} {'value':>12} {'expected':>12}  verdict"]
    for c in report["verdict"]["checks"]:
        out.append(
            f"{c['name']:<32} {_fmt(c['value']):>12} {_fmt(c['expected']):>12}  "
            f"{'ok' if c['ok'] else 'FAILED'}"
        )
    out.append("")
    for name, value in figures_rows(report):
        out.append(f"{name:<42} {value}")
    return "\n".join(out) + "\n"


MARKDOWN_HEAD = (
    "| database | code | workers x slots | jobs | runs | jobs run twice | succeeded at "
    "attempt 1 | attempt rows | workers exit 0 | wall (s) | jobs/s from spawn | "
    "could not record | lease lost | round took (back-pressure) | reaped | db load "
    "(transactions, /s) | hog CPU-s | CPUs busy |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)


def markdown_row(report: dict[str, Any]) -> str:
    f, v, s = report["figures"], report["verdict"], report["settings"]
    logs, load = f["log_lines"], f["load"]
    checks = {c["name"]: c for c in v["checks"]}
    return (
        f"| {s['database']} | {report['code']} | {s['workers']} x {s['concurrency']} "
        f"({s['pool']}{on_loop_note(s)}) | {s['jobs']:,} | {v['runs']:,} | {len(v['twice']):,} | "
        f"{_fmt(checks['succeeded at attempt 1']['value'])} | "
        f"{_fmt(checks['JobAttempt rows']['value'])} | "
        f"{'yes' if checks['workers exited 0']['ok'] else 'NO'} | "
        f"{_fmt(f['wall_seconds'], 1)} | {_fmt(f['rate_from_spawn'])} | "
        f"{logs['could_not_record']:,} | {logs['lease_lost']:,} | {logs['back_pressure']:,} | "
        f"{logs['reaped']:,} | {_fmt(load['transactions'])} ({load['loader']}), "
        f"{_fmt(f['db_load_rate'])}/s | {_fmt(load['hog_cpu'], 1)} | "
        f"{_fmt(f['busy_percent'])} % |\n"
    )


# -- the load's own processes (this script with a first word: _hog, _load) ----------------


def _stop_on_term() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    return stop


def hog_main(seconds: float) -> int:
    """Burn one CPU in pure Python until ``seconds`` passed or SIGTERM; print CPU used."""
    stop = _stop_on_term()
    deadline = time.monotonic() + seconds
    x = 0
    while not stop.is_set() and time.monotonic() < deadline:
        for i in range(20000):
            x = (x * 31 + i) % 1000003
    print(json.dumps({"cpu": time.process_time(), "x": x}), flush=True)
    return 0


def _connect(url: str) -> Any:
    parts = urlsplit(url)
    if parts.scheme.startswith("mysql"):
        import pymysql

        return pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=parts.path.lstrip("/") or None,
            autocommit=False,
        )
    import psycopg

    return psycopg.connect(url)


def load_main(url: str, seconds: float) -> int:
    """Short write transactions against the scratch tables until ``seconds`` passed or
    SIGTERM: UPDATE a random account, INSERT a history row, COMMIT. Prints the counts."""
    import random

    stop = _stop_on_term()
    deadline = time.monotonic() + seconds
    done = errors = 0
    conn = None
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            if conn is None:
                conn = _connect(url)
            account, delta = random.randint(1, LOAD_ROWS), random.randint(-5000, 5000)
            with conn.cursor() as cur:
                cur.execute(
                    "UPDATE overload_accounts SET balance = balance + %s WHERE id = %s",
                    [delta, account],
                )
                cur.execute(
                    "INSERT INTO overload_history (account, delta) VALUES (%s, %s)",
                    [account, delta],
                )
            conn.commit()
            done += 1
        except Exception as exc:  # a dropped connection, a deadlock: count, retry
            errors += 1
            print(f"load error: {exc}", file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                conn.close()  # type: ignore[union-attr]
            conn = None
            stop.wait(0.1)
    with contextlib.suppress(Exception):
        conn.close()  # type: ignore[union-attr]
    print(json.dumps({"transactions": done, "errors": errors}), flush=True)
    return 0


# -- the databases --------------------------------------------------------------------------


class Target:
    """One database server: the bench's two databases on it, the load, the job facts."""

    vendor = ""
    loader = "python"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.load_db = f"{args.db_name}_load"

    # (each vendor's)
    def url(self, name: str) -> str:
        raise NotImplementedError

    def connect(self, name: str | None = None) -> Any:
        raise NotImplementedError

    def create(self) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        raise NotImplementedError

    def facts(self) -> dict[str, Any]:
        raise NotImplementedError

    def epoch(self, column: str) -> str:
        raise NotImplementedError

    def load_counter(self) -> int | None:
        """Transactions committed in the scratch database so far (None: not known)."""
        return None

    def server_log(self) -> str:
        """The server's log, when the bench runs the server."""
        return ""

    def waits_sampler(self) -> ServerWaits | None:
        return None

    # (shared)
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = self.connect(self.args.db_name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def prepare_load(self, clients: int) -> None:
        """The Python loader's scratch tables."""
        if not clients:
            return
        conn = self.connect(self.load_db)
        try:
            with conn.cursor() as cur:
                cur.execute(self.accounts_ddl())
                cur.execute(self.history_ddl())
                values = ", ".join(f"({i})" for i in range(1, LOAD_ROWS + 1))
                cur.execute(f"INSERT INTO overload_accounts (id) VALUES {values}")
        finally:
            conn.close()

    def accounts_ddl(self) -> str:
        return "CREATE TABLE overload_accounts (id integer PRIMARY KEY, balance bigint DEFAULT 0)"

    def history_ddl(self) -> str:
        raise NotImplementedError

    def load_commands(self, clients: int, seconds: float) -> list[list[str]]:
        me = str(Path(__file__).resolve())
        url = self.url(self.load_db)
        return [[sys.executable, me, "_load", url, f"{seconds:.0f}"] for _ in range(clients)]

    def job_facts(self) -> dict[str, Any]:
        ids = [int(row[0]) for row in self.query("SELECT id FROM leasejobs_job")]
        statuses = self.query(
            "SELECT status, attempt, COUNT(*) FROM leasejobs_job GROUP BY status, attempt"
        )
        [(attempt_rows,)] = self.query("SELECT COUNT(*) FROM leasejobs_attempt")
        [(first, last)] = self.query(
            f"SELECT {self.epoch('MIN(started_at)')}, {self.epoch('MAX(finished_at)')} "
            "FROM leasejobs_job"
        )
        return {
            "ids": ids,
            "statuses": {f"{s} at attempt {a}": int(n) for s, a, n in statuses},
            "succeeded_first": sum(
                int(n) for s, a, n in statuses if s == "succeeded" and int(a) == 1
            ),
            "attempt_rows": int(attempt_rows),
            "first_started": float(first) if first is not None else None,
            "last_finished": float(last) if last is not None else None,
        }

    def job_details(self, jobs: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Row and attempt rows of the given jobs (those that ran twice)."""
        out: dict[int, dict[str, Any]] = {}
        for job in jobs[:50]:
            row = self.query(
                "SELECT status, attempt, stall_count, locked_by, last_worker, "
                f"{self.epoch('started_at')}, {self.epoch('finished_at')}, last_error "
                "FROM leasejobs_job WHERE id = %s",
                [job],
            )
            attempts = self.query(
                f"SELECT attempt, worker, outcome, error_message, {self.epoch('started_at')}, "
                f"{self.epoch('finished_at')} FROM leasejobs_attempt WHERE job_id = %s "
                "ORDER BY attempt",
                [job],
            )
            out[job] = {
                "row": [str(v) if v is not None else None for v in row[0]] if row else None,
                "attempt_rows": [[str(v) if v is not None else None for v in a] for a in attempts],
            }
        return out


class Postgres(Target):
    vendor = "postgresql"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import pgserver

        # Each busy worker: its database and claim threads, heartbeat, housekeeping, listener,
        # and a slot's own in the process pool when a job touches the database; the
        # load; the bench.
        connections = args.workers * (5 + args.concurrency) + args.db_load + 30
        self.server = pgserver.PrivateServer(
            connections,
            production=True,
            # Long enough for the statement samples to tell a renewal from a completion
            # (the lists of job ids come first).
            settings={
                "track_activity_query_size": "16384",
                **dict(setting.split("=", 1) for setting in args.pg_setting),
            },
            prefix="leasejobs-overload-pg-",
        )
        self.pgbench = self.server.bindir / "pgbench"
        if args.db_loader == "pgbench" and not self.pgbench.exists():
            self.server.stop()
            raise SystemExit(f"no pgbench in {self.server.bindir}")
        if args.db_loader != "python" and self.pgbench.exists():
            self.loader = "pgbench"

    def url(self, name: str) -> str:
        from pgserver import with_database

        return with_database(self.server.url, name)

    def connect(self, name: str | None = None) -> Any:
        import psycopg

        return psycopg.connect(self.url(name or "postgres"), autocommit=True)

    def create(self) -> None:
        from pgserver import create_database

        with self.connect() as admin:
            create_database(admin, self.args.db_name, MARK)
            create_database(admin, self.load_db, MARK)

    def drop(self) -> None:
        from pgserver import drop_database

        with self.connect() as admin:
            drop_database(admin, self.args.db_name, MARK)
            drop_database(admin, self.load_db, MARK)

    def stop(self) -> None:
        self.server.stop()

    def waits_sampler(self) -> ServerWaits | None:
        return ServerWaits(self.url("postgres"), self.args.db_name)

    def server_log(self) -> str:
        path = self.server.base / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def epoch(self, column: str) -> str:
        return f"EXTRACT(EPOCH FROM {column})"

    def history_ddl(self) -> str:
        return (
            "CREATE TABLE overload_history (id bigserial PRIMARY KEY, account integer, "
            "delta integer, at timestamptz DEFAULT now())"
        )

    def prepare_load(self, clients: int) -> None:
        if not clients:
            return
        if self.loader != "pgbench":
            super().prepare_load(clients)
            return
        subprocess.run(
            [
                str(self.pgbench),
                *self._pgbench_connection(),
                *("-i", "-q", "-s", str(max(1, clients))),
                self.load_db,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _pgbench_connection(self) -> list[str]:
        return ["-h", "127.0.0.1", "-p", str(self.server.port), "-U", "postgres"]

    def load_commands(self, clients: int, seconds: float) -> list[list[str]]:
        if self.loader != "pgbench" or not clients:
            return super().load_commands(clients, seconds)
        return [
            [
                str(self.pgbench),
                *self._pgbench_connection(),
                *("-n", "-c", str(clients), "-T", f"{seconds:.0f}"),
                self.load_db,
            ]
        ]

    def load_counter(self) -> int | None:
        with self.connect() as conn:
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [self.load_db]
            ).fetchone()
        return int(row[0]) if row else None

    def analyze(self) -> None:
        with self.connect(self.args.db_name) as conn:
            conn.execute("VACUUM ANALYZE leasejobs_job")

    def facts(self) -> dict[str, Any]:
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "autovacuum",
            "max_connections",
            "shared_buffers",
        )
        with self.connect() as conn:
            return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}  # type: ignore[index]


class MariaDB(Target):
    vendor = "mariadb"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        parts = urlsplit(args.mariadb_url)
        if not parts.scheme.startswith("mysql"):
            raise SystemExit(f"--mariadb-url must be mysql://...: {args.mariadb_url}")
        self.parts = parts

    def url(self, name: str) -> str:
        return self.parts._replace(path=f"/{name}", query="", fragment="").geturl()

    def connect(self, name: str | None = None) -> Any:
        import pymysql

        p = self.parts
        return pymysql.connect(
            host=p.hostname or "127.0.0.1",
            port=p.port or 3306,
            user=unquote(p.username or "root"),
            password=unquote(p.password or ""),
            database=name,
            autocommit=True,
            init_command="SET time_zone = '+00:00'",
        )

    def _comment(self, cur: Any, name: str) -> str | None:
        cur.execute(
            "SELECT SCHEMA_COMMENT FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
            [name],
        )
        row = cur.fetchone()
        return None if row is None else (row[0] or "")

    def _drop(self, cur: Any, name: str) -> None:
        comment = self._comment(cur, name)
        if comment is None:
            return
        if not comment.startswith(MARK):
            raise SystemExit(f"database {name!r} exists and is not this bench's: not touching it")
        cur.execute(f"DROP DATABASE `{name}`")

    def create(self) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for name in (self.args.db_name, self.load_db):
                    self._drop(cur, name)
                    cur.execute(
                        f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COMMENT %s",
                        [f"{MARK} {time.strftime('%Y-%m-%d %H:%M')}"],
                    )
        finally:
            conn.close()

    def drop(self) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for name in (self.args.db_name, self.load_db):
                    self._drop(cur, name)
        finally:
            conn.close()

    def stop(self) -> None:
        pass

    def epoch(self, column: str) -> str:
        return f"UNIX_TIMESTAMP({column})"  # the session is at UTC, as the stored values

    def accounts_ddl(self) -> str:
        return super().accounts_ddl() + " ENGINE=InnoDB"

    def history_ddl(self) -> str:
        return (
            "CREATE TABLE overload_history (id bigint AUTO_INCREMENT PRIMARY KEY, "
            "account integer, delta integer, at datetime(6) DEFAULT CURRENT_TIMESTAMP(6)) "
            "ENGINE=InnoDB"
        )

    def analyze(self) -> None:
        self.query("ANALYZE TABLE leasejobs_job")

    def facts(self) -> dict[str, Any]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                out: dict[str, Any] = {"server_version": cur.fetchone()[0]}
                cur.execute(
                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                    "('innodb_flush_log_at_trx_commit', 'sync_binlog', 'log_bin', "
                    "'max_connections', 'innodb_buffer_pool_size', 'transaction_isolation', "
                    "'tx_isolation')"
                )
                out.update({name: value for name, value in cur.fetchall()})
                cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
                out["threads_connected_at_start"] = cur.fetchone()[1]
                return out
        finally:
            conn.close()


# -- the machine ----------------------------------------------------------------------------


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot (``/proc/stat``); (0, 0) elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # (guest time is already in user)
    return total - idle, total


def busy_percent(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    busy, total = after[0] - before[0], after[1] - before[1]
    return 100.0 * busy / total if total > 0 else None


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, from ``/proc``; 0 when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


WAITS_SQL = """
SELECT CASE
         WHEN query LIKE '%%SET locked_until%%' THEN 'renew'
         WHEN query LIKE '%%SET status = ''succeeded''%%' THEN 'complete'
         WHEN query ~ '^\\s*WITH picked' THEN 'claim'
         WHEN query ~ '^\\s*WITH stale' THEN 'reap'
         WHEN query IN ('COMMIT', 'BEGIN') THEN lower(query)
         ELSE 'other'
       END,
       COALESCE(wait_event_type || ':' || wait_event, 'CPU (no wait event)'),
       count(*)
FROM pg_stat_activity
WHERE datname = %s AND state = 'active' AND pid <> pg_backend_pid()
GROUP BY 1, 2
"""


class ServerWaits(threading.Thread):
    """What the job database's busy backends wait on (PostgreSQL), every ``interval``:
    samples per kind of statement (renew, complete, claim, reap, other) and wait event
    ("CPU" when none: running, or waiting for a CPU)."""

    def __init__(self, url: str, database: str, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.database, self.interval = url, database, interval
        self.stop_event = threading.Event()
        self.samples = 0
        self.counts: dict[str, Counter[str]] = {}

    def run(self) -> None:
        import psycopg

        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop_event.wait(self.interval):
                for kind, event, count in c.execute(WAITS_SQL, [self.database]).fetchall():
                    self.counts.setdefault(kind, Counter())[event] += count
                self.samples += 1

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "interval": self.interval,
            "by_statement": {
                kind: dict(counter.most_common()) for kind, counter in sorted(self.counts.items())
            },
        }


class LoadAverage(threading.Thread):
    """The highest 1-minute load average seen, once a second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop_event = threading.Event()
        self.highest = os.getloadavg()[0]

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.highest = max(self.highest, os.getloadavg()[0])


def commit_of(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


# -- the run ------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="leasejobs-overload-"))
        self.logdir = self.work / "logs"
        self.logdir.mkdir()
        self.runs_file = self.work / "runs.txt"
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.load: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.target: Target | None = None

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("ab")
        try:
            return subprocess.Popen(
                argv,
                env=env,
                cwd=str(self.args.repo),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        from pgserver import stop_workers

        stop_workers(list(self.workers.values()))
        stop_workers([proc for _, proc in self.load], timeout=10)

    def go(self) -> dict[str, Any]:
        import shim  # (bench/, beside this script)

        args = self.args
        loadavg_before = os.getloadavg()[0]
        ticks = cpu_ticks()
        time.sleep(2.0)
        busy_before = busy_percent(ticks, cpu_ticks())
        print(
            f"machine: {os.cpu_count()} CPUs, load average {loadavg_before:.2f}, "
            f"{_fmt(busy_before)} % busy before the bench",
            flush=True,
        )
        target: Target = Postgres(args) if args.database == "postgresql" else MariaDB(args)
        self.target = target
        target.create()
        repo = args.repo.resolve()
        manage = repo / "testproject" / "manage.py"
        shim.write(self.work, SHIM)
        env = {
            **os.environ,
            "DATABASE_URL": target.url(args.db_name),
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "PYTHONPATH": os.pathsep.join([str(self.work), str(repo / "testproject"), str(repo)]),
            "LEASEJOBS_BENCH_OPTIONS": json.dumps(worker_options(args)),
            "LEASEJOBS_BENCH_LOG_INFO": "|".join([*INFO_LINES, *args.log_also]),
            "LEASEJOBS_BENCH_LOG_LEVEL": args.log_level,
            "LEASEJOBS_BENCH_RUNS": str(self.runs_file),
        }
        code_dir = subprocess.run(
            [sys.executable, "-c", WHERE_FROM], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        print(f"code: {code_dir} ({commit_of(repo)})", flush=True)
        subprocess.run([sys.executable, str(manage), "migrate", "-v0"], env=env, check=True)
        started = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-c",
                ENQUEUE,
                str(args.job_ms),
                "".join(str(int(spread_evenly(i, args.async_share))) for i in range(args.jobs)),
            ],
            env=env,
            cwd=str(repo),
            check=True,
        )
        target.analyze()
        print(f"enqueued {args.jobs:,} jobs in {time.monotonic() - started:.1f}s", flush=True)
        target.prepare_load(args.db_load)

        # The load: every process with a deadline of its own, past the drain's.
        seconds = args.load_lead + args.timeout + 60
        me = str(Path(__file__).resolve())
        counter0 = target.load_counter()
        load_started = time.monotonic()
        for index in range(args.hogs):
            self.load.append(
                (
                    f"hog-{index}",
                    self.spawn(f"hog-{index}", [sys.executable, me, "_hog", f"{seconds:.0f}"], env),
                )
            )
        for index, argv in enumerate(
            target.load_commands(args.db_load, seconds) if args.db_load else []
        ):
            self.load.append((f"load-{index}", self.spawn(f"load-{index}", argv, env)))
        print(
            f"load: {args.hogs} hogs, {args.db_load} clients ({target.loader}); "
            f"workers in {args.load_lead:g}s",
            flush=True,
        )
        time.sleep(args.load_lead)

        # The workers, all at once.
        sampler = LoadAverage()
        sampler.start()
        waits = target.waits_sampler()
        if waits is not None:
            waits.start()
        import resource

        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ticks0 = cpu_ticks()
        first_spawn = time.time()
        for index in range(args.workers):
            worker_id = f"ov-{index}"
            self.workers[worker_id] = self.spawn(
                worker_id,
                [
                    *(sys.executable, str(manage), "runworker", "--burst"),
                    *("--pool", args.pool, "--concurrency", str(args.concurrency)),
                    *("--worker-id", worker_id),
                    *(
                        ["--sync-on-loop"]
                        if spread_evenly(index, args.sync_on_loop_workers)
                        else []
                    ),
                    *args.worker_args.split(),
                ],
                env,
            )
        print(f"spawned {args.workers} workers", flush=True)
        exits: dict[str, int | None] = dict.fromkeys(self.workers)
        exited_at: dict[str, float] = {}
        deadline = time.monotonic() + args.timeout
        while len(exited_at) < len(self.workers) and time.monotonic() < deadline:
            for worker_id, proc in self.workers.items():
                if worker_id not in exited_at and proc.poll() is not None:
                    exits[worker_id] = proc.returncode
                    exited_at[worker_id] = time.time()
            time.sleep(0.1)
        timed_out = len(exited_at) < len(self.workers)
        last_exit = max(exited_at.values()) if exited_at else time.time()
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ticks1 = cpu_ticks()
        sampler.stop_event.set()
        if waits is not None:
            waits.stop_event.set()
            waits.join(timeout=5)
        print(
            f"workers: {len(exited_at)} of {len(self.workers)} exited in "
            f"{last_exit - first_spawn:.1f}s" + (" (TIMED OUT)" if timed_out else ""),
            flush=True,
        )

        # Stop the load; what it did.
        ended_early = sum(1 for _, proc in self.load if proc.poll() is not None)
        hog_cpu = sum(process_cpu(proc.pid) for name, proc in self.load if name.startswith("hog"))
        load_seconds = time.monotonic() - load_started
        self.stop_all()
        time.sleep(1.5)  # (the load's last statistics reach the server)
        counter1 = target.load_counter()
        reported = 0
        for name, _ in self.load:
            if name.startswith("load"):
                for line in self.log(name).splitlines():
                    with contextlib.suppress(ValueError):
                        reported += int(json.loads(line).get("transactions", 0))
        if target.loader == "pgbench" and counter0 is not None and counter1 is not None:
            transactions = counter1 - counter0
        else:
            transactions = reported
        load = {
            "hogs": args.hogs,
            "hog_cpu": hog_cpu,
            "clients": args.db_load,
            "loader": target.loader if args.db_load else "none",
            "transactions": transactions,
            "seconds": load_seconds,
            "ended_early": ended_early,
        }

        # What ran, what the database says, what the logs say.
        runs, bad = parse_runs(self.runs_file.read_text() if self.runs_file.exists() else "")
        facts = target.job_facts()
        result = verdict(
            jobs=args.jobs,
            runs=runs,
            bad_lines=len(bad),
            job_ids=facts["ids"],
            succeeded_first=facts["succeeded_first"],
            attempt_rows=facts["attempt_rows"],
            exit_codes=exits,
            load={
                k: load[k] for k in ("hogs", "hog_cpu", "clients", "transactions", "ended_early")
            },
        )
        logs = {w: self.log(w) for w in self.workers}
        if result["twice"]:  # the first 50 in detail: row, attempt rows, log lines
            details = target.job_details([t["job"] for t in result["twice"][:50]])
            for entry in result["twice"][:50]:
                entry.update(details.get(entry["job"], {}))
                entry["log_lines"] = lines_naming(logs, entry["job"])
        last_finished = facts["last_finished"]
        figures = {
            "wall_seconds": last_exit - first_spawn,
            "rate_from_spawn": (
                len(facts["ids"]) / (last_finished - first_spawn)
                if last_finished and last_finished > first_spawn
                else None
            ),
            "first_job_after_spawn": (
                facts["first_started"] - first_spawn if facts["first_started"] else None
            ),
            "log_lines": count_log_lines(logs.values()),
            "error_lines": lines_with(logs, ERROR_LINES, 40),
            "why_lines": lines_with(logs, WHY_LINES, 60),
            "load": load,
            "db_load_rate": transactions / load_seconds if load_seconds else None,
            "worker_cpu": (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime),
            "busy_percent": busy_percent(ticks0, ticks1),
            "busy_percent_before": busy_before,
            "loadavg": [loadavg_before, sampler.highest, os.getloadavg()[0]],
            "server_waits": waits.summary() if waits is not None else None,
            "statuses": facts["statuses"],
            "bad_lines": bad[:20],
        }
        return {
            "label": args.label,
            "code": commit_of(repo),
            "code_dir": code_dir,
            "settings": {
                "database": args.database,
                "workers": args.workers,
                "concurrency": args.concurrency,
                "pool": args.pool,
                "jobs": args.jobs,
                "job_ms": args.job_ms,
                "async_share": args.async_share,
                "sync_on_loop_workers": args.sync_on_loop_workers,
                "options": worker_options(args),
                "hogs": args.hogs,
                "db_load": args.db_load,
                "load_lead": args.load_lead,
                "timeout": args.timeout,
                "smoke": args.smoke,
                "worker_args": args.worker_args,
            },
            "server": target.facts(),
            "verdict": result,
            "figures": figures,
            "timed_out": timed_out,
        }


def machine() -> dict[str, Any]:
    import platform

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "bench_commit": commit_of(REPO_ROOT),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_hog"]:
        return hog_main(float(argv[1]))
    if argv[:1] == ["_load"]:
        return load_main(argv[1], float(argv[2]))
    args = parse_args(argv)
    args.repo = args.repo.resolve()
    sys.path.insert(0, str(BENCH_DIR))

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    run = Run(args)
    report: dict[str, Any] | None = None
    try:
        report = run.go()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        run.stop_all()
        if run.target is not None:
            with contextlib.suppress(OSError):
                (run.work / "server.log").write_text(run.target.server_log())
            with contextlib.suppress(Exception):
                run.target.drop()
            run.target.stop()
        passed = report is not None and report["verdict"]["ok"]
        if passed and not args.keep:
            shutil.rmtree(run.work, ignore_errors=True)
        else:
            print(f"kept: run file and logs in {run.work}", file=sys.stderr)
    report["machine"] = machine()
    report["work_dir"] = None if (report["verdict"]["ok"] and not args.keep) else str(run.work)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    s = report["settings"]
    print()
    print(
        f"overload: {s['database']}, {s['workers']} workers x {s['concurrency']} "
        f"({s['pool']}{on_loop_note(s)}), {s['jobs']:,} jobs of {s['job_ms']:g} ms, "
        f"{s['async_share']:.0%} async, lease {args.lease:g}s, "
        f"heartbeat {args.heartbeat:g}s, reaper {args.stale_lock_interval:g}s; code "
        f"{report['code']}"
    )
    print(text_table(report))
    for entry in report["verdict"]["twice"][:10]:
        print(f"ran twice: job {entry['job']} attempts {entry['attempts']}")
        for line in entry.get("log_lines", [])[:10]:
            print(f"    {line}")
    print(MARKDOWN_HEAD + markdown_row(report))
    print(f"JSON: {args.output}")
    if not report["verdict"]["ok"]:
        print("worker log lines on lost leases, back pressure and stretched leases:")
        for line in report["figures"].get("why_lines", []):
            print(f"    {line}")
        print("FAILED: " + ", ".join(c["name"] for c in report["verdict"]["checks"] if not c["ok"]))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
