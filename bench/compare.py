"""Side by side: django-leasejobs, django-tasks-db and django-ox, in one run, on one PostgreSQL.

Run it through ``scripts/bench`` (it makes ``.venv-bench`` with Python >= 3.12, the
project and the pinned peers), from the repository root::

    scripts/bench                 # every measurement, 3 interleaved rounds (15-30 minutes)
    scripts/bench --smoke         # tiny sizes, 1 round, everything end to end (~2 minutes)
    scripts/bench --only drain,latency --systems leasejobs,ox --rounds 5

The PostgreSQL server comes from ``DATABASE_URL`` (its database is used only as the admin
connection that creates the bench database) or, when ``DATABASE_URL`` is unset, a
throwaway embedded PostgreSQL. The bench creates its own database (``--db-name``,
default ``leasejobs_compare``) marked with a comment, recreates it on every run, refuses
to drop a database without that mark, and drops it at the end (``--keep-db`` keeps it).

Measurements (each round measures every system in turn; tables show medians of rounds):

1. enqueue: jobs/s of ``enqueue()`` one per transaction, and of each system's bulk path;
2. drain: 10,000 no-op jobs through four executors, from the COMMIT that makes them
   visible to idle, warmed-up workers until the last one finished;
3. latency: enqueue-to-start of jobs enqueued one by one to idle workers;
4. recovery: SIGKILL the worker running a job; seconds until the job starts again;
5. claim: the worker's own claim step, in-process, on an empty table and with
   1,000,000 finished rows;
6. memory: resident set size of the worker process, idle and after many jobs;
7. ceiling: this project against what the machine can do, in one interleaved loop: the
   Python floor (one psycopg 3 process that claims 64 jobs with ``SKIP LOCKED``, decodes
   their arguments, calls a no-op and completes the batch in one UPDATE) against this
   project's drain, and a bare psycopg ``INSERT ... RETURNING`` of the same row (one
   transaction each) against ``enqueue()``.

Targets are printed as met / NOT MET and never change the exit status: it is non-zero
only when something broke (a worker did not start, a drain timed out). See
bench/README.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

if TYPE_CHECKING:  # the bench's own virtualenv has these; the test suite imports helpers only
    from comparesite.systems import Fleet, System

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
DOCS_FILE = REPO_ROOT / "docs" / "benchmarks.md"
DOCS_START = "<!-- compare:start -->"
DOCS_END = "<!-- compare:end -->"
MARKER = "leasejobs-compare"  # database comment prefix: this database belongs to the bench

SYSTEM_KEYS = ("leasejobs", "tasksdb", "ox")
SYSTEM_NAMES = {"leasejobs": "django-leasejobs", "tasksdb": "django-tasks-db", "ox": "django-ox"}
MEASUREMENTS = ("enqueue", "drain", "latency", "recovery", "memory", "claim", "ceiling")

FULL_SIZES = {
    "rounds": 3,
    "jobs": 10_000,
    "latency_jobs": 200,
    "finished": 1_000_000,
    "claims": 1_000,
    "memory_jobs": 100_000,
    "recovery_cap": 120.0,
    "timeout": 600.0,
}
SMOKE_SIZES = {
    "rounds": 1,
    "jobs": 300,
    "latency_jobs": 20,
    "finished": 20_000,
    "claims": 100,
    "memory_jobs": 2_000,
    "recovery_cap": 15.0,
    "timeout": 120.0,
}

WARMUP_JOB_SECONDS = 0.0  # instant: each worker process keeps its own polling phase
SLEEPER_SECONDS = 3600.0  # the recovery job outlives the test; the bench kills its workers
CLAIM_WARMUP = 50  # untimed claims before the timed ones, per round
READY_TIMEOUT = 60.0  # a fleet must have run a warm-up job on every worker within this
FIRST_START_TIMEOUT = 30.0  # the recovery job must start within this
STOP_GRACE = 15.0  # SIGTERM, then SIGKILL after this
BULK_CHUNK = 10_000  # the memory run enqueues in chunks of this many jobs

# The targets for this project (checked against its process-pool rows).
TARGET_DRAIN_RATE = 3_000.0
TARGET_DRAIN_RATIO = 10.0
TARGET_SINGLE_VS_OX = 1.5
TARGET_BULK_RATE = 20_000.0
TARGET_LATENCY_P50_MS = 10.0
TARGET_LATENCY_P99_MS = 50.0
TARGET_CLAIM_GROWTH = 2.0
TARGET_IDLE_RSS_MB = 100.0
TARGET_RSS_GROWTH = 0.10
TARGET_DRAIN_VS_FLOOR = 0.33
TARGET_ENQUEUE_VS_INSERT = 0.8
FLOOR_BATCH = 64
PREPARED_ROW = "single enqueue(), prepare_threshold 5"
UNPREPARED_BARE_ROW = "bare INSERT, never prepared"


class BenchError(Exception):
    """Something broke (not a missed target): recorded, reported, and the exit status is 1."""


# -- pure helpers (the test suite imports these; stdlib only) --------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest value with ``fraction`` of them at or below it."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < fraction <= 1:
        raise ValueError("fraction must be in (0, 1]")
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def rotated(items: Sequence[Any], round_index: int) -> list[Any]:
    """``items`` starting at ``round_index`` (mod len): each round starts with another system."""
    if not items:
        return []
    shift = round_index % len(items)
    return [*items[shift:], *items[:shift]]


@dataclass(frozen=True)
class Target:
    """One of the issue's targets, with the measured value and the verdict."""

    text: str
    measured: str
    met: bool | None
    """None: not measured in this run (a measurement or system was left out, or failed)."""

    @property
    def verdict(self) -> str:
        return {True: "met", False: "NOT MET", None: "not measured"}[self.met]

    def line(self) -> str:
        return f"target: {self.text}: {self.measured} — {self.verdict}"


def at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def all_met(verdicts: Sequence[bool | None]) -> bool | None:
    """False if any verdict is False; None if any is missing (or there are none); else True."""
    if any(v is False for v in verdicts):
        return False
    if not verdicts or any(v is None for v in verdicts):
        return None
    return True


def replace_section(text: str, content: str, start: str = DOCS_START, end: str = DOCS_END) -> str:
    """``text`` with everything between the ``start`` and ``end`` markers replaced."""
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected exactly one {start!r} and one {end!r}")
    head, _, rest = text.partition(start)
    if end in head:
        raise ValueError(f"{end!r} comes before {start!r}")
    tail = rest.partition(end)[2]
    return f"{head}{start}\n{content.strip()}\n{end}{tail}"


POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "pgsql", "postgis"})


def parse_database_url(url: str) -> dict[str, Any]:
    """Django ``DATABASES`` keys from a PostgreSQL URL (the django-environ syntax).

    A Unix socket directory can be the host (``postgres://%2Frun%2Fpg/db``) or, as the
    embedded server writes it, the path before the database name
    (``postgres://user@:5432//tmp/socket/dir/db``). Query parameters become OPTIONS.
    """
    parts = urlsplit(url)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ValueError(f"not a PostgreSQL URL: {parts.scheme or url!r}")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    path = unquote(parts.path).removeprefix("/")
    if "/" in path:
        host, _, name = path.rpartition("/")
    else:
        name = path
    if not name:
        raise ValueError(f"no database name in {url!r}")
    return {
        "NAME": name,
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": unquote(host),
        "PORT": port,
        "OPTIONS": dict(parse_qsl(parts.query)),
    }


def masked_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for printing the command)."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***{at}{hostport}").geturl()


NUMERIC = re.compile(r"^[+-]?\d[\d,.]*(-\d[\d,.]*)?( ?(x|%|ms|s|MB))?$")
NOT_A_VALUE = frozenset({"", "—", "reference"})


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with padded columns (readable in a terminal too); numbers right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    right = [
        bool(rows) and all(NUMERIC.match(row[i]) for row in rows if row[i] not in NOT_A_VALUE)
        for i in range(len(headers))
    ]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(cells, widths, right, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = [
        ("-" * (w - 1) + ":") if align else "-" * w for w, align in zip(widths, right, strict=True)
    ]
    return "\n".join([line(headers), "| " + " | ".join(rule) + " |", *(line(r) for r in rows)])


def fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f} ms" if value < 10 else f"{value:,.1f} ms"


def fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def fmt_mb(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} MB"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def fmt_pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f} %"


# -- arguments -------------------------------------------------------------------------


def comma_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        items = [item.strip() for item in value.split(",") if item.strip()]
        unknown = sorted(set(items) - set(choices))
        if not items or unknown:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated subset of {', '.join(choices)}"
            )
        return [c for c in choices if c in items]

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure django-leasejobs against django-tasks-db and django-ox on one "
        "PostgreSQL (run it through scripts/bench).",
    )
    sizes = parser.add_argument_group("sizes (--smoke makes them tiny; an explicit value wins)")
    sizes.add_argument("--rounds", type=int, help="interleaved rounds (3)")
    sizes.add_argument("--jobs", type=int, help="jobs per enqueue test and per drain (10,000)")
    sizes.add_argument("--latency-jobs", type=int, help="jobs of the latency test (200)")
    sizes.add_argument(
        "--latency-pause", type=float, default=0.05, help="seconds between them (0.05)"
    )
    sizes.add_argument("--finished", type=int, help="finished rows for the claim test (1,000,000)")
    sizes.add_argument("--claims", type=int, help="timed claims per system and round (1,000)")
    sizes.add_argument(
        "--memory-jobs", type=int, help="jobs this project's worker runs for memory (100,000)"
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--recovery-cap",
        type=float,
        help="seconds to wait for a killed worker's job to start again (120)",
    )
    limits.add_argument(
        "--timeout", type=float, help="seconds any drain may take before the run fails (600)"
    )
    chosen = parser.add_argument_group("selection")
    chosen.add_argument(
        "--systems",
        type=comma_list(SYSTEM_KEYS),
        default=list(SYSTEM_KEYS),
        help="comma-separated subset of: " + ", ".join(SYSTEM_KEYS),
    )
    chosen.add_argument(
        "--only",
        type=comma_list(MEASUREMENTS),
        default=list(MEASUREMENTS),
        help="comma-separated subset of: " + ", ".join(MEASUREMENTS),
    )
    chosen.add_argument(
        "--smoke", action="store_true", help="tiny sizes and 1 round: checks that all runs"
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output",
        type=Path,
        default=REPO_ROOT / "artifacts" / "bench" / "compare.json",
        help="JSON file of every raw figure (artifacts/bench/compare.json)",
    )
    out.add_argument(
        "--write-docs",
        action="store_true",
        help="rewrite the generated section of docs/benchmarks.md (full runs only)",
    )
    db = parser.add_argument_group("database")
    db.add_argument(
        "--db-name",
        default="leasejobs_compare",
        help="the bench's own database (leasejobs_compare)",
    )
    db.add_argument("--keep-db", action="store_true", help="do not drop the bench database at exit")
    args = parser.parse_args(argv)

    defaults = SMOKE_SIZES if args.smoke else FULL_SIZES
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("rounds", "jobs", "latency_jobs", "claims", "memory_jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("finished", "latency_pause"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.recovery_cap <= 0 or args.timeout <= 0:
        parser.error("--recovery-cap and --timeout must be > 0")
    if args.write_docs and (
        args.smoke or args.systems != list(SYSTEM_KEYS) or args.only != list(MEASUREMENTS)
    ):
        parser.error("--write-docs needs a full run: every system and measurement, no --smoke")
    return args


# -- the database ----------------------------------------------------------------------


def server_settings() -> tuple[dict[str, Any], str]:
    """The server's ``DATABASES`` keys and a description: DATABASE_URL or an embedded server."""
    url = os.environ.get("DATABASE_URL")
    described = f"DATABASE_URL={masked_url(url)}" if url else "embedded PostgreSQL (throwaway)"
    if not url:
        sys.path.insert(0, str(REPO_ROOT / "testproject"))
        from testproject.embedded_db import ensure_database_url

        url = ensure_database_url(None, throwaway=True)
    try:
        return parse_database_url(url), described
    except ValueError as exc:
        raise SystemExit(f"bench/compare.py needs PostgreSQL: {exc}") from None


class CompareDatabase:
    """The bench's own database: created with a marking comment, dropped only if marked."""

    def __init__(self, server: dict[str, Any], name: str) -> None:
        import psycopg

        if server["NAME"] == name:
            raise SystemExit(
                f"DATABASE_URL names {name!r}, the bench's own database: point it at another "
                "database of the server or pick another --db-name"
            )
        self.name = name
        self.settings = {**server, "NAME": name}
        conninfo = {
            "dbname": server["NAME"],
            "user": server["USER"],
            "password": server["PASSWORD"],
            "host": server["HOST"],
            "port": server["PORT"],
        }
        self.admin = psycopg.connect(
            autocommit=True,
            **{k: v for k, v in conninfo.items() if v},
            **server["OPTIONS"],
        )

    def _comment(self) -> str | None:
        """The database's comment ('' when none); None when the database does not exist."""
        row = self.admin.execute(
            "SELECT coalesce(shobj_description(oid, 'pg_database'), '') "
            "FROM pg_database WHERE datname = %s",
            [self.name],
        ).fetchone()
        return None if row is None else str(row[0])

    def recreate(self) -> None:
        from psycopg import sql

        self.drop()
        self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        started = datetime.now(UTC).isoformat(timespec="seconds")
        self.admin.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(self.name), sql.Literal(f"{MARKER} bench/compare.py {started}")
            )
        )

    def drop(self) -> None:
        from psycopg import sql

        comment = self._comment()
        if comment is None:
            return
        if not comment.startswith(MARKER):  # never drop a database the bench did not create
            raise SystemExit(
                f"database {self.name!r} exists and was not created by bench/compare.py (its "
                f"comment does not start with {MARKER!r}); pick another --db-name"
            )
        self.admin.execute(
            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(self.name))
        )

    def close(self) -> None:
        self.admin.close()


