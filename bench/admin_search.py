"""Admin search on a million jobs: the job list's search by argument (issue 31), timed on
PostgreSQL, its count checked against plain SQL, and what its GIN indexes cost enqueue.

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/admin_search.py                     # 1,000,000 jobs, 20 timed runs a search
    python bench/admin_search.py --smoke             # 20,000 jobs, 3 runs (CI, seconds)
    python bench/admin_search.py --jobs 200000 --output /tmp/s.json --markdown /tmp/s.md

What it does:

1. **Server.** Without ``DATABASE_URL`` (or with ``--private-server``): a PostgreSQL of
   its own (``bench/pgserver.py``, ``production=True``: ``fsync``,
   ``synchronous_commit``, ``full_page_writes`` and autovacuum as PostgreSQL ships them),
   deleted at exit. With ``DATABASE_URL``: that server (its database is only the admin
   connection). Either way the bench creates its own database, ``--db-name`` (default
   ``leasejobs_search_bench``), marked with a comment, refuses to drop a database
   without that mark, and drops its own at exit unless ``--keep``. Django runs in this
   process on it (the demo project's settings, ``DEBUG`` off), migrated first: migration
   0018 creates the GIN indexes ``leasejobs_job_args_gin`` and ``leasejobs_job_kwargs_gin``
   (0022 makes them leave out jobs without arguments).
2. **Fill.** The two GIN indexes are dropped (their definitions kept), ``--jobs`` rows
   go in with one ``INSERT ... SELECT ... FROM generate_series`` (seeded ``random()``),
   the indexes are built again from those definitions (timed: what migration 0018 costs
   on a table that big, without ``CONCURRENTLY``), then ``VACUUM ANALYZE``. A job carries
   ``args = [order_id, action]`` (three jobs per order) and ``kwargs = {"customer_id":
   ..., "invoice": {"number", "currency", "lines": [{"sku", "qty"}, ...]}}``: one job in
   64 belongs to customer 7, the others are spread evenly over ``--customers`` (default
   ``jobs / 20``, at least 5,000), one in ten stores its customer id as text. Statuses: 90 %
   succeeded, 5 % failed, 2 % dead, 2 % pending, 1 % cancelled; failed and retried jobs
   carry an error (``ConnectionError: payment gateway timed out`` on some).
3. **Searches.** The values searched are those of one failed job in the middle of the
   table (what an operator looking at a failure would search for): its customer, its
   order (``args.0``), the first line's SKU (a nested path), customer 7 (many jobs, so the
   exact count matters), and the free word ``gateway``; each alone and with
   ``&status__exact=failed``. Each page is fetched through Django's test ``Client``
   logged in as a superuser, in process (URL routing, middleware, session, the view, its
   queries, the template; no HTTP server): once cold (the first request of that URL, the
   process having already served the plain job list), ``--warmup`` times untimed, then
   ``--repeat`` times timed (warm). The count the page shows and the ids it lists are
   checked against plain SQL written here (not the library's query): an argument search
   must count exactly; a free word is counted up to the admin's cap. Then one more
   request records the page's queries, and those holding the search are run again under
   ``EXPLAIN (ANALYZE, BUFFERS)``: which index answered, how long, how many buffers.
4. **Enqueue cost**, with autovacuum off for the job table (it would empty the GIN
   fast-update lists at a moment of its choosing). ``--enqueue-rounds`` rounds of
   ``backend.bulk_enqueue`` of ``--enqueue-jobs`` (10,000) jobs with the same kind of
   arguments, and ``--single`` single ``enqueue()`` calls (one transaction each), with
   the GIN indexes; then the argument searches again (``--repeat`` times each) while the
   indexes' fast-update lists hold those jobs (a search reads the lists whole), then the
   flush of the lists (``gin_clean_pending_list``: the insert work GIN deferred, which an
   insert that overflows ``gin_pending_list_limit`` or a vacuum would do); then the same
   rounds and calls with the GIN indexes dropped. They are built again at the end
   (timed too).

Goal: every argument search's page under ``--target-ms`` (1,000) p95. Free-word searches
read the whole table (no index can answer a substring); they are reported, not judged.
Any count or listing that differs from the SQL exits 1 (``--smoke`` too);
``--fail-on-miss`` exits 3 on a missed goal. ``--output`` (JSON, default
``artifacts/bench/admin_search.json``) holds every figure and every plan; ``--markdown``
the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench admin_search.py"
TARGET_MS = 1000.0
GIN_INDEXES = ("leasejobs_job_args_gin", "leasejobs_job_kwargs_gin")
CHANGELIST = "/admin/django_leasejobs/job/"
BIG_CUSTOMER = 7
BIG_CUSTOMER_EVERY = 64
SKUS = 2000
FREE_WORD = "gateway"
TASK_PATHS = (
    "billing.tasks.send_invoice",
    "billing.tasks.charge_card",
    "shop.tasks.ship_order",
    "crm.tasks.sync_customer",
    "mail.tasks.send_receipt",
)
ACTIONS = ("charge", "ship", "notify")


# -- options -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from pgserver import add_server_options  # (bench/, beside this script)

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=None, help="jobs in the table (1,000,000)")
    parser.add_argument("--customers", type=int, default=0, help="jobs / 20 (>= 5,000)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs a search (20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (2)")
    parser.add_argument("--target-ms", type=float, default=TARGET_MS, help="p95 goal (1000)")
    parser.add_argument("--enqueue-rounds", type=int, default=6, help="bulk rounds (6)")
    parser.add_argument("--enqueue-jobs", type=int, default=10_000, help="jobs a round")
    parser.add_argument("--single", type=int, default=1000, help="single enqueues (1,000)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="20,000 jobs, 3 runs, 1 round of 1,000: checks counts, judges nothing (CI)",
    )
    add_server_options(parser)
    parser.add_argument("--db-name", default="leasejobs_search_bench")
    parser.add_argument("--keep", action="store_true", help="keep the database (and server)")
    parser.add_argument(
        "--output",
        "--json",
        dest="output",
        type=Path,
        default=REPO_ROOT / "artifacts/bench/admin_search.json",
        help="JSON report",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 3 on a missed goal")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.repeat, args.warmup = 3, 1
        args.enqueue_rounds, args.enqueue_jobs, args.single = 1, 1000, 50
    if args.jobs is None:
        args.jobs = 20_000 if args.smoke else 1_000_000
    if not args.customers:
        args.customers = max(5000, args.jobs // 20)
    for name in ("jobs", "repeat", "enqueue_rounds", "enqueue_jobs", "customers"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.jobs < 1000 or args.warmup < 0 or args.single < 0:
        raise SystemExit("--jobs must be at least 1,000, --warmup and --single at least 0")
    return args


# -- pure parts: statistics, the searches, verdicts, tables ------------------------------


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


@dataclass
class Search:
    """One job-list URL: its search text, an optional status filter, and the plain SQL
    (a WHERE clause and its parameters) that finds the same jobs."""

    name: str
    q: str
    where: str
    params: list[Any]
    by_arguments: bool = True
    status: str = ""
    expected: int = 0
    shown: int | None = None
    ids_ok: bool = False
    first_ms: float = 0.0
    times_ms: list[float] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        query = {"q": self.q} if self.q else {}
        if self.status:
            query["status__exact"] = self.status
        return f"{CHANGELIST}?{urlencode(query)}" if query else CHANGELIST

    @property
    def label(self) -> str:
        text = f"?q={self.q}" if self.q else "(no search)"
        return f"{text} & status={self.status}" if self.status else text

    def sql_where(self) -> tuple[str, list[Any]]:
        if not self.status:
            return self.where, list(self.params)
        return f"({self.where}) AND status = %s", [*self.params, self.status]


def json_equals(path: str, value: Any) -> tuple[str, list[Any]]:
    """Plain SQL for "the value at ``path`` (a ``#>`` path) is ``value``, or its digits as
    text when it is a number", as the search syntax promises."""
    values = [json.dumps(value)]
    if isinstance(value, int) and not isinstance(value, bool):
        values.append(json.dumps(str(value)))
    return f"{path} IN ({', '.join(['%s::jsonb'] * len(values))})", values


