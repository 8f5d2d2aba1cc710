"""Flow control: does a backlog held back by a full concurrency key slow other claims?

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/flow.py                         # 100,000-job backlog, 3 repeats (~8 min)
    python bench/flow.py --smoke                 # 5,000-job backlog, tiny sizes (CI, ~20 s)
    python bench/flow.py --workers 0 --spread-keys 0 --repeats 1   # direct claims, (a)+(b) only
    python bench/flow.py --output /tmp/flow.json --markdown /tmp/flow.md

Goal (issue 17): a backlog of 100,000 pending jobs on one full key must not slow the
claim of other jobs by more than 2x.

What it does:

1. starts a PostgreSQL of its own (``bench/pgserver.py``, ``production=True``:
   PostgreSQL's own defaults, so ``fsync``, ``synchronous_commit``,
   ``full_page_writes`` and autovacuum are on; ``--fast-server`` turns the first three
   off; ``pg_stat_statements`` loaded when the binaries have it), creates a marked
   database in it and migrates it with the test project (``testproject``; a settings
   shim of its own logs at WARNING, has no schedules and imports a no-op task);
2. for each repeat (after one unrecorded warm-up pass of the baseline), measures the
   situations in turn, each on a freshly truncated job table:

   * ``none``: no backlog (the baseline);
   * ``one_key``: ``--backlog`` pending jobs of ONE concurrency key
     (``flow_group = 'key:backlog-0'``, ``concurrency_limit`` 1), due an hour ago, so
     AHEAD of every other job in claim order, and one job of that key ``running``
     under a lease that outlives the run (``locked_by = 'flow-bench-holder'``): the
     key is full for the whole run;
   * ``spread`` (``--spread-keys`` > 0): the same backlog over ``--spread-keys`` keys,
     each full the same way (one running holder per key);

   the backlog is inserted with one ``INSERT ... SELECT generate_series``, then the
   table is ``VACUUM ANALYZE``d (what autovacuum does to a backlog that sits there);
3. in each situation, for each kind of OTHER job, ``--other-jobs`` of them in the
   worker's queues, due now (behind the backlog in claim order):

   * ``unlimited``: no flow group (the main lane);
   * ``keyed``: ``--other-keys`` keys of their own (``key:other-<n>``, each of
     ``--other-limit`` running jobs), so that they go through the flow claim;

   a. ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of every statement of one claim
      (first repeat only; the claim runs inside a transaction rolled back at the end,
      each statement explained in a savepoint rolled back before the real one runs;
      when that claim says flow limits held jobs back, the worker's next claim, main
      lane only, too): per statement its buffers, time, rows and scan nodes;
   b. direct claims: ``leases.claim_round(...)`` (``leases.claim`` on code without it)
      in a loop with ``limit=--batch``, the worker's default queues and flow rules, as a
      worker's database rounds call it (after a claim held back by flow limits, main
      lane only for ``POLL_INTERVAL``; an empty such claim is followed at once by a full
      one); the claimed jobs are marked ``succeeded`` after each claim (not timed), until
      a full claim comes back empty; per claim: the latency (client side, every round
      trip and the commit), jobs per claim, and jobs per second of claim time;
   c. once they are all claimed, what an idle worker looks up after an empty claim
      (``leases.seconds_to_next_due``): 20 timed calls and, first repeat, its EXPLAIN
      (reported, not judged: it is not a claim, but a walk of the backlog shows there);
   d. with ``--workers`` > 0: the same number of no-op jobs again, drained by
      ``--workers`` ``runworker`` processes (``--pool``, ``--concurrency``) started at
      once and stopped when every one of those jobs finished: the drain rate (jobs /
      (last ``finished_at`` - first ``started_at``)), and with ``pg_stat_statements`` the
      calls and mean server time of each statement;

4. checks, every situation: no backlog job ever claimed (``last_attempted_at`` still
   NULL: a claim sets it, even one given back), all of them still pending, every holder
   still running under its lease, the running jobs of each backlog key never above its
   limit of 1 (a sampler reads them every ``--sample-ms``); every other job claimed
   exactly once (direct) or ``succeeded`` on attempt 1 (workers). A failed check exits 1;
5. verdict: per kind, the slowdown of ``one_key`` against ``none``: claim latency p50
   and p99 (``one_key / none``), direct jobs/s and the workers' drain rate
   (``none / one_key``); the goal is met when every slowdown is at most ``--goal``
   (2.0). ``spread`` is reported the same way, not judged (the issue names one key).
   ``--fail-on-miss`` exits 3 on a missed goal; ``--smoke`` prints the verdict without
   judging it (tiny sizes say nothing about the goal).

Output: a line per measurement while it runs, then the table and the verdict; all of
it with the machine, server and commit as JSON in ``--output``
(``artifacts/bench/flow.json``), the table in ``--markdown``. Every process it started
is stopped and the server deleted at exit, also on Ctrl-C or SIGTERM (``--keep`` leaves
the server running and prints where).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench flow.py"
DB_NAME = "leasejobs_flow_bench"
HOLDER = "flow-bench-holder"
CLAIMER = "flow-bench-claimer"
BACKLOG_PREFIX = "key:backlog-"
OTHER_PREFIX = "key:other-"
SITUATIONS = ("none", "one_key", "spread")
BASELINE, JUDGED = "none", "one_key"
KINDS = ("unlimited", "keyed")
LEASE_SECONDS = 300.0
NEXT_DUE_CALLS = 20

SHIM = "flow_bench"
"""The shim (``bench/shim.py``) the bench's processes import: settings and a no-op task."""
SETTINGS_MODULE, TASK_MODULE = f"{SHIM}_settings", f"{SHIM}_tasks"
TASK_PATH = f"{TASK_MODULE}.noop"