def setup_django(settings: dict[str, Any]) -> None:
    """Configure this process (and, through the environment, every worker) for the bench."""
    os.environ["COMPARE_DATABASE"] = json.dumps(settings)
    os.environ["DJANGO_SETTINGS_MODULE"] = "comparesite.settings"
    os.environ.pop("COMPARE_LEASEJOBS_OPTIONS", None)
    paths = [str(BENCH_DIR), str(REPO_ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ["PYTHONUNBUFFERED"] = "1"
    for path in reversed(paths[:2]):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def sql(statement: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[Any]:
    """Run one statement on the bench's connection (autocommit); returns its rows, if any."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def truncate(systems: Sequence[System]) -> None:
    from django.db import connection

    tables = [connection.ops.quote_name(t) for s in systems for t in s.tables()]
    sql(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def vacuum_analyze(system: System) -> None:
    from django.db import connection

    for table in system.tables():
        sql(f"VACUUM ANALYZE {connection.ops.quote_name(table)}")


# -- worker processes ------------------------------------------------------------------


@dataclass
class RunningFleet:
    """The processes of one fleet, each in its own process group (``start_new_session``)."""

    system: System
    fleet: Fleet
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    @classmethod
    def start(cls, ctx: Context, system: System, fleet: Fleet) -> RunningFleet:
        env = {**os.environ, **fleet.env}
        procs, logs = [], []
        for index, command in enumerate(fleet.commands):
            ctx.log_serial += 1
            log = ctx.log_dir / f"{ctx.log_serial:03d}-{system.key}-{index}.log"
            log.write_text(f"$ python -m django {shlex.join(command)}\n")
            with log.open("ab") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "django", *command],
                        cwd=REPO_ROOT,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            logs.append(log)
        running = cls(system, fleet, procs, logs)
        ctx.running.append(running)
        return running

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                raise BenchError(
                    f"{self.system.name} worker exited with status {proc.returncode} "
                    f"({log}):\n{tail(log)}"
                )

    def owner_of(self, pid: int) -> subprocess.Popen[bytes] | None:
        """The started process that is ``pid`` or one of its ancestors."""
        import psutil

        try:
            family = {pid, *(p.pid for p in psutil.Process(pid).parents())}
        except psutil.Error:
            return None
        return next((proc for proc in self.procs if proc.pid in family), None)

    def rss(self) -> dict[str, Any]:
        """Memory in MB: RSS of the started processes (largest, and each), and the PSS sum
        of their descendants (job processes forked from the worker share pages with it, so
        their RSS would count those pages again)."""
        import psutil

        own, children = [], 0.0
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(proc.pid)
                own.append(process.memory_info().rss / 2**20)
                for child in process.children(recursive=True):
                    with contextlib.suppress(psutil.Error, AttributeError):
                        children += child.memory_full_info().pss / 2**20
        return {"parent": max(own, default=None), "each": own, "children_pss": children}

    def descendants(self) -> list[Any]:
        import psutil

        found = []
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                found += psutil.Process(proc.pid).children(recursive=True)
        return found

    def signal_groups(self, signum: int, procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
        for proc in procs or self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM every group and wait (SIGKILL after STOP_GRACE), or SIGKILL at once."""
        import psutil

        left_over = self.descendants()
        if not kill:
            self.signal_groups(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(0.05)
        self.signal_groups(signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        # Job processes (the process pool's slots) must go with their worker; make sure.
        _, alive = psutil.wait_procs(left_over, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def fleet_running(
    ctx: Context, system: System, fleet: Fleet, kill: bool = False
) -> Iterator[RunningFleet]:
    """Start ``fleet``, wait until every worker ran a warm-up job, stop it afterwards."""
    running = RunningFleet.start(ctx, system, fleet)
    try:
        warm_up(running)
        yield running
    finally:
        running.stop(kill=kill)
        ctx.running.remove(running)


def warm_up(running: RunningFleet) -> None:
    """Feed warm-up jobs until each worker process took one, then wait for all to finish.

    Start-up time (interpreter, Django, connections, forking the pool) is never measured.
    The jobs are instant: processes that poll (django-tasks-db's four) keep their own
    polling phase. Jobs that ended together would leave them polling in step.
    """
    system, task = running.system, running.system.task("warmup")
    deadline = time.monotonic() + READY_TIMEOUT
    while len(system.warmed_workers()) < running.fleet.claimers:
        running.check_alive()
        if system.counts(task).active == 0:
            for _ in range(running.fleet.claimers):
                system.enqueue(task, WARMUP_JOB_SECONDS)
        if time.monotonic() > deadline:
            raise BenchError(
                f"{system.name} ({running.fleet.label}): not every worker ran a warm-up job "
                f"within {READY_TIMEOUT:.0f} s; logs: {', '.join(map(str, running.logs))}"
            )
        time.sleep(0.1)
    wait_until_done(running, task, expected=None, deadline=deadline)


def wait_until_done(
    running: RunningFleet,
    task: Any,
    expected: int | None,
    deadline: float,
    started: float | None = None,
) -> float:
    """Poll until no job of ``task`` is active (and ``expected`` succeeded); returns the time.

    The poll interval grows with the elapsed time (1 % of it, 20-500 ms), so the end time
    is exact to about 1 % while a long drain is not slowed by counting queries.
    """
    system = running.system
    started = time.perf_counter() if started is None else started
    while True:
        counts = system.counts(task)
        now = time.perf_counter()
        if counts.failed:
            raise BenchError(f"{system.name}: {counts.failed} job(s) of {task.name} failed")
        if counts.active == 0 and (expected is None or counts.succeeded >= expected):
            return now
        running.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(
                f"{system.name} ({running.fleet.label}): {counts.active} job(s) of "
                f"{task.name} still active after the deadline ({counts.succeeded} done)"
            )
        time.sleep(min(max((now - started) / 100, 0.02), 0.5))


# -- the run's state -------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    systems: list[System]
    log_dir: Path
    marker_dir: Path
    raw: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    running: list[RunningFleet] = field(default_factory=list)
    log_serial: int = 0

    def system(self, key: str) -> System | None:
        return next((s for s in self.systems if s.key == key), None)

    def record(
        self, measurement: str, system: System, row: str, round_no: int, figures: dict[str, Any]
    ) -> None:
        rows = self.raw.setdefault(measurement, {})
        entry = rows.setdefault(
            f"{system.key}: {row}",
            {"system": system.key, "name": system.name, "row": row, "rounds": []},
        )
        entry["rounds"].append({"round": round_no, **figures})

    def rows(self, measurement: str) -> list[dict[str, Any]]:
        return list(self.raw.get(measurement, {}).values())

    def attempt(
        self,
        measurement: str,
        system: System,
        row: str,
        round_no: int,
        run: Callable[[], dict[str, Any]],
        describe: Callable[[dict[str, Any]], str],
        rounds: int | None = None,
    ) -> None:
        """Run one measurement of one row in one round; a BenchError is recorded, not raised."""
        label = f"[{measurement} {round_no}/{rounds or self.args.rounds}] {system.name}, {row}"
        print(f"  {label} ...", end="", flush=True)
        try:
            figures = run()
        except BenchError as exc:
            self.errors.append(
                {
                    "measurement": measurement,
                    "system": system.key,
                    "row": row,
                    "round": round_no,
                    "error": str(exc),
                }
            )
            print(f" FAILED\n!! {exc}", flush=True)
            return
        self.record(measurement, system, row, round_no, figures)
        print(f" {describe(figures)}", flush=True)


# -- 1. enqueue ------------------------------------------------------------------------


def measure_enqueue(ctx: Context) -> None:
    """jobs/s of ``task.enqueue()`` one per transaction (autocommit), then of the bulk path.

    Both include the COMMIT. Each test starts on an empty table; the jobs never run.
    """
    jobs = ctx.args.jobs
    for round_no in range(1, ctx.args.rounds + 1):
        for system in rotated(ctx.systems, round_no - 1):

            def run(system: System = system) -> dict[str, Any]:
                task = system.task("noop")
                truncate([system])
                started = time.perf_counter()
                for _ in range(jobs):
                    system.enqueue(task)
                single = jobs / (time.perf_counter() - started)
                truncate([system])
                started = time.perf_counter()
                system.bulk_enqueue(task, jobs)
                bulk = jobs / (time.perf_counter() - started)
                truncate([system])
                return {"jobs": jobs, "single_per_s": single, "bulk_per_s": bulk}

            ctx.attempt(
                "enqueue",
                system,
                "enqueue",
                round_no,
                run,
                lambda f: (
                    f"single {fmt_rate(f['single_per_s'])}/s, bulk {fmt_rate(f['bulk_per_s'])}/s"
                ),
            )


# -- 2. drain (and the peers' memory) --------------------------------------------------


def drain_once(ctx: Context, system: System, fleet: Fleet, jobs: int) -> dict[str, Any]:
    """Idle, warmed-up workers; ``jobs`` no-op jobs made visible by one COMMIT; time to the last.

    The jobs are stored through the system's bulk path inside one transaction (not
    timed); the clock starts just before that transaction's COMMIT and stops at the
    first poll that finds every job succeeded. RSS is read idle and after the drain.
    """
    from django.db import transaction

    truncate([system])
    task = system.task("noop")
    with fleet_running(ctx, system, fleet) as running:
        idle = running.rss()
        with transaction.atomic():
            system.bulk_enqueue(task, jobs)
            started = time.perf_counter()  # COMMIT next: the jobs become visible
        deadline = time.monotonic() + max(ctx.args.timeout, jobs / 50)
        finished = wait_until_done(running, task, jobs, deadline, started)
        time.sleep(0.5)
        after = running.rss()
    seconds = finished - started
    return {
        "jobs": jobs,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds,
        "rss_idle": idle,
        "rss_after": after,
    }


def measure_drain(ctx: Context) -> None:
    """Throughput of four executors per system (every way the system offers to get four)."""
    for round_no in range(1, ctx.args.rounds + 1):
        for system in rotated(ctx.systems, round_no - 1):
            for fleet in system.drain_fleets():
                ctx.attempt(
                    "drain",
                    system,
                    fleet.label,
                    round_no,
                    lambda s=system, f=fleet: drain_once(ctx, s, f, ctx.args.jobs),
                    lambda f: f"{fmt_rate(f['jobs_per_s'])} jobs/s ({f['seconds']:.1f} s)",
                )


# -- 3. latency ------------------------------------------------------------------------


def latency_once(ctx: Context, system: System, fleet: Fleet) -> dict[str, Any]:
    """Jobs enqueued one by one (a pause between) to idle workers; start minus enqueue time.

    The enqueue time is taken just before ``enqueue()`` is called; the task returns
    ``time.time()`` as its first statement.
    """
    truncate([system])
    task = system.task("stamp")
    sent: list[tuple[str, float]] = []
    with fleet_running(ctx, system, fleet) as running:
        for _ in range(ctx.args.latency_jobs):
            before = time.time()
            sent.append((system.enqueue(task), before))
            time.sleep(ctx.args.latency_pause)
        deadline = time.monotonic() + ctx.args.timeout
        wait_until_done(running, task, len(sent), deadline)
    samples = [(float(system.return_value(task, rid)) - before) * 1000 for rid, before in sent]
    return {
        "samples_ms": samples,
        "p50_ms": percentile(samples, 0.50),
        "p99_ms": percentile(samples, 0.99),
        "max_ms": max(samples),
    }


def measure_latency(ctx: Context) -> None:
    for round_no in range(1, ctx.args.rounds + 1):
        for system in rotated(ctx.systems, round_no - 1):
            fleet = system.drain_fleets()[0]
            ctx.attempt(
                "latency",
                system,
                fleet.label,
                round_no,
                lambda s=system, f=fleet: latency_once(ctx, s, f),
                lambda f: f"p50 {fmt_ms(f['p50_ms'])}, p99 {fmt_ms(f['p99_ms'])}",
            )


# -- 4. recovery -----------------------------------------------------------------------


def read_starts(marker: Path) -> list[tuple[float, int]]:
    """(time, pid) of each start of the sleeper job: complete lines of its marker file."""
    try:
        text = marker.read_text()
    except FileNotFoundError:
        return []
    complete = text[: text.rfind("\n") + 1]
    return [(float(t), int(pid)) for t, pid in (line.split() for line in complete.splitlines())]


def recovery_once(ctx: Context, system: System, fleet: Fleet, tag: str) -> dict[str, Any]:
    """Two workers; SIGKILL the process group of the one running a long job; time its restart.

    Recovery = the job's second start (written by the job itself) minus the kill time.
    Waits at most ``--recovery-cap`` seconds; ``seconds`` is None when it did not restart.
    """
    truncate([system])
    marker = ctx.marker_dir / f"{tag}.starts"
    with fleet_running(ctx, system, fleet, kill=True) as running:
        system.enqueue(system.task("sleeper"), str(marker), SLEEPER_SECONDS)
        deadline = time.monotonic() + FIRST_START_TIMEOUT
        while not read_starts(marker):
            running.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{system.name}: the job did not start within 30 s")
            time.sleep(0.02)
        _, first_pid = read_starts(marker)[0]
        victim = running.owner_of(first_pid)
        if victim is None:
            raise BenchError(f"{system.name}: no started worker runs pid {first_pid}")
        killed_at = time.time()
        running.signal_groups(signal.SIGKILL, [victim])
        survivors = [p for p in running.procs if p is not victim]
        while len(read_starts(marker)) < 2 and time.time() - killed_at < ctx.args.recovery_cap:
            if any(p.poll() is not None for p in survivors):
                raise BenchError(f"{system.name}: the surviving worker exited")
            time.sleep(0.02)
        starts = read_starts(marker)
        restarted_by = running.owner_of(starts[1][1]) if len(starts) > 1 else None
    if len(starts) < 2:
        return {"seconds": None, "cap": ctx.args.recovery_cap, "killed_pid": victim.pid}
    return {
        "seconds": starts[1][0] - killed_at,
        "cap": ctx.args.recovery_cap,
        "killed_pid": victim.pid,
        "restarted_on_survivor": restarted_by is not None and restarted_by is not victim,
    }


def measure_recovery(ctx: Context) -> None:
    """A row that did not recover within the cap is not tried again in later rounds."""
    given_up: set[str] = set()
    for round_no in range(1, ctx.args.rounds + 1):
        for system in rotated(ctx.systems, round_no - 1):
            for number, fleet in enumerate(system.recovery_fleets()):
                key = f"{system.key}: {fleet.label}"
                if key in given_up:
                    continue
                tag = f"{system.key}-{number}-round{round_no}"
                ctx.attempt(
                    "recovery",
                    system,
                    fleet.label,
                    round_no,
                    lambda s=system, f=fleet, t=tag: recovery_once(ctx, s, f, t),
                    lambda f: (
                        f"not recovered within {fmt_s(f['cap'])}"
                        if f["seconds"] is None
                        else f"job ran again after {f['seconds']:.2f} s"
                    ),
                )
                rounds = ctx.raw.get("recovery", {}).get(key, {}).get("rounds", [])
                if rounds and rounds[-1]["round"] == round_no and rounds[-1]["seconds"] is None:
                    given_up.add(key)


# -- 5. claim --------------------------------------------------------------------------


def claim_round(ctx: Context, system: System, finished_rows: int) -> dict[str, Any]:
    """Time the worker's claim step for one job, in this process, ``--claims`` times.

    The table holds the finished rows plus enough pending rows for every claim (stored
    through the bulk path, then ANALYZE); CLAIM_WARMUP untimed claims come first. The
    claimed rows are deleted afterwards and the table vacuumed, on both table sizes.
    """
    claims = ctx.args.claims
    system.bulk_enqueue(system.task("noop"), CLAIM_WARMUP + claims + 5)
    vacuum_analyze(system)
    claim = system.claimer()
    for _ in range(CLAIM_WARMUP):
        claim()
    samples = []
    for _ in range(claims):
        started = time.perf_counter()
        claimed = claim()
        samples.append((time.perf_counter() - started) * 1000)
        if not claimed:
            raise BenchError(f"{system.name}: the claim found no job (pending rows left)")
    system.delete_active()
    vacuum_analyze(system)
    return {
        "finished_rows": finished_rows,
        "samples_ms": samples,
        "p50_ms": percentile(samples, 0.50),
        "p99_ms": percentile(samples, 0.99),
    }


def measure_claim(ctx: Context) -> None:
    """Claims on an empty table, then with ``--finished`` finished rows in every table."""
    for phase, rows in (("empty table", 0), (f"{ctx.args.finished:,} finished rows", None)):
        truncate(ctx.systems)
        if rows is None:
            rows = ctx.args.finished
            for system in ctx.systems:
                started = time.perf_counter()
                system.fill_finished(rows)
                vacuum_analyze(system)
                print(
                    f"  filled {system.name}: {rows:,} finished rows in "
                    f"{time.perf_counter() - started:.1f} s",
                    flush=True,
                )
        for round_no in range(1, ctx.args.rounds + 1):
            for system in rotated(ctx.systems, round_no - 1):
                ctx.attempt(
                    "claim",
                    system,
                    phase,
                    round_no,
                    lambda s=system, n=rows: claim_round(ctx, s, n),
                    lambda f: f"p50 {fmt_ms(f['p50_ms'])}, p99 {fmt_ms(f['p99_ms'])}",
                )
    truncate(ctx.systems)


# -- 6. memory -------------------------------------------------------------------------


def memory_once(ctx: Context, system: System, fleet: Fleet) -> dict[str, Any]:
    """RSS of the worker process idle (after warm-up) and after ``--memory-jobs`` no-op jobs.

    The jobs are enqueued in bulk chunks of 10,000 while the worker runs.
    """
    truncate([system])
    task = system.task("noop")
    jobs = ctx.args.memory_jobs
    with fleet_running(ctx, system, fleet) as running:
        time.sleep(1)
        idle = running.rss()
        started = time.perf_counter()
        for offset in range(0, jobs, BULK_CHUNK):
            system.bulk_enqueue(task, min(BULK_CHUNK, jobs - offset))
        deadline = time.monotonic() + max(ctx.args.timeout, jobs / 50)
        finished = wait_until_done(running, task, jobs, deadline, started)
        time.sleep(1)
        after = running.rss()
    truncate([system])
    return {
        "jobs": jobs,
        "seconds": finished - started,
        "rss_idle": idle,
        "rss_after": after,
        "growth": ratio(after["parent"] - idle["parent"], idle["parent"]),
    }


def measure_memory(ctx: Context) -> None:
    """This project only: the peers' memory comes from the drain runs."""
    system = ctx.system("leasejobs")
    if system is None:
        return
    fleet = system.drain_fleets()[0]
    ctx.attempt(
        "memory",
        system,
        f"{fleet.label}, {ctx.args.memory_jobs:,} jobs",
        1,
        lambda: memory_once(ctx, system, fleet),
        lambda f: (
            f"RSS {fmt_mb(f['rss_idle']['parent'])} idle, "
            f"{fmt_mb(f['rss_after']['parent'])} after ({fmt_pct(f['growth'])})"
        ),
        rounds=1,  # once: memory growth is not a noisy figure worth three runs
    )


# -- 7. ceiling -------------------------------------------------------------------------

FLOOR_CLAIM = """
WITH picked AS (
    SELECT id FROM leasejobs_job
    WHERE status = 'pending' AND flow_group IS NULL AND backend = %s AND queue = %s
        AND run_after <= statement_timestamp()
    ORDER BY priority DESC, run_after, id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE leasejobs_job AS j SET status = 'running', attempt = j.attempt + 1, locked_by = 'floor',
    locked_until = statement_timestamp() + interval '30 seconds',
    started_at = statement_timestamp()
FROM picked WHERE j.id = picked.id RETURNING j.id, j.args, j.kwargs
"""
FLOOR_COMPLETE = """
UPDATE leasejobs_job SET status = 'succeeded', result = 'null'::jsonb,
    finished_at = statement_timestamp(), locked_by = NULL, locked_until = NULL
WHERE id = ANY(%s)
"""
BARE_INSERT = """
INSERT INTO leasejobs_job (backend, queue, task_path, args, kwargs, priority, max_attempts,
    max_stalls, status, attempt, stall_count, snoozes, last_worker, cancel_requested,
    progress_message, last_error, enqueued_at, run_after)
VALUES (%s, %s, %s, %s, %s, 0, 3, 3, 'pending', 0, 0, 0, '', FALSE, '', '',
    statement_timestamp(), statement_timestamp())
RETURNING id
"""


def _raw_connection() -> Any:
    """A plain psycopg 3 connection to the bench database (its defaults: server-side
    binding, statements prepared after five runs), in autocommit."""
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    wanted = ("dbname", "user", "password", "host", "port")
    return psycopg.connect(**{k: params[k] for k in wanted if params.get(k)}, autocommit=True)


def floor_drain(backend: str, queue: str) -> dict[str, Any]:
    """The Python floor (:func:`floor_drain_on`) on a connection of its own."""
    with _raw_connection() as conn:
        return floor_drain_on(conn, backend, queue)


def floor_drain_on(conn: Any, backend: str, queue: str) -> dict[str, Any]:
    """The Python floor: drain the pending jobs of ``queue`` in batches of ``FLOOR_BATCH``
    over ``conn`` (psycopg 3, autocommit), one claim and one completion per batch, each
    job's arguments decoded and a no-op called with them. bench/cost_model.py runs it
    too, on a connection whose server process it measures."""

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    done = 0
    started = time.perf_counter()
    while True:
        rows = conn.execute(FLOOR_CLAIM, [backend, queue, FLOOR_BATCH]).fetchall()
        if not rows:
            break
        for _job_id, args, kwargs in rows:  # jsonb: decoded by psycopg
            noop(*args, **kwargs)
        conn.execute(FLOOR_COMPLETE, [[row[0] for row in rows]])
        done += len(rows)
    seconds = time.perf_counter() - started
    return {"jobs": done, "seconds": seconds, "jobs_per_s": done / seconds if seconds else None}


def bare_inserts(
    backend: str, queue: str, task_path: str, jobs: int, *, prepared: bool = True
) -> dict[str, Any]:
    """A bare psycopg ``INSERT ... RETURNING`` of a no-op job's row, one transaction each;
    prepared after five runs (psycopg's default), or with ``prepared=False`` never
    (``prepare_threshold`` None: Django's default connection settings)."""
    with _raw_connection() as conn:
        if not prepared:
            conn.prepare_threshold = None
        started = time.perf_counter()
        for _ in range(jobs):
            conn.execute(BARE_INSERT, [backend, queue, task_path, "[]", "{}"]).fetchone()
        seconds = time.perf_counter() - started
    return {"jobs": jobs, "seconds": seconds, "per_s": jobs / seconds}


def single_enqueues(
    system: System, jobs: int, prepare_threshold: int | None = None
) -> dict[str, Any]:
    """``enqueue()`` one per transaction; with ``prepare_threshold``, on a connection that
    allows prepared statements (``DATABASES[...]["OPTIONS"]``, as a site on a direct
    connection may set it), reopened for the loop and back to the bench's settings after."""
    from django.db import connection

    task = system.task("noop")
    options = connection.settings_dict.setdefault("OPTIONS", {})
    before = options.get("prepare_threshold")
    if prepare_threshold is not None:
        options["prepare_threshold"] = prepare_threshold
        connection.close()
    try:
        started = time.perf_counter()
        for _ in range(jobs):
            system.enqueue(task)
        seconds = time.perf_counter() - started
    finally:
        if prepare_threshold is not None:
            options["prepare_threshold"] = before
            connection.close()
    return {"jobs": jobs, "seconds": seconds, "per_s": jobs / seconds}


def measure_ceiling(ctx: Context) -> None:
    """This project's drain and single enqueue beside the Python floor and a bare INSERT,
    round by round, the four in a rotating order (this project only)."""
    system = ctx.system("leasejobs")
    if system is None:
        print("  (leasejobs not among --systems: nothing to compare)")
        return
    task = system.task("noop")
    fleets = system.drain_fleets()
    jobs = ctx.args.jobs

    def floor() -> dict[str, Any]:
        truncate([system])
        system.bulk_enqueue(task, jobs)
        vacuum_analyze(system)
        figures = floor_drain(task.backend, task.queue_name)
        truncate([system])
        if figures["jobs"] != jobs:
            raise BenchError(f"the floor drained {figures['jobs']} of {jobs} jobs")
        return figures

    def bare(prepared: bool = True) -> dict[str, Any]:
        truncate([system])
        figures = bare_inserts(
            task.backend, task.queue_name, task.module_path, jobs, prepared=prepared
        )
        truncate([system])
        return figures

    def enqueue(prepare_threshold: int | None = None) -> dict[str, Any]:
        truncate([system])
        figures = single_enqueues(system, jobs, prepare_threshold)
        truncate([system])
        return figures

    steps: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], str]]] = [
        ("python floor drain", floor, lambda f: f"{fmt_rate(f['jobs_per_s'])} jobs/s"),
        ("bare INSERT", bare, lambda f: f"{fmt_rate(f['per_s'])}/s"),
        (UNPREPARED_BARE_ROW, lambda: bare(False), lambda f: f"{fmt_rate(f['per_s'])}/s"),
        ("single enqueue()", enqueue, lambda f: f"{fmt_rate(f['per_s'])}/s"),
        (PREPARED_ROW, lambda: enqueue(5), lambda f: f"{fmt_rate(f['per_s'])}/s"),
    ]
    for fleet in fleets:
        steps.append(
            (
                f"drain, {fleet.label}",
                lambda fleet=fleet: drain_once(ctx, system, fleet, jobs),
                lambda f: f"{fmt_rate(f['jobs_per_s'])} jobs/s ({f['seconds']:.1f} s)",
            )
        )
    for round_no in range(1, ctx.args.rounds + 1):
        for label, run_step, describe in rotated(steps, round_no - 1):
            ctx.attempt("ceiling", system, label, round_no, run_step, describe)


MEASURE: dict[str, Callable[[Context], None]] = {
    "enqueue": measure_enqueue,
    "drain": measure_drain,
    "latency": measure_latency,
    "recovery": measure_recovery,
    "memory": measure_memory,
    "claim": measure_claim,
    "ceiling": measure_ceiling,
}


# -- summaries -------------------------------------------------------------------------


@dataclass
class Section:
    """One printed table: what was measured, the rows, the targets, notes."""

    title: str
    method: str
    headers: list[str]
    rows: list[list[str]]
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self, level: str = "###") -> str:
        table = markdown_table(self.headers, self.rows)
        parts = [f"{level} {self.title}", "", self.method, "", table]
        if self.targets or self.notes:
            parts.append("")
        parts += [f"* {t.line()}" for t in self.targets]
        parts += [f"* {note}" for note in self.notes]
        return "\n".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "headers": self.headers,
            "rows": self.rows,
            "targets": [
                {"target": t.text, "measured": t.measured, "verdict": t.verdict}
                for t in self.targets
            ],
            "notes": self.notes,
        }


