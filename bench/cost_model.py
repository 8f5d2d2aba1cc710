"""A cost model per job: where one job's CPU goes, in the worker, its slots and the database.

Run from the repository root, inside the project's virtualenv (``.venv``) or the bench
one (``.venv-bench``), with ``py-spy`` installed (the ``bench`` dependency group pins it)::

    python bench/cost_model.py                    # 20,000 jobs; PostgreSQL, SQLite, MariaDB
    python bench/cost_model.py --databases postgres --configs process-4,thread-4
    python bench/cost_model.py --smoke            # 1,000 jobs, process-4 on PostgreSQL
    python bench/cost_model.py --peer pgqueuer=artifacts/bench/pgqueuer_drain.json

For each database path (``--databases``: ``postgres``, a private server with production
settings from ``bench/pgserver.py``, or ``DATABASE_URL``'s; ``sqlite``, a file; ``mariadb``,
``--mariadb-url``) and each worker configuration (``--configs``: ``process-4``,
``thread-4``, ``thread-16``, ``async-process-4``: ``async def`` no-op jobs on the process
pool's event loops, ``sync-loop-process-4``: sync ones there, ``--sync-on-loop``), in a
database of its own (``lj_cost_bench``, marked, dropped at the end):

1. **drain**: ``--jobs`` no-op jobs enqueued with ``bulk_enqueue``, then ONE ``runworker
   --burst --pool P --concurrency C --no-scheduler`` (``DEBUG`` off: the shim's); a sampler thread
   reads, every 20 ms, the CPU (utime + stime, ``/proc/<pid>/stat``) of the worker's
   parent (its own threads: the main loop, the database thread, the heartbeat, a thread
   pool's slots), of its slots (the child processes: alive, or reaped into its
   ``cutime``), of the PostgreSQL backends that serve the bench database
   (``pg_stat_activity``; a backend that exited keeps its last reading) and of the whole
   database server (PostgreSQL: the postmaster and its children, reaped or alive, less
   the sampler's own backend; MariaDB: the ``mariadbd`` process, other clients
   included); the last reading is taken after the worker exited and before it is reaped.
   Each kind's CPU per job is its CPU between the first job's ``started_at`` and the
   last one's ``finished_at`` (interpolated between readings) over the jobs, so start-up
   and stop are left out; the rate is jobs over that window. Every job must have
   succeeded at attempt 1;
2. **profile** (py-spy found, not ``--no-profile``): the same drain again under ``py-spy
   record --format raw --rate 500 --subprocesses --threads --full-filenames
   --nonblocking`` (py-spy starts the
   worker, so start-up is sampled and then set apart); each sample's stack goes to one
   category by ``RULES`` below (innermost frame that a rule matches), per process kind
   (parent, slot); each category's CPU per job is its share of the kind's busy samples
   times the kind's measured CPU per job from step 1 (start-up, stop and waits left out),
   and the parent's 15 busiest leaf frames;
3. **the Python floor** (PostgreSQL only): ``bench/compare.py``'s ``floor_drain_on`` over
   the same number of jobs, its own CPU (thread time) and its backend's;
4. **peers**: ``--peer NAME=PATH`` reads a JSON another bench wrote (PgQueuer's drain,
   ``bench/pgqueuer_drain.py``, writes its best configuration's median there), with
   ``jobs``, ``jobs_per_s``, ``worker_cpu_s``, ``backends_cpu_s`` and ``server_cpu_s`` at
   its top or under ``"cost"``; ``artifacts/bench/pgqueuer_drain.json`` is read by
   default when it exists. A missing figure shows as ``-``. (That bench measures both
   systems' CPU per job with this script's sampler in one run, on one server: its table
   is the side-by-side comparison; the peer row here comes from another run.)

Writes the markdown tables to standard output (``--markdown``: also to a file) and every
figure to ``--output`` (``artifacts/bench/cost_model.json``). Exits 1 when a drain was not
clean (a job not succeeded at attempt 1, a worker that failed). The tables: see
docs/benchmarks.md, "Cost model: where a job's CPU goes".
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
MARK = "leasejobs-bench cost_model.py"
SHIM = "cost_bench"
SETTINGS_MODULE, TASK_MODULE = f"{SHIM}_settings", f"{SHIM}_tasks"
PGQUEUER_JSON = REPO_ROOT / "artifacts" / "bench" / "pgqueuer_drain.json"
PROFILE_RATE = 500
CPU_SAMPLE_SECONDS = 0.02


@dataclass(frozen=True)
class Config:
    """One worker configuration: its pool, its slots and the task its jobs run."""

    pool: str
    concurrency: int
    task: str
    sync_on_loop: bool = False
    """``--sync-on-loop``: sync jobs on the process slots' event loops, each in a thread."""


CONFIGS = {
    "process-4": Config("process", 4, "noop"),
    "thread-4": Config("thread", 4, "noop"),
    "thread-16": Config("thread", 16, "noop"),
    "async-process-4": Config("process", 4, "anoop"),
    "sync-loop-process-4": Config("process", 4, "noop", sync_on_loop=True),
}
DATABASES = ("postgres", "sqlite", "mariadb")
PORTABLE_CONFIGS = ("process-4", "thread-4")
"""What runs on SQLite and MariaDB by default (every config runs on PostgreSQL)."""