SMOKE = {
    "backlog": 5000,
    "spread_keys": 50,
    "other_jobs": 200,
    "repeats": 1,
    "workers": 1,
}
FULL = {
    "backlog": 100_000,
    "spread_keys": 1000,
    "other_jobs": 2000,
    "repeats": 3,
    "workers": 2,
}


# -- arguments -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (CI)")
    parser.add_argument("--backlog", type=int, help="pending jobs of the full key(s) (100,000)")
    parser.add_argument(
        "--spread-keys", type=int, help="keys of the spread situation, 0: skip it (1,000)"
    )
    parser.add_argument("--other-jobs", type=int, help="other jobs claimed per measure (2,000)")
    parser.add_argument("--other-keys", type=int, default=20, help="keys of the keyed kind (20)")
    parser.add_argument(
        "--other-limit", type=int, default=5, help="concurrency limit of each such key (5)"
    )
    parser.add_argument("--batch", type=int, default=10, help="limit of each direct claim (10)")
    parser.add_argument("--repeats", type=int, help="rounds over every situation (3)")
    parser.add_argument("--workers", type=int, help="burst workers per drain, 0: none (2)")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker (2)")
    parser.add_argument("--pool", choices=("thread", "process"), default="thread")
    parser.add_argument("--goal", type=float, default=2.0, help="largest slowdown allowed (2.0)")
    parser.add_argument("--sample-ms", type=float, default=50.0, help="running-count sampling")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="checkout whose code runs")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "artifacts/bench/flow.json")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--fast-server",
        action="store_true",
        help="fsync, synchronous_commit and full_page_writes off (not production settings)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the server and its data")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 3 on a missed goal")
    args = parser.parse_args(argv)
    for name, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    problem = argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def argument_problem(args: argparse.Namespace) -> str:
    """What is wrong with the options, or ``""``."""
    if args.backlog < 1 or args.other_jobs < 1:
        return "--backlog and --other-jobs must be at least 1"
    if args.spread_keys < 0 or args.spread_keys > args.backlog:
        return "--spread-keys must be between 0 and --backlog"
    if min(args.other_keys, args.other_limit, args.batch, args.repeats) < 1:
        return "--other-keys, --other-limit, --batch and --repeats must be at least 1"
    if args.workers < 0 or args.concurrency < 1:
        return "--workers must be 0 or more and --concurrency at least 1"
    if args.goal < 1:
        return "--goal must be at least 1 (a slowdown factor)"
    return ""


def situations(args: argparse.Namespace) -> list[str]:
    return [s for s in SITUATIONS if s != "spread" or args.spread_keys > 0]


def backlog_keys(situation: str, args: argparse.Namespace) -> int:
    """How many full keys hold the backlog of ``situation`` (0: no backlog)."""
    return {"none": 0, "one_key": 1, "spread": args.spread_keys}[situation]


# -- pure parts: statistics, verdict, plans, table -----------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(round(fraction * len(ordered), 9)))
    return ordered[min(len(ordered), rank) - 1]


def claim_summary(
    latencies_ms: Sequence[float],
    jobs: int,
    empty_ms: Sequence[float] = (),
    main_lane_only: int = 0,
    held: int = 0,
) -> dict[str, Any]:
    """Figures of a measure's claims: latency (ms) of the claims that took jobs, jobs per
    such claim, and jobs per second of claim time (every claim call, the empty ones
    too); how many calls came back empty, took the main lane only, or were held back
    by flow limits."""
    seconds = (sum(latencies_ms) + sum(empty_ms)) / 1000
    return {
        "claims": len(latencies_ms),
        "jobs": jobs,
        "p50_ms": percentile(latencies_ms, 0.50),
        "p90_ms": percentile(latencies_ms, 0.90),
        "p99_ms": percentile(latencies_ms, 0.99),
        "max_ms": max(latencies_ms) if latencies_ms else None,
        "mean_ms": statistics.fmean(latencies_ms) if latencies_ms else None,
        "jobs_per_claim": jobs / len(latencies_ms) if latencies_ms else None,
        "jobs_per_s": jobs / seconds if seconds > 0 else None,
        "empty_claims": len(empty_ms),
        "main_lane_only": main_lane_only,
        "held": held,
    }


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, Any] | None:
    """p50/p99/max of some calls' latencies (ms); None for no calls."""
    if not latencies_ms:
        return None
    return {
        "calls": len(latencies_ms),
        "p50_ms": percentile(latencies_ms, 0.50),
        "p99_ms": percentile(latencies_ms, 0.99),
        "max_ms": max(latencies_ms),
    }


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


MEASURES = (
    # (name, where, key, higher_is_better, judged)
    ("claim p50", "direct", "p50_ms", False, True),
    ("claim p99", "direct", "p99_ms", False, True),
    ("claim jobs/s", "direct", "jobs_per_s", True, True),
    ("workers drain jobs/s", "workers", "rate", True, True),
    # An idle worker's lookup after an empty claim (leases.seconds_to_next_due): not a
    # claim, so not judged, but a walk of the backlog shows here.
    ("next-due lookup p50", "next_due", "p50_ms", False, False),
)


