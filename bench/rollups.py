"""The rollups' cost on the drain rate: the same drain with ``ROLLUPS`` on and off.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/rollups.py                        # 4 workers, process pool, 20,000 jobs, 5 pairs
    python bench/rollups.py --smoke                # 1,000 jobs, 1 worker, 1 pair: seconds
    python bench/rollups.py --workers 1 --pool thread --repeats 3

It drives ``bench/workers.py``'s ``Bench`` (a PostgreSQL of its own with fast settings, a
database of its own, ``--jobs`` no-op jobs enqueued in one ``COPY``, N ``runworker --burst``
processes started at once and waited for; the drain rate is jobs / (last ``finished_at`` -
first ``started_at``), database clock) once with ``ROLLUPS = True`` and once with
``ROLLUPS = False`` per repeat, the order alternating from one repeat to the next, and the
rollup table emptied before each drain. It reports each side's median rate and the cost:
``1 - median(on) / median(off)``, and checks that with rollups on the rollup table counted
every job (``succeeded`` = ``started`` = ``enqueued`` = jobs), and with them off counted none.

Goal (issue 31): the cost is under 5 %. ``--fail-on-miss`` exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench rollups.py"
GOAL = 0.05
"""The most the rollups may cost, as a fraction of the drain rate without them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=None, help="worker processes (4)")
    parser.add_argument("--pool", choices=["process", "thread"], default="process")
    parser.add_argument("--jobs", type=int, default=None, help="no-op jobs per drain (20,000)")
    parser.add_argument("--repeats", type=int, default=None, help="pairs of drains (5)")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker (2)")
    parser.add_argument("--smoke", action="store_true", help="1,000 jobs, 1 worker, 1 pair")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "artifacts/bench/rollups.json")
    parser.add_argument("--db-name", default="leasejobs_rollups_bench")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 1 on a missed goal")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    defaults = (
        {"workers": 1, "jobs": 1000, "repeats": 1}
        if args.smoke
        else {"workers": 4, "jobs": 20000, "repeats": 5}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.workers, args.jobs, args.repeats, args.concurrency) < 1:
        raise SystemExit("--workers, --jobs, --repeats and --concurrency must be at least 1")
    # What bench/workers.py's Bench reads besides these.
    args.repo, args.launch, args.worker_args, args.sample_ms = REPO_ROOT, "separate", "", 50.0
    return args


def order(repeat: int) -> list[bool]:
    """Rollups on then off in even repeats, off then on in odd ones (drift cancels out)."""
    return [True, False] if repeat % 2 == 0 else [False, True]


def cost(on: Sequence[float], off: Sequence[float]) -> float | None:
    """``1 - median(on) / median(off)``: the fraction of the drain rate rollups cost."""
    if not on or not off or statistics.median(off) <= 0:
        return None
    return 1 - statistics.median(on) / statistics.median(off)


def verdict(value: float | None) -> str:
    if value is None:
        return "no figure"
    return "met" if value < GOAL else "missed"


def rollup_counts(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        [(succeeded, started, enqueued, rows)] = conn.execute(
            "SELECT coalesce(sum(succeeded), 0), coalesce(sum(started), 0), "
            "coalesce(sum(enqueued), 0), count(*) FROM leasejobs_rollup"
        ).fetchall()
    return {
        "succeeded": int(succeeded),
        "started": int(started),
        "enqueued": int(enqueued),
        "rows": int(rows),
    }


def measure(args: argparse.Namespace, admin_url: str) -> dict[str, Any]:
    import psycopg
    import workers as workers_bench  # (bench/, beside this script)
    from pgserver import create_database, drop_database

    bench = workers_bench.Bench(args, admin_url)
    runs: list[dict[str, Any]] = []
    with psycopg.connect(admin_url, autocommit=True) as admin:
        create_database(admin, args.db_name, MARK)
        try:
            bench.prepare()
            for repeat in range(args.repeats):
                for rollups in order(repeat):
                    with psycopg.connect(bench.url, autocommit=True) as conn:
                        conn.execute("TRUNCATE leasejobs_rollup")
                    bench.env["LEASEJOBS_BENCH_OPTIONS"] = json.dumps({"ROLLUPS": rollups})
                    run = bench.run_point(args.pool, args.workers)
                    counts = rollup_counts(bench.url)
                    wanted = args.jobs if rollups else 0
                    if any(counts[n] != wanted for n in ("succeeded", "started", "enqueued")):
                        run["problems"].append(f"rollup counted {counts}, not {wanted} each")
                        run["clean"] = False
                    run.update(rollups=rollups, rollup=counts)
                    runs.append(run)
                    print(
                        f"[{repeat + 1}/{args.repeats}] rollups {'on ' if rollups else 'off'}: "
                        f"{run['rate']:.0f} jobs/s, commits/job {run['commits_per_job']:.3f}, "
                        f"rollup rows {counts['rows']} "
                        + ("ok" if run["clean"] else "PROBLEMS: " + "; ".join(run["problems"])),
                        flush=True,
                    )
        finally:
            bench.stop()
            drop_database(admin, args.db_name, MARK)
    return {"runs": runs}


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    on = [r["rate"] for r in runs if r["rollups"] and r["rate"]]
    off = [r["rate"] for r in runs if not r["rollups"] and r["rate"]]
    value = cost(on, off)
    return {
        "on": statistics.median(on) if on else None,
        "off": statistics.median(off) if off else None,
        "rates_on": on,
        "rates_off": off,
        "cost": value,
        "goal": GOAL,
        "verdict": verdict(value),
        "clean": all(r["clean"] for r in runs),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import workers as workers_bench

    server = workers_bench._pg_binaries_server(
        args.workers * (5 + args.concurrency) + 30,
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
    result = summary(measured["runs"])
    report = {
        "machine": workers_bench.machine(),
        "workers": args.workers,
        "pool": args.pool,
        "concurrency": args.concurrency,
        "jobs": args.jobs,
        "repeats": args.repeats,
        **result,
        "runs": measured["runs"],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    shown = "-" if result["cost"] is None else f"{result['cost'] * 100:+.1f} %"
    print(
        f"\ndrain rate, median of {args.repeats}: rollups on {result['on']:.0f} jobs/s, "
        f"off {result['off']:.0f} jobs/s; cost {shown} (goal < {GOAL * 100:.0f} %): "
        f"{result['verdict']}"
    )
    if not result["clean"]:
        print("PROBLEMS: a job failed or ran twice, or the rollup miscounted (see JSON)")
        return 1
    if args.fail_on_miss and result["verdict"] != "met":
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    started = time.monotonic()
    status = main()
    print(f"({time.monotonic() - started:.0f} s)")
    raise SystemExit(status)