# -- the attribution rules -------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Frames whose file path contains ``path`` and, when ``functions`` is not empty, whose
    function (py-spy's qualified name, ``Class.method``) or its last part (``send`` of
    ``child_main.<locals>.send``) is one of them, go to ``category``."""

    category: str
    path: str
    functions: tuple[str, ...] = ()

    def matches(self, frame: Frame) -> bool:
        if self.path not in frame.file:
            return False
        name = frame.function
        return (
            not self.functions
            or name in self.functions
            or name.rpartition(".")[2] in (self.functions)
        )


# A sample goes to the category of the innermost frame that a rule matches; within one
# frame the first rule in this table wins. Frames no rule matches (psycopg, the ORM,
# pickle's C code shows as its caller) are skipped, so they count for their caller.
RULES: tuple[Rule, ...] = (
    # Waiting: a thread blocked in select/poll or on a lock (py-spy drops most of these as
    # idle; what is left is the way in and out).
    Rule("idle/wait", "/selectors.py"),
    Rule("idle/wait", "/threading.py", ("Condition.wait", "Event.wait", "Thread.join")),
    Rule("idle/wait", "/threading.py", ("Thread._wait_for_tstate_lock", "Semaphore.acquire")),
    Rule("idle/wait", "/queue.py", ("Queue.get",)),
    Rule("idle/wait", "django_leasejobs/worker/inbox.py", ("Inbox.wait",)),
    Rule("idle/wait", "/asyncio/base_events.py", ("BaseEventLoop.run_forever",)),
    Rule("idle/wait", "/concurrent/futures/thread.py", ("_worker",)),
    # Start-up and stop: imports (a module's own code runs as it is imported),
    # django.setup(), checks, registration, forking slots.
    Rule("start/stop", "", ("<module>",)),
    Rule("start/stop", "<frozen importlib"),
    Rule("start/stop", "/importlib/"),
    Rule("start/stop", "/django/apps/"),
    Rule("start/stop", "/django/core/checks/"),
    Rule("start/stop", "/django/utils/connection.py", ("BaseConnectionHandler.close_all",)),
    Rule("start/stop", "/django/__init__.py", ("setup",)),
    Rule("start/stop", "/django/core/management/base.py", ("BaseCommand.check",)),
    Rule("start/stop", "django_leasejobs/worker/lifecycle.py"),
    Rule("start/stop", "django_leasejobs/worker/config.py"),
    Rule("start/stop", "django_leasejobs/worker/pools/process.py", ("ProcessPool._spawn",)),
    Rule("start/stop", "django_leasejobs/worker/pools/process.py", ("ProcessPool.shutdown",)),
    Rule("start/stop", "django_leasejobs/worker/pools/thread.py", ("ThreadPool.shutdown",)),
    # Our signals and django.tasks' (their receivers: metrics, tracing, Django's logging).
    Rule("signals", "/django/dispatch/"),
    Rule("signals", "/django_tasks/signals.py"),
    Rule("signals", "/django/tasks/signals.py"),
    Rule("signals", "django_leasejobs/signals.py"),
    Rule("logs", "/logging/"),
    Rule("logs", "django_leasejobs/logs.py"),
    Rule("metrics/rollups", "django_leasejobs/worker/tallies.py"),
    Rule("metrics/rollups", "django_leasejobs/leases/rollups.py"),
    Rule("metrics/rollups", "django_leasejobs/metrics/"),
    Rule("metrics/rollups", "django_leasejobs/histograms.py"),
    Rule("metrics/rollups", "django_leasejobs/worker/driver.py", ("RoundDriver._add_rollup",)),
    Rule("metrics/rollups", "django_leasejobs/worker/driver.py", ("RoundDriver._write_rollup",)),
    Rule("tracing", "django_leasejobs/tracing.py"),
    Rule("tracing", "/opentelemetry/"),
    Rule("heartbeat/renewal", "django_leasejobs/worker/heartbeat.py"),
    Rule("heartbeat/renewal", "django_leasejobs/leases/renew.py"),
    Rule("heartbeat/renewal", "django_leasejobs/worker/watchdog.py"),
    Rule("heartbeat/renewal", "django_leasejobs/worker/listener.py"),
    Rule("heartbeat/renewal", "django_leasejobs/worker/shared.py"),
    Rule("heartbeat/renewal", "django_leasejobs/leases/reap.py"),
    Rule("heartbeat/renewal", "django_leasejobs/reaper.py"),
    # Fenced outcome writes: the round's write half and the recorder around it.
    Rule("write", "django_leasejobs/worker/rounds.py", ("_write_successes", "_write_failures")),
    Rule("write", "django_leasejobs/worker/rounds.py", ("_write_batch", "_write_fallback")),
    Rule("write", "django_leasejobs/worker/recorder.py"),
    Rule("write", "django_leasejobs/leases/finish.py"),
    Rule("write", "django_leasejobs/leases/batch_ops.py"),
    Rule("write", "django_leasejobs/leases/fenced.py"),
    Rule("write", "django_leasejobs/leases/dependants.py"),
    Rule("write", "django_leasejobs/leases/defer.py"),
    # The claim: its statement, decoding the rows, and the rest of the round.
    Rule("claim", "django_leasejobs/leases/"),
    Rule("claim", "django_leasejobs/worker/rounds.py"),
    Rule("claim", "django_leasejobs/worker/driver.py"),
    # Reading what slots report: pipes, unpickling, the main loop's handling of outcomes.
    Rule("outcome", "django_leasejobs/worker/pools/frames.py"),
    Rule("outcome", "django_leasejobs/worker/handover.py", ("Handover.handle",)),
    Rule("outcome", "django_leasejobs/worker/handover.py", ("Handover._ended",)),
    Rule("outcome", "django_leasejobs/worker/handover.py", ("Handover._back_to_ready",)),
    Rule("outcome", "django_leasejobs/worker/pools/process.py", ("ProcessPool.collect",)),
    Rule("outcome", "django_leasejobs/worker/pools/process.py", ("ProcessPool._read_messages",)),
    Rule("outcome", "django_leasejobs/worker/pools/process.py", ("ProcessPool._report_started",)),
    Rule("outcome", "django_leasejobs/worker/pools/thread.py", ("ThreadPool.collect",)),
    Rule("outcome", "django_leasejobs/worker/execution.py", ("Outcome.__reduce__",)),
    Rule("outcome", "django_leasejobs/worker/child.py", ("send", "ring", "_write_all")),
    Rule("outcome", "django_leasejobs/worker/child.py", ("_frame_header", "SlotLoop._send_all")),
    # Handing jobs to slots: the ready queue, the dispatch policy, pickling, pipe writes.
    Rule("hand-over", "django_leasejobs/worker/execution.py", ("JobSpec.__reduce__",)),
    Rule("hand-over", "django_leasejobs/worker/handover.py"),
    Rule("hand-over", "django_leasejobs/worker/dispatch.py"),
    Rule("hand-over", "django_leasejobs/worker/jobs.py"),
    Rule("hand-over", "django_leasejobs/worker/pools/"),
    # Running the job: the slot's side (execution.py, the child's loop) and the task.
    Rule("run", "django_leasejobs/worker/execution.py"),
    Rule("run", "django_leasejobs/worker/child.py"),
    Rule("run", "_bench_tasks.py"),
    Rule("run", "/asyncio/"),
    Rule("run", "/asgiref/"),
    Rule("run", "/django/tasks/"),
    Rule("run", "/django_tasks/"),
    Rule("run", "django_leasejobs/lease_task.py"),
    Rule("run", "django_leasejobs/serialization.py"),
)
CATEGORIES = (*dict.fromkeys(rule.category for rule in RULES), "other")
NOT_PER_JOB = ("idle/wait", "start/stop")
"""Categories left out of the CPU per job: waits, and start-up and stop (outside the drain's
window, which the measured CPU per job covers)."""


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    def label(self) -> str:
        """``function (path)`` with the path from its package on (site-packages cut)."""
        path = self.file.split("site-packages/")[-1]
        if REPO_ROOT.as_posix() in path:
            path = path.split(REPO_ROOT.as_posix() + "/")[-1]
        return f"{self.function} ({path})"


@dataclass(frozen=True)
class Sample:
    """One line of py-spy's raw output: the process path, the thread, the stack (root
    first) and how many samples had it."""

    pids: tuple[int, ...]
    thread: str
    frames: tuple[Frame, ...]
    count: int


def parse_frame(text: str) -> Frame:
    """``Class.method (/path/file.py:12)`` -> Frame("Class.method", "/path/file.py")."""
    function, _, rest = text.rpartition(" (")
    if not function:
        return Frame(text, "")
    return Frame(function, rest.rstrip(")").rpartition(":")[0] or rest.rstrip(")"))


def parse_raw(text: str) -> list[Sample]:
    """py-spy's ``--format raw`` (collapsed stacks: ``frame;frame;... count``)."""
    samples = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        pids: list[int] = []
        thread = ""
        frames: list[Frame] = []
        for part in stack.split(";"):
            if part.startswith("process ") and not frames and not thread:
                pids.append(int(part.split()[1].rstrip(":").split(":")[0]))
            elif part.startswith("thread (") and not frames:
                thread = part.partition(": ")[2] or part
            else:
                frames.append(parse_frame(part))
        samples.append(Sample(tuple(pids), thread, tuple(frames), int(count)))
    return samples


