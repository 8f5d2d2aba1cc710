"""Workflows: what a 10,000-step graph costs to enqueue, and how fast a chord fans in.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/workflows.py                     # 10,000 members, 2 workers, 3 repeats
    python bench/workflows.py --members 50 --repeats 1 --enqueue-repeats 1   # smoke, seconds
    python bench/workflows.py --workers 4 --pool thread --output /tmp/wf.json

What it does (issue 29):

1. **Server.** Without ``DATABASE_URL`` (or with ``--private-server``): a PostgreSQL of
   its own (``bench/pgserver.py``, ``production=True``: PostgreSQL's defaults, so
   ``fsync``, ``synchronous_commit``, ``full_page_writes`` and autovacuum on;
   ``pg_stat_statements`` loaded when Debian's binaries have it), deleted at exit. With
   ``DATABASE_URL``: that server (its database is only the admin connection; the
   machine's shared server may run with autovacuum off: the bench prints the settings).
   Either way the bench creates its own database, ``--db-name`` (default
   ``wf_bench_workflows``), marked with a comment, refuses to drop a database without
   that mark, and drops its own at exit unless ``--keep``. Django runs in this process
   on that database (the test project's settings through ``bench/shim.py``, ``DEBUG``
   off), migrated first.
2. **Enqueue** (no worker running), each shape ``--enqueue-repeats`` (3) times on an
   emptied job table: a chord of ``--members`` no-op members and a no-op callback
   (``chord(group(*members), callback).enqueue()``), a chain of ``--members`` steps
   (``chain(*steps).enqueue()``), and for reference the same number of plain jobs
   (``backend.bulk_enqueue``, one ``COPY``). Timed: the ``enqueue()`` call alone, wall
   clock (the canvas is built before). Counted: Django's ``CaptureQueriesContext`` (its
   ``execute()`` calls, plus the jobs' ``COPY`` that ``copy_jobs`` adds to the log) and,
   at the driver, every psycopg ``execute``, ``executemany``, ``copy`` and ``commit``,
   and the ``BEGIN`` psycopg sends itself (from Django's log): the round trips, by
   kind. Goal: one round trip per statement kind, whatever the number of steps.
3. **Drain**, ``--repeats`` (3) times, interleaved (plain, then chord): on an emptied
   table, ``--members`` plain no-op jobs, or the chord above, enqueued and
   ``VACUUM ANALYZE``d; then ``--workers`` (2) workers started at once by one
   ``runworker --processes N --pool P --concurrency C --no-scheduler`` (as
   ``bench/workers.py --launch forked`` starts them; ``--pool`` process, ``--concurrency``
   2), not ``--burst``; stopped (SIGTERM) once every job of the run has finished. From
   the database's own columns (its clock): the drain rate, jobs / (last ``finished_at`` -
   first ``started_at``) (the chord's over its members; also over every step, callback
   included), and the rate from spawn (the spawn's wall clock to the last
   ``finished_at``: same machine). The chord's **fan-in delay**: the callback's
   ``started_at`` - the last member's ``finished_at`` (the transaction that records the
   last member's success releases the callback; then a worker must claim it). Goal:
   under 1 s. While each drain runs, ``pg_stat_activity`` is sampled every
   ``--sample-ms`` (20 ms) for backends waiting on a lock (every member's completion
   batch locks the callback row to count it down), and with ``pg_stat_statements`` the
   statements that took the server's time are listed.
4. **Checks** (any failure exits 1): every job ``succeeded`` at attempt 1 with no attempt
   row, the drain finished within ``--timeout``, no worker died or logged an error.

Output: a line per measurement, then the tables and the verdicts; ``--output`` (also
``--json``; ``artifacts/bench/workflows.json``) holds all of it with every repeat, the
machine, the server and the commit; ``--markdown`` the tables. The settings shim and the
workers' logs (a temporary directory) are deleted unless a check failed or ``--keep``.
``--fail-on-miss``: exit 3 when a goal is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench workflows.py"
SHIM = "workflows_bench"
SETTINGS_MODULE, TASK_MODULE = f"{SHIM}_settings", f"{SHIM}_tasks"
FAN_IN_GOAL_S = 1.0
"""The callback of a chord starts within this many seconds of its last member's end."""
SHAPES = ("chord", "chain", "plain")
TABLES = (
    "leasejobs_dependency, leasejobs_fanin, leasejobs_attempt, leasejobs_job, leasejobs_workflow, "
    "leasejobs_worker"
)