def med(row: dict[str, Any] | None, *path: str) -> float | None:
    """Median over the rounds of ``row`` of the figure at ``path`` (None values skipped)."""
    if row is None:
        return None
    values = []
    for record in row["rounds"]:
        value: Any = record
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float):
            values.append(float(value))
    return median(values)


def find_row(rows: list[dict[str, Any]], system: str, label: str | None = None) -> Any:
    return next(
        (r for r in rows if r["system"] == system and (label is None or r["row"] == label)),
        None,
    )


def lj_primary(ctx: Context) -> str | None:
    """Label of this project's process-pool fleet (its targets are checked on it)."""
    system = ctx.system("leasejobs")
    return system.drain_fleets()[0].label if system else None


def summarize_enqueue(ctx: Context) -> Section:
    rows = ctx.rows("enqueue")
    lj = find_row(rows, "leasejobs")
    lj_single, lj_bulk = med(lj, "single_per_s"), med(lj, "bulk_per_s")
    table = []
    for row in rows:
        system = ctx.system(row["system"])
        single, bulk = med(row, "single_per_s"), med(row, "bulk_per_s")
        own = row["system"] == "leasejobs"
        table.append(
            [
                row["name"],
                fmt_rate(single),
                "—" if own else fmt_ratio(ratio(lj_single, single)),
                fmt_rate(bulk),
                "—" if own else fmt_ratio(ratio(lj_bulk, bulk)),
                system.bulk_path if system else "",
            ]
        )
    ox_single = med(find_row(rows, "ox"), "single_per_s")
    vs_ox = ratio(lj_single, ox_single)
    return Section(
        "Enqueue rate",
        f"{ctx.args.jobs:,} no-op jobs per test, on an empty table; median of "
        f"{ctx.args.rounds} round(s). Single: one `task.enqueue()` per transaction "
        "(autocommit). Bulk: the system's bulk path, one transaction. Both include the COMMIT.",
        [
            "system",
            "single, jobs/s",
            "leasejobs ÷ system",
            "bulk, jobs/s",
            "leasejobs ÷ system",
            "bulk path",
        ],
        table,
        targets=[
            Target(
                f"single enqueue ≥ {TARGET_SINGLE_VS_OX}x django-ox",
                fmt_ratio(vs_ox),
                at_least(vs_ox, TARGET_SINGLE_VS_OX),
            ),
            Target(
                f"bulk enqueue ≥ {TARGET_BULK_RATE:,.0f} jobs/s",
                f"{fmt_rate(lj_bulk)} jobs/s",
                at_least(lj_bulk, TARGET_BULK_RATE),
            ),
        ],
    )


