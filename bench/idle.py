"""Idle cost: what N idle ``runworker`` processes cost one PostgreSQL database.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/idle.py                        # 32 idle workers, 90 s measured
    python bench/idle.py --workers 8 --duration 30
    python bench/idle.py --repo /tmp/before     # the same, with another checkout's code
    python bench/idle.py --private-server       # on a PostgreSQL of its own (see 1.)
    python bench/idle.py --running 4            # busy instead: 4 sleeping jobs per worker

With ``--running K`` the workers are not idle: each runs ``--concurrency K`` and K jobs
(``demo.tasks.slow``, one sleep longer than the run) hold its slots for the whole
measurement, so what is measured is the heartbeat's cost: the renewals (job-table row
updates per running job per minute) and the registry rows, per worker and per job.

What it does:

1. with ``--private-server``, first starts a PostgreSQL of its own from the system's
   binaries (``/usr/lib/postgresql/*/bin``; as the ``postgres`` user when run as root):
   a fresh data directory under /tmp, TCP on 127.0.0.1 and a free port,
   ``max_connections`` 5 per worker + 20 (32 workers need more than the usual 100),
   stopped and deleted at exit; then ``DATABASE_URL`` is not used. Either way it
   creates its own database ``--db-name`` (default ``leasejobs_idle_bench``) on the
   server ``DATABASE_URL`` names (default ``postgres://postgres@127.0.0.1:5432/postgres``,
   only used as the admin connection), marked with a comment; it refuses to drop a
   database without that mark, and drops its own at exit unless ``--keep``;
2. migrates it with ``--repo``'s ``testproject/manage.py`` (default: this checkout) and
   starts ``--workers`` ``runworker --pool thread --concurrency 1`` processes of that
   project (its default OPTIONS: ``POLL_INTERVAL`` 1 s, ``HEARTBEAT_INTERVAL`` 10 s,
   ``STALE_LOCK_INTERVAL`` 10 s; ``--options`` adds JSON over them), no job enqueued;
3. after ``--warmup`` seconds, reads the database's ``xact_commit`` from
   ``pg_stat_database`` and the worker table's updates from ``pg_stat_user_tables``, and
   again ``--duration`` seconds later: commits per second (all workers together, and per
   worker), worker-row updates (heartbeats) per minute, and connections per worker
   (``pg_stat_activity``);
4. stops every worker it started (SIGTERM, then SIGKILL of its process group) and drops
   the database, also on Ctrl-C or an error.

PostgreSQL's statistics reach ``pg_stat_database`` when a backend reports them (at most
once a second while busy, within 10 s when idle), so a short ``--duration`` is noisy;
90 s keeps the error under a few percent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from pgserver import (
    PrivateServer,
    add_server_options,
    create_database,
    drop_database,
    stop_workers,
    with_database,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench idle.py"
DEFAULT_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def counters(admin: psycopg.Connection[Any], name: str, url: str) -> tuple[int, int, int, int]:
    """(xact_commit of the database, updates of its worker table, updates of its job
    table, the server's WAL position in bytes)."""
    [(commits, wal)] = admin.execute(
        "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_stat_database "
        "WHERE datname = %s",
        [name],
    ).fetchall()
    with psycopg.connect(url, autocommit=True) as conn:
        # (One autocommit transaction of our own: the first reading's falls in the
        # measured window, and main() takes it off.)
        rows = dict(
            conn.execute(
                "SELECT relname, n_tup_upd FROM pg_stat_user_tables "
                "WHERE relname IN ('leasejobs_worker', 'leasejobs_job')"
            ).fetchall()
        )
    return (
        int(commits),
        int(rows.get("leasejobs_worker", 0)),
        int(rows.get("leasejobs_job", 0)),
        int(wal),
    )


def enqueue_sleepers(manage: Path, env: dict[str, str], count: int) -> None:
    """``count`` jobs that each sleep an hour in one step (``demo.tasks.slow``)."""
    code = (
        "from demo.tasks import slow\n"
        f"for _ in range({count}): slow.enqueue(seconds=3600, steps=1)\n"
    )
    subprocess.run([sys.executable, str(manage), "shell", "-c", code], env=env, check=True)


def running_jobs(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        [(count,)] = conn.execute(
            "SELECT count(*) FROM leasejobs_job WHERE status = 'running'"
        ).fetchall()
    return int(count)


def connections_of(admin: psycopg.Connection[Any], name: str) -> int:
    [(count,)] = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = "
        "'client backend'",
        [name],
    ).fetchall()
    return int(count)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--duration", type=float, default=90.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring")
    parser.add_argument("--db-name", default="leasejobs_idle_bench")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="checkout whose code runs")
    parser.add_argument("--options", default="{}", help="backend OPTIONS as JSON, over defaults")
    parser.add_argument("--keep", action="store_true", help="keep the database at exit")
    parser.add_argument(
        "--running",
        type=int,
        default=0,
        metavar="K",
        help="busy instead of idle: K sleeping jobs per worker (--concurrency K)",
    )
    add_server_options(parser)
    args = parser.parse_args()
    server = PrivateServer(5 * args.workers + 20) if args.private_server else None
    try:
        return measure(args, server.url if server else None)
    finally:
        if server is not None:
            server.stop()