# -- pure parts: options, statistics, verdicts, tables -----------------------------------


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--members", type=int, default=10000, help="chord members (10,000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker (2)")
    parser.add_argument("--pool", choices=("process", "thread"), default="process")
    parser.add_argument("--repeats", type=int, default=3, help="drains of each kind (3)")
    parser.add_argument("--enqueue-repeats", type=int, default=3, help="enqueues per shape")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="lock-wait sampling")
    add_server_options(parser)
    parser.add_argument("--db-name", default="wf_bench_workflows")
    parser.add_argument("--keep", action="store_true", help="keep the database (and server)")
    parser.add_argument(
        "--output",
        "--json",
        dest="output",
        type=Path,
        default=REPO_ROOT / "artifacts/bench/workflows.json",
        help="JSON report",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 3 on a missed goal")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name in ("members", "workers", "concurrency", "repeats", "enqueue_repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    return args


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def statement_kind(sql: Any) -> str:
    """A short name of a statement: its first words, its table for writes."""
    text = sql if isinstance(sql, str) else str(getattr(sql, "_obj", sql))
    words = " ".join(text.split()).replace('"', "").split(" ")
    head = words[0].upper() if words and words[0] else "?"
    if head in ("INSERT", "COPY", "UPDATE", "DELETE") and len(words) > 1:
        table = words[2] if head in ("INSERT", "DELETE") and len(words) > 2 else words[1]
        return f"{head} {table}"
    return " ".join(words[:2]).split("(", 1)[0]


def enqueue_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median time of one shape's enqueues; its round trips (the same in every run, or
    the largest)."""
    seconds = median([run["seconds"] for run in runs])
    steps = runs[0]["steps"]
    trips = max(runs, key=lambda run: run["round_trips"])
    return {
        "shape": runs[0]["shape"],
        "steps": steps,
        "runs": len(runs),
        "seconds": seconds,
        "steps_per_s": steps / seconds if seconds else None,
        "seconds_all": [run["seconds"] for run in runs],
        "django_queries": trips["django_queries"],
        "django_log": trips.get("django_log"),
        "round_trips": trips["round_trips"],
        "kinds": trips["kinds"],
    }


def drain_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    keys = ("rate", "rate_all", "rate_from_spawn", "fan_in_s", "lock_samples", "seconds")
    out: dict[str, Any] = {key: median([run.get(key) for run in runs]) for key in keys}
    out["fan_in_max_s"] = max(
        (run["fan_in_s"] for run in runs if run.get("fan_in_s") is not None), default=None
    )
    out["fan_in_all"] = [run.get("fan_in_s") for run in runs]
    out["rates"] = [run.get("rate") for run in runs]
    out["runs"] = len(runs)
    out["problems"] = sorted({p for run in runs for p in run.get("problems", [])})
    out["clean"] = not out["problems"]
    return out


def verdicts(
    enqueues: dict[str, dict[str, Any]], drains: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One line per goal: met, missed (with the figure) or not measured."""
    lines = []
    for shape in ("chord", "chain"):
        summary = enqueues.get(shape)
        if summary is None:
            lines.append(
                {
                    "goal": f"{shape} enqueue: one round trip per statement kind",
                    "value": None,
                    "verdict": "not measured",
                }
            )
            continue
        most = max(summary["kinds"].values(), default=0)
        lines.append(
            {
                "goal": f"{shape} enqueue: one round trip per statement kind",
                "value": f"{summary['round_trips']} round trips for {summary['steps']:,} steps, "
                f"at most {most} of a kind",
                "verdict": "met" if most == 1 else "missed",
            }
        )
    chord = drains.get("chord")
    worst = chord.get("fan_in_max_s") if chord else None
    if worst is None:
        lines.append(
            {
                "goal": f"fan-in delay < {FAN_IN_GOAL_S:g} s",
                "value": None,
                "verdict": "not measured",
            }
        )
    else:
        met = worst < FAN_IN_GOAL_S and bool(chord and chord["clean"])
        lines.append(
            {
                "goal": f"fan-in delay < {FAN_IN_GOAL_S:g} s",
                "value": f"{worst * 1000:,.0f} ms (worst of {chord['runs'] if chord else 0})",
                "verdict": "met" if met else "missed",
            }
        )
    return lines


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_tables(enqueues: dict[str, dict[str, Any]], drains: dict[str, dict[str, Any]]) -> str:
    out = [
        "| shape | steps | enqueue() (s, median) | steps/s | round trips | by kind |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for shape in SHAPES:
        e = enqueues.get(shape)
        if e is None:
            continue
        kinds = ", ".join(f"{k} x{n}" for k, n in e["kinds"].items())
        out.append(
            f"| {shape} | {e['steps']:,} | {_fmt(e['seconds'], 3)} | {_fmt(e['steps_per_s'])} "
            f"| {e['round_trips']} | {kinds} |"
        )
    out += [
        "",
        "| drain | jobs/s draining (median) | jobs/s, every step | jobs/s from spawn | "
        "fan-in delay, median / max (ms) | lock-wait samples | every job once |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind in ("plain", "chord"):
        d = drains.get(kind)
        if d is None:
            continue
        fan_in = (
            "-"
            if d["fan_in_s"] is None
            else f"{d['fan_in_s'] * 1000:,.0f} / {d['fan_in_max_s'] * 1000:,.0f}"
        )
        out.append(
            f"| {kind} | {_fmt(d['rate'])} | {_fmt(d['rate_all'])} | "
            f"{_fmt(d['rate_from_spawn'])} | {fan_in} | {_fmt(d['lock_samples'])} | "
            f"{'yes' if d['clean'] else 'NO'} |"
        )
    return "\n".join(out) + "\n"


# -- the measurement ----------------------------------------------------------------------


class RoundTrips:
    """Counts, by kind, the statements psycopg sends (``execute``, ``executemany``,
    ``copy``) and the commits, while it is entered: the round trips of the code inside."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> RoundTrips:
        import psycopg

        def wrap(name: str, original: Any) -> Any:
            def counted(this: Any, *args: Any, **kwargs: Any) -> Any:
                kind = "COMMIT" if name == "commit" else statement_kind(args[0] if args else "")
                self.kinds[kind] += 1
                return original(this, *args, **kwargs)

            return counted

        for cls, name in (
            (psycopg.Cursor, "execute"),
            (psycopg.Cursor, "executemany"),
            (psycopg.Cursor, "copy"),
            (psycopg.Connection, "commit"),
        ):
            original = cls.__dict__[name]
            self._saved.append((cls, name, original))
            setattr(cls, name, wrap(name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, original in self._saved:
            setattr(cls, name, original)
        self._saved = []

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


class LockSampler(threading.Thread):
    """Samples ``pg_stat_activity`` for backends of one database waiting on a lock."""

    def __init__(self, conninfo: str, database: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.database, self.interval = conninfo, database, interval
        self.stop_event = threading.Event()
        self.samples = 0
        self.lock_samples = 0
        self.events: Counter[str] = Counter()
        self.error: str | None = None

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    rows = conn.execute(
                        "SELECT wait_event || ': ' || left(regexp_replace(query, '\\s+', ' ', "
                        "'g'), 70) FROM pg_stat_activity "
                        "WHERE datname = %s AND wait_event_type = 'Lock'",
                        [self.database],
                    ).fetchall()
                    self.samples += 1
                    if rows:
                        self.lock_samples += 1
                    self.events.update(row[0] for row in rows)
                    self.stop_event.wait(self.interval)
        except Exception as exc:  # reported, never silent
            self.error = repr(exc)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


class Bench:
    """The measurement, with Django set up in this process (on the bench database)."""

    def __init__(self, args: argparse.Namespace, url: str, conninfo: str) -> None:
        self.args = args
        self.url = url
        self.conninfo = conninfo
        self.shim = Path(tempfile.mkdtemp(prefix="leasejobs-workflows-"))
        import shim  # (bench/, beside this script)

        shim.write(self.shim, SHIM)
        paths = [str(self.shim), str(REPO_ROOT / "testproject"), str(REPO_ROOT)]
        self.env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "DEBUG": "false",
            "PYTHONPATH": os.pathsep.join(paths),
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.statements = False
        os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE, DEBUG="false")
        for path in reversed(paths):
            sys.path.insert(0, path)

    def prepare(self) -> None:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        import importlib

        from django_leasejobs.compat import task_backends

        self.backend = task_backends["default"]
        self.noop = importlib.import_module(TASK_MODULE).noop
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

    def empty(self) -> None:
        self.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")

    def canvas(self, shape: str) -> Any:
        from django_leasejobs.workflows import chain, chord, group, step

        members = [step(self.noop) for _ in range(self.args.members)]
        if shape == "chord":
            return chord(group(*members), step(self.noop))
        return chain(*members)

    def enqueue(self, shape: str) -> tuple[dict[str, Any], int | None]:
        """Enqueue one shape on an emptied table; its figures and the last step's id."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        self.empty()
        canvas = self.canvas(shape) if shape != "plain" else None
        calls = [(self.noop, (), {})] * self.args.members
        last: int | None = None
        with CaptureQueriesContext(connection) as captured, RoundTrips() as trips:
            started = time.perf_counter()
            if canvas is not None:
                result = canvas.enqueue()
                last = int(result.steps[-1].id)
            else:
                self.backend.bulk_enqueue(calls)
            seconds = time.perf_counter() - started
        # psycopg opens the transaction with a BEGIN of its own (not through a cursor);
        # Django's log shows it.
        trips.kinds["BEGIN"] += sum(q["sql"] == "BEGIN" for q in captured.captured_queries)
        [(count,)] = self.execute("SELECT count(*) FROM leasejobs_job")
        steps = self.args.members + (1 if shape == "chord" else 0)
        problems = [] if count == steps else [f"{shape}: {count} rows for {steps} steps"]
        return (
            {
                "shape": shape,
                "steps": steps,
                "seconds": seconds,
                "django_queries": len(captured),
                "django_log": [" ".join(q["sql"].split())[:80] for q in captured.captured_queries],
                "round_trips": trips.total,
                "kinds": dict(trips.kinds),
                "problems": problems,
            },
            last,
        )

    def drain(self, kind: str) -> dict[str, Any]:
        """Enqueue ``kind`` (plain or chord), then drain it with the workers."""
        from pgserver import stop_workers

        args = self.args
        figures, callback = self.enqueue(kind)
        self.execute("VACUUM ANALYZE leasejobs_job")
        self.execute("VACUUM ANALYZE leasejobs_dependency")
        if self.statements:
            time.sleep(0.6)  # (statistics of the enqueue reach the server)
            self.execute("SELECT pg_stat_statements_reset()")
        problems: list[str] = list(figures["problems"])
        logdir = self.shim / f"logs-{kind}-{time.monotonic_ns()}"
        logdir.mkdir()
        sampler = LockSampler(self.conninfo, args.db_name, args.sample_ms / 1000)
        sampler.start()
        self.procs = []
        log = (logdir / "runworker.log").open("wb")
        spawned = time.time()
        try:
            self.procs.append(
                subprocess.Popen(
                    [
                        *(sys.executable, str(REPO_ROOT / "testproject" / "manage.py")),
                        *("runworker", "--no-scheduler", "--pool", args.pool),
                        *("--concurrency", str(args.concurrency)),
                        *("--processes", str(args.workers), "--worker-id", "wfb"),
                    ],
                    env=self.env,
                    cwd=str(REPO_ROOT),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            deadline = time.monotonic() + args.timeout
            while True:
                [(left,)] = self.execute(
                    "SELECT count(*) FROM leasejobs_job WHERE finished_at IS NULL"
                )
                if not left:
                    break
                if time.monotonic() > deadline:
                    problems.append(f"{kind}: {left} jobs left after {args.timeout:g}s ({logdir})")
                    break
                if any(proc.poll() is not None for proc in self.procs):
                    problems.append(f"{kind}: the workers exited during the drain ({logdir})")
                    break
                time.sleep(0.05)
            ended = time.time()
        finally:
            log.close()
            sampler.finish()
            stop_workers(self.procs)
            self.procs = []
        if sampler.error:
            problems.append(f"lock sampler: {sampler.error}")
        text = (logdir / "runworker.log").read_text(errors="replace")
        if "Traceback" in text or " ERROR " in text:
            problems.append(f"{kind}: an error in the workers' log (kept: {logdir})")
        [(total, good, attempts)] = self.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded' AND attempt = 1), "
            "(SELECT count(*) FROM leasejobs_attempt) FROM leasejobs_job"
        )
        if good != total or attempts:
            problems.append(
                f"{kind}: {total} jobs, {good} succeeded at attempt 1, {attempts} attempt rows"
            )
        member_filter = "" if callback is None else "WHERE id <> %s"
        [(members, first, last)] = self.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM min(started_at)), "
            f"EXTRACT(EPOCH FROM max(finished_at)) FROM leasejobs_job {member_filter}",
            [] if callback is None else [callback],
        )
        run: dict[str, Any] = {"kind": kind, "jobs": int(total), "seconds": ended - spawned}
        span = float(last) - float(first) if first is not None and last is not None else None
        run["rate"] = int(members) / span if span else None
        run["rate_all"] = run["rate"]
        run["rate_from_spawn"] = int(total) / (float(last) - spawned) if last is not None else None
        run["fan_in_s"] = None
        if callback is not None:
            [(cb_started, cb_finished)] = self.execute(
                "SELECT EXTRACT(EPOCH FROM started_at), EXTRACT(EPOCH FROM finished_at) "
                "FROM leasejobs_job WHERE id = %s",
                [callback],
            )
            if cb_started is not None and last is not None:
                run["fan_in_s"] = float(cb_started) - float(last)
            if cb_finished is not None and first is not None:
                run["rate_all"] = int(total) / (float(cb_finished) - float(first))
                run["rate_from_spawn"] = int(total) / (float(cb_finished) - spawned)
        run["lock_samples"] = sampler.lock_samples
        run["samples"] = sampler.samples
        run["lock_waits"] = dict(sampler.events.most_common(8))
        run["statements"] = self.statement_figures() if self.statements else None
        run["problems"] = problems
        return run

    def statement_figures(self) -> list[dict[str, Any]]:
        """The statements that took the server's time during a drain (pg_stat_statements)."""
        time.sleep(0.6)  # (the workers' last statistics reach the server)
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
                "mean_ms": float(total) / int(calls) if calls else None,
            }
            for q, calls, count, total in rows
        ]

    def stop(self) -> None:
        from pgserver import stop_workers

        stop_workers(self.procs)
        self.procs = []


