"""Photograph the admin for docs/admin.md (run it through scripts/screenshots).

Builds a throwaway SQLite database with made-up but plausible traffic (an hour of
finished jobs, a backlog on three queues, running jobs with progress, a frozen worker
whose lease ran out, dead letters, a flaky job with tracebacks) through the lease
protocol itself, serves the admin with ``runserver`` on a free local port and takes
screenshots with the system's headless Chromium (see tests/browser.py): at 1366x768
with the admin's navigation sidebar open, as a person first sees it, and the dashboard
on a phone. It fails when a table's header cells are cut off, or when the phone's page
scrolls sideways.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = REPO_ROOT / "testproject" / "manage.py"
USERNAME, PASSWORD = "admin", "screenshots-only"
WIDTH, HEIGHT = 1366, 768

# Workers of the made-up fleet: id -> (host, pid, queues, concurrency).
FLEET = {
    "web-1:2817:9f3a": ("web-1", 2817, ["default", "high"], 4),
    "web-2:3104:51c7": ("web-2", 3104, ["default", "high"], 4),
    "batch-1:911:0be2": ("batch-1", 911, ["low"], 2),
}
FROZEN = "batch-2:1422:77d0"  # stopped heartbeating; its lease has just run out


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    import django

    django.setup()


# -- data ----------------------------------------------------------------------------------


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise RuntimeError(f"unexpected state while building the data: {what}")


def build_data(seed: int) -> dict[str, int]:
    """Fill the database; return the ids of the jobs worth photographing."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db.models.functions import Now

    from django_leasejobs import leases
    from django_leasejobs.models import Job, JobStatus, Queue, Worker, WorkerState

    call_command("migrate", verbosity=0)
    get_user_model().objects.create_superuser(USERNAME, "admin@example.com", PASSWORD)
    rng = random.Random(seed)  # noqa: S311 - made-up data, not crypto
    ago = lambda **kw: Now() - timedelta(**kw)  # noqa: E731

    # An hour of finished jobs: a daytime curve with noise, a few failures.
    for minute in range(1, 60):
        busy = 9 + 6 * math.sin(minute / 9) + rng.randint(0, 4)
        per_task = {"demo.tasks.add": 0.7, "demo.tasks.slow": 0.2, "demo.tasks.flaky": 0.1}
        for task_path, share in per_task.items():
            count = round(busy * share)
            if not count:
                continue
            queue = "high" if task_path == "demo.tasks.add" and minute % 4 == 0 else "default"
            jobs = Job.objects.bulk_create(
                Job(
                    task_path=task_path,
                    queue=queue,
                    args=[rng.randint(1, 99), rng.randint(1, 99)],
                    status=JobStatus.SUCCEEDED,
                    attempt=1,
                    last_worker=rng.choice(list(FLEET)),
                    result=rng.randint(2, 198),
                )
                for _ in range(count)
            )
            run = rng.randint(1, 20)
            Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
                enqueued_at=ago(minutes=minute, seconds=run + 3),
                started_at=ago(minutes=minute, seconds=run),
                last_attempted_at=ago(minutes=minute, seconds=run),
                finished_at=ago(minutes=minute),
            )
        if rng.random() < 0.25:
            failed = Job.objects.create(
                task_path="demo.tasks.always_fails",
                queue="low",
                status=JobStatus.FAILED,
                attempt=2,
                max_attempts=2,
                last_worker="batch-1:911:0be2",
                last_error="demo.tasks.DemoError: this task always fails",
            )
            Job.objects.filter(pk=failed.pk).update(
                enqueued_at=ago(minutes=minute + 1),
                started_at=ago(minutes=minute, seconds=40),
                finished_at=ago(minutes=minute),
            )

    # Backlog: ready jobs (waiting for a while on "low"), a few scheduled retries.
    def backlog(queue: str, count: int, oldest_minutes: float, **fields: Any) -> list[int]:
        jobs = Job.objects.bulk_create(
            Job(task_path="demo.tasks.add", queue=queue, args=[i, i + 1], **fields)
            for i in range(count)
        )
        for i, job in enumerate(jobs):
            Job.objects.filter(pk=job.pk).update(
                run_after=ago(seconds=oldest_minutes * 60 * (count - i) / count),
                enqueued_at=ago(seconds=oldest_minutes * 60 * (count - i) / count),
            )
        return [j.pk for j in jobs]

    backlog("low", 37, 14)
    backlog("default", 12, 2)
    backlog("high", 2, 0.2)
    retries = backlog(
        "low", 4, 3, attempt=1, last_error="demo.tasks.DemoError: attempt 1 fails on purpose"
    )
    Job.objects.filter(pk__in=retries).update(run_after=Now() + timedelta(minutes=3))
    Job.objects.create(task_path="demo.tasks.slow", kwargs={"seconds": 600}, queue="default")
    Job.objects.filter(task_path="demo.tasks.slow", status=JobStatus.PENDING).update(
        run_after=Now() + timedelta(hours=1)
    )

    # Dead letters: poison pills that took their worker down twice (max_stalls=2).
    poison = [
        Job.objects.create(task_path="demo.tasks.crash_worker", priority=90, max_stalls=2)
        for _ in range(2)
    ]
    for crashed_worker in ("web-2:2990:c41d", "web-1:2702:8e15"):
        claimed = leases.claim(crashed_worker, limit=2, lease_duration=30, queues=["default"])
        expect(sorted(c.id for c in claimed) == sorted(j.pk for j in poison), f"{claimed}")
        Job.objects.filter(pk__in=[j.pk for j in poison]).update(locked_until=ago(seconds=5))
        leases.reap()
    Job.objects.filter(pk__in=[j.pk for j in poison]).update(finished_at=ago(minutes=6))

    # A flaky job: two attempts failed with a traceback, the third succeeded.
    from demo import tasks as demo_tasks

    flaky = Job.objects.create(
        task_path="demo.tasks.flaky",
        kwargs={"succeed_on_attempt": 3},
        priority=90,
        max_attempts=5,
        key="nightly-report-2026-11-21",
    )
    for attempt in (1, 2, 3):
        worker = "web-1:2817:9f3a" if attempt != 2 else "web-2:3104:51c7"
        (claimed,) = leases.claim(worker, limit=1, lease_duration=30, queues=["default"])
        expect(claimed.id == flaky.pk, "the flaky job is claimed")
        if attempt < 3:
            try:
                demo_tasks.flaky.func(SimpleNamespace(attempt=attempt), succeed_on_attempt=3)
            except demo_tasks.DemoError as exc:
                # The task's own frames (not this script's), as a deployed app would show.
                frames = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)
                text = "".join(frames).replace(str(REPO_ROOT / "testproject"), "/srv/app")
                error = leases.ErrorInfo("demo.tasks.DemoError", str(exc), text)
            leases.fail(flaky.pk, claimed.attempt, worker, error=error, retry_delay=0)
            # ...and its backoff has passed (SQLite: "now + 0" may sort after "now" for 1 ms).
            Job.objects.filter(pk=flaky.pk).update(run_after=ago(seconds=1))
        else:
            leases.complete(flaky.pk, claimed.attempt, worker, result=attempt)

    # The fleet, and what it is running now (with progress where the task reports it).
    for worker_id, (host, pid, queues, concurrency) in FLEET.items():
        Worker.objects.create(
            id=worker_id, host=host, pid=pid, queues=queues, pool="process", concurrency=concurrency
        )
    Worker.objects.update(started_at=ago(hours=3), last_seen_at=ago(seconds=2))
    running: list[int] = []
    for worker_id, queue, task_path, kwargs, progress in [
        ("web-1:2817:9f3a", "default", "demo.tasks.slow", {"seconds": 120}, (0.62, "step 62/100")),
        ("web-1:2817:9f3a", "high", "demo.tasks.add", {}, None),
        ("web-2:3104:51c7", "default", "demo.tasks.slow", {"seconds": 300}, (0.18, "step 9/50")),
        ("batch-1:911:0be2", "low", "demo.tasks.slow", {"seconds": 900}, (0.91, "almost done")),
    ]:
        job = Job.objects.create(task_path=task_path, queue=queue, kwargs=kwargs, priority=80)
        (claimed,) = leases.claim(worker_id, limit=1, lease_duration=40, queues=[queue])
        expect(claimed.id == job.pk, f"job {job.pk} is claimed")
        if progress:
            leases.set_progress(job.pk, claimed.attempt, worker_id, leases.Progress(*progress))
        running.append(job.pk)

    Worker.objects.create(
        id=FROZEN, host="batch-2", pid=1422, queues=["low"], pool="process", concurrency=2
    )
    Worker.objects.filter(pk=FROZEN).update(started_at=ago(hours=2), last_seen_at=ago(seconds=75))
    stuck = Job.objects.create(
        task_path="demo.tasks.slow", queue="low", kwargs={"seconds": 60}, priority=80
    )
    (claimed,) = leases.claim(FROZEN, limit=1, lease_duration=40, queues=["low"])
    expect(claimed.id == stuck.pk, "the stuck job is claimed")
    leases.set_progress(stuck.pk, claimed.attempt, FROZEN, leases.Progress(0.3, "step 3/10"))
    Job.objects.filter(pk=stuck.pk).update(
        locked_until=ago(seconds=4), heartbeat_at=ago(seconds=75)
    )
    # A worker that stopped cleanly a while ago.
    Worker.objects.create(
        id="web-3:1999:aa01",
        host="web-3",
        pid=1999,
        queues=["default"],
        pool="thread",
        concurrency=8,
        state=WorkerState.STOPPED,
    )
    Worker.objects.filter(pk="web-3:1999:aa01").update(
        started_at=ago(hours=5), last_seen_at=ago(minutes=22), stopped_at=ago(minutes=22)
    )
    # Flow control: one sync per customer at a time (the second one waits for the first),
    # and the "low" queue paused by an operator a few minutes ago.
    sync = {"task_path": "demo.tasks.sync_customer", "flow_group": "key:customer-7"}
    first = Job.objects.create(**sync, args=[7], concurrency_limit=1, priority=100)
    (claimed,) = leases.claim("web-1:2817:9f3a", limit=1, lease_duration=40, queues=["default"])
    expect(claimed.id == first.pk, "the first sync of customer 7 is claimed")
    waiting = Job.objects.create(**sync, args=[7], concurrency_limit=1, priority=10)
    Queue.objects.create(backend="default", name="low", paused=True)
    Queue.objects.filter(name="low").update(paused_at=ago(minutes=7))
    return {"flaky": flaky.pk, "dead": poison[0].pk, "waiting": waiting.pk}


