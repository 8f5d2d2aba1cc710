"""Big values stay out of pages: server time and size of the admin pages of jobs whose
arguments and result are 50 MB, on PostgreSQL (issue 28).

Run from the repository root, inside the project's virtualenv (``.venv``)::

    python bench/admin_big_values.py                 # 50 MB values, 20 timed runs each
    python bench/admin_big_values.py --size-mb 200   # bigger
    python bench/admin_big_values.py --smoke         # 1 MB values, 3 runs (CI, seconds)

What it does:

1. creates its own database ``--db-name`` (default ``leasejobs_bigvalues_bench``) on the
   server ``DATABASE_URL`` names (default ``postgres://postgres@127.0.0.1:5432/postgres``,
   only used as the admin connection), marked with a comment; it refuses to drop a
   database without that mark, and drops its own at exit unless ``--keep``;
2. migrates it with the demo project's settings (``DEBUG`` off) and enqueues two jobs
   through the lease protocol: *args*, pending, whose one argument is a string of
   ``--size-mb`` MiB; *all*, succeeded after a failed attempt, with that argument, a
   result of the same size, a checkpoint of a tenth of it and the longest traceback a
   worker stores (64,000 characters). The strings are random letters, so PostgreSQL's
   compression does not make them small;
3. times, through Django's test ``Client`` logged in as a superuser (in process: URL
   routing, middleware, session, the view, the template; no HTTP server), each page
   ``--repeat`` times after ``--warmup`` untimed runs, and prints the first (cold: the
   first request of the process, right after the jobs were written) and the median, p95
   and max of the warm runs, the page's size, and the bytes the database sent Django
   for it. The download of the whole argument is timed too, for information.

Targets: every page's p95 under ``--target-ms`` (1,000) and its size under 200 kB;
``--fail-on-miss`` exits 1 when one is missed. ``--smoke`` judges nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "leasejobs-bench admin_big_values.py"
DEFAULT_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
TARGET_MS = 1000.0
PAGE_BYTES = 200_000
WORKER = "bench-worker"
MiB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Server time and size of admin pages of jobs with 50 MB values."
    )
    parser.add_argument("--size-mb", type=float, default=50, help="MiB per big value (50)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per page (20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (2)")
    parser.add_argument("--target-ms", type=float, default=TARGET_MS, help="p95 target (1000)")
    parser.add_argument(
        "--smoke", action="store_true", help="1 MiB values, 3 runs: checks that all runs (CI)"
    )
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 1 on a missed target")
    parser.add_argument(
        "--db-name", default="leasejobs_bigvalues_bench", help="the bench's own database"
    )
    parser.add_argument("--keep", action="store_true", help="keep the bench database at exit")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size_mb, args.repeat, args.warmup = 1, 3, 1
    if args.size_mb <= 0 or args.repeat < 1 or args.warmup < 0:
        parser.error("--size-mb must be > 0, --repeat >= 1 and --warmup >= 0")
    return args


def setup_django(url: str) -> None:
    """The demo project's settings on the bench database, DEBUG off (no query log)."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    os.environ["DEBUG"] = "false"
    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test Client's host
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def letters(size: int, seed: int) -> str:
    """``size`` random letters (incompressible enough that the row is as big as it says)."""
    rng = random.Random(seed)
    chunk = "".join(rng.choices(string.ascii_letters, k=MiB))
    whole, rest = divmod(size, MiB)
    return chunk * whole + chunk[:rest]