def measure(bench: Bench) -> dict[str, Any]:
    args = bench.args
    enqueue_runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(args.enqueue_repeats):
        for shape in SHAPES:
            figures, _ = bench.enqueue(shape)
            enqueue_runs.setdefault(shape, []).append(figures)
            kinds = ", ".join(f"{k} x{n}" for k, n in figures["kinds"].items())
            print(
                f"[{repeat + 1}/{args.enqueue_repeats}] enqueue {shape:5} {figures['steps']:,} "
                f"steps: {figures['seconds']:.3f} s, {figures['round_trips']} round trips "
                f"({figures['django_queries']} in Django's log): {kinds}",
                flush=True,
            )
    drain_runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for kind in ("plain", "chord"):
            run = bench.drain(kind)
            drain_runs.setdefault(kind, []).append(run)
            fan_in = "" if run["fan_in_s"] is None else f", fan-in {run['fan_in_s'] * 1000:,.0f} ms"
            print(
                f"[{repeat + 1}/{args.repeats}] drain {kind:5} {run['jobs']:,} jobs: "
                f"{_fmt(run['rate'])} jobs/s draining, {_fmt(run['rate_from_spawn'])} from "
                f"spawn{fan_in}, lock-wait samples {run['lock_samples']}/{run['samples']} "
                + ("ok" if not run["problems"] else "PROBLEMS: " + "; ".join(run["problems"])),
                flush=True,
            )
    enqueues = {shape: enqueue_summary(runs) for shape, runs in enqueue_runs.items()}
    for shape, runs in enqueue_runs.items():
        enqueues[shape]["problems"] = sorted({p for run in runs for p in run["problems"]})
    drains = {kind: drain_summary(runs) for kind, runs in drain_runs.items()}
    return {"enqueues": enqueues, "drains": drains, "drain_runs": drain_runs}


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
        "load": os.getloadavg(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _statements_library() -> bool:
    """Whether the binaries bench/pgserver.py will pick have pg_stat_statements."""
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return bool(found) and (Path(found[-1]).parent.parent / "lib/pg_stat_statements.so").exists()


@contextlib.contextmanager
def server_for(args: argparse.Namespace) -> Iterator[tuple[str, dict[str, Any], str]]:
    """The admin URL, its Django config and a label: DATABASE_URL's server, or a private one."""
    from pgserver import PrivateServer, django_url_config

    url = os.environ.get("DATABASE_URL")
    if url and not args.private_server:
        config = django_url_config(url)
        if "postgres" not in config["ENGINE"]:
            raise SystemExit(f"bench/workflows.py needs PostgreSQL, DATABASE_URL is {url!r}")
        yield url, config, "DATABASE_URL's server"
        return
    settings = (
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "1000"}
        if _statements_library()
        else {}
    )
    server = PrivateServer(
        args.workers * (6 + args.concurrency) + 30,
        production=True,
        settings=settings,
        prefix="leasejobs-workflows-pg-",
    )
    try:
        yield server.url, django_url_config(server.url), "private (production settings)"
    finally:
        if args.keep:
            print(f"kept: server at {server.url} (data {server.base})")
        else:
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pgserver import connect_admin, create_database, drop_database, with_database
    from psycopg.conninfo import make_conninfo

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    bench: Bench | None = None
    with server_for(args) as (admin_url, config, server_label):
        with connect_admin(config) as admin:
            server = {
                name: admin.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("server_version", "fsync", "synchronous_commit", "autovacuum")
            }
            server["kind"] = server_label
            create_database(admin, args.db_name, MARK)
        print(
            f"PostgreSQL {server['server_version']}, {server_label}: fsync {server['fsync']}, "
            f"synchronous_commit {server['synchronous_commit']}, autovacuum "
            f"{server['autovacuum']}; database {args.db_name}; {args.members:,} members; "
            f"{args.workers} x {args.pool} workers (runworker --processes, concurrency "
            f"{args.concurrency}); load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        conninfo = {
            "dbname": args.db_name,
            "user": config.get("USER") or None,
            "password": config.get("PASSWORD") or None,
            "host": config.get("HOST") or None,
            "port": config.get("PORT") or None,
        }
        try:
            bench = Bench(
                args,
                with_database(admin_url, args.db_name),
                make_conninfo(**{k: v for k, v in conninfo.items() if v is not None}),
            )
            bench.prepare()
            measured = measure(bench)
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
                    drop_database(admin, args.db_name, MARK)
                    print(f"dropped {args.db_name}")
    enqueues, drains = measured["enqueues"], measured["drains"]
    lines = verdicts(enqueues, drains)
    problems = sorted(
        {p for e in enqueues.values() for p in e["problems"]}
        | {p for d in drains.values() for p in d["problems"]}
    )
    tables = markdown_tables(enqueues, drains)
    plain, chord = drains.get("plain"), drains.get("chord")
    ratio = (
        chord["rate"] / plain["rate"]
        if plain and chord and plain["rate"] and chord["rate"]
        else None
    )
    print()
    print(tables)
    if ratio is not None:
        print(f"chord members' drain rate / plain jobs': {ratio:.2f}x")
    for kind, runs in measured["drain_runs"].items():
        statements = runs[-1].get("statements")
        if statements:
            print(f"server time by statement, last {kind} drain (pg_stat_statements):")
            for s in statements[:6]:
                print(
                    f"  {s['ms']:9,.0f} ms {s['calls']:7,} calls {_fmt(s['mean_ms'], 3):>8} ms "
                    f"mean  {s['query'][:90]}"
                )
        waits = runs[-1].get("lock_waits")
        if waits:
            print(f"lock waits seen, last {kind} drain: {waits}")
    for line in lines:
        print(f"goal {line['goal']}: {line['verdict']} ({line['value'] or '-'})")
    report = {
        "machine": machine(),
        "server": server,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "enqueues": enqueues,
        "drains": drains,
        "chord_vs_plain": ratio,
        "verdicts": lines,
        "drain_runs": measured["drain_runs"],
        "problems": problems,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(tables)
    if problems or args.keep:
        print(f"kept: the settings shim and the workers' logs in {bench.shim}")
    else:
        shutil.rmtree(bench.shim, ignore_errors=True)
    if problems:
        print("PROBLEMS: " + "; ".join(problems))
        return 1
    if args.fail_on_miss and any(line["verdict"] == "missed" for line in lines):
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