def free_word_where(word: str) -> tuple[str, list[Any]]:
    like = f"%{word}%"
    where = (
        "(task_path ILIKE %s OR last_error ILIKE %s OR last_worker ILIKE %s "
        "OR locked_by ILIKE %s OR key = %s)"
    )
    return where, [like, like, like, like, word]


def plan_searches(probe: dict[str, Any]) -> list[Search]:
    """The searches, built from one failed job's values (``probe``)."""
    searches: list[Search] = []
    for status in ("", "failed"):
        customer = probe["customer_id"]
        for name, q, (where, params) in (
            (
                "one customer",
                f"kwargs.customer_id:{customer}",
                json_equals("kwargs #> '{customer_id}'", customer),
            ),
            (
                "big customer (1 job in 64)",
                f"kwargs.customer_id:{BIG_CUSTOMER}",
                json_equals("kwargs #> '{customer_id}'", BIG_CUSTOMER),
            ),
            (
                "one order, args.0",
                f"args.0:{probe['order_id']}",
                json_equals("args #> '{0}'", probe["order_id"]),
            ),
            (
                "nested path",
                f"kwargs.invoice.lines.0.sku:{probe['sku']}",
                json_equals("kwargs #> '{invoice,lines,0,sku}'", probe["sku"]),
            ),
        ):
            searches.append(Search(name, q, where, params, status=status))
        where, params = free_word_where(FREE_WORD)
        searches.append(
            Search("free word (error)", FREE_WORD, where, params, by_arguments=False, status=status)
        )
    return searches