def summarize_drain(ctx: Context) -> Section:
    rows = ctx.rows("drain")
    reference = find_row(rows, "leasejobs", lj_primary(ctx))
    lj_rate = med(reference, "jobs_per_s")
    table, ratios = [], []
    for row in rows:
        rate = med(row, "jobs_per_s")
        values = [r["jobs_per_s"] for r in row["rounds"]]
        own = row["system"] == "leasejobs"
        if not own:
            ratios.append((row, ratio(lj_rate, rate)))
        table.append(
            [
                row["name"],
                row["row"],
                fmt_rate(rate),
                f"{fmt_rate(min(values))}-{fmt_rate(max(values))}",
                "reference" if row is reference else fmt_ratio(ratio(lj_rate, rate)),
                fmt_s(med(row, "seconds")),
            ]
        )
    peers = ", ".join(f"{fmt_ratio(r)} {row['name']} ({row['row']})" for row, r in ratios)
    peer_verdicts = [at_least(r, TARGET_DRAIN_RATIO) for _, r in ratios]
    return Section(
        "Drain throughput, four executors",
        f"{ctx.args.jobs:,} no-op jobs; workers started first and warmed up (every worker "
        "process ran a job); the jobs are stored in one transaction and the clock runs from "
        "its COMMIT to the first poll that finds all of them succeeded. Median of "
        f"{ctx.args.rounds} round(s).",
        ["system", "executors", "jobs/s", "range", "leasejobs ÷ row", "time"],
        table,
        targets=[
            Target(
                f"drain ≥ {TARGET_DRAIN_RATE:,.0f} jobs/s with the process pool",
                f"{fmt_rate(lj_rate)} jobs/s",
                at_least(lj_rate, TARGET_DRAIN_RATE),
            ),
            Target(
                f"drain ≥ {TARGET_DRAIN_RATIO:.0f}x each peer (process pool)",
                peers or "no peer measured",
                all_met(peer_verdicts) if ratios else None,
            ),
        ],
    )


