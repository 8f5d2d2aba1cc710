"""Sustained load: enqueue and drain at a steady rate for a long time, pruning on schedule.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/soak.py                          # 30 minutes at 200 jobs/s (the full run)
    python bench/soak.py --smoke                  # about a minute, low rate (CI)
    python bench/soak.py --duration 600 --rate 200 --output /tmp/soak.json --markdown /tmp/soak.md

What it does:

1. starts a PostgreSQL of its own (``bench/pgserver.py``, ``production=True``:
   PostgreSQL's own defaults, so fsync, full_page_writes, synchronous_commit and
   autovacuum are on, nothing tuned; never the shared server of the machine), creates a
   marked database in it and migrates it with ``testproject/manage.py``;
2. starts ``--workers`` ``runworker --pool process --concurrency N`` processes of the
   test project, each in its own session, and a feeder process (this script with
   ``--feed``) that enqueues the demo's no-op task ``demo.tasks.add`` through the
   backend's ``bulk_enqueue`` in small batches every 0.1 s, so that the rate is steady;
3. runs ``manage.py prune_jobs --older-than <--prune-age>`` every ``--prune-every``
   seconds (the first run after one period);
4. every ``--sample`` seconds reads, for the window since the last sample (window edges on
   the database clock, 2 s behind it so that jobs finishing in the window have committed):
   jobs finished per second, enqueue-to-start p50/p99 of the jobs started in the window
   (``started_at - enqueued_at``, both the database's clock), the size of the job and
   attempt tables (``pg_total_relation_size``, heap ``pg_relation_size``,
   ``pg_indexes_size``; each index of the job table in the JSON), ``n_live_tup`` /
   ``n_dead_tup`` and ``autovacuum_count`` / ``autoanalyze_count`` of
   ``pg_stat_user_tables``, and WAL bytes
   (``pg_current_wal_lsn()``) per job finished in the window; it prints a row per sample;
5. after ``--duration`` seconds stops the feeder, waits for the workers to drain the
   queue, checks that no job was lost or ran twice, prints the verdict, writes
   ``--output`` (JSON) and ``--markdown`` (a table for docs/benchmarks.md), then stops
   every process it started and deletes the server, also on Ctrl-C or an error.

PostgreSQL's table statistics (``pg_stat_user_tables``) reach the shared counters when
a backend reports them (at most once a second while busy, within 10 s when idle), so
``n_dead_tup`` and the autovacuum counts of a sample may lag by a few seconds; the
window figures (jobs, latencies, WAL) are exact.

Goals (issue 16) and how they are judged, over the feeding period of length D:

* throughput: jobs finished per second over the last five minutes within 10 % of the
  first five minutes (with ``--smoke``, or when D < 15 minutes: the first and the last
  fifth of D). Samples are whole windows; a window belongs to a period when it lies in it;
* enqueue-to-start p99: the p99 of every job started in the last period within 10 % of
  (at most 1.10 times) that of the first period. A p99 that got *lower* is met;
* table size flat once pruning starts: the largest ``pg_total_relation_size`` of
  ``leasejobs_job`` over the samples of the last third of D is at most 1.10 times the
  largest over the second third. Judged only when the first prune finished before the
  second third began (otherwise reported as not measurable).

Correctness, every mode: every enqueued job is either pruned (counted from
``prune_jobs``' output) or still in the table, and every job that finished did so as
``succeeded`` on attempt 1 with no attempt row (a job re-run after a lost lease has
attempt 2; the check runs per window, before pruning removes the rows).

Exit status: 1 on a lost, re-run or failed job, or when the machinery failed (a worker
or the feeder died, no sample, no prune ran, the queue did not drain); with ``--smoke``
the goals are printed but not judged. A missed goal of a full run is printed as
``MISSED`` with its figures and exits 0 (``--fail-on-miss``: 3), so that a long run
always ends with its report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench soak.py"
DB_NAME = "leasejobs_soak_bench"
LAG_SECONDS = 2.0
TICK = 0.1
TABLES = ("leasejobs_job", "leasejobs_attempt")

SMOKE = {
    "duration": 45.0,
    "rate": 30.0,
    "sample": 4.0,
    "prune_every": 4.0,
    "prune_age": 11.0,
}
FULL = {
    "duration": 1800.0,
    "rate": 200.0,
    "sample": 30.0,
    "prune_every": 60.0,
    "prune_age": 240.0,
}


# -- arguments -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="about a minute, low rate (CI)")
    parser.add_argument("--duration", type=float, help="seconds of feeding (full: 1800)")
    parser.add_argument("--rate", type=float, help="jobs enqueued per second (full: 200)")
    parser.add_argument("--workers", type=int, default=2, help="runworker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker")
    parser.add_argument("--sample", type=float, help="seconds between samples (full: 30)")
    parser.add_argument("--prune-every", type=float, help="seconds between prunes (full: 60)")
    parser.add_argument(
        "--prune-age", type=float, help="prune_jobs --older-than, seconds (full: 240)"
    )
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the markdown table here")
    parser.add_argument("--keep", action="store_true", help="keep the server and its data")
    parser.add_argument(
        "--fail-on-miss", action="store_true", help="exit 3 when a goal of a full run is missed"
    )
    parser.add_argument("--feed", action="store_true", help=argparse.SUPPRESS)  # the feeder
    args = parser.parse_args(argv)
    defaults = SMOKE if args.smoke else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    problem = argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def argument_problem(args: argparse.Namespace) -> str:
    """What is wrong with the options, or ``""``."""
    if args.duration <= 0:
        return "--duration must be positive"
    if args.rate <= 0 or args.rate > 10_000:
        return "--rate must be in (0, 10000]"
    if args.workers < 1 or args.concurrency < 1:
        return "--workers and --concurrency must be at least 1"
    if args.feed:
        return ""
    if args.sample < 1:
        return "--sample must be at least 1 second"
    if args.sample * 3 > args.duration:
        return "--sample must fit at least three times in --duration"
    if args.prune_every <= 0 or args.prune_age < 1:
        return "--prune-every must be positive and --prune-age at least 1 second"
    if args.prune_age < 2 * args.sample + LAG_SECONDS + 1:
        # A job must be counted in its window before pruning deletes its row.
        return "--prune-age must be at least 2 x --sample + 3 s (rows are read before pruning)"
    if args.prune_every + args.prune_age >= args.duration:
        return "--prune-every + --prune-age must be shorter than --duration: nothing is pruned"
    return ""


# -- the verdict (pure) --------------------------------------------------------------------


@dataclass
class Sample:
    """One window: ``t0``..``t1`` are seconds since the feed started (database clock)."""

    t0: float
    t1: float
    finished: int
    p50_ms: float | None
    p99_ms: float | None
    job_total: int
    job_heap: int
    job_indexes: int
    attempt_total: int
    attempt_heap: int
    attempt_indexes: int
    live: int
    dead: int
    autovacuum: int
    autoanalyze: int
    wal_bytes: int
    anomalies: int = 0
    job_index_sizes: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def per_second(self) -> float:
        return self.finished / (self.t1 - self.t0) if self.t1 > self.t0 else 0.0

    @property
    def wal_per_job(self) -> float | None:
        return self.wal_bytes / self.finished if self.finished else None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["latencies_ms"]
        data["per_second"] = round(self.per_second, 2)
        data["wal_per_job"] = None if self.wal_per_job is None else round(self.wal_per_job)
        return data


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` in 0..1), ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(round(fraction * len(ordered), 9)))
    return ordered[min(len(ordered), rank) - 1]


def within(sample: Sample, lo: float, hi: float) -> bool:
    """Whether the middle of the sample's window lies in ``lo``..``hi`` (``lo`` included)."""
    middle = (sample.t0 + sample.t1) / 2
    return lo <= middle < hi


