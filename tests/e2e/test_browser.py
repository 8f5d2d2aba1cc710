"""The admin in a real browser: log in, read the live dashboard, retry a dead letter,
and see that the lists fit a laptop's screen and the dashboard a phone's.

Headless Chromium (the system's, see tests/browser.py) talks to pytest-django's
``live_server`` (a threaded server in this process, on the test database); a real
``runworker`` subprocess runs the retried job. The window is 1366x768 with the admin's
navigation sidebar open (Django's default on a wide window, kept open here), plus a
390x844 phone for the dashboard. Screenshots of the dashboard, the job list, the worker
list and the job detail land in ``artifacts/screenshots/<python>-<database>/``.

Without Chromium the tests are skipped, except under CI (``CI=true``), where a
missing browser is a failure: CI must install it (.ci/run does).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection, connections
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.models import AttemptOutcome, Job, JobStatus, Worker
from tests import tasks
from tests.browser import (
    PHONE,
    PageProblems,
    chromium,
    cut_off_headers,
    header_widths,
    in_ci,
    keep_nav_sidebar_open,
    log_in,
    missing_browser,
    missing_playwright,
    nav_sidebar_is_open,
    page_overflow,
    screenshot_dir,
)
from tests.helpers_leases import expire, make_job, make_jobs, make_ready
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "browser-test-password"
TIMEOUT_MS = 15_000
REFRESH_SECONDS = 5  # what the dashboard promises (data-refresh-seconds)

# Finished jobs for the chart: minutes ago -> how many finished then.
SUCCEEDED_AT = {2: 3, 5: 1, 9: 4, 14: 2, 27: 5, 41: 1}
FAILED_AT = {5: 1, 33: 2}
READY_LOW = 4
SCHEDULED_LOW = 2


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Playwright BrowserContext on the system's Chromium, 1366x768 with the admin's
    navigation sidebar open (skip/fail as documented above)."""
    with _browser_context(monkeypatch) as context:
        keep_nav_sidebar_open(context)
        yield context