def measure(args: argparse.Namespace, admin_url: str | None) -> int:
    admin_url = admin_url or os.environ.get("DATABASE_URL", DEFAULT_ADMIN_URL)
    url = with_database(admin_url, args.db_name)
    manage = args.repo.resolve() / "testproject" / "manage.py"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
    }
    options = json.loads(args.options)
    if options:
        env["LEASEJOBS_IDLE_BENCH_OPTIONS"] = json.dumps(options)
    procs: list[subprocess.Popen[bytes]] = []
    logdir = Path(tempfile.mkdtemp(prefix="leasejobs-idle-"))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        create_database(admin, args.db_name, MARK)
        try:
            subprocess.run([sys.executable, str(manage), "migrate", "-v0"], env=env, check=True)
            if options:  # the testproject reads no OPTIONS from the environment: a shim
                shim = logdir / "idle_bench_settings.py"
                shim.write_text(
                    "import json, os\nfrom testproject.settings import *  # noqa\n"
                    "TASKS['default']['OPTIONS'].update("
                    "json.loads(os.environ['LEASEJOBS_IDLE_BENCH_OPTIONS']))\n"
                )
                env["PYTHONPATH"] = str(logdir)
                env["DJANGO_SETTINGS_MODULE"] = "idle_bench_settings"
            print(f"starting {args.workers} idle workers ({manage.parent.parent})", flush=True)
            for index in range(args.workers):
                log = (logdir / f"worker-{index}.log").open("wb")
                procs.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, str(manage), "runworker", "--pool", "thread"),
                            *("--concurrency", str(max(1, args.running))),
                            *("--worker-id", f"idle-{index}"),
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                log.close()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                started = sum(
                    b"started: backend=" in (logdir / f"worker-{i}.log").read_bytes()
                    for i in range(args.workers)
                )
                if started == args.workers or any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.5)
            if started != args.workers:
                raise SystemExit(
                    f"only {started} of {args.workers} workers started (logs {logdir})"
                )
            running = args.running * args.workers
            if running:
                enqueue_sleepers(manage, env, running)
                deadline = time.monotonic() + 120
                while running_jobs(url) < running:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{running} jobs did not all start (logs {logdir})")
                    time.sleep(0.5)
            time.sleep(args.warmup)
            commits0, updates0, job_updates0, wal0 = counters(admin, args.db_name, url)
            began = time.monotonic()
            time.sleep(args.duration)
            commits1, updates1, job_updates1, wal1 = counters(admin, args.db_name, url)
            elapsed = time.monotonic() - began
            conns = connections_of(admin, args.db_name)
            listening = sum(
                b"listening for new jobs" in (logdir / f"worker-{i}.log").read_bytes()
                for i in range(args.workers)
            )
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a worker exited during the run (logs {logdir})")
            # The first reading's own query of the worker table falls in the window.
            commits = commits1 - commits0 - 1
            job_updates = job_updates1 - job_updates0
            result = {
                "server": "private" if args.private_server else admin_url,
                "workers": args.workers,
                "listening": listening,
                "seconds": round(elapsed, 1),
                "commits_per_second": round(commits / elapsed, 2),
                "commits_per_second_per_worker": round(commits / elapsed / args.workers, 3),
                "worker_row_updates_per_minute": round((updates1 - updates0) / elapsed * 60, 1),
                "running_jobs": running,
                "job_row_updates_per_minute": round(job_updates / elapsed * 60, 1),
                "job_row_updates_per_running_job_per_minute": (
                    round(job_updates / elapsed * 60 / running, 2) if running else None
                ),
                "wal_bytes_per_second": round((wal1 - wal0) / elapsed),
                "connections": conns,
                "connections_per_worker": round(conns / args.workers, 2),
                "options": options,
            }
            print(json.dumps(result, indent=2))
        finally:
            stop_workers(procs)
            if not args.keep:
                drop_database(admin, args.db_name, MARK)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