def make_jobs(size: int) -> dict[str, int]:
    """The two jobs, through the lease protocol, as a site and its worker write them."""
    from demo.tasks import add  # never run: only its path is stored
    from django_leasejobs import leases

    big = letters(size, seed=1)
    ids = {
        "args": int(add.using(queue_name="low").enqueue(big, 1).id),
        "all": int(add.enqueue(big, 1).id),
    }
    [first] = leases.claim(WORKER, limit=1, lease_duration=60, queues=["default"])
    leases.save_checkpoint(first.id, first.attempt, WORKER, letters(size // 10, seed=2))
    traceback = "Traceback (most recent call last):\n" + "  frame\n" * 8000
    error = leases.ErrorInfo("builtins.ValueError", "boom", traceback)
    leases.fail(first.id, first.attempt, WORKER, error=error, retry_delay=0)
    deadline = time.monotonic() + 5
    while not (claimed := leases.claim(WORKER, limit=1, lease_duration=60, queues=["default"])):
        if time.monotonic() > deadline:  # due from the database clock's next tick
            raise SystemExit("the retried job never became ready")
    leases.complete(claimed[0].id, claimed[0].attempt, WORKER, result=letters(size, seed=3))
    return ids


@dataclass
class Page:
    name: str
    url: str
    first_ms: float = 0.0
    times_ms: list[float] = field(default_factory=list)
    size: int = 0
    read: int = 0
    is_page: bool = True


def read_counter() -> tuple[list[int], Callable[[], None]]:
    """Counts the bytes of the rows Django fetches (text and binary values; 8 for others)."""
    from django.db.backends.utils import CursorWrapper

    counted = [0]

    def count(rows: Any) -> Any:
        for row in rows or ():
            for value in row:
                counted[0] += len(value) if isinstance(value, str | bytes | memoryview) else 8
        return rows

    CursorWrapper.fetchone = lambda self: (  # type: ignore[attr-defined]
        count([r])[0] if (r := self.cursor.fetchone()) is not None else None
    )
    CursorWrapper.fetchmany = lambda self, size=0: count(  # type: ignore[attr-defined]
        self.cursor.fetchmany(size) if size else self.cursor.fetchmany()
    )
    CursorWrapper.fetchall = lambda self: count(self.cursor.fetchall())  # type: ignore[attr-defined]

    def undo() -> None:
        for name in ("fetchone", "fetchmany", "fetchall"):
            delattr(CursorWrapper, name)

    return counted, undo


def measure(client: Any, page: Page, repeat: int, warmup: int) -> None:
    def get() -> Any:
        response = client.get(page.url)
        if response.status_code != 200:
            raise SystemExit(f"{page.name}: HTTP {response.status_code}")
        return response

    started = time.perf_counter()
    response = get()
    page.first_ms = (time.perf_counter() - started) * 1000
    page.size = len(response.content)
    for _ in range(warmup):
        get()
    for _ in range(repeat):
        started = time.perf_counter()
        get()
        page.times_ms.append((time.perf_counter() - started) * 1000)
    counted, undo = read_counter()
    try:
        get()
    finally:
        undo()
    page.read = counted[0]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def facts(size: int) -> dict[str, str]:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (version,) = cursor.fetchone()
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('leasejobs_job'))")
        (table,) = cursor.fetchone()
    return {
        "machine": f"{platform.machine()}, nproc {os.cpu_count()}, {platform.system()}",
        "postgresql": str(version),
        "python / django": f"{platform.python_version()} / {django.get_version()}",
        "load average": " ".join(f"{load:.2f}" for load in os.getloadavg()),
        "values": f"{size:,} bytes ({size / MiB:g} MiB) per big value; job table {table}",
        "server": "Django's test Client in process (no HTTP server), DEBUG off",
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (REPO_ROOT / "testproject", REPO_ROOT, REPO_ROOT / "bench"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from pgserver import connect_admin, create_database, django_url_config, drop_database

    from testproject.embedded_db import settings_to_database_url

    admin_url = os.environ.get("DATABASE_URL", DEFAULT_ADMIN_URL)
    config = django_url_config(admin_url)
    if not config["ENGINE"].endswith("postgresql"):
        raise SystemExit(
            f"bench/admin_big_values.py needs PostgreSQL, DATABASE_URL is {admin_url!r}"
        )
    size = int(args.size_mb * MiB)
    with connect_admin(config) as admin:
        create_database(admin, args.db_name, MARK)
        try:
            bench_url = settings_to_database_url({**config, "NAME": args.db_name})
            return run(args, bench_url, size)
        finally:
            from django.db import connections

            connections.close_all()
            if args.keep:
                print(f"kept {args.db_name}")
            else:
                drop_database(admin, args.db_name, MARK)
                print(f"dropped {args.db_name}")


def run(args: argparse.Namespace, url: str, size: int) -> int:
    setup_django(url)
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    started = time.perf_counter()
    ids = make_jobs(size)
    print(f"wrote 2 jobs with {size / MiB:g} MiB values in {time.perf_counter() - started:.1f}s")
    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", None)
    client = Client()
    client.force_login(user)

    def change(job_id: int) -> str:
        return reverse("admin:django_leasejobs_job_change", args=[job_id])

    pages = [
        Page("job page: big argument", change(ids["args"])),
        Page("job page: big everything", change(ids["all"])),
        Page("job list, first page", reverse("admin:django_leasejobs_job_changelist")),
        Page(
            "download of the argument",
            reverse("admin:django_leasejobs_job_download", args=[ids["args"], "args"]),
            is_page=False,
        ),
    ]
    print()
    for name, value in facts(size).items():
        print(f"{name + ':':<17}{value}")
    print(f"{'repeats:':<17}{args.repeat} timed after {args.warmup} warm-up runs per page")
    print()
    for page in pages:
        measure(client, page, args.repeat, args.warmup)

    header = f"{'page':<28}{'first':>10}{'median':>10}{'p95':>10}{'max':>10}{'size':>15}"
    print(header + f"{'db read':>15}  verdict")
    missed = []
    for page in pages:
        late = p95(page.times_ms) >= args.target_ms
        big = page.size >= PAGE_BYTES
        verdict = "-" if not page.is_page else ("MISSED" if late or big else "ok")
        if page.is_page and (late or big):
            missed.append(page.name)
        print(
            f"{page.name:<28}{page.first_ms:>7.0f} ms{statistics.median(page.times_ms):>7.0f} ms"
            f"{p95(page.times_ms):>7.0f} ms{max(page.times_ms):>7.0f} ms"
            f"{page.size:>13,} B{page.read:>13,} B  {verdict}"
        )
    print()
    target = f"p95 < {args.target_ms:.0f} ms and size < {PAGE_BYTES:,} B"
    if args.smoke:
        print(f"smoke run: nothing judged (targets: {target})")
        return 0
    if missed:
        print(f"TARGET MISSED by: {', '.join(missed)} ({target})")
        return 1 if args.fail_on_miss else 0
    print(f"every page within its targets ({target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