@pytest.fixture
def phone(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The same on a 390x844 touch phone."""
    with _browser_context(monkeypatch, width=PHONE[0], height=PHONE[1], mobile=True) as context:
        yield context


@contextlib.contextmanager
def _browser_context(monkeypatch: pytest.MonkeyPatch, **size: Any) -> Iterator[Any]:
    problem = missing_browser()
    if problem:
        if in_ci():
            pytest.fail(f"CI=true but {problem}: CI must install Chromium (see .ci/run)")
        pytest.skip(problem)
    problem = missing_playwright()
    if problem:
        pytest.fail(problem)
    # Playwright's sync API keeps an event loop running in this thread; the ORM calls in
    # the test body are plain synchronous code (see tests/browser.py).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with chromium(**size) as context:
        context.set_default_timeout(TIMEOUT_MS)
        try:
            yield context
        finally:
            # While Playwright's loop runs, Django keeps this thread's connections in a
            # context variable, apart from the usual ones: close what the test opened
            # there, or it outlives the test (and blocks dropping the test database).
            connections.close_all()


@pytest.fixture
def shots() -> Path:
    return screenshot_dir(connection.vendor)


def _finished_jobs(per_minute: dict[int, int], status: str, **fields: Any) -> int:
    """Jobs that finished ``minutes`` ago (database clock); returns how many."""
    for minutes, count in per_minute.items():
        ids = make_jobs(count, status=status, **fields)
        Job.objects.filter(pk__in=ids).update(
            finished_at=Now() - timedelta(minutes=minutes, seconds=0)
        )
    return sum(per_minute.values())


def _rollup(per_minute: dict[int, int], counter: str, queue: str) -> None:
    """What workers would have counted: ``count`` outcomes ``minutes`` ago (database clock)."""
    now = leases.database_now()
    tally = leases.Tally()
    for minutes, count in per_minute.items():
        at = leases.minute_of(now - timedelta(minutes=minutes))
        key = leases.RollupKey("default", at, queue, tasks.add.module_path)
        tally.count(key, counter, count)
        tally.count(key, "started", count)
        tally.run(key, 0.02 * minutes)
    leases.add_tally(tally, using="default")


def _dead_letter() -> Job:
    """A job of a task that succeeds, made dead by a worker that vanished (max_stalls=1)."""
    job = make_job(queue="default", args=[2, 3], max_stalls=1)
    claimed = leases.claim("vanished-worker", limit=1, lease_duration=30, queues=["default"])
    assert [c.id for c in claimed] == [job.pk]
    expire(job.pk)
    reaped = leases.reap().jobs
    assert [(r.id, r.status) for r in reaped] == [(job.pk, JobStatus.DEAD)]
    return job


def _running_job_with_progress() -> Job:
    """A job in queue ``high`` held by a (fake) busy worker, 40 % done, long lease."""
    job = make_job(queue="high", args=[20, 22])
    (claimed,) = leases.claim("busy-worker", limit=1, lease_duration=600, queues=["high"])
    leases.set_progress(
        claimed.id, claimed.attempt, "busy-worker", leases.Progress(0.4, "step 4 of 10")
    )
    return job


def _text(page: Any, selector: str) -> str:
    return page.inner_text(selector).strip()


def _wait_for_text(page: Any, selector: str, expected: str) -> None:
    page.wait_for_function(
        "([sel, want]) => { const e = document.querySelector(sel);"
        " return e !== null && e.textContent.trim() === want; }",
        arg=[selector, expected],
        timeout=(REFRESH_SECONDS * 2 + 5) * 1000,
    )


def test_dashboard_shows_the_queues_and_refreshes_in_place(
    live_server: Any, browser: Any, shots: Path
) -> None:
    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    succeeded = _finished_jobs(SUCCEEDED_AT, JobStatus.SUCCEEDED, queue="default", result=3)
    failed = _finished_jobs(
        FAILED_AT, JobStatus.FAILED, queue="low", attempt=3, last_error="ValueError: nope"
    )
    _rollup(SUCCEEDED_AT, "succeeded", "default")
    _rollup(FAILED_AT, "failed", "low")
    _dead_letter()  # (the reaper counts it in the rollup: dead, now)
    running = _running_job_with_progress()
    make_ready(*make_jobs(READY_LOW, queue="low"), seconds_ago=300)
    scheduled = make_jobs(SCHEDULED_LOW, queue="low")
    Job.objects.filter(pk__in=scheduled).update(run_after=Now() + timedelta(hours=1))
    Worker.objects.create(
        id="busy-worker", host="web-1", pid=4242, queues=["high"], pool="process", concurrency=2
    )

    page = browser.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)

    # -- the dashboard, reached from the admin index --------------------------------------
    page.get_by_role("link", name="Queue dashboard").first.click()
    page.wait_for_selector("#leasejobs-dashboard")
    assert page.title().startswith("Queue dashboard")
    assert _text(page, "#lj-ready") == str(READY_LOW)
    assert _text(page, "#lj-scheduled") == str(SCHEDULED_LOW)
    assert _text(page, "#lj-running") == "1"
    assert _text(page, "#lj-expired") == "0"
    assert _text(page, "#lj-dead") == "1"
    assert _text(page, "#lj-workers") == "1"
    assert _text(page, "#lj-oldest") == "5m"
    failed_total = failed + 1  # the dead letter finished (as dead) just now
    rate = failed_total / (failed_total + succeeded) * 100
    assert _text(page, "#lj-failure-rate") == f"{rate:.1f}%"
    low = page.locator('#lj-queues tr[data-queue="low"] td').all_inner_texts()
    assert low[:6] == ["low", str(READY_LOW), str(SCHEDULED_LOW), "0", "0", "0"]
    running_row = page.locator("#lj-running-jobs tbody tr").first
    assert f"#{running.pk}" in running_row.inner_text()
    assert "busy-worker" in running_row.inner_text()
    assert running_row.locator("progress").get_attribute("value") == "0.400"
    assert "web-1" in page.inner_text("#lj-workers-table")

    # The chart (from the rollup): one green bar per minute with successes, one red per
    # minute with failures (the dead letter's minute included), the busiest minute full
    # height.
    chart = page.locator("#lj-chart")
    assert chart.is_visible()
    assert chart.locator("rect.lj-ok").count() == len(SUCCEEDED_AT)
    assert chart.locator("rect.lj-fail").count() == len(FAILED_AT) + 1
    chart_height = float(chart.get_attribute("viewBox").split()[3])
    bars = chart.locator("rect.lj-ok, rect.lj-fail")
    heights = bars.evaluate_all("rs => rs.map(r => r.getAttribute('height'))")
    assert max(float(h) for h in heights) == chart_height
    assert f"peak {max(SUCCEEDED_AT.values())} per step" in page.inner_text(".leasejobs-legend")
    page.screenshot(path=shots / "dashboard_initial.png", full_page=True)

    # -- in-place refresh: a new job shows up without a navigation -----------------------
    root = page.locator("#leasejobs-dashboard")
    assert root.get_attribute("data-refresh-seconds") == str(REFRESH_SECONDS)
    assert root.get_attribute("data-refreshed") is None
    page.evaluate("window.__leasejobsSamePage = true")
    tasks.add.using(queue_name="low").enqueue(5, 6)
    _wait_for_text(page, "#lj-ready", str(READY_LOW + 1))
    first_refresh = root.get_attribute("data-refreshed")
    assert first_refresh
    assert page.evaluate("window.__leasejobsSamePage === true"), "the page was reloaded"
    # The fragment replaced the body only: one dashboard, one set of cards, chart intact.
    assert page.locator("#leasejobs-dashboard").count() == 1
    assert page.locator(".leasejobs-cards").count() == 1
    assert page.locator("#lj-chart rect.lj-ok").count() == len(SUCCEEDED_AT)
    assert page.locator("#header").count() == 1
    low = page.locator('#lj-queues tr[data-queue="low"] td').all_inner_texts()
    assert low[1] == str(READY_LOW + 1)
    page.screenshot(path=shots / "dashboard.png", full_page=True)
    page.wait_for_function(
        "before => document.getElementById('leasejobs-dashboard').dataset.refreshed !== before",
        arg=first_refresh,
        timeout=(REFRESH_SECONDS * 2 + 5) * 1000,
    )
    assert page.evaluate("window.__leasejobsSamePage === true")
    assert problems.items == []


def test_a_dead_job_retried_from_the_job_list_succeeds_on_a_worker(
    live_server: Any, browser: Any, workers: Any, shots: Path
) -> None:
    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    dead = _dead_letter()
    # A real worker for queue "default": it runs the job once it is retried.
    worker = workers.start(
        args=["--queues", "default", "--concurrency", "1", "--worker-id", "browser-worker"],
        wait_started=False,
    )
    page = browser.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)

    # The dead letter's detail: the expired lease is its one attempt.
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/{dead.pk}/change/")
    assert _text(page, ".field-status_badge .readonly") == "Dead"
    attempts = page.inner_text("#attempts-group")
    assert str(AttemptOutcome.LEASE_EXPIRED.label) in attempts
    assert "vanished-worker" in attempts
    page.screenshot(path=shots / "job_detail_dead.png", full_page=True)

    # From the dashboard's "dead letters" card to the job list, filtered.
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/dashboard/")
    assert _text(page, "#lj-dead") == "1"
    page.locator("#lj-dead").locator("xpath=..").get_by_role("link", name="dead letters").click()
    page.wait_for_url(re.compile(r"/admin/django_leasejobs/job/\?status__exact=dead$"))
    assert page.locator("input.action-select").count() == 1
    page.locator(f'input.action-select[value="{dead.pk}"]').check()
    page.select_option("select[name=action]", label="Retry now (failed or dead jobs)")
    page.screenshot(path=shots / "job_changelist.png", full_page=True)
    worker.wait_for_event("worker_started")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click(".actions button[name=index]")  # "Go" (Django 5.2), "Run" (Django 6)
    assert posted.value.status == 302, f"the retry action answered HTTP {posted.value.status}"
    page.wait_for_selector(".messagelist")
    assert "Retried 1 job." in page.inner_text(".messagelist .success")
    page.screenshot(path=shots / "job_changelist_retried.png", full_page=True)
    assert LogEntry.objects.filter(object_id=str(dead.pk), change_message="Retried (was dead)")

    # The detail again: reload until the worker has run it.
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/{dead.pk}/change/")
    # A running job's status cell also names its lease holder ("Running browser-worker · 2s left").
    status = _text(page, ".field-status_badge .readonly")
    assert status.split()[0] in {"Pending", "Running", "Succeeded"}, status
    wait_until(
        lambda: Job.objects.filter(pk=dead.pk, status=JobStatus.SUCCEEDED).exists(),
        timeout=30,
        what=f"job {dead.pk} to succeed on the real worker",
    )
    page.reload()
    assert _text(page, ".field-status_badge .readonly") == "Succeeded"
    assert _text(page, ".field-result_json .readonly") == "5"
    assert _text(page, ".field-args_json .readonly") == "[\n  2,\n  3\n]"
    assert str(AttemptOutcome.LEASE_EXPIRED.label) in page.inner_text("#attempts-group")
    page.screenshot(path=shots / "job_detail.png", full_page=True)
    job = Job.objects.get(pk=dead.pk)
    assert (job.last_worker, job.attempt, job.result) == ("browser-worker", 2, 5)
    assert problems.items == []


def test_actions_follow_the_permissions_of_a_group(live_server: Any, browser: Any) -> None:
    """view_job + retry_job (a group) offers "Retry now" only; view_job alone: no actions."""
    users = get_user_model().objects
    perms = Permission.objects.filter(content_type__app_label="django_leasejobs")
    operators = Group.objects.create(name="job operators")
    operators.permissions.add(*perms.filter(codename__in=["view_job", "retry_job"]))
    operator = users.create_user("operator", password=PASSWORD, is_staff=True)
    operator.groups.add(operators)
    viewer = users.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(perms.get(codename="view_job"))
    make_jobs(2, status=JobStatus.FAILED, attempt=3, finished_at=None)

    for username, expected_actions in [
        ("operator", ["Retry now (failed or dead jobs)"]),
        ("viewer", []),
    ]:
        page = browser.new_page()
        problems = PageProblems(page)
        log_in(page, live_server.url, username, PASSWORD)
        page.goto(f"{live_server.url}/admin/django_leasejobs/job/")
        assert page.locator("#result_list tbody tr").count() == 2
        options = page.locator("select[name=action] option").all_inner_texts()
        assert [o for o in options if not o.startswith("-")] == expected_actions, username
        page.goto(f"{live_server.url}/admin/django_leasejobs/queuedashboard/")
        assert _text(page, "#lj-ready") == "0"
        assert problems.items == [], username
        page.close()
        browser.clear_cookies()

    # Staff without view_job: no job list, no dashboard (at either of its addresses).
    users.create_user("stranger", password=PASSWORD, is_staff=True)
    page = browser.new_page()
    log_in(page, live_server.url, "stranger", PASSWORD)
    for path in ["job/", "job/dashboard/", "job/dashboard/?fragment=1", "queuedashboard/"]:
        response = page.goto(f"{live_server.url}/admin/django_leasejobs/{path}")
        assert response is not None and response.status == 403, path


BROWSER_SCHEDULES = {
    "nightly-report": {"task": "tests.tasks.add", "cron": "0 3 * * *", "args": [1, 2]},
    "every-minute": {"task": "tests.tasks.add", "every": 60, "args": [2, 3]},
}


def test_the_schedules_page_lists_the_schedules_and_their_next_runs(
    live_server: Any, browser: Any, shots: Path
) -> None:
    from django.conf import settings
    from django.test import override_settings

    from django_leasejobs.schedules import operations

    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    default = {**settings.TASKS["default"], "OPTIONS": {"SCHEDULES": BROWSER_SCHEDULES}}
    with override_settings(TASKS={**settings.TASKS, "default": default}):
        page = browser.new_page()
        problems = PageProblems(page)
        log_in(page, live_server.url, "boss", PASSWORD)

        # Declared in settings, never seen by a worker: the page lists them all the same.
        page.get_by_role("link", name="Schedules").first.click()
        page.wait_for_selector("#result_list")
        names = page.locator("#result_list th.field-name a").all_inner_texts()
        assert sorted(names) == sorted(BROWSER_SCHEDULES)
        nightly = page.locator("#result_list tr", has_text="nightly-report")
        assert _text_of(nightly, "td.field-state") == "active"
        assert "At 03:00 every day" in _text_of(nightly, "td.field-trigger")
        next_run = nightly.locator("td.field-next_run time")
        assert next_run.is_visible()
        [view] = [v for v in operations.overview() if v.name == "nightly-report"]
        assert view.next_tick is not None
        assert next_run.get_attribute("datetime") == view.next_tick.isoformat()
        assert "(in " in _text_of(nightly, "td.field-next_run")
        page.screenshot(path=shots / "schedules.png", full_page=True)

        # The dashboard's panel names the same next runs.
        page.goto(f"{live_server.url}/admin/django_leasejobs/queuedashboard/")
        panel = page.inner_text("#lj-next-runs")
        assert "nightly-report" in panel and "every-minute" in panel
        assert problems.items == []


def _text_of(row: Any, selector: str) -> str:
    return str(row.locator(selector).inner_text()).strip()


# -- widths ----------------------------------------------------------------------------------

BUSY_WORKER = "worker-7.eu-west-1.compute.internal:48213:9f3a2b"
FIT_WIDTHS = (1280, 1366, 1440)
# The columns that must stay in sight on each list (their header cells' classes).
KEY_COLUMNS = {
    "job": [
        "column-id",
        "column-task_name",
        "column-status_badge",
        "column-queue",
        "column-priority",
        "column-attempts_display",
        "column-progress_display",
        "column-when",
    ],
    "worker": ["column-id", "column-last_seen", "column-online", "column-jobs_held"],
}


def _busy_admin() -> None:
    """Jobs in every state with long worker ids and messages, and workers with problems."""
    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    _finished_jobs(SUCCEEDED_AT, JobStatus.SUCCEEDED, queue="default", result=3)
    _finished_jobs(FAILED_AT, JobStatus.FAILED, queue="low", attempt=3, last_error="nope")
    _dead_letter()
    make_jobs(3, queue="reports-nightly", priority=90)
    for n in range(3):
        job = make_job(queue="default", priority=50)
        (claimed,) = leases.claim(BUSY_WORKER, limit=1, lease_duration=600, queues=["default"])
        assert claimed.id == job.pk
        message = f"step {n + 40} of 100: resizing images in batch {n}"
        progress = leases.Progress(0.4 + n / 10, message)
        leases.set_progress(claimed.id, claimed.attempt, BUSY_WORKER, progress)
    Job.objects.filter(status=JobStatus.FAILED).update(progress=0.9, progress_message="almost")
    for n in range(4):
        Worker.objects.create(
            id=f"{BUSY_WORKER[:-2]}{n:02d}",
            host="worker-7.eu-west-1.compute.internal",
            pid=48213 + n,
            queues=["default", "high", "low", "reports-nightly"],
            pool="process",
            concurrency=8,
            problem="gave up recording 2 attempt(s) since it started; last: job 7 attempt 1"
            if n == 0
            else "",
        )


def _assert_fits(page: Any, name: str, key_columns: list[str]) -> None:
    width = page.viewport_size["width"]
    assert nav_sidebar_is_open(page), f"{name} at {width} px: the navigation sidebar is closed"
    assert cut_off_headers(page) == [], f"{name} at {width} px: {header_widths(page)}"
    for column in key_columns:
        right = page.locator(f"#result_list thead th.{column}").evaluate(
            "th => th.getBoundingClientRect().right"
        )
        assert right <= width, f"{name} at {width} px: {column} ends at {right} px"


def test_the_lists_and_the_dashboard_fit_with_the_sidebar_open(
    live_server: Any, browser: Any, shots: Path
) -> None:
    _busy_admin()
    page = browser.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)
    admin = f"{live_server.url}/admin/django_leasejobs"

    for width in FIT_WIDTHS:
        page.set_viewport_size({"width": width, "height": 768})
        page.goto(f"{admin}/job/")
        assert page.locator("#result_list tbody tr").count() > 20
        _assert_fits(page, "job list", KEY_COLUMNS["job"])
        if width == 1366:
            page.screenshot(path=shots / "job_list_1366.png")
        page.goto(f"{admin}/worker/")
        _assert_fits(page, "worker list", KEY_COLUMNS["worker"])
        if width == 1366:
            page.screenshot(path=shots / "workers_1366.png")
        page.goto(f"{admin}/job/dashboard/")
        page.wait_for_selector("#lj-chart")
        assert nav_sidebar_is_open(page)
        assert cut_off_headers(page, ".leasejobs-table") == [], f"dashboard at {width} px"
        if width == 1366:
            page.screenshot(path=shots / "dashboard_1366.png", full_page=True)
    assert problems.items == []


def test_the_dashboard_on_a_phone_does_not_scroll_sideways(
    live_server: Any, phone: Any, shots: Path
) -> None:
    _busy_admin()
    page = phone.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/dashboard/")
    page.wait_for_selector("#lj-chart")
    assert page.viewport_size == {"width": PHONE[0], "height": PHONE[1]}
    assert page_overflow(page) == 0
    # Each table stays in its box, which scrolls sideways when the table is wider.
    for table in page.locator(".leasejobs-table").all():
        box = table.locator("xpath=..")
        assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto"
        assert box.evaluate("b => b.getBoundingClientRect().right") <= PHONE[0]
    assert page.locator("#lj-running-jobs tbody tr").count() == 3
    page.screenshot(path=shots / "dashboard_phone.png", full_page=True)
    assert problems.items == []


@pytest.mark.parametrize("device", ["browser", "phone"])
def test_the_search_by_argument_finds_a_customers_jobs(
    live_server: Any, request: pytest.FixtureRequest, device: str, shots: Path
) -> None:
    """Typed into the job list's search box at 1366 px and on a phone: the customer's
    jobs, their exact count, a URL to bookmark; a malformed search says how to write it."""
    context = request.getfixturevalue(device)
    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    wanted = {int(tasks.carry.enqueue(customer_id=4711, n=n).id) for n in range(3)}
    for n in range(5):
        tasks.carry.enqueue(customer_id=4712 + n)
    page = context.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/")
    page.fill("#searchbar", "kwargs.customer_id:4711")
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"\?q=kwargs\.customer_id%3A4711$"))
    shown = {
        int(text) for text in page.locator("#result_list tbody th.field-id a").all_inner_texts()
    }
    assert shown == wanted
    assert "3 results" in page.inner_text("#changelist-search")
    page.screenshot(path=shots / f"job_search_{device}.png", full_page=True)
    page.fill("#searchbar", "args.first:1")
    page.press("#searchbar", "Enter")
    page.wait_for_selector(".messagelist .error")
    assert "starts with a position (args.0:42)" in page.inner_text(".messagelist .error")
    assert page.locator("#result_list tbody tr").count() == 0
    assert problems.items == []


@pytest.mark.parametrize("device", ["browser", "phone"])
def test_the_trend_charts_switch_ranges_and_fit_the_screen(
    live_server: Any, request: pytest.FixtureRequest, device: str, shots: Path
) -> None:
    """At 1366 px with the sidebar open and on a phone: the range links switch the charts
    (bookmarkable ``?range=``), the refresh keeps the range, nothing scrolls sideways, and
    every step says its numbers in a ``<title>``."""
    context = request.getfixturevalue(device)  # (the browser's sidebar is open)
    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    _rollup({3: 4, 50: 2}, "succeeded", "default")
    _rollup({90: 5, 600: 1}, "failed", "low")  # 1.5 h and 10 h ago: the day's
    _rollup({3 * 24 * 60: 7}, "succeeded", "default")  # 3 days ago: the week's
    page = context.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/dashboard/")
    page.wait_for_selector("#lj-chart")
    width = page.viewport_size["width"]
    expected = {"hour": ("6", "0"), "day": ("6", "6"), "week": ("13", "6")}
    for name, label in (
        ("hour", "last hour, per minute"),
        ("day", "last day, per hour"),
        ("week", "last week, per 6 hours"),
    ):
        if name != "hour":
            page.get_by_role("link", name=label).click()
            page.wait_for_selector(f'#lj-chart[data-range="{name}"]')
            assert page.url.endswith(f"?range={name}")
        current = page.locator(".leasejobs-ranges [aria-current='page']")
        assert current.inner_text() == label
        succeeded, failed = expected[name]
        assert _text(page, "#lj-trend-succeeded") == succeeded, name
        assert _text(page, "#lj-trend-failed") == failed, name
        for chart in ("#lj-chart", "#lj-times"):
            box = page.locator(chart).bounding_box()
            assert box is not None and box["width"] > 0 and box["x"] + box["width"] <= width
        assert page.locator("#lj-times polyline").count() >= 1
        titles = page.locator("#lj-chart g.lj-step > title").all_text_contents()
        assert any("succeeded" in t and "failed" in t for t in titles)
        assert page_overflow(page) == 0, f"{name} on {device}"
        page.screenshot(path=shots / f"trends_{name}_{device}.png", full_page=True)
    # The refresh fetches the same range.
    root = page.locator("#leasejobs-dashboard")
    assert root.get_attribute("data-refresh-url") == "?range=week&fragment=1"
    page.wait_for_function(
        "() => document.getElementById('leasejobs-dashboard').dataset.refreshed !== undefined",
        timeout=(REFRESH_SECONDS * 2 + 5) * 1000,
    )
    assert page.locator('#lj-chart[data-range="week"]').count() == 1
    assert _text(page, "#lj-trend-succeeded") == "13"
    assert problems.items == []