def slowdown(base: float | None, value: float | None, higher_is_better: bool) -> float | None:
    """How many times slower ``value`` is than ``base`` (1.0: the same; below 1: faster)."""
    if base is None or value is None or base <= 0 or value <= 0:
        return None
    return base / value if higher_is_better else value / base


def verdicts(results: dict[str, dict[str, Any]], goal: float) -> list[dict[str, Any]]:
    """One line per situation with a backlog, kind and measure: its slowdown against
    the baseline and the verdict (``met``, ``missed``, ``not measured``; the spread
    situation is ``informative``, never judged). A situation whose checks failed never
    meets its goal."""
    lines = []
    base_kinds = results.get(BASELINE, {})
    for situation, kinds in results.items():
        if situation == BASELINE:
            continue
        for kind, figures in kinds.items():
            base = base_kinds.get(kind, {})
            for name, where, key, higher, judged in MEASURES:
                before = (base.get(where) or {}).get(key)
                after = (figures.get(where) or {}).get(key)
                factor = slowdown(before, after, higher)
                if factor is None:
                    verdict = "not measured"
                elif situation != JUDGED or not judged:
                    verdict = "informative"
                elif factor <= goal and not figures.get("problems"):
                    verdict = "met"
                else:
                    verdict = "missed"
                lines.append(
                    {
                        "situation": situation,
                        "kind": kind,
                        "measure": name,
                        "baseline": before,
                        "value": after,
                        "slowdown": factor,
                        "goal": goal if situation == JUDGED and judged else None,
                        "verdict": verdict,
                    }
                )
    return lines


def overall(lines: Sequence[dict[str, Any]]) -> str:
    """``met`` when every judged line is met, ``missed`` when one is missed, else
    ``not measured``."""
    judged = [line["verdict"] for line in lines if line["verdict"] in ("met", "missed")]
    if "missed" in judged:
        return "missed"
    if judged and all(v == "met" for v in judged):
        return "met"
    return "not measured"


STATEMENT_LABELS = (
    # (a fragment of the SQL, the label); the first match wins
    ("WITH picked AS", "main-lane claim"),
    ("SELECT CASE WHEN EXISTS", "flow-lane due?"),
    ("leasejobs_flow_lock", "flow lock"),
    ("EXTRACT(EPOCH FROM LEAST", "next-due lookup"),
    ('FROM "leasejobs_queue"', "paused queues"),
    ("FROM leasejobs_queue", "paused queues"),
    ("WITH RECURSIVE qs", "pending queues"),
    ("GROUP BY j.queue, j.flow_group", "running per queue/group"),
    ("WITH RECURSIVE g", "flow-lane candidates"),
    ("UNION ALL", "main-lane candidates"),
    ("leasejobs_rate_start", "rate starts"),
    ("RETURNING", "claim rows"),
)


def statement_label(sql: str) -> str:
    """A short name for one statement of a claim."""
    flat = " ".join(sql.split())
    for fragment, label in STATEMENT_LABELS:
        if fragment in flat:
            return label
    return flat[:40]


