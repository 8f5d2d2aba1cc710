"""PgQueuer, side by side: one drain of no-op jobs by PgQueuer and by this project.

Run from the repository root with the bench virtualenv (``.venv-bench``: the ``bench``
dependency group holds PgQueuer, pinned; ``scripts/bench --help`` makes it)::

    env -u DATABASE_URL flock /tmp/leasejobs-bench.lock \
        .venv-bench/bin/python bench/pgqueuer_drain.py       # about 6 minutes
    .venv-bench/bin/python bench/pgqueuer_drain.py --smoke    # 300 jobs, each system once
    .venv-bench/bin/python bench/pgqueuer_drain.py --jobs 50000 --rounds 5 --pgq-managers 2

What it does (issue 32):

1. **Server.** Without ``DATABASE_URL`` (or with ``--private-server``): a PostgreSQL of
   its own (``bench/pgserver.py``, ``production=True``: ``fsync``, ``synchronous_commit``
   and autovacuum on), deleted at exit. With ``DATABASE_URL``: that server. Either way
   each system gets a database of its own, ``--db-name`` (default ``lj_pgq_drain``) for
   this project and ``<db-name>_pgqueuer`` for PgQueuer, marked with a comment; the bench
   refuses to drop a database without that mark and drops its own at exit unless ``--keep``.
2. **The jobs.** ``--jobs`` (20,000) no-op jobs per drain, stored before the workers start,
   each system through its bulk path in one statement per 10,000: this project's
   ``bulk_enqueue`` (``COPY``) of the shim's ``noop`` (or ``anoop``, an ``async def``
   no-op), PgQueuer's ``Queries.enqueue`` with lists (one ``INSERT ... SELECT unnest``) of
   an ``async def`` entrypoint that returns at once. Both tables are emptied first and
   ``VACUUM ANALYZE``-d after the enqueue.
3. **PgQueuer** (its schema installed with ``Queries.install()``, its default durability:
   every table logged) runs as it is meant to: one process (``uvloop``, as ``pgq run``
   picks it), ``M`` ``QueueManager``\\ s in it, each on its own asyncpg connection, each
   ``run(mode=drain, batch_size=B, max_concurrent_tasks=C)``: a manager stops once the
   queue is empty and its jobs are done; with ``P`` processes, ``P`` such processes forked
   from one command. First a **grid** (``--pgq-processes`` 1,2 x ``--pgq-managers`` 1,2,4 x
   ``--pgq-batches`` 32,100 x ``--pgq-caps`` 0,200, where 0 is no cap and a cap below twice
   the batch, which PgQueuer refuses, is left out), ``--grid-rounds`` (1) each; its best
   point by the median drain rate is PgQueuer's **best configuration**. Then the rounds run
   it with the row **4 in flight** (one manager, batches of 2, ``max_concurrent_tasks=4``:
   as many jobs at once as this project's 4 slots).
4. **This project:** ``runworker --burst`` (it exits once nothing is left), logging at
   WARNING (the settings shim of ``bench/shim.py``): ``--pool process --concurrency 4``;
   ``--pool thread --concurrency 16``; ``async def`` no-ops in the process pool,
   ``--concurrency 2`` (each slot's event loop runs up to 100 at once); sync no-ops the
   same way, ``--concurrency 2 --sync-on-loop`` (each in a thread); and for each
   ``--forked`` N (2), ``--processes N --pool thread --concurrency 8`` (N workers forked
   from one command).
5. **Rounds.** ``--rounds`` (3) times every row once, each round starting with another
   row (interleaved); the tables show medians and ranges.
6. **Figures.** The **drain rate**: jobs / (first start .. last end), both on the
   database's clock: this project's ``min(started_at)`` and ``max(finished_at)``,
   PgQueuer's first ``picked`` and last ``successful`` row of its log table (both
   ``now()`` of the statement's transaction). The **rate from spawn**: jobs / (last end -
   the spawn of the worker command, ``time.time()`` on this machine): start-up included.
   The **CPU per job** over the same window (start-up and exit left out), read every
   20 ms from ``/proc`` by ``bench/cost_model.py``'s sampler: of the worker command and
   every process under it (PgQueuer's forked processes; a worker's slots, or
   ``--processes``' workers), and of the PostgreSQL backends serving the system's
   database (``pg_stat_activity``); the server must run on this machine, else ``-``.
7. **Checks** (a failure exits 1): every job done exactly once (this project: every job
   ``succeeded`` at attempt 1, no attempt row; PgQueuer: its queue table empty, one
   ``picked`` and one ``successful`` log row per job), the worker exited 0 within
   ``--timeout`` and logged no error.
8. **Verdict** (issue 32): this project's best row >= 1.2x PgQueuer's best configuration,
   on the drain rate; the same ratio from spawn is printed beside it. Speed never fails
   the run (``--fail-on-miss``: exit 3).

Output: a line per drain, the grid, the side-by-side table and the verdict; ``--output``
(default ``artifacts/bench/pgqueuer_drain.json``) holds every run with the machine, the
server and the settings, and under ``"cost"`` PgQueuer's best row as
``bench/cost_model.py`` reads a peer; ``--markdown`` writes the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
MARK = "leasejobs-bench pgqueuer_drain.py"
SHIM = "pgq_drain_bench"
ENTRYPOINT = "noop"
GOAL = 1.2
"""This project's best drain rate over PgQueuer's best (issue 32)."""
STEADY_SPREAD = 1.5
"""A best row whose own fastest drain is more than this many times its slowest ran on a
machine whose speed changed within the run (seen here: PgQueuer's drains at 10,519 and
25,740 jobs/s, its CPU per job 58 and 31 µs, minutes apart): the verdict is then
"inconclusive", neither met nor missed."""
CHUNK = 10000
"""Jobs per bulk enqueue statement, both systems."""
SMOKE = {"jobs": 300, "rounds": 1}
PGQ_TABLES = "pgqueuer, pgqueuer_log, pgqueuer_statistics"
OUR_TABLES = "leasejobs_attempt, leasejobs_job, leasejobs_worker"
CPU_KINDS = ("worker", "backends")
"""CPU per job of a drain: the worker command's processes (every one it started), and the
database backends serving its database (``bench/cost_model.py``'s sampler)."""

ENQUEUE = """\
import sys

import django

django.setup()
from django_leasejobs.compat import task_backends

import {module} as tasks

task, count, chunk = getattr(tasks, sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for start in range(0, count, chunk):
    task_backends["default"].bulk_enqueue([(task, (), {{}})] * min(chunk, count - start))
"""


# -- the rows ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PgqRow:
    """PgQueuer: ``processes`` processes of ``managers`` queue managers each, each manager
    dequeuing ``batch`` jobs per statement, with at most ``cap`` jobs in flight (0: no cap)."""

    managers: int
    batch: int
    cap: int
    processes: int = 1
    name: str = ""

    system = "PgQueuer"

    @property
    def key(self) -> str:
        return f"pgq-p{self.processes}-m{self.managers}-b{self.batch}-c{self.cap}"

    @property
    def settings(self) -> str:
        cap = f"max_concurrent_tasks={self.cap}" if self.cap else "no cap"
        processes = f"{self.processes} processes x " if self.processes > 1 else ""
        return (
            f"{processes}{self.managers} QueueManager{'s' if self.managers > 1 else ''} x "
            f"batch_size={self.batch}, {cap}, mode=drain"
        )

    @property
    def in_flight(self) -> str:
        return "no limit" if not self.cap else f"{self.cap * self.managers * self.processes:,}"


@dataclasses.dataclass(frozen=True)
class OurRow:
    """This project: one ``runworker --burst`` (``processes`` > 1: forked workers)."""

    pool: str
    concurrency: int
    processes: int = 1
    task: str = "noop"
    sync_on_loop: bool = False
    """``--sync-on-loop``: sync jobs on the slots' event loops, each in a thread."""
    prefetch: int | None = None
    """``--prefetch``; None: the worker's default."""

    system = "django-leasejobs"
    name = ""

    @property
    def key(self) -> str:
        loop = "-on-loop" if self.sync_on_loop else ""
        ahead = "" if self.prefetch is None else f"-pf{self.prefetch}"
        return f"ours-{self.pool}-c{self.concurrency}-p{self.processes}-{self.task}{loop}{ahead}"

    @property
    def options(self) -> list[str]:
        """This row's ``runworker`` options (besides ``--burst``)."""
        return [
            *(("--processes", str(self.processes)) if self.processes > 1 else ()),
            *("--pool", self.pool, "--concurrency", str(self.concurrency)),
            *(("--prefetch", str(self.prefetch)) if self.prefetch is not None else ()),
            *(("--sync-on-loop",) if self.sync_on_loop else ()),
        ]

    @property
    def settings(self) -> str:
        jobs = ", async def jobs" if self.task == "anoop" else ""
        return " ".join(["runworker", *self.options]) + jobs

    @property
    def in_flight(self) -> str:
        on_loop = self.task == "anoop" or self.sync_on_loop
        per_slot = 100 if on_loop else 1  # --async-concurrency's default
        return f"{self.processes * self.concurrency * per_slot:,}"


Row = PgqRow | OurRow
FOUR_IN_FLIGHT = PgqRow(managers=1, batch=2, cap=4, name="4 in flight")


def parse_ints(text: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"a list of integers: {text!r}") from None
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError(f"a list of integers >= 0: {text!r}")
    return values


def pgq_grid(
    processes: Sequence[int], managers: Sequence[int], batches: Sequence[int], caps: Sequence[int]
) -> list[PgqRow]:
    """Every point of the grid PgQueuer accepts (a cap must be at least twice the batch)."""
    return [
        PgqRow(m, b, c, processes=p)
        for p in processes
        for m in managers
        for b in batches
        for c in caps
        if p >= 1 and m >= 1 and b >= 1 and (c == 0 or c >= 2 * b)
    ]


def our_rows(forked: Sequence[int], prefetch: Sequence[int] = ()) -> list[OurRow]:
    """Our rows: each pool at its defaults, and for each ``forked`` process count a
    thread-pool worker per process, at the default prefetch and at each of ``prefetch``."""
    return [
        OurRow("process", 4),
        OurRow("thread", 16),
        OurRow("process", 2, task="anoop"),
        OurRow("process", 2, sync_on_loop=True),
        *(
            OurRow("thread", 8, processes=n, prefetch=ahead)
            for n in forked
            if n > 1
            for ahead in (None, *prefetch)
        ),
    ]


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=None, help="no-op jobs per drain (20,000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every row (3)")
    parser.add_argument("--grid-rounds", type=int, default=1, help="rounds of PgQueuer's grid")
    parser.add_argument("--pgq-processes", type=parse_ints, default=[1, 2])
    parser.add_argument("--pgq-managers", type=parse_ints, default=[1, 2, 4])
    parser.add_argument("--pgq-batches", type=parse_ints, default=[32, 100])
    parser.add_argument("--pgq-caps", type=parse_ints, default=[0, 200], help="0: no cap")
    parser.add_argument("--forked", type=parse_ints, default=[2], help="runworker --processes")
    parser.add_argument(
        "--prefetch",
        type=parse_ints,
        default=[1024],
        help="each --forked row again with runworker --prefetch N (1024)",
    )
    parser.add_argument("--smoke", action="store_true", help="300 jobs, each system once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain")
    add_server_options(parser)
    parser.add_argument("--db-name", default="lj_pgq_drain")
    parser.add_argument("--keep", action="store_true", help="keep databases, server, work dir")
    parser.add_argument(
        "--output",
        "--json",
        dest="output",
        type=Path,
        default=REPO_ROOT / "artifacts/bench/pgqueuer_drain.json",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 3 on a missed goal")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.jobs is None:
        args.jobs = SMOKE["jobs"] if args.smoke else 20000
    if args.rounds is None:
        args.rounds = SMOKE["rounds"] if args.smoke else 3
    if args.smoke:
        args.grid = [PgqRow(1, 32, 0)]
    else:
        args.grid = pgq_grid(args.pgq_processes, args.pgq_managers, args.pgq_batches, args.pgq_caps)
    if args.jobs < 1 or args.rounds < 1 or args.grid_rounds < 1 or not args.grid:
        raise SystemExit("--jobs, --rounds and --grid-rounds must be >= 1, the grid not empty")
    return args


# -- pure parts: rates, summaries, verdict, tables -------------------------------------------


def rate(jobs: int, start: float | None, end: float | None) -> float | None:
    if start is None or end is None or end <= start:
        return None
    return jobs / (end - start)


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row's medians and ranges over its runs, and whether every run was clean."""
    drains = [r["drain_rate"] for r in runs if r["drain_rate"] is not None]
    cpu = [r.get("cpu_us_per_job", {}) for r in runs]
    return {
        "runs": len(runs),
        "drain_rate": median(drains),
        "drain_range": [min(drains), max(drains)] if drains else None,
        "spawn_rate": median([r["spawn_rate"] for r in runs]),
        "cpu_us_per_job": {kind: median([c.get(kind) for c in cpu]) for kind in CPU_KINDS},
        "clean": all(not r["problems"] for r in runs),
    }


def rotated(rows: Sequence[Row], round_index: int) -> list[Row]:
    """``rows`` starting at another row each round."""
    shift = round_index % len(rows)
    return [*rows[shift:], *rows[:shift]]


def verdict(ours: dict[str, dict[str, Any]], peer: dict[str, Any] | None) -> dict[str, Any]:
    """Issue 32: this project's best row >= GOAL x PgQueuer's best, on the drain rate."""
    goal = f"drain, best configuration: django-leasejobs >= {GOAL:g}x PgQueuer's best"
    measured = {k: s for k, s in ours.items() if s["drain_rate"] is not None}
    if not measured or peer is None or not peer.get("drain_rate"):
        return {"goal": goal, "verdict": "not measured"}
    best_key = max(measured, key=lambda k: measured[k]["drain_rate"])
    best = measured[best_key]
    ratio = best["drain_rate"] / peer["drain_rate"]
    spawn = (
        best["spawn_rate"] / peer["spawn_rate"]
        if best["spawn_rate"] and peer.get("spawn_rate")
        else None
    )
    clean = best["clean"] and peer["clean"]
    spreads = [spread(best), spread(peer)]
    steady = all(s is None or s <= STEADY_SPREAD for s in spreads)
    if not clean:
        outcome = "missed"
    elif not steady:
        outcome = "inconclusive"
    else:
        outcome = "met" if ratio >= GOAL else "missed"
    return {
        "goal": goal,
        "ours_best": best_key,
        "ours_rate": best["drain_rate"],
        "pgqueuer_rate": peer["drain_rate"],
        "ratio": ratio,
        "ratio_from_spawn": spawn,
        "leader": "ours best" if ratio >= 1 else "PgQueuer best",
        "spreads": spreads,
        "verdict": outcome,
    }


def spread(summary: dict[str, Any]) -> float | None:
    """A row's fastest drain over its slowest (None with fewer than two)."""
    span = summary["drain_range"]
    if not span or summary["runs"] < 2 or not span[0]:
        return None
    return float(span[1] / span[0])


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _range(summary: dict[str, Any]) -> str:
    span = summary["drain_range"]
    return "-" if not span else f"{span[0]:,.0f}-{span[1]:,.0f}"


def grid_table(grid: dict[str, dict[str, Any]], rows: dict[str, Row], best: str) -> str:
    out = [
        "| processes | queue managers (each) | batch_size | max_concurrent_tasks (each) | "
        "jobs/s, drain | jobs/s from spawn | runs |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, s in sorted(grid.items(), key=lambda kv: -(kv[1]["drain_rate"] or 0)):
        row = rows[key]
        assert isinstance(row, PgqRow)
        mark = " **(best)**" if key == best else ""
        out.append(
            f"| {row.processes} | {row.managers} | {row.batch} | {row.cap or 'no cap'} | "
            f"{_fmt(s['drain_rate'])}{mark} | {_fmt(s['spawn_rate'])} | {s['runs']} |"
        )
    return "\n".join(out) + "\n"


def side_table(table: dict[str, dict[str, Any]], rows: dict[str, Row], best_ours: str) -> str:
    out = [
        "| system | configuration | jobs in flight at most | jobs/s, drain (median) | range | "
        "jobs/s from spawn | our best ÷ row | CPU µs per job: worker | db backends | both "
        "| every job once |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    reference = table.get(best_ours, {}).get("drain_rate")
    for key, s in table.items():
        row = rows[key]
        label = f"{row.settings} ({row.name})" if row.name else row.settings
        ratio = (
            "reference"
            if key == best_ours
            else (f"{reference / s['drain_rate']:.2f}x" if reference and s["drain_rate"] else "-")
        )
        cpu = s.get("cpu_us_per_job", {})
        worker, backends = cpu.get("worker"), cpu.get("backends")
        both = worker + backends if worker is not None and backends is not None else None
        out.append(
            f"| {row.system} | {label} | {row.in_flight} | {_fmt(s['drain_rate'])} | "
            f"{_range(s)} | {_fmt(s['spawn_rate'])} | {ratio} | {_fmt(worker)} | "
            f"{_fmt(backends)} | {_fmt(both)} | {'yes' if s['clean'] else 'NO'} |"
        )
    return "\n".join(out) + "\n"


# -- PgQueuer's side: the consumer process, the schema, the enqueue ----------------------------


def consume_in(processes: int, dsn: str, managers: int, batch: int, cap: int) -> int:
    """``consume`` in ``processes`` processes (forked), until each is done; the first
    non-zero exit code of one, or 0."""
    import multiprocessing

    if processes == 1:
        consume(dsn, managers, batch, cap)
        return 0
    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=consume, args=(dsn, managers, batch, cap)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join()
    return next((child.exitcode for child in children if child.exitcode), 0) or 0


def consume(dsn: str, managers: int, batch: int, cap: int) -> None:
    """PgQueuer's worker: ``managers`` queue managers on one event loop (uvloop), each on
    its own asyncpg connection, each draining until the queue is empty."""
    import asyncpg
    import uvloop
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def one() -> None:
        connection = await asyncpg.connect(dsn)
        manager = QueueManager(Queries.from_asyncpg_connection(connection))

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            return None

        try:
            await manager.run(
                batch_size=batch, mode=QueueExecutionMode.drain, max_concurrent_tasks=cap or None
            )
        finally:
            if not connection.is_closed():
                await connection.close()

    async def every() -> None:
        await asyncio.gather(*(one() for _ in range(managers)))

    uvloop.run(every())


async def pgq_install(dsn: str) -> None:
    import asyncpg
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    try:
        await Queries.from_asyncpg_connection(connection).install()
    finally:
        await connection.close()


async def pgq_enqueue(dsn: str, jobs: int) -> None:
    """PgQueuer's bulk path: ``Queries.enqueue`` with lists, CHUNK jobs per statement."""
    import asyncpg
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries.from_asyncpg_connection(connection)
        for start in range(0, jobs, CHUNK):
            count = min(CHUNK, jobs - start)
            await queries.enqueue([ENTRYPOINT] * count, [None] * count, [0] * count)
    finally:
        await connection.close()


def pgqueuer_missing() -> str | None:
    """Why PgQueuer cannot run here, or None."""
    for module in ("pgqueuer", "asyncpg", "uvloop"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed here (the bench dependency group: .venv-bench)"
    return None


# -- the measurement -----------------------------------------------------------------------


def conninfo_of(config: dict[str, Any], database: str) -> str:
    """A libpq URL of ``database`` on the server ``config`` (Django's) names: asyncpg
    and psycopg both read it."""
    from urllib.parse import quote

    user = quote(str(config.get("USER") or "postgres"))
    password = f":{quote(str(config['PASSWORD']))}" if config.get("PASSWORD") else ""
    host = str(config.get("HOST") or "127.0.0.1")
    port = f":{config['PORT']}" if config.get("PORT") else ""
    if host.startswith("/"):  # a socket directory
        socket_port = config.get("PORT") or 5432
        return f"postgresql://{user}{password}@/{database}?host={quote(host)}&port={socket_port}"
    return f"postgresql://{user}{password}@{host}{port}/{database}"


class Bench:
    """Both systems on one server, each in its database; one method per drain."""

    def __init__(
        self,
        args: argparse.Namespace,
        ours_url: str,
        ours_dsn: str,
        pgq_dsn: str,
        watched: dict[str, Any],
    ):
        import shim  # (bench/, beside this script)

        self.args = args
        self.ours_dsn = ours_dsn
        self.pgq_dsn = pgq_dsn
        self.watched = watched
        """Per system (``ours``, ``pgq``): its database as ``cost_model.Postgres``, whose
        sampler reads the CPU of the worker command and of the backends serving it."""
        self.workdir = Path(tempfile.mkdtemp(prefix="leasejobs-pgq-drain-"))
        settings_module, self.task_module = shim.write(self.workdir, SHIM)
        paths = [str(self.workdir), str(REPO_ROOT / "testproject"), str(REPO_ROOT), str(BENCH_DIR)]
        self.env = {
            **os.environ,
            "DATABASE_URL": ours_url,
            "DJANGO_SETTINGS_MODULE": settings_module,
            "DEBUG": "false",
            "PYTHONPATH": os.pathsep.join(paths),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def prepare(self) -> None:
        manage = str(REPO_ROOT / "testproject" / "manage.py")
        subprocess.run(
            [sys.executable, manage, "migrate", "--verbosity", "0"], env=self.env, check=True
        )
        asyncio.run(pgq_install(self.pgq_dsn))

    def execute(self, dsn: str, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            cursor = conn.execute(sql)
            return list(cursor.fetchall()) if cursor.description else []

    def spawn(self, row: Row, argv: list[str], env: dict[str, str], system: str) -> dict[str, Any]:
        """Run one worker command to its end; its spawn time, the problems seen and the
        CPU readings taken meanwhile (``points``: the command's processes, the backends
        serving ``system``'s database; the last one after it exited, before its reaping)."""
        from cost_model import CpuSampler, wait_unreaped
        from pgserver import stop_workers

        log_path = self.workdir / f"{row.key}-{time.monotonic_ns()}.log"
        problems: list[str] = []
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
            sampler = CpuSampler(self.proc.pid, self.watched[system])
            sampler.start()
            try:
                if not wait_unreaped(self.proc, self.args.timeout):
                    problems.append(f"not done after {self.args.timeout:g} s")
            finally:
                exited = time.time()
                sampler.stop.set()
                sampler.join(timeout=10)
                status = self.proc.poll()
                stop_workers([self.proc])
                self.proc = None
            if status:
                problems.append(f"the worker exited with status {status}")
        text = log_path.read_text(errors="replace")
        if "Traceback" in text or " ERROR " in text or "ERROR:" in text:
            problems.append(f"an error in the worker's log ({log_path})")
        return {
            "spawned": spawned,
            "exit_s": exited - spawned,
            "problems": problems,
            "points": sampler.points,
        }

    def drain(self, row: Row) -> dict[str, Any]:
        run = self.pgqueuer(row) if isinstance(row, PgqRow) else self.ours(row)
        jobs, first = self.args.jobs, run.pop("first_start")
        run.update(
            key=row.key,
            jobs=jobs,
            drain_rate=rate(jobs, first, run["last_end"]),
            spawn_rate=rate(jobs, run["spawned"], run["last_end"]),
            cpu_us_per_job=cpu_per_job(run.pop("points"), jobs, first, run["last_end"]),
        )
        cpu = run["cpu_us_per_job"]
        print(
            f"{row.system}, {row.settings}: {_fmt(run['drain_rate'])} jobs/s drain, "
            f"{_fmt(run['spawn_rate'])} from spawn, exit after {run['exit_s']:.2f} s; CPU per "
            f"job {_fmt(cpu['worker'])} µs worker, {_fmt(cpu['backends'])} µs db backends; "
            + ("ok" if not run["problems"] else "PROBLEMS: " + "; ".join(run["problems"])),
            flush=True,
        )
        return run

    def pgqueuer(self, row: PgqRow) -> dict[str, Any]:
        jobs = self.args.jobs
        self.execute(self.pgq_dsn, f"TRUNCATE {PGQ_TABLES} RESTART IDENTITY")
        asyncio.run(pgq_enqueue(self.pgq_dsn, jobs))
        self.execute(self.pgq_dsn, "VACUUM ANALYZE pgqueuer")
        argv = [
            *(sys.executable, str(Path(__file__).resolve()), "--consume", self.pgq_dsn),
            *(str(row.processes), str(row.managers), str(row.batch), str(row.cap)),
        ]
        run = self.spawn(row, argv, dict(os.environ), "pgq")
        [(first, last, picked, done, distinct, left)] = self.execute(
            self.pgq_dsn,
            "SELECT EXTRACT(EPOCH FROM min(created) FILTER (WHERE status = 'picked')), "
            "EXTRACT(EPOCH FROM max(created) FILTER (WHERE status = 'successful')), "
            "count(*) FILTER (WHERE status = 'picked'), "
            "count(*) FILTER (WHERE status = 'successful'), "
            "count(DISTINCT job_id) FILTER (WHERE status = 'successful'), "
            "(SELECT count(*) FROM pgqueuer) FROM pgqueuer_log",
        )
        if (picked, done, distinct, left) != (jobs, jobs, jobs, 0):
            run["problems"].append(
                f"{jobs} jobs enqueued: {picked} picks, {done} successful ({distinct} distinct),"
                f" {left} left in the queue"
            )
        return {**run, "first_start": _float(first), "last_end": _float(last)}

    def ours(self, row: OurRow) -> dict[str, Any]:
        jobs = self.args.jobs
        self.execute(self.ours_dsn, f"TRUNCATE {OUR_TABLES} RESTART IDENTITY CASCADE")
        script = ENQUEUE.format(module=self.task_module)
        subprocess.run(
            [sys.executable, "-c", script, row.task, str(jobs), str(CHUNK)],
            env=self.env,
            cwd=str(REPO_ROOT),
            check=True,
        )
        self.execute(self.ours_dsn, "VACUUM ANALYZE leasejobs_job")
        argv = [
            *(sys.executable, str(REPO_ROOT / "testproject" / "manage.py"), "runworker"),
            *("--burst", *row.options),
        ]
        run = self.spawn(row, argv, self.env, "ours")
        [(first, last, total, good, attempts)] = self.execute(
            self.ours_dsn,
            "SELECT EXTRACT(EPOCH FROM min(started_at)), EXTRACT(EPOCH FROM max(finished_at)), "
            "count(*), count(*) FILTER (WHERE status = 'succeeded' AND attempt = 1), "
            "(SELECT count(*) FROM leasejobs_attempt) FROM leasejobs_job",
        )
        if (total, good, attempts) != (jobs, jobs, 0):
            run["problems"].append(
                f"{jobs} jobs enqueued: {total} stored, {good} succeeded at attempt 1, "
                f"{attempts} attempt rows"
            )
        return {**run, "first_start": _float(first), "last_end": _float(last)}

    def stop(self) -> None:
        from pgserver import stop_workers

        if self.proc is not None:
            stop_workers([self.proc])
            self.proc = None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def cpu_per_job(
    points: Sequence[Any], jobs: int, first: float | None, last: float | None
) -> dict[str, float | None]:
    """CPU µs per job between the drain's first start and last end (``CPU_KINDS``): the
    worker command's processes (``cost_model``'s parent and slots: the command and every
    process under it) and the database backends serving it."""
    from cost_model import per_job_us, window

    if first is None or last is None or last <= first or not points:
        return dict.fromkeys(CPU_KINDS)
    cpu = window(points, first, last)
    parent, under = cpu["parent"], cpu["slots"]
    worker = None if parent is None else parent + (under or 0.0)
    return {"worker": per_job_us(worker, jobs), "backends": per_job_us(cpu["backends"], jobs)}


def run_rounds(
    bench: Bench, rows: Sequence[Row], rounds: int, label: str
) -> dict[str, list[dict[str, Any]]]:
    """Every row once per round, interleaved; the runs by row."""
    runs: dict[str, list[dict[str, Any]]] = {row.key: [] for row in rows}
    for index in range(rounds):
        print(f"-- {label}, round {index + 1} of {rounds}", flush=True)
        for row in rotated(rows, index):
            runs[row.key].append(bench.drain(row))
    return runs


def peer_cost(row: Row, summary: dict[str, Any], jobs: int) -> dict[str, Any]:
    """PgQueuer's best row as ``bench/cost_model.py`` reads a peer (``--peer``): its
    median drain rate and CPU seconds per drain, of its processes and of its backends."""

    def seconds(kind: str) -> float | None:
        us = summary.get("cpu_us_per_job", {}).get(kind)
        return None if us is None else us * jobs / 1e6

    return {
        "settings": row.settings,
        "jobs": jobs,
        "jobs_per_s": summary["drain_rate"],
        "worker_cpu_s": seconds("worker"),
        "backends_cpu_s": seconds("backends"),
    }


def measure(bench: Bench) -> dict[str, Any]:
    args = bench.args
    grid_runs = run_rounds(bench, args.grid, args.grid_rounds, "PgQueuer's grid")
    grid = {key: summarize(runs) for key, runs in grid_runs.items()}
    best_key = max(grid, key=lambda k: grid[k]["drain_rate"] or 0)
    best = next(row for row in args.grid if row.key == best_key)
    best = dataclasses.replace(best, name="best")
    ours = our_rows(args.forked, args.prefetch)
    rows: list[Row] = [best, FOUR_IN_FLIGHT, *ours]
    runs = run_rounds(bench, rows, args.rounds, "side by side")
    table = {key: summarize(r) for key, r in runs.items()}
    return {
        "grid": grid,
        "grid_runs": grid_runs,
        "pgq_best": best_key,
        "table": table,
        "runs": runs,
        "verdict": verdict({r.key: table[r.key] for r in ours}, table[best_key]),
        "cost": peer_cost(best, table[best_key], args.jobs),
        "rows": {row.key: row for row in [*args.grid, *rows]},
    }


def server_settings(dsn: str, bench: Bench) -> dict[str, str]:
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "autovacuum")
    return {name: str(bench.execute(dsn, f"SHOW {name}")[0][0]) for name in names}


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in ("pgqueuer", "asyncpg", "uvloop", "psycopg"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def report(result: dict[str, Any], facts: dict[str, Any], args: argparse.Namespace) -> str:
    rows = result["rows"]
    line = result["verdict"]
    best_ours = line.get("ours_best", "")
    text = (
        f"PgQueuer's grid ({args.jobs:,} jobs, {args.grid_rounds} round(s) each):\n\n"
        + grid_table(result["grid"], rows, result["pgq_best"])
        + f"\nSide by side ({args.jobs:,} no-op jobs, median of {args.rounds} round(s)):\n\n"
        + side_table(result["table"], rows, best_ours)
    )
    if line["verdict"] == "not measured":
        return text + f"\ngoal {line['goal']}: not measured\n"
    if line["verdict"] == "inconclusive":
        text += (
            f"\nthe best rows' own drains spread {_fmt(line['spreads'][0], 2)}x (ours) and "
            f"{_fmt(line['spreads'][1], 2)}x (PgQueuer), more than {STEADY_SPREAD:g}x: the "
            "machine's speed changed within the run, so no verdict\n"
        )
    return text + (
        f"\ngoal {line['goal']}: {line['verdict']} ({line['leader']}: "
        f"{line['ours_rate']:,.0f} / {line['pgqueuer_rate']:,.0f} jobs/s = "
        f"{line['ratio']:.2f}x on the drain rate; {_fmt(line['ratio_from_spawn'], 2)}x from "
        f"spawn; {facts['load_at_start']} load at the start)\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["--consume"]:
        dsn, *numbers = raw[1:6]
        processes, managers, batch, cap = (int(n) for n in numbers)
        return consume_in(processes, dsn, managers, batch, cap)
    args = parse_args(raw)
    missing = pgqueuer_missing()
    if missing:
        print(f"not run: {missing}")
        return 2
    sys.path.insert(0, str(BENCH_DIR))
    from pgserver import (
        connect_admin,
        create_database,
        drop_database,
        machine,
        server_for,
        with_database,
    )

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    peer_db = f"{args.db_name}_pgqueuer"
    bench: Bench | None = None
    with server_for(
        args, bench="bench/pgqueuer_drain.py", prefix="leasejobs-pgq-drain-pg-", max_connections=100
    ) as (admin_url, config, label):
        with connect_admin(config) as admin:
            for name in (args.db_name, peer_db):
                create_database(admin, name, MARK)
        try:
            from cost_model import Postgres

            ours_url = with_database(admin_url, args.db_name)
            watched = {
                "ours": Postgres(ours_url, admin_url, label, datname=args.db_name),
                "pgq": Postgres(with_database(admin_url, peer_db), admin_url, label, peer_db),
            }
            bench = Bench(
                args,
                ours_url,
                conninfo_of(config, args.db_name),
                conninfo_of(config, peer_db),
                watched,
            )
            server = {**server_settings(bench.pgq_dsn, bench), "kind": label}
            print(
                f"PostgreSQL {server['server_version']}, {label}: fsync {server['fsync']}, "
                f"synchronous_commit {server['synchronous_commit']}, autovacuum "
                f"{server['autovacuum']}; {args.jobs:,} no-op jobs per drain; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            facts = {**machine(REPO_ROOT), **versions()}
            bench.prepare()
            result = measure(bench)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            if bench is not None:
                bench.stop()
            if not args.keep:
                with contextlib.suppress(Exception), connect_admin(config) as admin:
                    for name in (args.db_name, peer_db):
                        drop_database(admin, name, MARK)
                        print(f"dropped {name}")
    facts["load_at_end"] = [round(load, 2) for load in os.getloadavg()]
    text = report(result, facts, args)
    print()
    print(text)
    problems = [
        f"{run['key']}: {problem}"
        for runs in (*result["grid_runs"].values(), *result["runs"].values())
        for run in runs
        for problem in run["problems"]
    ]
    out = {
        "machine": facts,
        "server": server,
        "options": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "grid"
        },
        **{k: v for k, v in result.items() if k != "rows"},
        "rows": {
            k: {"system": r.system, "settings": r.settings} for k, r in result["rows"].items()
        },
        "problems": problems,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    if problems or args.keep:
        print(f"kept: the settings shim and the worker logs in {bench.workdir}")
    else:
        shutil.rmtree(bench.workdir, ignore_errors=True)
    if problems:
        print("PROBLEMS: " + "; ".join(problems))
        return 1
    if args.fail_on_miss and result["verdict"]["verdict"] == "missed":
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