def period_figures(samples: list[Sample], lo: float, hi: float) -> dict[str, Any]:
    """Throughput and p99 of the samples of the period ``lo``..``hi`` (``within``)."""
    inside = [s for s in samples if within(s, lo, hi)]
    seconds = sum(s.t1 - s.t0 for s in inside)
    latencies = [value for s in inside for value in s.latencies_ms]
    return {
        "from": lo,
        "to": hi,
        "samples": len(inside),
        "per_second": sum(s.finished for s in inside) / seconds if seconds else None,
        "p99_ms": percentile(latencies, 0.99),
    }


def periods(duration: float, smoke: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first and the last period the goals compare."""
    length = duration / 5 if smoke or duration < 900 else 300.0
    return (0.0, length), (duration - length, duration)


def verdict(
    samples: list[Sample], duration: float, first_prune_at: float | None, smoke: bool
) -> dict[str, Any]:
    """Each goal: ``met`` (True/False; None when not measurable), its figures, and why."""
    (a0, a1), (b0, b1) = periods(duration, smoke)
    first, last = period_figures(samples, a0, a1), period_figures(samples, b0, b1)
    goals: dict[str, Any] = {}

    def compare(name: str, key: str, good_if_higher: bool) -> None:
        before, after = first[key], last[key]
        if before is None or after is None or not before:
            goals[name] = {"met": None, "why": "no samples in one of the periods"}
            return
        change = (after - before) / before
        met = change >= -0.10 if good_if_higher else change <= 0.10
        goals[name] = {
            "met": met,
            "first": round(before, 2),
            "last": round(after, 2),
            "change_percent": round(change * 100, 1),
        }

    compare("throughput", "per_second", good_if_higher=True)
    # Throughput higher than at the start is no better: the feed rate bounds it, so a
    # drift either way beyond 10 % misses.
    if goals["throughput"]["met"] is not None:
        goals["throughput"]["met"] = abs(goals["throughput"]["change_percent"]) <= 10.0
    compare("p99", "p99_ms", good_if_higher=False)

    second = [s.job_total for s in samples if within(s, duration / 3, 2 * duration / 3)]
    third = [s.job_total for s in samples if within(s, 2 * duration / 3, duration + 1e9)]
    if first_prune_at is None or first_prune_at > duration / 3:
        goals["table_size"] = {"met": None, "why": "pruning had not started by a third of the run"}
    elif not second or not third:
        goals["table_size"] = {"met": None, "why": "no samples in the second or last third"}
    else:
        ratio = max(third) / max(second)
        goals["table_size"] = {
            "met": ratio <= 1.10,
            "max_second_third": max(second),
            "max_last_third": max(third),
            "ratio": round(ratio, 3),
        }
    return {"first_period": first, "last_period": last, "goals": goals}


def describe_goal(name: str, goal: dict[str, Any]) -> str:
    state = {True: "met", False: "MISSED", None: "not measurable"}[goal["met"]]
    if "why" in goal:
        return f"{name}: {state} ({goal['why']})"
    if name == "table_size":
        return (
            f"{name}: {state} (max {goal['max_last_third']:,} B in the last third vs "
            f"{goal['max_second_third']:,} B in the second: x{goal['ratio']})"
        )
    return (
        f"{name}: {state} (first {goal['first']}, last {goal['last']}, "
        f"{goal['change_percent']:+.1f} %)"
    )


# -- output --------------------------------------------------------------------------------

COLUMNS = (
    "t (s)",
    "jobs/s",
    "p50 ms",
    "p99 ms",
    "job total kB",
    "job heap kB",
    "job idx kB",
    "att. total kB",
    "live",
    "dead",
    "autovac",
    "autoanalyze",
    "WAL B/job",
)


def row_of(s: Sample) -> list[str]:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    return [
        f"{s.t1:.0f}",
        f"{s.per_second:.1f}",
        ms(s.p50_ms),
        ms(s.p99_ms),
        f"{s.job_total // 1024:,}",
        f"{s.job_heap // 1024:,}",
        f"{s.job_indexes // 1024:,}",
        f"{s.attempt_total // 1024:,}",
        f"{s.live:,}",
        f"{s.dead:,}",
        str(s.autovacuum),
        str(s.autoanalyze),
        "—" if s.wal_per_job is None else f"{s.wal_per_job:,.0f}",
    ]


def markdown_table(samples: list[Sample], every: int = 1) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---:" for _ in COLUMNS) + "|"]
    for index, s in enumerate(samples):
        if index % every == every - 1 or index == len(samples) - 1:
            lines.append("| " + " | ".join(row_of(s)) + " |")
    return "\n".join(lines) + "\n"


# -- the feeder (a process of its own, with Django) ----------------------------------------


def feed(args: argparse.Namespace) -> int:
    """Enqueue ``demo.tasks.add`` at ``--rate`` for ``--duration`` s; print the count."""
    sys.path.insert(0, str(REPO_ROOT / "testproject"))
    import django

    django.setup()
    from demo.tasks import add
    from django_leasejobs.compat import task_backends

    backend = task_backends["default"]
    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    sent = 0
    slowest = 0.0
    print("feeding", flush=True)  # the main process starts its clock on this line
    began = time.monotonic()
    while not stop:
        elapsed = time.monotonic() - began
        if elapsed >= args.duration:
            break
        due = int(args.rate * elapsed) + 1 - sent
        if due > 0:
            backend.bulk_enqueue([(add, (sent + n, 1), {}) for n in range(due)])
            sent += due
        late = time.monotonic() - began - elapsed
        slowest = max(slowest, late)
        next_tick = began + (int(elapsed / TICK) + 1) * TICK
        time.sleep(max(0.0, next_tick - time.monotonic()))
    elapsed = time.monotonic() - began
    print(
        json.dumps(
            {"enqueued": sent, "seconds": round(elapsed, 2), "slowest_tick": round(slowest, 3)}
        ),
        flush=True,
    )
    return 0


# -- the run -------------------------------------------------------------------------------


SAMPLE_SQL = """
WITH w AS (SELECT %(a)s::timestamptz AS a, %(b)s::timestamptz AS b)
SELECT
  (SELECT count(*) FROM leasejobs_job, w WHERE finished_at >= w.a AND finished_at < w.b),
  (SELECT count(*) FROM leasejobs_job, w WHERE finished_at >= w.a AND finished_at < w.b
     AND (status <> 'succeeded' OR attempt <> 1))
  + (SELECT count(*) FROM leasejobs_attempt, w WHERE finished_at >= w.a AND finished_at < w.b),
  (SELECT coalesce(array_agg(round(extract(epoch FROM started_at - enqueued_at) * 1000, 1)),
                   '{}')
     FROM leasejobs_job, w WHERE started_at >= w.a AND started_at < w.b)
"""

SIZES_SQL = """
SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid),
       pg_indexes_size(c.oid), coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       coalesce(s.autovacuum_count, 0), coalesce(s.autoanalyze_count, 0)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relname = ANY(%s) AND c.relkind = 'r'