def plan_nodes(node: dict[str, Any], depth: int = 0) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` plan, depth first."""
    yield {
        "depth": depth,
        "node": node.get("Node Type", "?"),
        "index": node.get("Index Name"),
        "relation": node.get("Relation Name"),
        "rows": node.get("Actual Rows"),
        "loops": node.get("Actual Loops"),
        "buffers": int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0)),
    }
    for child in node.get("Plans", []):
        yield from plan_nodes(child, depth + 1)


def plan_summary(sql: str, explained: Any) -> dict[str, Any]:
    """One statement's plan, boiled down: its buffers (shared hit + read, of the whole
    statement and of each scan node), execution time, rows, and the scans."""
    document = explained[0] if isinstance(explained, list) else explained
    top = document["Plan"]
    scans = [n for n in plan_nodes(top) if "Scan" in n["node"] or n["node"] in ("ModifyTable",)]
    return {
        "statement": statement_label(sql),
        "execution_ms": document.get("Execution Time"),
        "rows": top.get("Actual Rows"),
        "shared_hit": int(top.get("Shared Hit Blocks", 0)),
        "shared_read": int(top.get("Shared Read Blocks", 0)),
        "buffers": int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
        "scans": [
            f"{n['node']}"
            + (f" using {n['index']}" if n["index"] else "")
            + (f" on {n['relation']}" if n["relation"] and not n["index"] else "")
            + f": {n['rows']} rows x {n['loops']} loops, {n['buffers']} buffers"
            for n in scans
        ],
    }


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    head = (
        "| situation | other jobs | claims | claim p50 (ms) | claim p99 (ms) | jobs per claim | "
        "claim jobs/s | workers jobs/s | buffers per claim | next-due p50 (ms) | "
        "next-due buffers |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for situation, kinds in results.items():
        for kind, figures in kinds.items():
            direct = figures.get("direct") or {}
            workers = figures.get("workers") or {}
            due = figures.get("next_due") or {}
            explain = figures.get("explain")
            rows.append(
                f"| {situation} | {kind} | {_fmt(direct.get('claims'))} | "
                f"{_fmt(direct.get('p50_ms'), 2)} | {_fmt(direct.get('p99_ms'), 2)} | "
                f"{_fmt(direct.get('jobs_per_claim'), 1)} | {_fmt(direct.get('jobs_per_s'))} | "
                f"{_fmt(workers.get('rate'))} | {_fmt(explain_buffers(explain))} | "
                f"{_fmt(due.get('p50_ms'), 2)} | "
                f"{_fmt(explain_buffers(explain, 'next-due lookup'))} |"
            )
    return head + "\n".join(rows) + "\n"


def explain_buffers(
    explain: Sequence[dict[str, Any]] | None, which: str = "full claim"
) -> float | None:
    """Buffers (shared hit + read) of the explained statements of ``which`` (the first,
    full claim; ``"next-due lookup"``)."""
    chosen = [s["buffers"] for s in explain or () if s.get("claim", "full claim") == which]
    return float(sum(chosen)) if chosen else None


def describe_line(line: dict[str, Any]) -> str:
    factor = line["slowdown"]
    verdict = "MISSED" if line["verdict"] == "missed" else line["verdict"]
    shown = "-" if factor is None else f"{factor:.2f}x"
    goal = f" (goal <= {line['goal']:g}x)" if line["goal"] is not None else ""
    return (
        f"{line['situation']:8} {line['kind']:9} {line['measure']:21} "
        f"{_fmt(line['baseline'], 2):>9} -> {_fmt(line['value'], 2):>9}: "
        f"slowdown {shown}{goal} {verdict}"
    )


# -- the measurement ----------------------------------------------------------------------

JOB_COLUMNS = (
    "backend, queue, task_path, args, kwargs, priority, max_attempts, max_stalls, "
    "flow_group, concurrency_limit, status, attempt, stall_count, snoozes, last_worker, "
    "cancel_requested, progress_message, last_error, enqueued_at, run_after, locked_by, "
    "locked_until, heartbeat_at, started_at, last_attempted_at"
)

BACKLOG_SQL = f"""
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT 'default', %(queue)s, %(task)s, '[]', '{{}}', 0, 3, 3,
       %(prefix)s || ((i - 1) %% %(keys)s), 1, 'pending', 0, 0, 0, '',
       false, '', '', now() - interval '1 hour', now() - interval '1 hour'
       + interval '1 millisecond' * (i / %(keys)s), NULL, NULL, NULL, NULL, NULL
FROM generate_series(1, %(n)s) AS i
"""

HOLDERS_SQL = f"""
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT 'default', %(queue)s, %(task)s, '[]', '{{}}', 0, 3, 3,
       %(prefix)s || k, 1, 'running', 1, 0, 0, %(holder)s,
       false, '', '', now() - interval '2 hours', now() - interval '2 hours', %(holder)s,
       now() + interval '1 day', now(), now(), now()
FROM generate_series(0, %(keys)s - 1) AS k
"""

OTHERS_SQL = f"""
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT 'default', %(queue)s, %(task)s, '[]', '{{}}', 0, 3, 3,
       CASE WHEN %(keys)s > 0 THEN %(prefix)s || (i %% GREATEST(%(keys)s, 1)) END,
       CASE WHEN %(keys)s > 0 THEN %(limit)s END, 'pending', 0, 0, 0, '',
       false, '', '', now(), now(), NULL, NULL, NULL, NULL, NULL
FROM generate_series(1, %(n)s) AS i
RETURNING id
"""

COMPLETE_SQL = (
    "UPDATE leasejobs_job SET status = 'succeeded', finished_at = now(), locked_by = NULL, "
    "locked_until = NULL WHERE id = ANY(%s) AND status = 'running'"
)

CHECK_SQL = """
SELECT
  count(*) FILTER (WHERE status = 'pending'),
  count(*) FILTER (WHERE last_attempted_at IS NOT NULL AND locked_by IS DISTINCT FROM %(holder)s),
  count(*) FILTER (WHERE status = 'running' AND locked_by = %(holder)s
                   AND locked_until > now())
FROM leasejobs_job WHERE flow_group LIKE %(like)s
"""

RUNNING_SQL = """
SELECT coalesce(max(c), 0) FROM (
  SELECT count(*) AS c FROM leasejobs_job
  WHERE status = 'running' AND flow_group LIKE %s GROUP BY flow_group
) AS per_key
"""


class RunningSampler(threading.Thread):
    """Polls the most running jobs any backlog key has (its own connection)."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.stop_event = threading.Event()
        self.samples = 0
        self.most = 0
        self.error: str | None = None

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    (most,) = conn.execute(RUNNING_SQL, [BACKLOG_PREFIX + "%"]).fetchone()  # type: ignore[misc]
                    self.samples += 1
                    self.most = max(self.most, int(most))
                    self.stop_event.wait(self.interval)
        except Exception as exc:  # reported, never silent
            self.error = repr(exc)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


class Bench:
    """The measurement, with Django set up in this process (on the bench database)."""

    def __init__(self, args: argparse.Namespace, url: str, statements: bool) -> None:
        self.args = args
        self.url = url
        self.statements = statements
        self.shim = Path(tempfile.mkdtemp(prefix="leasejobs-flow-"))
        import shim  # (bench/, beside this script)

        shim.write(self.shim, SHIM)
        self.repo = args.repo.resolve()
        paths = [str(self.shim), str(self.repo / "testproject"), str(self.repo)]
        self.env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "PYTHONPATH": os.pathsep.join(paths),
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.backlog_max_id = 0
        os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE)
        for path in reversed(paths):
            sys.path.insert(0, path)

    def prepare(self) -> None:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from django_leasejobs.compat import task_backends

        backend = task_backends["default"]
        self.flow = backend.config.flow  # type: ignore[attr-defined]
        self.queues = tuple(sorted(backend.queues)) if backend.queues else None
        self.queue = "default"
        self.poll_interval = float(backend.config.poll_interval)  # type: ignore[attr-defined]
        if self.statements:
            self.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []

    # -- situations ------------------------------------------------------------------------

    def set_up(self, situation: str) -> dict[str, Any]:
        """A fresh job table holding ``situation``'s backlog and its running holders."""
        args = self.args
        self.execute(
            "TRUNCATE leasejobs_attempt, leasejobs_job, leasejobs_worker, leasejobs_rate_start "
            "RESTART IDENTITY CASCADE"
        )
        keys = backlog_keys(situation, args)
        started = time.monotonic()
        if keys:
            values = {
                "queue": self.queue,
                "task": TASK_PATH,
                "prefix": BACKLOG_PREFIX,
                "keys": keys,
                "n": args.backlog,
                "holder": HOLDER,
            }
            self.execute(BACKLOG_SQL, values)
            self.execute(HOLDERS_SQL, values)
        [(top,)] = self.execute("SELECT coalesce(max(id), 0) FROM leasejobs_job")
        self.backlog_max_id = int(top)
        return {
            "keys": keys,
            "jobs": args.backlog if keys else 0,
            "insert_s": time.monotonic() - started,
        }

    def add_others(self, kind: str, task_path: str) -> tuple[int, int]:
        """Insert the other jobs of ``kind``; VACUUM ANALYZE; their id range."""
        # The previous measure's other jobs go; the backlog and its holders stay.
        self.execute("DELETE FROM leasejobs_job WHERE id > %s", [self.backlog_max_id])
        rows = self.execute(
            OTHERS_SQL,
            {
                "queue": self.queue,
                "task": task_path,
                "prefix": OTHER_PREFIX,
                "keys": self.args.other_keys if kind == "keyed" else 0,
                "limit": self.args.other_limit,
                "n": self.args.other_jobs,
            },
        )
        ids = [int(r[0]) for r in rows]
        self.execute("VACUUM ANALYZE leasejobs_job")
        return min(ids), max(ids)

    def checks(self, situation: str, sampler: RunningSampler) -> list[str]:
        keys = backlog_keys(situation, self.args)
        if not keys:
            return []
        [(pending, started, holding)] = self.execute(
            CHECK_SQL, {"holder": HOLDER, "like": BACKLOG_PREFIX + "%"}
        )
        problems = []
        if pending != self.args.backlog:
            problems.append(f"{pending} backlog jobs pending, not {self.args.backlog}")
        if started:
            problems.append(f"{started} backlog jobs were claimed")
        if holding != keys:
            problems.append(f"{holding} holders running under a lease, not {keys}")
        if sampler.most > 1:
            problems.append(f"a backlog key had {sampler.most} running jobs (limit 1)")
        if sampler.error:
            problems.append(f"the running-count sampler failed: {sampler.error}")
        return problems

    # -- one claim, explained -------------------------------------------------------------

    def claim(self, main_lane_first: bool) -> tuple[list[Any], bool]:
        """One claim as a worker's database round makes it: ``leases.claim_round`` (the
        jobs, and whether flow limits held due jobs back); ``leases.claim`` on code
        without it."""
        from django_leasejobs import leases

        claim_round = getattr(leases, "claim_round", None)
        if claim_round is None:
            jobs = leases.claim(
                CLAIMER,
                limit=self.args.batch,
                lease_duration=LEASE_SECONDS,
                queues=self.queues,
                flow=self.flow,
            )
            return jobs, False
        result = claim_round(
            CLAIMER,
            limit=self.args.batch,
            lease_duration=LEASE_SECONDS,
            queues=self.queues,
            flow=self.flow,
            main_lane_first=main_lane_first,
        )
        return result.jobs, bool(result.flow_held)

    def explained(self, which: str, call: Any) -> tuple[Any, list[dict[str, Any]]]:
        """``call()`` in a transaction rolled back at the end, with EXPLAIN (ANALYZE,
        BUFFERS) of each of its statements, each explained in a savepoint rolled back
        before the real statement runs (so the call goes on as it would)."""
        from django.db import connection, transaction

        plans: list[dict[str, Any]] = []

        def explain(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            first = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
            if not many and first in ("SELECT", "WITH", "UPDATE", "INSERT", "DELETE"):
                raw = context["cursor"].cursor
                raw.execute("SAVEPOINT flow_bench_explain")
                raw.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
                (document,) = raw.fetchone()
                raw.execute("ROLLBACK TO SAVEPOINT flow_bench_explain")
                raw.execute("RELEASE SAVEPOINT flow_bench_explain")
                if isinstance(document, str):
                    document = json.loads(document)
                plans.append({"claim": which, **plan_summary(sql, document)})
            return execute(sql, params, many, context)

        with transaction.atomic(), connection.execute_wrapper(explain):
            result = call()
            transaction.set_rollback(True)
        return result, plans

    def explain_claim(self) -> list[dict[str, Any]]:
        """The statements of one claim, explained (``explained``); when that claim says
        flow limits held jobs back, also those of the claim a worker makes next (main
        lane only)."""
        (_, held), plans = self.explained("full claim", lambda: self.claim(True))
        if held:
            _, more = self.explained("main lane only", lambda: self.claim(False))
            plans += more
        return plans

    def next_due(self, explain: bool) -> tuple[list[float], list[dict[str, Any]]]:
        """What an idle worker asks after an empty claim (``leases.seconds_to_next_due``,
        absent from older code): 20 timed calls, and with ``explain`` its plan."""
        from django_leasejobs import leases

        lookup = getattr(leases, "seconds_to_next_due", None)
        if lookup is None:
            return [], []
        plans: list[dict[str, Any]] = []
        if explain:
            _, plans = self.explained("next-due lookup", lambda: lookup("default", self.queues))
        latencies = []
        for _ in range(NEXT_DUE_CALLS):
            started = time.perf_counter()
            lookup("default", self.queues)
            latencies.append((time.perf_counter() - started) * 1000)
        return latencies, plans

    # -- direct claims ---------------------------------------------------------------------

    def direct(self, low: int, high: int) -> tuple[dict[str, Any], list[str]]:
        """Claim the other jobs in ``--batch``es, as a worker's rounds do, until a full
        claim comes back empty.

        After a claim that says flow limits held due jobs back, the next claims take the
        main lane only for ``POLL_INTERVAL`` (as the worker does); an empty main-lane-only
        claim is followed at once by a full one (a worker would wait for its next poll:
        this loop measures claims, not idle waits)."""
        latencies: list[float] = []
        empty: list[float] = []
        claimed: set[int] = set()
        problems: list[str] = []
        twice = wrong = main_only = held_count = 0
        held_until = 0.0
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline:
            main_lane_first = time.monotonic() < held_until
            started = time.perf_counter()
            jobs, held = self.claim(main_lane_first)
            elapsed = (time.perf_counter() - started) * 1000
            main_only += main_lane_first
            if held:
                held_count += 1
                held_until = time.monotonic() + self.poll_interval
            if not jobs:  # (main lane first still makes a flow claim for what it leaves)
                empty.append(elapsed)
                break
            latencies.append(elapsed)
            ids = [job.id for job in jobs]
            wrong += sum(1 for i in ids if not low <= i <= high)
            twice += sum(1 for i in ids if i in claimed)
            claimed.update(ids)
            self.execute(COMPLETE_SQL, [ids])
        else:
            problems.append(f"direct claims took longer than {self.args.timeout:g}s")
        if wrong:
            problems.append(f"{wrong} claimed jobs were not the other jobs (backlog jobs?)")
        if twice:
            problems.append(f"{twice} jobs claimed twice")
        if len(claimed) != high - low + 1:
            problems.append(f"claimed {len(claimed)} of {high - low + 1} other jobs")
        run = {
            "latencies": latencies,
            "empty": empty,
            "jobs": len(claimed),
            "main_lane_only": main_only,
            "held": held_count,
        }
        return run, problems

    # -- real workers ----------------------------------------------------------------------

    def workers(self, low: int, high: int, label: str) -> tuple[dict[str, Any], list[str]]:
        """Drain the other jobs ``low``..``high`` with ``--workers`` runworker processes
        started at once; stop them (SIGTERM) once every one of those jobs finished.

        Not ``--burst``: a burst worker exits after a claim that came back empty while
        its own jobs held their keys' slots (``worker/loop.py``), leaving keyed jobs
        pending (see bench/README.md)."""
        from pgserver import stop_workers

        args = self.args
        if self.statements:
            self.execute("SELECT pg_stat_statements_reset()")
        logdir = self.shim / f"logs-{label}-{time.monotonic_ns()}"
        logdir.mkdir()
        problems: list[str] = []
        self.procs = []
        spawned = time.time()
        try:
            for index in range(args.workers):
                log = (logdir / f"w{index}.log").open("wb")
                try:
                    self.procs.append(
                        subprocess.Popen(
                            [
                                *(sys.executable, str(self.repo / "testproject" / "manage.py")),
                                *("runworker", "--no-scheduler", "--pool", args.pool),
                                *("--concurrency", str(args.concurrency)),
                                *("--worker-id", f"flow-bench-w{index}"),
                            ],
                            env=self.env,
                            cwd=str(self.repo),
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
                finally:
                    log.close()
            deadline = time.monotonic() + args.timeout
            while True:
                [(left,)] = self.execute(
                    "SELECT count(*) FROM leasejobs_job WHERE id BETWEEN %s AND %s "
                    "AND finished_at IS NULL",
                    [low, high],
                )
                if not left:
                    break
                if time.monotonic() > deadline:
                    problems.append(
                        f"{left} jobs left after {args.timeout:g}s of draining (logs {logdir})"
                    )
                    break
                if any(proc.poll() is not None for proc in self.procs):
                    problems.append(f"a worker exited during the drain (logs {logdir})")
                    break
                time.sleep(0.05)
        finally:
            stop_workers(self.procs)
            self.procs = []
        for path in sorted(logdir.glob("*.log")):
            text = path.read_text(errors="replace")
            if "Traceback" in text or " ERROR " in text:
                problems.append(f"{path.name}: an error in its log (kept: {path})")
        [(total, good, first, last)] = self.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded' AND attempt = 1), "
            "EXTRACT(EPOCH FROM min(started_at)), EXTRACT(EPOCH FROM max(finished_at)) "
            "FROM leasejobs_job WHERE id BETWEEN %s AND %s",
            [low, high],
        )
        if good != total:
            problems.append(f"{total - good} of {total} other jobs not succeeded at attempt 1")
        span = float(last) - float(first) if first is not None and last is not None else None
        figures = {
            "jobs": int(total),
            "rate": good / span if span else None,
            "from_spawn_s": float(last) - spawned if last is not None else None,
            "statements": self.statement_figures() if self.statements else None,
        }
        return figures, problems

    def statement_figures(self) -> list[dict[str, Any]]:
        """Calls and mean server time of the claim's statements (pg_stat_statements)."""
        time.sleep(0.6)  # (the workers' last statistics reach the server)
        rows = self.execute(
            "SELECT query, calls, rows, total_exec_time FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT LIKE '%%pg_stat_statements%%'"
        )
        merged: dict[str, dict[str, Any]] = {}
        for query, calls, count, total in rows:
            label = statement_label(query)
            entry = merged.setdefault(label, {"statement": label, "calls": 0, "rows": 0, "ms": 0.0})
            entry["calls"] += int(calls)
            entry["rows"] += int(count)
            entry["ms"] += float(total)
        top = sorted(merged.values(), key=lambda e: -e["ms"])[:10]
        for entry in top:
            entry["mean_ms"] = entry["ms"] / entry["calls"] if entry["calls"] else None
        return top

    def stop(self) -> None:
        from pgserver import stop_workers

        stop_workers(self.procs)


def measure(bench: Bench) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Every repeat of every situation and kind; pooled into the results table."""
    args = bench.args
    raw: dict[tuple[str, str], dict[str, Any]] = {}
    log: list[dict[str, Any]] = []
    # Warm-up, not recorded: the first claims of a fresh server and process are slower.
    bench.set_up(BASELINE)
    for kind in KINDS:
        low, high = bench.add_others(kind, TASK_PATH)
        bench.direct(low, high)
    for repeat in range(args.repeats):
        for situation in situations(args):
            setup = bench.set_up(situation)
            for kind in KINDS:
                entry = raw.setdefault(
                    (situation, kind),
                    {
                        "latencies": [],
                        "empty": [],
                        "jobs": 0,
                        "main_lane_only": 0,
                        "held": 0,
                        "rates": [],
                        "problems": [],
                        "explain": None,
                        "next_due": [],
                        "statements": None,
                        "setup": setup,
                    },
                )
                sampler = RunningSampler(bench.url, args.sample_ms / 1000)
                sampler.start()
                try:
                    low, high = bench.add_others(kind, TASK_PATH)
                    if repeat == 0:
                        entry["explain"] = bench.explain_claim()
                    run, problems = bench.direct(low, high)
                    # The other jobs are done: what an idle worker looks up next.
                    due_ms, due_plans = bench.next_due(explain=repeat == 0)
                    entry["next_due"] += due_ms
                    if repeat == 0:
                        entry["explain"] += due_plans
                    figures = None
                    if args.workers:
                        low, high = bench.add_others(kind, TASK_PATH)
                        figures, more = bench.workers(low, high, f"{situation}-{kind}")
                        problems += more
                        entry["rates"].append(figures["rate"])
                        if figures["statements"] is not None and entry["statements"] is None:
                            entry["statements"] = figures["statements"]
                finally:
                    sampler.finish()
                problems += bench.checks(situation, sampler)
                for key in ("latencies", "empty", "jobs", "main_lane_only", "held"):
                    entry[key] += run[key]
                entry["problems"] += problems
                summary = claim_summary(
                    run["latencies"], run["jobs"], run["empty"], run["main_lane_only"], run["held"]
                )
                line = {
                    "repeat": repeat + 1,
                    "situation": situation,
                    "kind": kind,
                    **summary,
                    "workers_rate": figures["rate"] if figures else None,
                    "most_running_per_backlog_key": sampler.most,
                    "sampler_samples": sampler.samples,
                    "problems": problems,
                }
                log.append(line)
                print(
                    f"[{repeat + 1}/{args.repeats}] {situation:8} {kind:9} claim p50 "
                    f"{_fmt(summary['p50_ms'], 2)} p99 {_fmt(summary['p99_ms'], 2)} ms, "
                    f"x{_fmt(summary['jobs_per_claim'], 1)}, {_fmt(summary['jobs_per_s'])} "
                    f"jobs/s ({summary['empty_claims']} empty, {summary['main_lane_only']} "
                    f"main lane only, {summary['held']} held); workers "
                    f"{_fmt(line['workers_rate'])} jobs/s; most running "
                    f"per backlog key {sampler.most} "
                    + ("ok" if not problems else "PROBLEMS: " + "; ".join(problems)),
                    flush=True,
                )
    results: dict[str, dict[str, Any]] = {}
    for (situation, kind), entry in raw.items():
        results.setdefault(situation, {})[kind] = {
            "backlog": entry["setup"],
            "direct": claim_summary(
                entry["latencies"],
                entry["jobs"],
                entry["empty"],
                entry["main_lane_only"],
                entry["held"],
            ),
            "workers": {"rate": median(entry["rates"]), "rates": entry["rates"]}
            if entry["rates"]
            else None,
            "next_due": latency_summary(entry["next_due"]),
            "statements": entry["statements"],
            "explain": entry["explain"],
            "problems": entry["problems"],
        }
    return results, log


def print_explain(results: dict[str, dict[str, Any]]) -> None:
    for situation, kinds in results.items():
        for kind, figures in kinds.items():
            print(f"\nEXPLAIN of one claim: {situation}, {kind}")
            for s in figures.get("explain") or []:
                print(
                    f"  {s['claim']:14} {s['statement']:24} {_fmt(s['execution_ms'], 3):>8} ms  "
                    f"{s['buffers']:>6} buffers  {s['rows']} rows"
                )
                for scan in s["scans"]:
                    print(f"      {scan}")


def machine(repo: Path) -> dict[str, Any]:
    import platform

    import django

    import django_leasejobs

    commit = subprocess.run(
        ["git", "-C", str(repo), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "code": str(Path(django_leasejobs.__file__).parent),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "commit": commit or "(not a git checkout)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _statements_library() -> bool:
    """Whether the binaries bench/pgserver.py will pick have pg_stat_statements."""
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return bool(found) and (Path(found[-1]).parent.parent / "lib/pg_stat_statements.so").exists()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import psycopg
    from pgserver import PrivateServer, create_database, drop_database, with_database

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    statements = _statements_library()
    settings = (
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "1000"}
        if statements
        else {}
    )
    server = PrivateServer(
        10 * args.workers + 30,
        production=not args.fast_server,
        settings=settings,
        prefix="leasejobs-flow-pg-",
    )
    bench: Bench | None = None
    started = time.monotonic()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin:
            (version,) = admin.execute("SHOW server_version").fetchone()  # type: ignore[misc]
            (autovacuum,) = admin.execute("SHOW autovacuum").fetchone()  # type: ignore[misc]
            (fsync,) = admin.execute("SHOW fsync").fetchone()  # type: ignore[misc]
            create_database(admin, DB_NAME, MARK)
        bench = Bench(args, with_database(server.url, DB_NAME), statements)
        bench.prepare()
        print(
            f"PostgreSQL {version} ({'fast' if args.fast_server else 'production'} settings: "
            f"fsync {fsync}, autovacuum {autovacuum}); backlog {args.backlog:,} jobs; "
            f"other jobs {args.other_jobs:,} per measure, claims of {args.batch}; "
            f"{args.workers} x {args.pool} workers (concurrency {args.concurrency}); "
            f"{args.repeats} repeat(s)",
            flush=True,
        )
        results, log = measure(bench)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if bench is not None:
            bench.stop()
            from django.db import connections

            connections.close_all()
        if args.keep:
            print(f"kept: server at {server.url} (data {server.base})")
        else:
            with (
                contextlib.suppress(Exception),
                psycopg.connect(server.url, autocommit=True) as admin,
            ):
                drop_database(admin, DB_NAME, MARK)
            server.stop()
    lines = verdicts(results, args.goal)
    verdict = overall(lines)
    problems = sorted(
        {p for kinds in results.values() for f in kinds.values() for p in f["problems"]}
    )
    table = markdown_table(results)
    print_explain(results)
    print()
    print(table)
    label = "verdict (smoke: printed, not judged)" if args.smoke else "verdict"
    print(f"{label}: a backlog of {args.backlog:,} jobs on full keys vs none")
    for line in lines:
        print("  " + describe_line(line))
    for problem in problems:
        print(f"!! {problem}")
    status = 1 if problems else 0
    if bench is not None and not problems and not args.keep:
        shutil.rmtree(bench.shim, ignore_errors=True)  # (kept when a check failed: the logs)
    if args.smoke:
        print("flow bench smoke:", "FAILED" if status else "ok")
    else:
        print(
            "flow bench:",
            "FAILED"
            if status
            else {"met": "goal met", "missed": "goal MISSED"}.get(verdict, "goal not measured"),
        )
    report = {
        "machine": machine(args.repo),
        "server": {
            "version": version,
            "settings": "fsync, synchronous_commit and full_page_writes off (--fast-server), "
            "autovacuum on"
            if args.fast_server
            else "PostgreSQL defaults (production): fsync, synchronous_commit, "
            "full_page_writes and autovacuum on",
            "autovacuum": autovacuum,
            "pg_stat_statements": statements,
        },
        "settings": {
            k: getattr(args, k)
            for k in (
                "smoke",
                "backlog",
                "spread_keys",
                "other_jobs",
                "other_keys",
                "other_limit",
                "batch",
                "repeats",
                "workers",
                "concurrency",
                "pool",
                "goal",
                "fast_server",
            )
        },
        "seconds": round(time.monotonic() - started, 1),
        "results": results,
        "verdicts": lines,
        "verdict": verdict,
        "runs": log,
        "problems": problems,
        "status": status,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    if status == 0 and verdict == "missed" and args.fail_on_miss and not args.smoke:
        return 3
    return status


if __name__ == "__main__":
    raise SystemExit(main())