def expected_shown(search: Search, cap: int) -> int:
    """The count the page must show: exact for an argument search, else capped (the job
    list counts at most ``cap`` + 1 rows when no argument is searched)."""
    return search.expected if search.by_arguments else min(search.expected, cap + 1)


def verdicts(searches: Sequence[Search], target_ms: float) -> list[dict[str, Any]]:
    lines = []
    for search in searches:
        if not search.q:
            continue
        worst = p95(search.times_ms)
        if search.by_arguments:
            verdict = "met" if worst < target_ms else "missed"
        else:
            verdict = "information (reads the whole table)"
        lines.append({"search": search.label, "p95_ms": round(worst, 1), "verdict": verdict})
    return lines


def plan_summary(plan: str) -> dict[str, Any]:
    """What a plan's text says: the indexes it uses, whether it reads the whole job table,
    its execution time and the buffers of its top node."""
    indexes = sorted(
        set(
            re.findall(
                r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)"
                r"(?: Backward)? (?:using|on) (\w+)",
                plan,
            )
        )
    )
    seq = "Seq Scan on leasejobs_job" in plan
    time_ms = re.search(r"Execution Time: ([0-9.]+) ms", plan)
    buffers = re.search(r"Buffers: ([^\n]+)", plan)
    return {
        "indexes": indexes,
        "gin": any(name in GIN_INDEXES for name in indexes),
        "seq_scan": seq,
        "execution_ms": float(time_ms.group(1)) if time_ms else None,
        "buffers": buffers.group(1).strip() if buffers else "",
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def search_table(searches: Sequence[Search], cap: int) -> str:
    rows = [
        "| search | matches (SQL) | page shows | first (cold) | median | p95 | max |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for s in searches:
        shown = "-" if s.shown is None else f"{s.shown:,}"
        if s.shown is not None and not s.by_arguments and s.q and s.expected > cap:
            shown += " (capped)"
        rows.append(
            f"| {s.name}: `{s.label}` | {s.expected:,} | {shown} | {_ms(s.first_ms)} | "
            f"{_ms(statistics.median(s.times_ms))} | {_ms(p95(s.times_ms))} | "
            f"{_ms(max(s.times_ms))} |"
        )
    return "\n".join(rows)


def plan_table(searches: Sequence[Search]) -> str:
    rows = [
        "| search | query | rows read by | execution | buffers (top node) |",
        "|---|---|---|--:|---|",
    ]
    for s in searches:
        for plan in s.plans:
            summary = plan["summary"]
            reads = ", ".join(summary["indexes"]) or "-"
            if summary["seq_scan"]:
                reads += " + Seq Scan on leasejobs_job"
            rows.append(
                f"| `{s.label}` | {plan['kind']} | {reads} | "
                f"{summary['execution_ms'] or 0:,.1f} ms | {summary['buffers']} |"
            )
    return "\n".join(rows)


def query_table(searches: Sequence[Search]) -> str:
    """Per page: its queries, their summed time, and the slowest one."""
    rows = ["| search | queries | their time | slowest | its time |", "|---|--:|--:|---|--:|"]
    for s in searches:
        if not s.queries:
            continue
        slowest = max(s.queries, key=lambda query: query["ms"])
        text = " ".join(slowest["sql"].split())[:90].replace("|", "\\|")
        rows.append(
            f"| `{s.label}` | {len(s.queries)} | {sum(q['ms'] for q in s.queries):,.0f} ms | "
            f"`{text}...` | {slowest['ms']:,.0f} ms |"
        )
    return "\n".join(rows)


def enqueue_table(enqueue: dict[str, Any]) -> str:
    rows = [
        "| GIN indexes | bulk_enqueue rounds (jobs/round) | median | max | jobs/s (all rounds) "
        "| single enqueue (n) | per call, median | deferred GIN work flushed after |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for label, key in (("with", "with_gin"), ("without", "without_gin")):
        run = enqueue[key]
        bulk = run["bulk_s"]
        single = run["single_ms"]
        rate = run["jobs"] * len(bulk) / sum(bulk) if bulk else 0
        rows.append(
            f"| {label} | {len(bulk)} ({run['jobs']:,}) | {statistics.median(bulk) * 1000:,.0f} ms"
            f" | {max(bulk) * 1000:,.0f} ms | {rate:,.0f} | {len(single)} | "
            + (f"{statistics.median(single):.2f} ms |" if single else "- |")
            + (f" {run['flush_s'] * 1000:,.0f} ms |" if "flush_s" in run else " - |")
        )
    return "\n".join(rows)


def pending_table(searches: Sequence[Search], enqueue: dict[str, Any]) -> str:
    """The argument searches before the enqueue rounds and with the fast-update lists full."""
    pending = enqueue["with_gin"].get("pending_list", {})
    held = ", ".join(f"{name} {v['pending_tuples']:,}" for name, v in pending.items())
    rows = [
        f"| search | median before | p95 before | median, lists full ({held or '?'}) | p95 |",
        "|---|--:|--:|--:|--:|",
    ]
    for s in searches:
        after = enqueue["with_gin"].get("searches_before_flush", {}).get(s.label)
        if after is None:
            continue
        rows.append(
            f"| `{s.label}` | {_ms(statistics.median(s.times_ms))} | {_ms(p95(s.times_ms))} | "
            f"{_ms(after['median_ms'])} | {_ms(after['p95_ms'])} |"
        )
    return "\n".join(rows)


def size_table(sizes: dict[str, Any]) -> str:
    rows = ["| relation | size |", "|---|--:|"]
    for name, size in sizes.items():
        rows.append(f"| {name} | {size / 1024 / 1024:,.1f} MiB |")
    return "\n".join(rows)


# -- the database ------------------------------------------------------------------------

JOB_COLUMNS = (
    "backend, queue, task_path, args, kwargs, priority, run_after, status, attempt, "
    "max_attempts, stall_count, max_stalls, snoozes, locked_by, last_worker, "
    "cancel_requested, progress_message, result, last_error, enqueued_at, started_at, "
    "last_attempted_at, finished_at"
)

# Row i of n: ids in time order over the last 30 days; three jobs per order (args.0);
# customer 7 on one job in 64, else 1 + i mod customers (a customer's jobs spread over
# the whole table); one job in ten stores its customer id as text; one to three invoice
# lines of SKUS SKUs; the task, the text form and the error drawn at random.
FILL_SQL = f"""
WITH g AS (
    SELECT i, random() AS rs, random() AS rl, random() AS rc, random() AS rr,
        random() AS rt, random() AS rx, random() AS rg,
        now() - interval '30 days' * ((%(n)s - i)::float8 / %(n)s) AS at
    FROM generate_series(1, %(n)s) AS i
), t AS (
    SELECT *,
        CASE WHEN rs < 0.90 THEN 'succeeded' WHEN rs < 0.95 THEN 'failed'
             WHEN rs < 0.97 THEN 'dead' WHEN rs < 0.99 THEN 'pending'
             ELSE 'cancelled' END AS status,
        CASE WHEN i %% {BIG_CUSTOMER_EVERY} = 0 THEN {BIG_CUSTOMER}
             ELSE 1 + i %% %(customers)s END AS customer,
        100000 + i / 3 AS order_id
    FROM g
)
INSERT INTO leasejobs_job ({JOB_COLUMNS})
SELECT
    'default', 'default',
    (%(tasks)s::text[])[1 + floor(rt * %(ntasks)s)::int],
    jsonb_build_array(order_id, (%(actions)s::text[])[1 + i %% 3]),
    jsonb_build_object(
        'customer_id', CASE WHEN rx < 0.1 THEN to_jsonb(customer::text)
                            ELSE to_jsonb(customer) END,
        'invoice', jsonb_build_object(
            'number', 'INV-' || i,
            'currency', CASE WHEN rc < 0.7 THEN 'EUR' WHEN rc < 0.9 THEN 'USD' ELSE 'GBP' END,
            'lines', (
                SELECT jsonb_agg(jsonb_build_object(
                    'sku', 'SKU-' || (1 + floor(random() * {SKUS}))::int,
                    'qty', 1 + floor(random() * 5)::int))
                FROM generate_series(1, CASE WHEN rl < 0.5 THEN 1 WHEN rl < 0.85 THEN 2
                                             ELSE 3 END)
            )
        )
    ),
    0,
    at,
    status,
    CASE status WHEN 'pending' THEN 0 WHEN 'cancelled' THEN 0
                WHEN 'succeeded' THEN 1 + (rr < 0.05)::int ELSE 3 END,
    3,
    CASE status WHEN 'dead' THEN 3 ELSE 0 END,
    3, 0, NULL,
    CASE WHEN status IN ('pending', 'cancelled') THEN '' ELSE 'web-' || (i %% 4) || ':8000' END,
    status = 'cancelled',
    '',
    CASE WHEN status = 'succeeded' THEN '{{"ok": true}}'::jsonb END,
    CASE
        WHEN status = 'failed' AND rg < 0.1 THEN 'ConnectionError: payment gateway timed out'
        WHEN status = 'failed' THEN 'ValueError: invoice INV-' || i || ' does not add up'
        WHEN status = 'dead' THEN 'lease expired (stalled 3 times)'
        WHEN status = 'succeeded' AND rr < 0.025 THEN 'ConnectionError: payment gateway timed out'
        WHEN status = 'succeeded' AND rr < 0.05 THEN 'TimeoutError: first attempt'
        ELSE ''
    END,
    at,
    CASE WHEN status IN ('pending', 'cancelled') THEN NULL ELSE at + interval '1 second' END,
    CASE WHEN status IN ('pending', 'cancelled') THEN NULL ELSE at + interval '1 second' END,
    CASE WHEN status IN ('pending') THEN NULL ELSE at + interval '2 seconds' END
FROM t
ORDER BY i
"""

# A failed job in the middle of the table, of an ordinary customer: its values are searched.
PROBE_SQL = f"""
SELECT id, (kwargs ->> 'customer_id')::int, (args ->> 0)::int,
       kwargs #>> '{{invoice,lines,0,sku}}'
FROM leasejobs_job
WHERE status = 'failed' AND id >= %s AND (kwargs ->> 'customer_id')::int <> {BIG_CUSTOMER}
ORDER BY id LIMIT 1
"""


def execute(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def check_columns() -> None:
    """Every NOT NULL column of the job table without a default is one FILL_SQL writes
    (so a new column makes this bench say so, not fail obscurely)."""
    written = {name.strip() for name in JOB_COLUMNS.split(",")}
    rows = execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = "
        "'leasejobs_job' AND is_nullable = 'NO' AND column_default IS NULL"
    )
    missing = sorted({name for (name,) in rows} - written - {"id"})
    if missing:
        raise SystemExit(f"bench/admin_search.py does not fill NOT NULL columns {missing}")


def gin_definitions() -> dict[str, str]:
    rows = execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'leasejobs_job' "
        "AND indexname = ANY(%s)",
        [list(GIN_INDEXES)],
    )
    found = dict(rows)
    if set(found) != set(GIN_INDEXES):
        raise SystemExit(f"migration 0018's GIN indexes missing: found {sorted(found)}")
    return found


def drop_gin() -> None:
    for name in GIN_INDEXES:
        execute(f"DROP INDEX {name}")


def build_gin(definitions: dict[str, str]) -> float:
    """Build the GIN indexes from their definitions; seconds taken."""
    started = time.perf_counter()
    for name in GIN_INDEXES:
        execute(definitions[name])
    return time.perf_counter() - started


def fill(jobs: int, customers: int) -> float:
    started = time.perf_counter()
    execute("SELECT setseed(0.31)")
    execute(
        FILL_SQL,
        {
            "n": jobs,
            "customers": customers,
            "tasks": list(TASK_PATHS),
            "ntasks": len(TASK_PATHS),
            "actions": list(ACTIONS),
        },
    )
    return time.perf_counter() - started


def vacuum_analyze() -> float:
    started = time.perf_counter()
    execute("VACUUM ANALYZE leasejobs_job")
    return time.perf_counter() - started


def relation_sizes() -> dict[str, int]:
    rows = execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
        "WHERE c.relname = 'leasejobs_job' OR c.oid IN (SELECT indexrelid FROM pg_index "
        "WHERE indrelid = 'leasejobs_job'::regclass) ORDER BY 2 DESC"
    )
    sizes = {name: int(size) for name, size in rows}
    sizes["TOAST of leasejobs_job"] = int(
        execute(
            "SELECT coalesce(pg_total_relation_size(reltoastrelid), 0) FROM pg_class "
            "WHERE relname = 'leasejobs_job'"
        )[0][0]
    )
    return sizes


def find_probe(jobs: int) -> dict[str, Any]:
    rows = execute(PROBE_SQL, [jobs // 2])
    if not rows:
        raise SystemExit("no failed job in the second half of the table")
    job_id, customer, order, sku = rows[0]
    return {"id": job_id, "customer_id": customer, "order_id": order, "sku": sku}


def oracle(search: Search, page: int) -> tuple[int, list[int]]:
    """The count and the first page of ids of ``search``, by plain SQL."""
    where, params = search.sql_where()
    [(count,)] = execute(f"SELECT count(*) FROM leasejobs_job WHERE {where}", params)
    ids = execute(
        f"SELECT id FROM leasejobs_job WHERE {where} ORDER BY id DESC LIMIT %s", [*params, page]
    )
    return int(count), [int(job_id) for (job_id,) in ids]


# -- the pages ---------------------------------------------------------------------------

PAGINATOR = re.compile(r'<(p|nav) class="paginator"[^>]*>(.*?)</\1>', re.DOTALL)
"""The admin's paginator line: a ``<p>`` up to Django 6.0, a ``<nav>`` from 6.1."""
SELECTED = re.compile(r'name="_selected_action" value="(\d+)"')


def page_facts(html: str) -> tuple[int | None, list[int]]:
    """The count the page's paginator line shows ("15625 jobs"; "10,000+ jobs", past the
    cap, as 10001) and the ids it lists."""
    shown = None
    block = PAGINATOR.search(html)
    count = block and re.search(r"(\d[\d,]*)(\+?)\s+jobs?\b", block.group(2))
    if count:
        shown = int(count.group(1).replace(",", "")) + (1 if count.group(2) else 0)
    return shown, [int(job_id) for job_id in SELECTED.findall(html)]


def fetch(client: Any, url: str) -> str:
    response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"{url}: HTTP {response.status_code}")
    return response.content.decode()


def time_search(client: Any, search: Search, repeat: int, warmup: int) -> str:
    started = time.perf_counter()
    html = fetch(client, search.url)
    search.first_ms = (time.perf_counter() - started) * 1000
    for _ in range(warmup):
        fetch(client, search.url)
    for _ in range(repeat):
        started = time.perf_counter()
        fetch(client, search.url)
        search.times_ms.append((time.perf_counter() - started) * 1000)
    return html


def profile_page(client: Any, search: Search) -> None:
    """One more request of the page, its queries recorded (SQL and time); then
    EXPLAIN (ANALYZE, BUFFERS) of those that hold the search."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fetch(client, search.url)
    search.queries = [
        {"ms": float(query["time"]) * 1000, "sql": query["sql"] or ""}
        for query in captured.captured_queries
    ]
    if not search.q:
        return
    marker = "@>" if search.by_arguments else "LIKE"
    for query in captured.captured_queries:
        sql = query["sql"] or ""
        if "leasejobs_job" not in sql or marker not in sql:
            continue
        kind = "count" if "COUNT(" in sql.upper() else "page"
        plan = "\n".join(row[0] for row in execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"))
        search.plans.append(
            {
                "kind": kind,
                "sql": sql,
                "page_ms": float(query["time"]) * 1000,
                "plan": plan,
                "summary": plan_summary(plan),
            }
        )


# -- enqueue cost ------------------------------------------------------------------------


def job_calls(count: int, seed: int) -> list[tuple[Any, list[Any], dict[str, Any]]]:
    """``count`` (task, args, kwargs) calls shaped like the table's jobs."""
    from demo.tasks import add  # never run: only its path is stored

    rng = random.Random(seed)
    calls = []
    for number in range(count):
        lines = [
            {"sku": f"SKU-{rng.randint(1, SKUS)}", "qty": rng.randint(1, 5)}
            for _ in range(rng.choice((1, 1, 2, 3)))
        ]
        kwargs = {
            "customer_id": rng.randint(1, 50_000),
            "invoice": {"number": f"INV-B{seed}-{number}", "currency": "EUR", "lines": lines},
        }
        calls.append((add, [900_000 + number, rng.choice(ACTIONS)], kwargs))
    return calls


def time_enqueues(rounds: int, jobs: int, single: int, seed: int) -> dict[str, Any]:
    from django_leasejobs.compat import task_backends

    backend: Any = task_backends["default"]  # the demo's LeaseJobsBackend
    bulk = []
    for number in range(rounds):
        calls = job_calls(jobs, seed + number)
        started = time.perf_counter()
        backend.bulk_enqueue(calls)
        bulk.append(time.perf_counter() - started)
    single_ms = []
    for task, args, kwargs in job_calls(single, seed + 1000):
        started = time.perf_counter()
        task.enqueue(*args, **kwargs)
        single_ms.append((time.perf_counter() - started) * 1000)
    return {"jobs": jobs, "bulk_s": bulk, "single_ms": single_ms}


def gin_pending() -> dict[str, Any]:
    """Pages and tuples waiting in each GIN index's fast-update list (pgstattuple), when
    the server has that extension."""
    from django.db import DatabaseError

    try:
        execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except DatabaseError:  # not installed with this server: no figure
        return {}
    return {
        name: dict(
            zip(
                ("pending_pages", "pending_tuples"),
                execute(f"SELECT pending_pages, pending_tuples FROM pgstatginindex('{name}')")[0],
                strict=True,
            )
        )
        for name in GIN_INDEXES
    }


def time_pending_searches(
    client: Any, searches: Sequence[Search], repeat: int
) -> dict[str, dict[str, float]]:
    """Median and p95 of the argument searches (no status filter) while the GIN indexes'
    fast-update lists hold what the enqueue rounds added: a search reads those lists
    whole."""
    timed = {}
    for search in searches:
        if not search.by_arguments or search.status:
            continue
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            fetch(client, search.url)
            times.append((time.perf_counter() - started) * 1000)
        timed[search.label] = {"median_ms": statistics.median(times), "p95_ms": p95(times)}
    return timed


def autovacuum_facts() -> dict[str, Any]:
    """When autovacuum last vacuumed and analyzed the job table, and how often (an
    autovacuum also empties the GIN fast-update lists)."""
    [row] = execute(
        "SELECT last_autovacuum, autovacuum_count, last_autoanalyze, autoanalyze_count "
        "FROM pg_stat_user_tables WHERE relname = 'leasejobs_job'"
    )
    names = ("last_autovacuum", "autovacuum_count", "last_autoanalyze", "autoanalyze_count")
    return dict(zip(names, (str(value) for value in row), strict=True))


def flush_pending() -> float:
    """Seconds to move what the GIN indexes' fast-update lists still hold into the
    indexes (``gin_clean_pending_list``): insert work GIN defers to a later insert or to
    (auto)vacuum."""
    started = time.perf_counter()
    for name in GIN_INDEXES:
        execute("SELECT gin_clean_pending_list(%s::regclass)", [name])
    return time.perf_counter() - started


# -- running it --------------------------------------------------------------------------


def setup_django(url: str) -> None:
    """The demo project's settings on the bench database, DEBUG off, migrated."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    os.environ["DEBUG"] = "false"
    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test Client's host
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def step(message: str) -> None:
    load = os.getloadavg()[0]
    print(f"[{time.strftime('%H:%M:%S')} load {load:.2f}] {message}", flush=True)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Everything after Django is set up on the bench database: fill, searches, costs."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_leasejobs.admin.jobs import CappedCountPaginator, JobAdmin

    check_columns()
    definitions = gin_definitions()
    drop_gin()
    step(f"filling {args.jobs:,} jobs ({args.customers:,} customers)")
    fill_s = fill(args.jobs, args.customers)
    step(f"filled in {fill_s:.1f}s; building the GIN indexes")
    build_s = build_gin(definitions)
    step(f"built in {build_s:.1f}s; VACUUM ANALYZE")
    vacuum_s = vacuum_analyze()
    sizes = relation_sizes()
    probe = find_probe(args.jobs)
    step(f"vacuumed in {vacuum_s:.1f}s; searching for the values of job {probe['id']}")

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", None)
    client = Client()
    client.force_login(user)
    cap, page = CappedCountPaginator.CAP, JobAdmin.list_per_page
    plain = Search("job list", "", "true", [], by_arguments=False)
    searches = [plain, *plan_searches(probe)]
    problems: list[str] = []
    for search in searches:
        html = time_search(client, search, args.repeat, args.warmup)
        search.expected, ids = oracle(search, page)  # after: its reads would warm the cache
        search.shown, listed = page_facts(html)
        search.ids_ok = listed == ids
        if search is not plain:
            if search.expected == 0:
                problems.append(f"{search.label}: no job matches (the data is wrong)")
            if search.shown != expected_shown(search, cap):
                problems.append(
                    f"{search.label}: page shows {search.shown}, SQL counts {search.expected}"
                )
            if not search.ids_ok:
                problems.append(f"{search.label}: page lists {listed[:5]}..., SQL {ids[:5]}...")
        profile_page(client, search)
        step(
            f"{search.label}: {search.expected:,} match, page shows {search.shown}; "
            f"first {search.first_ms:,.0f} ms, median {statistics.median(search.times_ms):,.0f}"
            f" ms, p95 {p95(search.times_ms):,.0f} ms"
        )

    # Autovacuum would empty the GIN fast-update lists at a moment of its choosing (the
    # fill's inserts can reach its counters after the VACUUM above): off for this table
    # while the enqueue cost is measured, so the deferred work is timed on its own.
    execute("ALTER TABLE leasejobs_job SET (autovacuum_enabled = off)")
    step(f"enqueue with the GIN indexes: {args.enqueue_rounds} x {args.enqueue_jobs:,}")
    enqueue: dict[str, Any] = {
        "with_gin": time_enqueues(args.enqueue_rounds, args.enqueue_jobs, args.single, 1)
    }
    enqueue["with_gin"]["pending_list"] = gin_pending()
    enqueue["with_gin"]["searches_before_flush"] = time_pending_searches(
        client, searches, args.repeat
    )
    enqueue["with_gin"]["pending_list_before_flush"] = gin_pending()
    enqueue["with_gin"]["flush_s"] = flush_pending()
    enqueue["with_gin"]["autovacuum"] = autovacuum_facts()
    drop_gin()
    step("enqueue without them")
    enqueue["without_gin"] = time_enqueues(
        args.enqueue_rounds, args.enqueue_jobs, args.single, 5000
    )
    execute("ALTER TABLE leasejobs_job RESET (autovacuum_enabled)")
    [(total,)] = execute("SELECT count(*) FROM leasejobs_job")
    step(f"building them again on {total:,} jobs")
    enqueue["rebuild_s"] = build_gin(definitions)
    enqueue["rebuild_on_jobs"] = int(total)
    return {
        "fill_s": fill_s,
        "gin_build_s": build_s,
        "vacuum_s": vacuum_s,
        "sizes": sizes,
        "probe": probe,
        "searches": searches,
        "cap": cap,
        "enqueue": enqueue,
        "problems": problems,
    }


def server_facts(admin: Any, label: str) -> dict[str, Any]:
    names = (
        "server_version",
        "fsync",
        "synchronous_commit",
        "autovacuum",
        "shared_buffers",
        "work_mem",
        "maintenance_work_mem",
        "gin_pending_list_limit",
    )
    facts = {name: admin.execute(f"SHOW {name}").fetchone()[0] for name in names}
    facts["kind"] = label
    return facts


def report_markdown(measured: dict[str, Any], target_ms: float) -> str:
    searches, cap = measured["searches"], measured["cap"]
    lines = verdicts(searches, target_ms)
    verdict_rows = ["| search | p95 | verdict |", "|---|--:|---|"] + [
        f"| `{line['search']}` | {line['p95_ms']:,.0f} ms | {line['verdict']} |" for line in lines
    ]
    enqueue = measured["enqueue"]
    return "\n\n".join(
        [
            search_table(searches, cap),
            "\n".join(verdict_rows),
            plan_table(searches),
            query_table(searches),
            size_table(measured["sizes"]),
            f"GIN build after the fill ({len(GIN_INDEXES)} indexes, not concurrently): "
            f"{measured['gin_build_s']:.1f} s; again at the end on "
            f"{enqueue['rebuild_on_jobs']:,} jobs: {enqueue['rebuild_s']:.1f} s.",
            enqueue_table(enqueue),
            pending_table(searches, enqueue),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (REPO_ROOT / "testproject", REPO_ROOT, REPO_ROOT / "bench"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from pgserver import bench_database, connect_admin, machine

    with bench_database(
        args, bench="bench/admin_search.py", prefix="leasejobs-search-pg-", mark=MARK
    ) as (
        url,
        config,
        label,
    ):
        with connect_admin(config) as admin:
            server = server_facts(admin, label)
        step(
            f"PostgreSQL {server['server_version']}, {label}: fsync {server['fsync']}, "
            f"synchronous_commit {server['synchronous_commit']}, autovacuum "
            f"{server['autovacuum']}; database {args.db_name}; load "
            f"{os.getloadavg()[0]:.2f}"
        )
        setup_django(url)
        facts = machine(REPO_ROOT)
        measured = measure(args)
        facts["load_at_end"] = [round(load, 2) for load in os.getloadavg()]
    tables = report_markdown(measured, args.target_ms)
    print()
    print(tables)
    print()
    lines = verdicts(measured["searches"], args.target_ms)
    for line in lines:
        print(f"goal {line['search']}: {line['verdict']} (p95 {line['p95_ms']:,.0f} ms)")
    report = {
        "machine": facts,
        "server": server,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **{k: v for k, v in measured.items() if k != "searches"},
        "searches": [asdict(s) | {"url": s.url, "label": s.label} for s in measured["searches"]],
        "verdicts": lines,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(tables + "\n")
    if measured["problems"]:
        print("PROBLEMS: " + "; ".join(measured["problems"]))
        return 1
    if args.smoke:
        print(
            f"smoke run: counts and listings checked, nothing judged (goal p95 < "
            f"{args.target_ms:,.0f} ms)"
        )
        return 0
    missed = any(line["verdict"] == "missed" for line in lines)
    return 3 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    raise SystemExit(main())