"""


INDEX_SIZES_SQL = """
SELECT i.relname, pg_relation_size(i.oid)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = 'leasejobs_job'::regclass ORDER BY i.relname
"""


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="leasejobs-soak-"))
        self.samples: list[Sample] = []
        self.prunes: list[dict[str, Any]] = []
        self.pruned = 0
        self.problems: list[str] = []

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("ab")
        try:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def go(self, url: str, admin: Any) -> int:
        import psycopg
        from pgserver import create_database

        args = self.args
        manage = REPO_ROOT / "testproject" / "manage.py"
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            # This checkout's code, also when run from another worktree than the editable one.
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
        }
        create_database(admin, DB_NAME, MARK)
        subprocess.run([sys.executable, str(manage), "migrate", "-v0"], env=env, check=True)
        conn = psycopg.connect(url, autocommit=True)
        workers = []
        for index in range(args.workers):
            workers.append(
                self.spawn(
                    f"worker-{index}",
                    [
                        *(sys.executable, str(manage), "runworker", "--pool", "process"),
                        *("--concurrency", str(args.concurrency)),
                        *("--worker-id", f"soak-{index}", "--no-scheduler"),
                    ],
                    env,
                )
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            started = sum(
                "started: backend=" in self.log(f"worker-{i}") for i in range(len(workers))
            )
            if started == len(workers) or any(p.poll() is not None for p in workers):
                break
            time.sleep(0.3)
        if started != len(workers):
            self.problems.append(f"only {started} of {len(workers)} workers started")
            return 1
        print(
            f"{args.workers} workers x {args.concurrency} (process pool), {args.rate:g} jobs/s "
            f"for {args.duration:g} s, sample {args.sample:g} s, prune_jobs --older-than "
            f"{args.prune_age:g}s every {args.prune_every:g} s; logs {self.logdir}",
            flush=True,
        )
        feeder = self.spawn(
            "feeder",
            [
                *(sys.executable, str(Path(__file__).resolve()), "--feed"),
                *("--rate", str(args.rate), "--duration", str(args.duration)),
            ],
            env,
        )
        deadline = time.monotonic() + 60
        while "feeding" not in self.log("feeder"):
            if feeder.poll() is not None or time.monotonic() > deadline:
                self.problems.append(f"the feeder did not start: {self.log('feeder')[-800:]}")
                return 1
            time.sleep(0.02)
        (t_start,) = conn.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
        began = time.monotonic()
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
        edge = t_start
        print(" | ".join(COLUMNS), flush=True)
        next_sample = began + args.sample
        next_prune = began + args.prune_every
        prune: subprocess.Popen[bytes] | None = None
        prune_name = ""
        prune_started = 0.0
        first_prune_at: float | None = None
        end = began + args.duration
        while True:
            now = time.monotonic()
            if prune is not None and prune.poll() is not None:
                if not self.prune_done(prune, prune_name, prune_started - began, now - began):
                    return 1
                if first_prune_at is None and self.pruned:
                    first_prune_at = now - began
                prune = None
            if now >= next_prune and now < end:
                next_prune += args.prune_every
                if prune is None:
                    prune_started = now
                    prune_name = f"prune-{len(self.prunes) + 1}"
                    prune = self.spawn(
                        prune_name,
                        [
                            *(sys.executable, str(manage), "prune_jobs"),
                            *("--older-than", f"{args.prune_age:g}s"),
                        ],
                        env,
                    )
            if now >= next_sample:
                sample, lsn, edge = self.sample(conn, t_start, edge, lsn)
                self.samples.append(sample)
                print(" | ".join(row_of(sample)), flush=True)
                if next_sample >= end:  # the last sample is taken when the feed ends
                    break
                next_sample = min(next_sample + args.sample, end)
            if any(p.poll() is not None for p in workers):
                self.problems.append(f"a worker exited during the run (logs {self.logdir})")
                return 1
            if feeder.poll() is not None and now < end - 5:
                self.problems.append(f"the feeder exited early: {self.log('feeder')[-800:]}")
                return 1
            pause = min(next_sample, next_prune, end + 1) - time.monotonic()
            time.sleep(min(1.0, max(0.05, pause)))
        if prune is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                prune.wait(timeout=120)
            now = time.monotonic()
            if not self.prune_done(prune, prune_name, prune_started - began, now - began):
                return 1
            if first_prune_at is None and self.pruned:
                first_prune_at = now - began
        feeder.wait(timeout=60)
        fed = json.loads(self.log("feeder").strip().splitlines()[-1])
        enqueued = int(fed["enqueued"])
        # Drain: every job finished.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            (open_jobs,) = conn.execute(  # type: ignore[misc]
                "SELECT count(*) FROM leasejobs_job WHERE finished_at IS NULL"
            ).fetchone()
            if open_jobs == 0:
                break
            time.sleep(0.5)
        time.sleep(LAG_SECONDS + 0.5)
        tail, lsn, edge = self.sample(conn, t_start, edge, lsn)
        (left, bad, attempts) = conn.execute(  # type: ignore[misc]
            "SELECT count(*), count(*) FILTER (WHERE status <> 'succeeded' OR attempt <> 1), "
            "(SELECT count(*) FROM leasejobs_attempt) FROM leasejobs_job"
        ).fetchone()
        conn.close()
        anomalies = sum(s.anomalies for s in self.samples) + tail.anomalies
        checks = {
            "enqueued": enqueued,
            "fed_seconds": fed["seconds"],
            "slowest_feed_tick": fed.get("slowest_tick"),
            "pruned": self.pruned,
            "left_in_table": left,
            "lost": enqueued - self.pruned - left,
            "not_succeeded_first_attempt": bad,
            "attempt_rows": attempts,
            "window_anomalies": anomalies,
            "unfinished_after_drain": open_jobs,
        }
        self.checks = checks
        self.tail = tail
        self.first_prune_at = first_prune_at
        if checks["lost"] != 0:
            self.problems.append(f"{checks['lost']} jobs lost (or extra) of {enqueued}")
        if bad or attempts or anomalies:
            self.problems.append(
                f"jobs not succeeded on attempt 1: {bad} in the table, {attempts} attempt "
                f"rows, {anomalies} in the windows"
            )
        if open_jobs:
            self.problems.append(f"{open_jobs} jobs unfinished 120 s after the feed stopped")
        if not self.samples:
            self.problems.append("no samples")
        if not self.prunes or self.pruned == 0:
            self.problems.append("no prune_jobs run deleted anything")
        return 1 if self.problems else 0

    def prune_done(
        self, prune: subprocess.Popen[bytes], name: str, started: float, ended: float
    ) -> bool:
        text = self.log(name)
        found = re.search(r"pruned finished jobs count=(\d+)", text)
        if prune.returncode != 0 or not found:
            self.problems.append(f"{name} failed: {text[-500:]}")
            return False
        count = int(found.group(1))
        self.pruned += count
        self.prunes.append(
            {"at": round(started, 1), "seconds": round(ended - started, 2), "pruned": count}
        )
        return True

    def sample(
        self, conn: Any, t_start: datetime, edge: datetime, lsn: str
    ) -> tuple[Sample, str, datetime]:
        (new_edge, new_lsn, wal) = conn.execute(  # type: ignore[misc]
            "SELECT clock_timestamp() - make_interval(secs => %s), pg_current_wal_lsn(), "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)",
            [LAG_SECONDS, lsn],
        ).fetchone()
        if new_edge < t_start:
            new_edge = t_start
        finished, anomalies, latencies = conn.execute(
            SAMPLE_SQL, {"a": edge, "b": new_edge}
        ).fetchone()
        sizes = {row[0]: row[1:] for row in conn.execute(SIZES_SQL, [list(TABLES)])}
        indexes = dict(conn.execute(INDEX_SIZES_SQL).fetchall())
        job, att = sizes["leasejobs_job"], sizes["leasejobs_attempt"]
        values = [float(v) for v in latencies]
        sample = Sample(
            t0=round((edge - t_start).total_seconds(), 2),
            t1=round((new_edge - t_start).total_seconds(), 2),
            finished=int(finished),
            p50_ms=percentile(values, 0.50),
            p99_ms=percentile(values, 0.99),
            job_total=job[0],
            job_heap=job[1],
            job_indexes=job[2],
            attempt_total=att[0],
            attempt_heap=att[1],
            attempt_indexes=att[2],
            live=job[3],
            dead=job[4],
            autovacuum=job[5],
            autoanalyze=job[6],
            wal_bytes=int(wal),
            anomalies=int(anomalies),
            job_index_sizes={name: int(size) for name, size in indexes.items()},
            latencies_ms=values,
        )
        return sample, new_lsn, new_edge


def report(run: Run, args: argparse.Namespace, status: int, server_version: str) -> int:
    first_prune = getattr(run, "first_prune_at", None)
    judged = verdict(run.samples, args.duration, first_prune, args.smoke)
    print()
    print(
        f"prunes: {len(run.prunes)}, {run.pruned:,} jobs deleted; the first that deleted "
        f"any ended at {first_prune if first_prune is None else round(first_prune)} s"
    )
    print("checks:", json.dumps(getattr(run, "checks", {})))
    label = "goals (smoke: printed, not judged)" if args.smoke else "goals"
    print(f"{label}:")
    for name, goal in judged["goals"].items():
        print("  " + describe_goal(name, goal))
    for problem in run.problems:
        print(f"!! {problem}")
    missed = any(goal["met"] is False for goal in judged["goals"].values())
    if args.smoke:
        print("soak smoke:", "FAILED" if status else "ok")
    else:
        print("soak:", "FAILED" if status else ("goal MISSED" if missed else "every goal met"))
    result = {
        "settings": {
            k: getattr(args, k)
            for k in (
                "smoke",
                "duration",
                "rate",
                "workers",
                "concurrency",
                "sample",
                "prune_every",
                "prune_age",
            )
        },
        "server": {"version": server_version, "settings": "PostgreSQL defaults (production)"},
        "samples": [s.as_json() for s in run.samples],
        "prunes": run.prunes,
        "checks": getattr(run, "checks", {}),
        "verdict": {k: v for k, v in judged.items()},
        "problems": run.problems,
        "status": status,
    }
    if args.output:
        args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = markdown_table(
        run.samples, every=max(1, round(120 / args.sample)) if not args.smoke else 1
    )
    if args.markdown:
        args.markdown.write_text(table)
    if status == 0 and missed and args.fail_on_miss and not args.smoke:
        return 3
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.feed:
        return feed(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import psycopg
    from pgserver import PrivateServer, drop_database, stop_workers

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    server = PrivateServer(10 * args.workers + 40, production=True, prefix="leasejobs-soak-pg-")
    run = Run(args)
    status = 1
    version = ""
    try:
        admin_url = server.url
        from pgserver import with_database

        url = with_database(admin_url, DB_NAME)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            (version,) = admin.execute("SHOW server_version").fetchone()  # type: ignore[misc]
            try:
                status = run.go(url, admin)
            finally:
                stop_workers(run.procs)
                if not args.keep:
                    with contextlib.suppress(Exception):
                        drop_database(admin, DB_NAME, MARK)
        return report(run, args, status, version)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop_workers(run.procs)
        if args.keep:
            print(f"kept: server at {server.url} (data {server.base}), logs {run.logdir}")
        else:
            server.stop()
            if status == 0:
                shutil.rmtree(run.logdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