def categorize(frames: Sequence[Frame]) -> str:
    """The category of a stack (root first): that of its innermost frame a rule matches.
    A stack without a Python frame is the interpreter starting or stopping."""
    if not frames:
        return "start/stop"
    for frame in reversed(frames):
        for rule in RULES:
            if rule.matches(frame):
                return rule.category
    return "other"


def kind_of(sample: Sample) -> str:
    """``parent`` for the process py-spy started (the worker), ``slot`` for its children."""
    return "parent" if len(sample.pids) <= 1 else "slot"


@dataclass
class Attribution:
    """Samples per process kind and category, and the parent's busiest leaf frames."""

    samples: dict[str, Counter[str]] = field(default_factory=dict)
    leaves: Counter[str] = field(default_factory=Counter)
    threads: Counter[str] = field(default_factory=Counter)

    def add(self, sample: Sample) -> None:
        kind, category = kind_of(sample), categorize(sample.frames)
        self.samples.setdefault(kind, Counter())[category] += sample.count
        if kind == "parent" and category not in NOT_PER_JOB and sample.frames:
            self.leaves[sample.frames[-1].label()] += sample.count
            self.threads[sample.thread] += sample.count

    def busy(self, kind: str) -> int:
        """Samples of ``kind`` that count per job (waits and start-up/stop left out)."""
        counts = self.samples.get(kind, Counter())
        return sum(n for category, n in counts.items() if category not in NOT_PER_JOB)

    def per_job(self, kind: str, cpu_us_per_job: float | None) -> dict[str, float | None]:
        """Each category's CPU per job: its share of the busy samples times the kind's
        measured CPU per job (None without samples or without a measured CPU)."""
        counts, busy = self.samples.get(kind, Counter()), self.busy(kind)
        return {
            category: (
                counts[category] / busy * cpu_us_per_job
                if busy and cpu_us_per_job is not None and category not in NOT_PER_JOB
                else None
            )
            for category in CATEGORIES
        }


def attribute(samples: Sequence[Sample]) -> Attribution:
    result = Attribution()
    for sample in samples:
        result.add(sample)
    return result


# -- options -----------------------------------------------------------------------------