# -- server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def runserver(database_url: str, log_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": database_url, "DEBUG": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, str(MANAGE_PY), "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/admin/login/", timeout=2):  # noqa: S310 - our own local server
                        break
                except (urllib.error.URLError, ConnectionError):
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"runserver did not come up; see {log_path}") from None
                    time.sleep(0.2)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


# -- pictures -------------------------------------------------------------------------------


def take_screenshots(url: str, ids: dict[str, int], out: Path) -> list[Path]:
    from tests.browser import (
        PHONE,
        PageProblems,
        chromium,
        cut_off_headers,
        keep_nav_sidebar_open,
        log_in,
        nav_sidebar_is_open,
        page_overflow,
    )

    shots: list[Path] = []
    problems: list[str] = []

    def shot(page: Any, name: str, *, full_page: bool = True) -> None:
        path = out / name
        page.screenshot(path=path, full_page=full_page)
        shots.append(path)

    def fits(page: Any, name: str) -> None:
        if not nav_sidebar_is_open(page):
            problems.append(f"{name}: the navigation sidebar is closed")
        problems.extend(f"{name}: {cut}" for cut in cut_off_headers(page))

    with chromium(width=WIDTH, height=HEIGHT) as context:
        keep_nav_sidebar_open(context)
        context.set_default_timeout(15_000)
        page = context.new_page()
        watch = PageProblems(page)
        log_in(page, url, USERNAME, PASSWORD)

        page.goto(f"{url}/admin/django_leasejobs/job/dashboard/")
        page.wait_for_selector("#lj-chart")
        fits(page, "dashboard")
        shot(page, "admin-dashboard.png")

        page.goto(f"{url}/admin/django_leasejobs/job/")
        fits(page, "job list")
        shot(page, "admin-job-list.png", full_page=False)

        page.goto(f"{url}/admin/django_leasejobs/job/?status__exact=dead")
        page.locator("input.action-select").first.check()
        page.select_option("select[name=action]", label="Retry now (failed or dead jobs)")
        shot(page, "admin-job-actions.png", full_page=False)

        page.goto(f"{url}/admin/django_leasejobs/job/{ids['flaky']}/change/")
        page.locator("#attempts-group details").first.evaluate("d => d.open = true")
        shot(page, "admin-job-detail.png")

        page.goto(f"{url}/admin/django_leasejobs/job/{ids['waiting']}/change/")
        shot(page, "admin-job-waiting.png", full_page=False)

        page.goto(f"{url}/admin/django_leasejobs/queue/")
        fits(page, "queue list")
        shot(page, "admin-queues.png", full_page=False)

        page.goto(f"{url}/admin/django_leasejobs/worker/")
        fits(page, "worker list")
        shot(page, "admin-workers.png", full_page=False)
        problems.extend(watch.items)

    with chromium(width=PHONE[0], height=PHONE[1], scale=2, mobile=True) as context:
        context.set_default_timeout(15_000)
        page = context.new_page()
        watch = PageProblems(page)
        log_in(page, url, USERNAME, PASSWORD)
        page.goto(f"{url}/admin/django_leasejobs/job/dashboard/")
        page.wait_for_selector("#lj-chart")
        if page_overflow(page):
            problems.append(f"phone dashboard: {page_overflow(page)} px wider than the phone")
        shot(page, "admin-dashboard-phone.png")
        problems.extend(watch.items)

    if problems:
        raise RuntimeError("the pages had problems:\n" + "\n".join(problems))
    return shots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(REPO_ROOT / "docs" / "img"))
    parser.add_argument("--seed", type=int, default=2026)
    options = parser.parse_args()
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "testproject")]

    from tests.browser import missing_browser, missing_playwright

    problem = missing_browser() or missing_playwright()
    if problem:
        print(f"scripts/screenshots: {problem}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="leasejobs-screenshots-") as tmp:
        database_url = f"sqlite:///{tmp}/screenshots.sqlite3"
        setup_django(database_url)
        ids = build_data(options.seed)
        from django.db import connections

        connections.close_all()
        with runserver(database_url, Path(tmp) / "runserver.log") as url:
            for path in take_screenshots(url, ids, out):
                print(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