def summarize_latency(ctx: Context) -> Section:
    rows = ctx.rows("latency")
    lj = find_row(rows, "leasejobs")
    lj_p50, lj_p99 = med(lj, "p50_ms"), med(lj, "p99_ms")
    table = []
    for row in rows:
        p50, p99 = med(row, "p50_ms"), med(row, "p99_ms")
        own = row["system"] == "leasejobs"
        table.append(
            [
                row["name"],
                row["row"],
                fmt_ms(p50),
                fmt_ms(p99),
                fmt_ms(med(row, "max_ms")),
                "—" if own else fmt_ratio(ratio(p50, lj_p50)),
                "—" if own else fmt_ratio(ratio(p99, lj_p99)),
            ]
        )
    return Section(
        "Enqueue → start latency, idle workers",
        f"{ctx.args.latency_jobs} jobs enqueued one by one, {ctx.args.latency_pause * 1000:.0f} "
        "ms apart, to idle warmed-up workers; latency = the task's first `time.time()` minus "
        "the time just before `enqueue()`. Each system with its default polling; p50/p99 per "
        f"round, median of {ctx.args.rounds} round(s).",
        ["system", "executors", "p50", "p99", "max", "system ÷ leasejobs, p50", "… p99"],
        table,
        targets=[
            Target(
                f"p50 ≤ {TARGET_LATENCY_P50_MS:.0f} ms",
                fmt_ms(lj_p50),
                at_most(lj_p50, TARGET_LATENCY_P50_MS),
            ),
            Target(
                f"p99 ≤ {TARGET_LATENCY_P99_MS:.0f} ms",
                fmt_ms(lj_p99),
                at_most(lj_p99, TARGET_LATENCY_P99_MS),
            ),
        ],
    )