def parse_list(allowed: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        wrong = [name for name in names if name not in allowed]
        if not names or wrong:
            raise argparse.ArgumentTypeError(f"choose among {', '.join(allowed)}: {text!r}")
        return names

    return parse


def parse_peer(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--peer NAME=PATH, not {text!r}")
    return name, Path(path)


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=None, help="no-op jobs per drain (20,000)")
    parser.add_argument("--databases", type=parse_list(DATABASES), default=None)
    parser.add_argument("--configs", type=parse_list(tuple(CONFIGS)), default=None)
    parser.add_argument(
        "--portable-configs",
        type=parse_list(tuple(CONFIGS)),
        default=list(PORTABLE_CONFIGS),
        help="configs on SQLite and MariaDB (process-4,thread-4)",
    )
    parser.add_argument("--smoke", action="store_true", help="1,000 jobs, process-4, PostgreSQL")
    parser.add_argument("--no-profile", action="store_true", help="CPU figures only, no py-spy")
    add_server_options(parser)
    parser.add_argument("--mariadb-url", default="mysql://root@127.0.0.1:3306/")
    parser.add_argument("--peer", type=parse_peer, action="append", default=[])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain")
    parser.add_argument("--db-name", default="lj_cost_bench")
    parser.add_argument("--keep", action="store_true", help="keep the server and databases")
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "artifacts" / "bench" / "cost_model.json"
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.smoke:
        defaults: dict[str, Any] = {
            "jobs": 1000,
            "databases": ["postgres"],
            "configs": ["process-4"],
        }
    else:
        defaults = {"jobs": 20000, "databases": list(DATABASES), "configs": list(CONFIGS)}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.jobs < 1:
        raise SystemExit("--jobs must be at least 1")
    if not any(name == "pgqueuer" for name, _ in args.peer) and PGQUEUER_JSON.exists():
        args.peer.append(("pgqueuer", PGQUEUER_JSON))
    return args


def configs_for(args: argparse.Namespace, database: str) -> list[str]:
    if database == "postgres":
        return list(args.configs)
    return [name for name in args.configs if name in args.portable_configs]


# -- CPU readings ------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_times(pid: int) -> tuple[float, float] | None:
    """(utime + stime, cutime + cstime) of ``pid`` in seconds, None when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    own, children = (int(fields[11]) + int(fields[12])), (int(fields[13]) + int(fields[14]))
    return own / TICKS, children / TICKS


def tree_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` and all its descendants: its own, its reaped children's
    (which hold theirs), and each live child's tree."""
    times = proc_times(pid)
    if times is None:
        return None
    return times[0] + times[1] + sum(tree_cpu(child) or 0.0 for child in live_children(pid))


def live_children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (children of any of its threads)."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                children += [int(c) for c in (task / "children").read_text().split()]
    return children


def per_job_us(seconds: float | None, jobs: int) -> float | None:
    return None if seconds is None else seconds * 1e6 / jobs


# -- the database paths ------------------------------------------------------------------


class Database:
    """One database path: the worker's URL, and how to read the server's CPU."""

    name = ""
    label = ""

    def __init__(self, url: str) -> None:
        self.url = url

    def server_cpu(self) -> float | None:
        """CPU seconds so far of the whole database server (None: not readable)."""
        return None

    @contextlib.contextmanager
    def backend_finder(self) -> Iterator[Callable[[], list[int]]]:
        """While the block runs: a function that lists the pids of the server processes
        serving the bench database (none when unknown)."""
        yield list


class Postgres(Database):
    name = "postgres"

    def __init__(self, url: str, admin_url: str, label: str, datname: str = "") -> None:
        super().__init__(url)
        self.admin_url, self.label = admin_url, f"PostgreSQL, {label}"
        self.datname = datname or url.rpartition("/")[2]
        """The bench database's name (whose backends count as the worker's)."""
        self.postmaster = self._postmaster()
        self.probe = 0  # the sampler's backend while it runs

    def _postmaster(self) -> int | None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(stat[1])
        return None

    def server_cpu(self) -> float | None:
        """The postmaster and its children, less the sampler's own backend."""
        total = tree_cpu(self.postmaster) if self.postmaster else None
        own = proc_times(self.probe) if self.probe else None
        return None if total is None else total - (own[0] if own else 0.0)

    @contextlib.contextmanager
    def backend_finder(self) -> Iterator[Callable[[], list[int]]]:
        import psycopg

        database = self.datname
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            self.probe = conn.info.backend_pid

            def find() -> list[int]:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s", [database]
                ).fetchall()
                return [int(pid) for (pid,) in rows]

            try:
                yield find
            finally:
                self.probe = 0


class Sqlite(Database):
    name = "sqlite"
    label = "SQLite, a file (WAL)"


class Mariadb(Database):
    name = "mariadb"

    def __init__(self, url: str, server_url: str) -> None:
        super().__init__(url)
        self.server_url = server_url
        self.label = f"MariaDB at {server_url.split('@')[-1].rstrip('/')} (shared server)"
        self.pid = self._pid()

    def _connect(self) -> Any:
        import pymysql
        from pgserver import django_url_config

        config = django_url_config(self.server_url)
        return pymysql.connect(
            host=config["HOST"] or "127.0.0.1",
            port=int(config["PORT"] or 3306),
            user=config["USER"] or "root",
            password=config["PASSWORD"] or "",
            autocommit=True,
        )

    def _pid(self) -> int | None:
        with self._connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT @@pid_file")
            (path,) = cursor.fetchone()
        with contextlib.suppress(OSError, ValueError):
            return int(Path(path).read_text().split()[0])
        return None

    def server_cpu(self) -> float | None:
        times = proc_times(self.pid) if self.pid else None
        return times[0] if times else None

    def create(self, name: str) -> None:
        """A database of the bench's own: an earlier one of this bench (it holds the table
        ``lj_cost_mark``) is dropped first; any other is refused."""
        self.drop(name)
        with self._connect() as conn, conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            cursor.execute(f"CREATE TABLE `{name}`.lj_cost_mark (note varchar(80))")

    def drop(self, name: str) -> None:
        with self._connect() as conn, conn.cursor() as cursor:
            cursor.execute("SHOW DATABASES LIKE %s", [name])
            if cursor.fetchone() is None:
                return
            cursor.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = %s AND table_name = 'lj_cost_mark'",
                [name],
            )
            (marked,) = cursor.fetchone()
            if not marked:
                raise SystemExit(f"database {name!r} exists and is not this bench's")
            cursor.execute(f"DROP DATABASE `{name}`")


# -- the drains --------------------------------------------------------------------------


KINDS = ("parent", "slots", "backends", "server")
WAIT_KINDS = ("parent", "slots", "backends")
"""The process kinds whose run-queue wait is read (``run_queue_wait``)."""


@dataclass(frozen=True)
class Point:
    """CPU seconds so far of each kind (``KINDS``) at the time ``at`` (``time.time()``),
    and seconds spent waiting for a core (``WAIT_KINDS``)."""

    at: float
    cpu: dict[str, float | None]
    wait: dict[str, float | None] = field(default_factory=dict)


def interpolate(
    points: Sequence[Point], at: float, kind: str, *, waits: bool = False
) -> float | None:
    """The CPU (``waits``: the run-queue wait) of ``kind`` at ``at``, linear between the
    two points around it (the first or last point outside the series)."""
    known: list[tuple[float, float]] = [
        (p.at, value)
        for p in points
        if (value := (p.wait if waits else p.cpu).get(kind)) is not None
    ]
    if not known:
        return None
    if at <= known[0][0]:
        return known[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(known):
        if t0 <= at <= t1:
            return v0 + (v1 - v0) * ((at - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return known[-1][1]


def window(
    points: Sequence[Point], first: float, last: float, *, waits: bool = False
) -> dict[str, float | None]:
    """CPU seconds (``waits``: seconds waiting for a core) of each kind between ``first``
    and ``last``."""
    out: dict[str, float | None] = {}
    for kind in WAIT_KINDS if waits else KINDS:
        start = interpolate(points, first, kind, waits=waits)
        end = interpolate(points, last, kind, waits=waits)
        out[kind] = None if start is None or end is None else max(0.0, end - start)
    return out


def run_queue_wait(pid: int) -> float | None:
    """Seconds the live threads of ``pid`` have waited runnable for a core (the second
    field of each thread's ``/proc/.../schedstat``), None when unreadable. A busy thread
    that waits as long as it runs loses half its pace to the others on the machine;
    py-spy counts those waits as busy samples of whatever frame the thread is in."""
    total, seen = 0, False
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[1])
                seen = True
    return total / 1e9 if seen else None


def tree_wait(pid: int) -> float:
    """Run-queue seconds of ``pid``'s live descendants (a worker's slots; ``--processes``'
    workers and their slots); a reaped child's are lost (slots live as long as the drain)."""
    return sum((run_queue_wait(child) or 0.0) + tree_wait(child) for child in live_children(pid))


def slots_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid``'s descendants: the children it reaped and the live ones'
    trees (a worker's slots; ``runworker --processes``' workers and their slots)."""
    times = proc_times(pid)
    if times is None:
        return None
    return times[1] + sum(tree_cpu(child) or 0.0 for child in live_children(pid))


class CpuSampler(threading.Thread):
    """Every ``CPU_SAMPLE_SECONDS``: the worker's, its slots', its backends' and the
    server's CPU so far, from ``/proc``; a backend that exited keeps its last reading."""

    def __init__(self, pid: int, database: Database) -> None:
        super().__init__(daemon=True)
        self.pid, self.database = pid, database
        self.points: list[Point] = []
        self.backends: dict[int, float] = {}
        self.backend_waits: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with self.database.backend_finder() as find:
            pids: list[int] = []
            tick = 0
            while True:
                if tick % 5 == 0:
                    pids = find()
                self.sample(pids)
                tick += 1
                if self.stop.wait(CPU_SAMPLE_SECONDS):
                    self.sample(pids)  # the worker has exited, not yet reaped
                    return

    def sample(self, pids: Sequence[int]) -> None:
        for pid in pids:
            times, waited = proc_times(pid), run_queue_wait(pid)
            if times is not None:
                self.backends[pid] = times[0]
            if waited is not None:
                self.backend_waits[pid] = waited
        own = proc_times(self.pid)
        self.points.append(
            Point(
                time.time(),
                {
                    "parent": own[0] if own else None,
                    "slots": slots_cpu(self.pid),
                    "backends": sum(self.backends.values()) if self.backends else None,
                    "server": self.database.server_cpu(),
                },
                {
                    "parent": run_queue_wait(self.pid),
                    "slots": tree_wait(self.pid),
                    "backends": sum(self.backend_waits.values()) if self.backend_waits else None,
                },
            )
        )


def wait_unreaped(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until ``proc`` has exited without reaping it (its ``/proc`` entry stays, with
    its final CPU times); False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if info is not None:
            return True
        time.sleep(0.01)
    return False


@dataclass(frozen=True)
class Drain:
    """The jobs of one drain as the database has them."""

    problems: list[str]
    first: float | None
    last: float | None

    @property
    def seconds(self) -> float | None:
        if self.first is None or self.last is None or self.last <= self.first:
            return None
        return self.last - self.first


CHECK = """\
import json, sys, django

django.setup()
from django.db.models import Count, Max, Min, Q
from django_leasejobs.models import Job, JobAttempt

row = Job.objects.aggregate(
    total=Count("id"), good=Count("id", filter=Q(status="succeeded", attempt=1)),
    first=Min("started_at"), last=Max("finished_at"),
)
print(json.dumps({
    "total": row["total"], "good": row["good"], "attempts": JobAttempt.objects.count(),
    "first": row["first"] and row["first"].timestamp(),
    "last": row["last"] and row["last"].timestamp(),
}))
"""
"""The drain's jobs, read with the ORM in a subprocess (any vendor): their count, how many
succeeded at attempt 1, the attempt rows, the first start and the last finish (epoch)."""


class Bench:
    """The worker runs of one database path, with the shim's settings."""

    def __init__(self, args: argparse.Namespace, database: Database, workdir: Path) -> None:
        import shim  # (bench/, beside this script)

        self.args, self.database, self.workdir = args, database, workdir
        shim.write(workdir, SHIM)
        self.manage = REPO_ROOT / "testproject" / "manage.py"
        self.env = {
            **os.environ,
            "DATABASE_URL": database.url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "PYTHONPATH": os.pathsep.join([str(workdir), str(self.manage.parent), str(REPO_ROOT)]),
        }
        self.pyspy = None if args.no_profile else find_pyspy()

    def django(self, *command: str) -> None:
        subprocess.run(
            [sys.executable, str(self.manage), *command], env=self.env, cwd=REPO_ROOT, check=True
        )

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        """Run one statement through Django's connection in a subprocess (any vendor)."""
        code = (
            "import json, sys, django; django.setup(); from django.db import connection\n"
            "with connection.cursor() as c:\n"
            "    c.execute(sys.argv[1]); rows = c.fetchall() if c.description else []\n"
            "print(json.dumps(rows, default=str))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, statement],
            env=self.env,
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return [tuple(row) for row in json.loads(out.strip().splitlines()[-1])]

    def reset(self) -> None:
        if self.database.name == "postgres":
            self.sql("TRUNCATE leasejobs_attempt, leasejobs_job RESTART IDENTITY CASCADE")
        else:
            self.sql("DELETE FROM leasejobs_attempt")
            self.sql("DELETE FROM leasejobs_job")

    def enqueue(self, task: str, jobs: int) -> None:
        import workers  # (bench/, beside this script)

        subprocess.run(
            [sys.executable, "-c", workers.ENQUEUE, str(jobs), f"{TASK_MODULE}.{task}"],
            env=self.env,
            cwd=REPO_ROOT,
            check=True,
        )
        if self.database.name == "postgres":
            self.sql("ANALYZE leasejobs_job")

    def check(self, jobs: int) -> Drain:
        out = subprocess.run(
            [sys.executable, "-c", CHECK],
            env=self.env,
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        row = json.loads(out.strip().splitlines()[-1])
        problems = []
        if row["total"] != jobs or row["good"] != jobs or row["attempts"]:
            problems.append(
                f"{row['total']} jobs, {row['good']} succeeded at attempt 1, "
                f"{row['attempts']} attempt rows"
            )
        return Drain(problems, row["first"], row["last"])

    def command(self, config: Config, name: str) -> list[str]:
        return [
            *(sys.executable, str(self.manage), "runworker", "--burst", "--no-scheduler"),
            *("--pool", config.pool, "--concurrency", str(config.concurrency)),
            *(("--sync-on-loop",) if config.sync_on_loop else ()),
            *("--worker-id", f"cost-{name}"),
        ]

    def run_worker(self, command: list[str], name: str) -> tuple[int, list[Point]]:
        """Run ``command`` to its end; its exit code, and the CPU points sampled while it
        ran (its own, its children's, the database's)."""
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            command, env=self.env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        sampler = CpuSampler(proc.pid, self.database)
        sampler.start()
        try:
            if not wait_unreaped(proc, self.args.timeout):
                raise SystemExit(f"{name}: the worker ran longer than {self.args.timeout:g}s")
        finally:
            sampler.stop.set()
            sampler.join(timeout=10)
            if proc.poll() is None:
                proc.kill()
            code = proc.wait()
            log.close()
        return code, sampler.points

    def profile(self, config: Config, name: str) -> list[Sample]:
        """The same drain under py-spy, which starts the worker; its samples."""
        assert self.pyspy
        out = self.workdir / f"{name}.pyspy.txt"
        command = [
            *(self.pyspy, "record", "--format", "raw", "--rate", str(PROFILE_RATE)),
            *("--subprocesses", "--threads", "--full-filenames", "--nonblocking"),
            *("-o", str(out), "--"),
            *self.command(config, name),
        ]
        self.run_worker(command, name)
        return parse_raw(out.read_text()) if out.exists() else []

    def measure(self, name: str, config: Config) -> dict[str, Any]:
        jobs, label = self.args.jobs, f"{self.database.name}-{name}"
        self.reset()
        self.enqueue(config.task, jobs)
        code, points = self.run_worker(self.command(config, label), label)
        drain = self.check(jobs)
        problems = list(drain.problems)
        if code:
            problems.append(f"the worker exited with {code}")
        seconds = drain.seconds
        cpu = window(points, drain.first or 0.0, drain.last or 0.0) if seconds else {}
        us = {kind: per_job_us(cpu.get(kind), jobs) for kind in KINDS}
        waited = (
            window(points, drain.first or 0.0, drain.last or 0.0, waits=True) if seconds else {}
        )
        wait_us = {kind: per_job_us(waited.get(kind), jobs) for kind in WAIT_KINDS}
        result: dict[str, Any] = {
            "database": self.database.name,
            "config": name,
            "pool": config.pool,
            "concurrency": config.concurrency,
            "task": config.task,
            "jobs": jobs,
            "rate": jobs / seconds if seconds else None,
            "drain_seconds": seconds,
            "cpu_s": cpu,
            "cpu_us_per_job": us,
            "run_queue_us_per_job": wait_us,
            "cpu_points": len(points),
            "problems": problems,
            "clean": not problems,
        }
        if self.pyspy:
            self.reset()
            self.enqueue(config.task, jobs)
            result["profile"] = profile_figures(self.profile(config, f"{label}-profile"), us)
        print(
            f"  {self.database.name:8} {name:16} {fmt(result['rate'])} jobs/s; CPU per job (µs): "
            f"parent {fmt(us['parent'])}, slots {fmt(us['slots'])}, db backends "
            f"{fmt(us['backends'])}, db server {fmt(us['server'])}; waiting for a core: parent "
            f"{fmt(wait_us['parent'])}, slots {fmt(wait_us['slots'])}, db backends "
            f"{fmt(wait_us['backends'])} "
            + ("ok" if result["clean"] else "PROBLEMS: " + "; ".join(problems)),
            flush=True,
        )
        return result

    def floor(self) -> dict[str, Any]:
        """The Python floor of bench/compare.py over the same jobs, with its CPU and its
        backend's (PostgreSQL only)."""
        import compare  # (bench/, beside this script)
        import psycopg

        jobs = self.args.jobs
        self.reset()
        self.enqueue("noop", jobs)
        with psycopg.connect(self.database.url, autocommit=True) as conn:
            backend = conn.info.backend_pid
            before, own = proc_times(backend), time.thread_time()
            figures = compare.floor_drain_on(conn, "default", "default")
            own, after = time.thread_time() - own, proc_times(backend)
        server = after[0] - before[0] if after and before else None
        figures["cpu_us_per_job"] = {
            "parent": per_job_us(own, jobs),
            "slots": None,
            "backends": per_job_us(server, jobs),
            "server": None,
        }
        figures["problems"] = [] if figures["jobs"] == jobs else [f"{figures['jobs']} drained"]
        print(
            f"  python floor             {fmt(figures['jobs_per_s'])} jobs/s; CPU per job (µs): "
            f"{fmt(figures['cpu_us_per_job']['parent'])}, its backend "
            f"{fmt(figures['cpu_us_per_job']['backends'])}",
            flush=True,
        )
        return figures


def find_pyspy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def profile_figures(samples: Sequence[Sample], us: dict[str, float | None]) -> dict[str, Any]:
    """The attribution of a profiled drain: per kind, each category's samples and CPU per
    job (scaled to the measured drain's CPU per job), and the parent's top 15 frames."""
    attribution = attribute(samples)
    kinds = {}
    for kind, measured in (("parent", us["parent"]), ("slot", us["slots"])):
        counts = attribution.samples.get(kind, Counter())
        kinds[kind] = {
            "samples": dict(counts),
            "busy_samples": attribution.busy(kind),
            "us_per_job": attribution.per_job(kind, measured),
        }
    busy = attribution.busy("parent")
    return {
        "tool": "py-spy",
        "rate": PROFILE_RATE,
        "kinds": kinds,
        "threads": dict(attribution.threads.most_common()),
        "top_parent": [
            {"frame": frame, "samples": n, "share": n / busy if busy else None}
            for frame, n in attribution.leaves.most_common(15)
        ],
    }


# -- peers and output --------------------------------------------------------------------


def read_peer(name: str, path: Path) -> dict[str, Any]:
    """A peer's drain figures from its bench's JSON (see the module docstring)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"name": name, "path": str(path), "error": str(exc)}
    figures = data.get("cost", data) if isinstance(data, dict) else {}
    jobs = figures.get("jobs")

    def us(key: str) -> float | None:
        value = figures.get(key)
        return per_job_us(float(value), int(jobs)) if value is not None and jobs else None

    return {
        "name": name,
        "path": str(path),
        "jobs": jobs,
        "jobs_per_s": figures.get("jobs_per_s"),
        "cpu_us_per_job": {
            "worker": us("worker_cpu_s"),
            "backends": us("backends_cpu_s"),
            "server": us("server_cpu_s"),
        },
    }


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def add(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def cpu_table(runs: Sequence[dict[str, Any]], floor: dict[str, Any] | None, peers: Any) -> str:
    """CPU per job per process kind, each run's total against the floor's."""
    floor_total = add(*floor["cpu_us_per_job"].values()) if floor else None
    lines = [
        "| database | config | jobs/s | parent | slots | worker total | db backends (worker's) "
        "| db server (all) | worker + backends | ÷ floor's |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        us = run["cpu_us_per_job"]
        worker = add(us["parent"], us["slots"])
        both = add(worker, us["backends"])
        ratio = both / floor_total if both and floor_total else None
        lines.append(
            f"| {run['database']} | {run['config']} | {fmt(run['rate'])} | {fmt(us['parent'])} | "
            f"{fmt(us['slots'])} | {fmt(worker)} | {fmt(us['backends'])} | {fmt(us['server'])} | "
            f"{fmt(both)} | {fmt(ratio, 1)}{'x' if ratio else ''} |"
        )
    if floor:
        us = floor["cpu_us_per_job"]
        lines.append(
            f"| postgres | Python floor | {fmt(floor['jobs_per_s'])} | {fmt(us['parent'])} | - | "
            f"{fmt(us['parent'])} | {fmt(us['backends'])} | - | {fmt(floor_total)} | 1.0x |"
        )
    for peer in peers:
        us = peer.get("cpu_us_per_job", {})
        worker, backends = us.get("worker"), us.get("backends")
        both = worker + backends if worker is not None and backends is not None else None
        ratio = both / floor_total if both and floor_total else None
        lines.append(
            f"| postgres | {peer['name']} | {fmt(peer.get('jobs_per_s'))} | - | - | "
            f"{fmt(worker)} | {fmt(backends)} | {fmt(us.get('server'))} | {fmt(both)} | "
            f"{fmt(ratio, 1)}{'x' if ratio else ''} |"
        )
    return "\n".join(lines) + "\n"


def wait_table(runs: Sequence[dict[str, Any]]) -> str:
    """Run-queue wait per job per process kind, beside its CPU: how much of its pace each
    kind loses to the others on the machine."""
    lines = [
        "| database | config | parent: CPU / waiting | slots: CPU / waiting "
        "| db backends: CPU / waiting |",
        "|---|---|---:|---:|---:|",
    ]
    for run in runs:
        us, wait = run["cpu_us_per_job"], run.get("run_queue_us_per_job", {})
        cells = [f"{fmt(us[kind])} / {fmt(wait.get(kind))}" for kind in WAIT_KINDS]
        lines.append(f"| {run['database']} | {run['config']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def category_table(runs: Sequence[dict[str, Any]]) -> str:
    """CPU per job (µs) per category, per run and process kind (profiled runs only)."""
    shown = [c for c in CATEGORIES if c not in NOT_PER_JOB]
    lines = [
        "| database | config | process | " + " | ".join(shown) + " |",
        "|---|---|---|" + "---:|" * len(shown),
    ]
    for run in runs:
        for kind, figures in run.get("profile", {}).get("kinds", {}).items():
            if not figures["busy_samples"]:
                continue
            cells = " | ".join(fmt(figures["us_per_job"][c], 1) for c in shown)
            lines.append(f"| {run['database']} | {run['config']} | {kind} | {cells} |")
    return "\n".join(lines) + "\n"


def top_frames(run: dict[str, Any]) -> str:
    top = run.get("profile", {}).get("top_parent", [])
    lines = [
        f"Top frames of the parent, {run['database']} {run['config']} (busy samples, leaf):",
        "",
        "| frame | share |",
        "|---|---:|",
    ]
    lines += [f"| `{row['frame']}` | {fmt((row['share'] or 0) * 100, 1)} % |" for row in top]
    return "\n".join(lines) + "\n"


def report_markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    parts = [
        f"Cost model, {report['jobs']:,} jobs per drain; {report['machine']['date']}, commit "
        f"`{report['machine']['commit']}`, {report['machine']['machine']}, load "
        f"{report['machine']['load_at_start']} at start, {report['load_at_end']} at end; "
        f"profile: {report['profiler']}.",
        "",
        "CPU per job (µs) from the first job's start to the last one's end (start-up and "
        "stop left out):",
        "",
        cpu_table(runs, report.get("floor"), report.get("peers", [])),
        "Waiting for a core (µs per job, over the same window): the time each kind's threads "
        "were runnable with no core free (`/proc/.../schedstat`), beside its CPU:",
        "",
        wait_table(runs),
    ]
    if any(run.get("profile") for run in runs):
        parts += [
            "Where it goes: CPU per job (µs) by category, each category's share of the "
            "process kind's busy py-spy samples times its measured CPU per job:",
            "",
            category_table(runs),
        ]
        parts += [top_frames(run) for run in runs if run.get("profile")]
    return "\n".join(parts)


# -- main --------------------------------------------------------------------------------


@contextlib.contextmanager
def database_path(args: argparse.Namespace, name: str, workdir: Path) -> Iterator[Database]:
    """The database path ``name``, its bench database made for the run and dropped after."""
    if name == "sqlite":
        yield Sqlite(f"sqlite:///{workdir / 'cost.sqlite3'}")
        return
    if name == "mariadb":
        server = args.mariadb_url.rstrip("/") + "/"
        mariadb = Mariadb(server + args.db_name, server)
        mariadb.create(args.db_name)
        try:
            yield mariadb
        finally:
            if not args.keep:
                mariadb.drop(args.db_name)
        return
    import pgserver

    with pgserver.server_for(args, bench="cost_model.py", prefix="lj-cost-pg-") as (
        admin_url,
        config,
        label,
    ):
        with pgserver.connect_admin(config) as admin:
            pgserver.create_database(admin, args.db_name, MARK)
        try:
            url = pgserver.with_database(admin_url, args.db_name)
            yield Postgres(url, admin_url, label, datname=args.db_name)
        finally:
            if not args.keep:
                with pgserver.connect_admin(config) as admin:
                    pgserver.drop_database(admin, args.db_name, MARK)


def measure_path(args: argparse.Namespace, name: str) -> tuple[str, list[dict[str, Any]], Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"lj-cost-{name}-"))
    try:
        with database_path(args, name, workdir) as database:
            print(f"{database.label}:", flush=True)
            bench = Bench(args, database, workdir)
            bench.django("migrate", "-v0")
            runs = [bench.measure(config, CONFIGS[config]) for config in configs_for(args, name)]
            floor = bench.floor() if name == "postgres" else None
            return database.label, runs, floor
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(BENCH_DIR))
    import pgserver

    machine = pgserver.machine(REPO_ROOT)
    runs: list[dict[str, Any]] = []
    servers: dict[str, str] = {}
    floor = None
    for name in args.databases:
        label, path_runs, path_floor = measure_path(args, name)
        servers[name], floor = label, path_floor or floor
        runs += path_runs
    pyspy = None if args.no_profile else find_pyspy()
    report = {
        "machine": machine,
        "load_at_end": [round(load, 2) for load in os.getloadavg()],
        "jobs": args.jobs,
        "servers": servers,
        "profiler": (
            f"py-spy at {PROFILE_RATE} Hz"
            if pyspy
            else "none (--no-profile)"
            if args.no_profile
            else "none (py-spy not found)"
        ),
        "rules": [[r.category, r.path, list(r.functions)] for r in RULES],
        "runs": runs,
        "floor": floor,
        "peers": [read_peer(name, path) for name, path in args.peer],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = report_markdown(report)
    print()
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if not all(run["clean"] for run in runs) or (floor and floor["problems"]):
        print("PROBLEMS: a job did not succeed at attempt 1, or a worker failed (see the JSON)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