def recovery_cell(row: dict[str, Any]) -> str:
    recovered = [r["seconds"] for r in row["rounds"] if r["seconds"] is not None]
    if len(recovered) == len(row["rounds"]):
        return fmt_s(median(recovered))
    cap = row["rounds"][0]["cap"]
    if not recovered:
        return f"not recovered within {cap:.0f} s"
    missed = len(row["rounds"]) - len(recovered)
    return f"{fmt_s(median(recovered))} ({missed} not within {cap:.0f} s)"


def summarize_recovery(ctx: Context) -> Section:
    table = []
    for row in ctx.rows("recovery"):
        system = ctx.system(row["system"])
        fleets = {f.label: f for f in system.recovery_fleets()} if system else {}
        fleet = fleets.get(row["row"])
        values = ", ".join(
            "—" if r["seconds"] is None else f"{r['seconds']:.1f}" for r in row["rounds"]
        )
        table.append(
            [
                row["name"],
                row["row"],
                recovery_cell(row),
                values,
                fleet.bound if fleet else "",
            ]
        )
    notes = [f"{SYSTEM_NAMES[s.key]}: {s.recovery}." for s in ctx.systems if ctx.rows("recovery")]
    notes.append(
        "A row that did not recover within the cap in one round is not tried again in later "
        "rounds (each try costs the whole cap)."
    )
    return Section(
        "Recovery after SIGKILL",
        "Two workers per system (the same executors as above); a job that sleeps starts on "
        "one of them, the bench SIGKILLs that worker's process group and waits for the job "
        f"to start again (cap {ctx.args.recovery_cap:.0f} s). Time = second start minus "
        "the kill, both written by the processes themselves.",
        ["system", "workers and timings", "recovery", "per round (s)", "bound by configuration"],
        table,
        notes=notes,
    )


def summarize_claim(ctx: Context) -> Section:
    rows = ctx.rows("claim")
    full = f"{ctx.args.finished:,} finished rows"
    table, lj_growth = [], None
    for system in ctx.systems:
        empty = find_row(rows, system.key, "empty table")
        filled = find_row(rows, system.key, full)
        empty_p99, filled_p99 = med(empty, "p99_ms"), med(filled, "p99_ms")
        growth = ratio(filled_p99, empty_p99)
        if system.key == "leasejobs":
            lj_growth = growth
        if empty is None and filled is None:
            continue
        table.append(
            [
                system.name,
                fmt_ms(med(empty, "p50_ms")),
                fmt_ms(empty_p99),
                fmt_ms(med(filled, "p50_ms")),
                fmt_ms(filled_p99),
                fmt_ratio(growth),
                system.claim_step,
            ]
        )
    return Section(
        "Claim latency: empty table vs a big history",
        f"The worker's own claim step for one job, called in the bench process over one open "
        f"connection, {ctx.args.claims:,} timed claims per round (after {CLAIM_WARMUP} "
        "untimed), on a table holding only pending rows and then also "
        f"{ctx.args.finished:,} finished rows (`INSERT ... SELECT generate_series`, `VACUUM "
        f"ANALYZE`). Median of {ctx.args.rounds} round(s).",
        ["system", "empty p50", "empty p99", "big p50", "big p99", "big ÷ empty (p99)", "claim"],
        table,
        targets=[
            Target(
                f"claim p99 with {ctx.args.finished:,} finished rows within "
                f"{TARGET_CLAIM_GROWTH:.0f}x of the empty table",
                fmt_ratio(lj_growth),
                at_most(lj_growth, TARGET_CLAIM_GROWTH),
            )
        ],
    )


def summarize_memory(ctx: Context) -> Section:
    table = []
    lj_idle = lj_growth = None
    memory = ctx.rows("memory")
    if memory:
        row = memory[0]
        lj_idle, lj_growth = med(row, "rss_idle", "parent"), med(row, "growth")
        table.append(memory_row(row, "rss_idle", "rss_after", ctx.args.memory_jobs))
    drains = ctx.rows("drain")
    for system in ctx.systems:
        primary = find_row(drains, system.key, system.drain_fleets()[0].label)
        if primary is not None:
            table.append(memory_row(primary, "rss_idle", "rss_after", ctx.args.jobs))
    return Section(
        "Worker memory (RSS)",
        "Resident set size (psutil) of the worker process the bench started: idle after the "
        "warm-up, and after the jobs (0.5-1 s after the last one). django-tasks-db: the "
        "largest of its 4 processes. The last column is the proportional set size (PSS) of "
        "the process pool's job processes, summed.",
        ["system", "run", "idle", "after", "growth", "job processes (PSS, after)"],
        table,
        targets=[
            Target(
                f"parent RSS ≤ {TARGET_IDLE_RSS_MB:.0f} MB idle",
                fmt_mb(lj_idle),
                at_most(lj_idle, TARGET_IDLE_RSS_MB),
            ),
            Target(
                f"growth < {TARGET_RSS_GROWTH * 100:.0f} % over {ctx.args.memory_jobs:,} jobs",
                fmt_pct(lj_growth),
                None if lj_growth is None else lj_growth < TARGET_RSS_GROWTH,
            ),
        ],
    )


def memory_row(row: dict[str, Any], idle_key: str, after_key: str, jobs: int) -> list[str]:
    idle, after = med(row, idle_key, "parent"), med(row, after_key, "parent")
    children = med(row, after_key, "children_pss")
    return [
        row["name"],
        f"{row['row'].split(',')[0]}, {jobs:,} jobs",
        fmt_mb(idle),
        fmt_mb(after),
        fmt_pct(ratio(None if after is None or idle is None else after - idle, idle)),
        fmt_mb(children) if children else "—",
    ]


def summarize_ceiling(ctx: Context) -> Section:
    rows = ctx.rows("ceiling")
    floor = med(find_row(rows, "leasejobs", "python floor drain"), "jobs_per_s")
    bare = med(find_row(rows, "leasejobs", "bare INSERT"), "per_s")
    unprepared = med(find_row(rows, "leasejobs", UNPREPARED_BARE_ROW), "per_s")
    single = med(find_row(rows, "leasejobs", "single enqueue()"), "per_s")
    prepared = med(find_row(rows, "leasejobs", PREPARED_ROW), "per_s")
    table = [
        ["Python floor: claim 64, decode, no-op, complete 64", fmt_rate(floor), "reference"],
    ]
    drains = {}
    for row in rows:
        if row["row"].startswith("drain, "):
            rate = med(row, "jobs_per_s")
            drains[row["row"]] = rate
            table.append([row["row"], fmt_rate(rate), fmt_ratio(ratio(rate, floor))])
    # Each enqueue beside the bare INSERT on the same connection settings: Django's
    # defaults (never prepared; issue 32's goal), then prepared statements allowed.
    table += [
        [
            "bare psycopg INSERT ... RETURNING, never prepared (Django's default settings)",
            fmt_rate(unprepared),
            "reference",
        ],
        [
            "single `enqueue()`, one transaction each (Django's default settings)",
            fmt_rate(single),
            fmt_ratio(ratio(single, unprepared)),
        ],
        [
            "bare psycopg INSERT ... RETURNING, prepared after 5 runs (psycopg's default)",
            fmt_rate(bare),
            "reference",
        ],
        [
            "single `enqueue()`, the alias's `prepare_threshold` 5 (prepared statements allowed)",
            fmt_rate(prepared),
            fmt_ratio(ratio(prepared, bare)),
        ],
    ]
    primary = f"drain, {lj_primary(ctx)}"
    drain_ratio = ratio(drains.get(primary), floor)
    enqueue_ratio = ratio(single, unprepared)
    return Section(
        "Ceiling: this project against the machine",
        f"{ctx.args.jobs:,} no-op jobs per step; the steps of a round in a rotating order, "
        f"median of {ctx.args.rounds} round(s). The Python floor is one process with psycopg 3 "
        f"(its defaults): claim {FLOOR_BATCH} jobs with `FOR UPDATE SKIP LOCKED`, decode their "
        "arguments, call a no-op with them, complete the batch in one UPDATE, until none is "
        "left. The bare INSERT writes the same row `enqueue()` writes, with the same indexes, "
        "in autocommit. The drains are those of the drain measurement (one warmed-up worker, "
        "four executors, clock from the COMMIT).",
        ["what", "jobs/s", "÷ its reference"],
        table,
        targets=[
            Target(
                f"drain (process pool) ≥ {TARGET_DRAIN_VS_FLOOR}x the Python floor",
                fmt_ratio(drain_ratio),
                at_least(drain_ratio, TARGET_DRAIN_VS_FLOOR),
            ),
            Target(
                f"single enqueue ≥ {TARGET_ENQUEUE_VS_INSERT}x the bare INSERT, both on "
                "Django's default connection settings",
                fmt_ratio(enqueue_ratio),
                at_least(enqueue_ratio, TARGET_ENQUEUE_VS_INSERT),
            ),
        ],
        notes=[
            "Django's defaults turn prepared statements off (for connection poolers); psycopg's "
            "prepare a statement after its fifth run. Against the prepared bare INSERT, "
            f"`enqueue()` on Django's defaults does {fmt_ratio(ratio(single, bare))}, and the "
            f"bare INSERT never prepared {fmt_ratio(ratio(unprepared, bare))}: the server parses "
            "and plans every statement that is not prepared.",
        ],
    )


SUMMARIZE: dict[str, Callable[[Context], Section]] = {
    "enqueue": summarize_enqueue,
    "drain": summarize_drain,
    "latency": summarize_latency,
    "recovery": summarize_recovery,
    "memory": summarize_memory,
    "claim": summarize_claim,
    "ceiling": summarize_ceiling,
}


# -- facts and reports -----------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def os_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                name = line.partition("=")[2].strip('"')
                return f"{name}, {platform.system()} {platform.release()}"
    return platform.platform()


def git_commit() -> str:
    """This checkout's commit, and whether the engine (django_leasejobs/) differs from it."""

    def git(*arguments: str) -> str:
        return subprocess.run(
            ["git", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", "django_leasejobs")
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {commit}" + (" + uncommitted changes in django_leasejobs/" if changed else "")


def engine_fingerprint() -> str:
    """A hash of the engine's source (django_leasejobs/): workers started later in a run
    import whatever is on disk then, so a change during the run mixes versions."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "django_leasejobs").rglob("*.py")):
        digest.update(str(path.relative_to(REPO_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def facts(ctx: Context, server: str, command: str, started: datetime) -> dict[str, str]:
    import django
    import psutil
    import psycopg

    settings = {
        name: sql(f"SHOW {name}")[0][0]
        for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers")
    }
    version = settings.pop("server_version")
    systems = ", ".join(
        f"{s.name} {s.version}" + (f" ({git_commit()})" if s.key == "leasejobs" else "")
        for s in ctx.systems
    )
    return {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "CPU": f"{cpu_model()}, {os.cpu_count()} cores",
        "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GB",
        "OS": os_name(),
        "Python / Django / psycopg": (
            f"{platform.python_version()} / {django.get_version()} / {psycopg.__version__}"
        ),
        "PostgreSQL": f"{version}, {server} ("
        + ", ".join(f"{k}={v}" for k, v in settings.items())
        + ")",
        "systems": systems,
        "load average": f"{load_average()} at the start",
    }


def executors_lines(ctx: Context) -> list[str]:
    return [f"{s.name}: {s.executors}" for s in ctx.systems]


def command_line(argv: Sequence[str]) -> str:
    launcher = os.environ.get("COMPARE_LAUNCHER", "python bench/compare.py")
    url = os.environ.get("COMPARE_DATABASE_URL_GIVEN")
    prefix = f"DATABASE_URL={masked_url(url)} " if url else ""
    return prefix + " ".join([launcher, *map(shlex.quote, argv)]).strip()


def report(
    ctx: Context, sections: list[Section], fact_lines: dict[str, str], level: str = "###"
) -> str:
    """The whole report as Markdown (printed, and the generated part of the docs)."""
    parts = [
        markdown_table(["", ""], [[k, v] for k, v in fact_lines.items()]),
        "",
        "Four executors:",
        "",
        *(f"* {line}" for line in executors_lines(ctx)),
    ]
    for section in sections:
        parts += ["", section.markdown(level)]
    if ctx.errors:
        parts += ["", f"{level} Failures", ""]
        parts += [
            f"* {e['measurement']} round {e['round']}, {SYSTEM_NAMES[e['system']]} "
            f"({e['row']}): {e['error'].splitlines()[0]}"
            for e in ctx.errors
        ]
    return "\n".join(parts)


def write_docs(body: str) -> None:
    note = (
        "_Generated by `bench/compare.py --write-docs`; rerun it rather than editing this part "
        "by hand._"
    )
    text = DOCS_FILE.read_text()
    DOCS_FILE.write_text(replace_section(text, f"{note}\n\n{body}"))


def write_json(
    ctx: Context, path: Path, fact_lines: dict[str, str], sections: list[Section]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ctx.args).items()}
    payload = {
        "facts": fact_lines,
        "args": args,
        "executors": executors_lines(ctx),
        "raw": ctx.raw,
        "summary": [s.as_dict() for s in sections],
        "errors": ctx.errors,
    }
    path.write_text(json.dumps(payload, indent=1, default=str))


# -- main ------------------------------------------------------------------------------


def run(ctx: Context) -> None:
    for name in MEASUREMENTS:
        if name in ctx.args.only:
            print(f"\n== {name}", flush=True)
            MEASURE[name](ctx)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    started = datetime.now(UTC)
    if os.environ.get("DATABASE_URL"):
        os.environ["COMPARE_DATABASE_URL_GIVEN"] = os.environ["DATABASE_URL"]
    server, described = server_settings()
    database = CompareDatabase(server, args.db_name)
    workdir = Path(tempfile.mkdtemp(prefix="leasejobs-compare-"))
    log_dir = args.output.parent / "compare-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("*.log"):
        old.unlink()
    ctx: Context | None = None
    created = False
    try:
        database.recreate()
        created = True
        setup_django(database.settings)
        from comparesite.systems import make_systems

        ctx = Context(args, make_systems(args.systems), log_dir, workdir)
        fingerprint = engine_fingerprint()
        fact_lines = facts(ctx, described, command_line(argv), started)
        print(markdown_table(["", ""], [[k, v] for k, v in fact_lines.items()]), flush=True)
        run(ctx)
        fact_lines["load average"] += f", {load_average()} at the end"
        if engine_fingerprint() != fingerprint:
            fact_lines["warning"] = (
                "django_leasejobs/ changed on disk during the run: workers started later "
                "ran newer code, so this project's figures mix versions"
            )
        sections = [SUMMARIZE[name](ctx) for name in MEASUREMENTS if name in args.only]
        body = report(ctx, sections, fact_lines)
        print("\n" + body, flush=True)
        write_json(ctx, args.output, fact_lines, sections)
        print(f"\nraw figures: {args.output}\nworker logs: {log_dir}")
        if args.write_docs:
            write_docs(report(ctx, sections, fact_lines, level="####"))
            print(f"rewrote the generated section of {DOCS_FILE.relative_to(REPO_ROOT)}")
        took = (datetime.now(UTC) - started).total_seconds()
        print(f"took {took / 60:.1f} min")
        if ctx.errors:
            print(f"{len(ctx.errors)} measurement(s) FAILED (see above)", file=sys.stderr)
            return 1
        return 0
    finally:
        for running in list(ctx.running if ctx else []):
            running.stop(kill=True)
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if created and not args.keep_db:
            database.drop()
        database.close()
        for leftover in workdir.glob("*"):
            leftover.unlink()
        workdir.rmdir()


if __name__ == "__main__":
    sys.exit(main())
