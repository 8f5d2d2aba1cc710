"""The Django admin: job and worker pages, filters, search, the queue dashboard, the
permission-gated actions, read-only rows, access rules, and escaping of job data.

Jobs reach their states through the lease protocol only (``django_leasejobs.leases``);
the one direct write is moving a lease's expiry into the past (database clock).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.db import connection
from django.db.models.functions import Now
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from freezegun import freeze_time

from django_leasejobs import leases
from django_leasejobs.models import Job, JobAttempt, JobStatus, Worker, WorkerState
from tests.tasks import add, configured
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db

WORKER = "host-a:1001:aaaaaa"
WORKER2 = "host-b:2002:bbbbbb"
LEASE = 30.0

CHANGELIST = "/admin/django_leasejobs/job/"
DASHBOARD = "/admin/django_leasejobs/job/dashboard/"
QUEUE_DASHBOARD = "/admin/django_leasejobs/queuedashboard/"
WORKERS = "/admin/django_leasejobs/worker/"
DASHBOARDS = [
    DASHBOARD,
    QUEUE_DASHBOARD,
    DASHBOARD + "?fragment=1",
    QUEUE_DASHBOARD + "?fragment=1",
]

# The action each permission unlocks, and a job state the action changes.
ACTION_PERMISSIONS = {
    "retry_now": "retry_job",
    "cancel_jobs": "cancel_job",
    "requeue_dead": "requeue_job",
    "delete_finished": "purge_job",
}

SCRIPT = "<script>alert(1)</script>"
SCRIPT_ESCAPED = b"&lt;script&gt;alert(1)&lt;/script&gt;"
IMG = "<img src=x onerror=alert(1)>"
IMG_ESCAPED = b"&lt;img src=x onerror=alert(1)&gt;"
BOLD = "<b>xss</b>"
BOLD_ESCAPED = b"&lt;b&gt;xss&lt;/b&gt;"

# --------------------------------------------------------------------------- jobs by state


def enqueue(task: Any = add, *args: Any, **using: Any) -> int:
    if not args:
        args = (1, 2) if task is add else ()
    if using:
        task = task.using(**using)
    return int(task.enqueue(*args).id)


def claim(job_id: int, worker: str = WORKER) -> leases.ClaimedJob:
    """Claim the one ready job, which must be ``job_id``.

    A job retried with ``retry_delay=0`` is ready from the next tick of the database
    clock (SQLite's has millisecond steps): wait for that briefly.
    """
    claimed = wait_until(
        lambda: leases.claim(worker, limit=1, lease_duration=LEASE),
        timeout=2,
        interval=0.002,
        what=f"job {job_id} to become ready",
    )
    assert [c.id for c in claimed] == [job_id], "another ready job was claimed first"
    return claimed[0]


def expire(job_id: int) -> None:
    changed = Job.objects.filter(pk=job_id).update(locked_until=Now() - timedelta(seconds=5))
    assert changed == 1


def error(message: str = "boom", cls: str = "builtins.ValueError", tb: str = "") -> Any:
    traceback = tb or f"Traceback (most recent call last):\n  ...\n{cls}: {message}\n"
    return leases.ErrorInfo(cls, message, traceback)


def succeeded_job(**using: Any) -> int:
    job_id = enqueue(add, **using)
    c = claim(job_id)
    leases.complete(c.id, c.attempt, WORKER, result=3)
    return job_id


def failed_job(task: Any = add, attempts: int = 2, **using: Any) -> int:
    """A job that failed for good after ``attempts`` failed attempts."""
    job_id = enqueue(task, **using)
    for n in range(1, attempts + 1):
        c = claim(job_id)
        last = n == attempts
        status = leases.fail(
            c.id, c.attempt, WORKER, error=error(f"boom {n}"), retry_delay=None if last else 0
        )
        assert status == (JobStatus.FAILED if last else JobStatus.PENDING)
    return job_id


def dead_job(**using: Any) -> int:
    """A dead letter: its only lease expired and the reaper took it (max_stalls=1)."""
    job_id = enqueue(add, max_stalls=1, **using)
    claim(job_id)
    expire(job_id)
    reaped = leases.reap().jobs
    assert [(r.id, r.status) for r in reaped] == [(job_id, JobStatus.DEAD)]
    return job_id


def cancelled_job() -> int:
    job_id = enqueue()
    assert leases.cancel(job_id) == leases.CancelResult.CANCELLED
    return job_id


def running_job(worker: str = WORKER, **using: Any) -> int:
    job_id = enqueue(add, **using)
    claim(job_id, worker)
    return job_id


def expired_job(worker: str = WORKER) -> int:
    job_id = running_job(worker)
    expire(job_id)
    return job_id


def cancel_requested_job(worker: str = WORKER) -> int:
    job_id = running_job(worker)
    assert leases.cancel(job_id) == leases.CancelResult.REQUESTED
    return job_id


def scheduled_job() -> int:
    return enqueue(add, run_after=timezone.now() + timedelta(hours=1))


def status_of(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)


@pytest.fixture
def states() -> dict[str, int]:
    """One job in every state (and on a few queues, tasks and workers), by name."""
    ids: dict[str, int] = {}
    ids["succeeded"] = succeeded_job()
    ids["failed"] = failed_job(configured, queue_name="high")
    ids["dead"] = dead_job(queue_name="low")
    ids["cancelled"] = cancelled_job()
    ids["running"] = running_job()
    job = Job.objects.get(pk=ids["running"])  # progress: the lease holder's own write
    leases.set_progress(job.pk, job.attempt, WORKER, leases.Progress(0.25, "a quarter"))
    ids["expired"] = expired_job()
    ids["cancel_requested"] = cancel_requested_job(WORKER2)
    ids["scheduled"] = scheduled_job()
    ids["pending"] = enqueue(add, key="dedup-key-1")
    # A workflow step waiting for its parent (its parent left out: one job per state).
    ids["waiting"] = enqueue(add)
    Job.objects.filter(pk=ids["waiting"]).update(status=JobStatus.WAITING, waiting_on=1)
    return ids


STATUS_OF_STATE = {
    "succeeded": JobStatus.SUCCEEDED,
    "failed": JobStatus.FAILED,
    "dead": JobStatus.DEAD,
    "cancelled": JobStatus.CANCELLED,
    "running": JobStatus.RUNNING,
    "expired": JobStatus.RUNNING,
    "cancel_requested": JobStatus.RUNNING,
    "scheduled": JobStatus.PENDING,
    "waiting": JobStatus.WAITING,
    "pending": JobStatus.PENDING,
}


# --------------------------------------------------------------------------- users and pages


def staff_user(*codenames: str, username: str = "staff", is_staff: bool = True) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=is_staff)
    perms = Permission.objects.filter(
        content_type__app_label="django_leasejobs", codename__in=codenames
    )
    assert sorted(p.codename for p in perms) == sorted(codenames)
    user.user_permissions.add(*perms)
    return user


def client_for(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def shown_ids(response: HttpResponse) -> set[int]:
    """Ids of the jobs (or workers) listed on a changelist page."""
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def action_names(response: HttpResponse) -> list[str]:
    form = response.context["action_form"]
    if form is None:
        return []
    return [name for name, _label in form.fields["action"].choices if name]


def post_action(client: Client, action: str, ids: Iterable[int], **extra: str) -> HttpResponse:
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra}
    return client.post(CHANGELIST, data)


def confirm_delete(client: Client, ids: Iterable[int], **extra: str) -> HttpResponse:
    """The confirmation page's POST: the selection again, ``post=yes``, no ``index``."""
    data = {
        "action": "delete_finished",
        "_selected_action": [str(i) for i in ids],
        "select_across": "0",
        "post": "yes",
        **extra,
    }
    return client.post(CHANGELIST, data)


def page_form(page: HttpResponse) -> dict[str, list[str]]:
    """The hidden fields of the delete confirmation page's form, as it posts them."""
    assert page.status_code == 200, page.status_code
    found = re.search(r'<form method="post">(.*?)</form>', page.content.decode(), re.S)
    assert found, "no form on the page"
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', found[1]):
        fields.setdefault(name, []).append(html.unescape(value))
    return fields


def confirm_on_page(
    client: Client, page: HttpResponse, url: str = CHANGELIST, **changed: list[str]
) -> HttpResponse:
    """Press *Yes, I'm sure* on a delete confirmation page: post its form back."""
    return client.post(url, {**page_form(page), **changed})


def finish(job_id: int) -> None:
    """The worker's part: claim the one ready job, ``job_id``, and complete it."""
    c = claim(job_id)
    leases.complete(c.id, c.attempt, WORKER, result=3)


def database_clock_past(job_ids: Iterable[int]) -> None:
    """Until the database's clock is past the ``finished_at`` of ``job_ids`` (SQLite's
    clock has millisecond steps)."""
    latest = max(Job.objects.filter(pk__in=list(job_ids)).values_list("finished_at", flat=True))
    wait_until(
        lambda: leases.database_now() > latest,
        timeout=2,
        interval=0.001,
        what="the database clock to move",
    )


def run_action(client: Client, action: str, ids: Iterable[int]) -> HttpResponse:
    """Run an action as a person does: choose it, and confirm a deletion when asked."""
    response = post_action(client, action, ids)
    if action == "delete_finished" and response.status_code == 200:
        asked = response.templates[0].name.endswith("delete_finished_confirmation.html")
        response = confirm_on_page(client, response) if asked else confirm_delete(client, ids)
    return response


def messages_of(response: HttpResponse) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def log_entries(job_ids: Iterable[int], flag: int) -> list[LogEntry]:
    job_type = ContentType.objects.get_for_model(Job)
    return list(
        LogEntry.objects.filter(
            content_type=job_type, object_id__in=[str(i) for i in job_ids], action_flag=flag
        ).order_by("object_id")
    )


def change_url(job_id: int) -> str:
    return reverse("admin:django_leasejobs_job_change", args=[job_id])


def worker_url(worker_id: str) -> str:
    return reverse("admin:django_leasejobs_worker_change", args=[quote(worker_id)])


def card(content: bytes, name: str) -> str:
    """The number on one dashboard card (``id="lj-<name>"``)."""
    found = re.search(rb'id="lj-' + name.encode() + rb'">([^<]*)<', content)
    assert found, f"no card lj-{name}"
    return found.group(1).decode()


def queue_row(content: bytes, queue: str) -> list[str]:
    """The cells after the name of one queue's row in the dashboard's queue table."""
    found = re.search(rb'<tr data-queue="' + queue.encode() + rb'">(.*?)</tr>', content)
    assert found, f"no row for queue {queue}"
    cells = re.findall(rb"<td>(.*?)</td>", found.group(1))
    return [c.decode() for c in cells[1:]]


def make_worker(worker_id: str, *, seen_ago: float = 0, **fields: Any) -> Worker:
    fields = {"host": "host-a", "pid": 1001, "queues": ["default"], "pool": "process", **fields}
    fields.setdefault("concurrency", 4)
    worker = Worker.objects.create(id=worker_id, **fields)
    if seen_ago:
        Worker.objects.filter(pk=worker_id).update(last_seen_at=Now() - timedelta(seconds=seen_ago))
    return worker


# --------------------------------------------------------------------------- import paths


def test_the_model_admins_are_importable_from_django_leasejobs_admin() -> None:
    """The import paths of the one-module admin still work: projects subclass, unregister
    and register these again."""
    from django.contrib import admin

    from django_leasejobs import admin as leasejobs_admin
    from django_leasejobs.admin import (
        JobAdmin,
        JobAttemptInline,
        QueueDashboardAdmin,
        ScheduleAdmin,
        WorkerAdmin,
    )
    from django_leasejobs.models import QueueDashboard, Schedule

    registered = {model: type(model_admin) for model, model_admin in admin.site._registry.items()}
    assert registered[Job] is JobAdmin
    assert registered[Worker] is WorkerAdmin
    assert registered[Schedule] is ScheduleAdmin
    assert registered[QueueDashboard] is QueueDashboardAdmin
    assert JobAttemptInline in JobAdmin.inlines
    for name in leasejobs_admin.__all__:
        assert getattr(leasejobs_admin, name).__module__.startswith("django_leasejobs.admin.")

    class ProjectJobAdmin(JobAdmin):
        pass

    admin.site.unregister(Job)
    try:
        admin.site.register(Job, ProjectJobAdmin)
        assert type(admin.site._registry[Job]) is ProjectJobAdmin
    finally:
        admin.site.unregister(Job)
        admin.site.register(Job, JobAdmin)


# --------------------------------------------------------------------------- pages render


def test_changelist_renders_jobs_in_every_state(
    admin_client: Client, states: dict[str, int]
) -> None:
    response = admin_client.get(CHANGELIST)
    assert shown_ids(response) == set(states.values())
    content = response.content
    for status in JobStatus.values:
        assert f'leasejobs-status leasejobs-status-{status}"'.encode() in content
    assert b"cancel requested" in content
    assert b'<span class="leasejobs-expired">expired</span>' in content
    assert b"25% a quarter" in content
    assert b"2/5" in content  # the failed job: attempt 2 of configured's 5
    assert b"Queue dashboard" in content  # the object tool linking the dashboard
    assert DASHBOARD.encode() in content


@pytest.mark.parametrize("state", list(STATUS_OF_STATE))
def test_change_view_renders_every_state_read_only(
    admin_client: Client, states: dict[str, int], state: str
) -> None:
    job_id = states[state]
    assert status_of(job_id) == STATUS_OF_STATE[state]

    response = admin_client.get(change_url(job_id))

    assert response.status_code == 200
    content = response.content
    assert f"leasejobs-status-{STATUS_OF_STATE[state]}".encode() in content
    assert b'name="_save"' not in content
    assert b'name="_continue"' not in content
    assert b'<input type="text"' not in content
    assert b"<textarea" not in content


def test_change_view_shows_result_attempts_lease_and_errors(
    admin_client: Client, states: dict[str, int]
) -> None:
    succeeded = admin_client.get(change_url(states["succeeded"])).content
    assert b'<pre class="leasejobs-json">3</pre>' in succeeded

    failed = admin_client.get(change_url(states["failed"])).content
    assert b"boom 1" in failed
    assert b"boom 2" in failed
    assert b"builtins.ValueError: boom 2" in failed  # last_error
    assert failed.count(b'class="leasejobs-traceback"') == 2  # one per attempt row

    dead = admin_client.get(change_url(states["dead"])).content
    assert b"lease expired" in dead
    assert b"Lease expired" in dead  # the attempt's outcome

    expired = admin_client.get(change_url(states["expired"])).content
    assert b'<span class="leasejobs-expired">expired</span>' in expired
    assert WORKER.encode() in expired

    cancel = admin_client.get(change_url(states["cancel_requested"])).content
    assert b"cancel requested" in cancel
    assert WORKER2.encode() in cancel


def test_attempt_history_says_why_each_attempt_was_retried_snoozed_or_not(
    admin_client: Client,
) -> None:
    job = Job.objects.create(task_path="tests.tasks.add", status=JobStatus.FAILED, snoozes=1)
    for attempt, outcome, decision in (
        (1, "snoozed", "snoozed for 60s (1 of 10)"),
        (2, "error", "Transient is in retry_on: retried in 4s (attempt 2 of 4)"),
        (3, "error", "not retried: <Odd> is in dont_retry_on"),
    ):
        JobAttempt.objects.create(job=job, attempt=attempt, outcome=outcome, decision=decision)

    content = admin_client.get(change_url(job.pk)).content.decode()

    assert "Snoozed" in content  # the outcome's label
    assert "snoozed for 60s (1 of 10)" in content
    assert "Transient is in retry_on: retried in 4s (attempt 2 of 4)" in content
    assert "not retried: &lt;Odd&gt; is in dont_retry_on" in content  # escaped
    assert re.search(r'<th class="column-decision[^"]*">\s*Decision', content), "no column"


def test_view_only_staff_sees_the_attempt_history(states: dict[str, int]) -> None:
    client = client_for(staff_user("view_job"))
    content = client.get(change_url(states["failed"])).content
    assert b"builtins.ValueError: boom 2" in content  # last error: shown
    assert b"boom 1" in content  # first attempt's error: only in the attempts inline


def test_missing_job_redirects_to_the_changelist(admin_client: Client) -> None:
    response = admin_client.get(change_url(987654))
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:index")


# --------------------------------------------------------------------------- filters and search


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status__exact": "pending"}, {"scheduled", "pending"}),
        ({"status__exact": "running"}, {"running", "expired", "cancel_requested"}),
        ({"status__exact": "succeeded"}, {"succeeded"}),
        ({"status__exact": "failed"}, {"failed"}),
        ({"status__exact": "dead"}, {"dead"}),
        ({"status__exact": "cancelled"}, {"cancelled"}),
        ({"queue": "high"}, {"failed"}),
        ({"queue": "low"}, {"dead"}),
        (
            {"queue": "default"},
            set(STATUS_OF_STATE) - {"failed", "dead"},
        ),
        ({"task": "tests.tasks.configured"}, {"failed"}),
        ({"task": "tests.tasks.add"}, set(STATUS_OF_STATE) - {"failed"}),
        ({"has_errors": "yes"}, {"failed", "dead"}),
        ({"has_errors": "no"}, set(STATUS_OF_STATE) - {"failed", "dead"}),
        ({"worker": WORKER}, {"running", "expired"}),
        ({"worker": WORKER2}, {"cancel_requested"}),
        ({"worker": "nobody"}, set()),
        ({"status__exact": "running", "worker": WORKER}, {"running", "expired"}),
    ],
    ids=lambda value: (
        "&".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_filters(
    admin_client: Client, states: dict[str, int], query: dict[str, str], expected: set[str]
) -> None:
    response = admin_client.get(CHANGELIST, query)
    assert shown_ids(response) == {states[name] for name in expected}


def test_filter_sidebar_offers_statuses_queues_tasks_and_errors(
    admin_client: Client, states: dict[str, int]
) -> None:
    content = admin_client.get(CHANGELIST).content
    for status in JobStatus.values:
        assert f"?status__exact={status}".encode() in content
    for queue in ("default", "high", "low"):
        assert f"?queue={queue}".encode() in content
    assert b"?task=tests.tasks.add" in content
    assert b"?task=tests.tasks.configured" in content
    assert b"?has_errors=yes" in content
    assert b'data-filter-title="has errors"' in content
    # The worker filter shows only when a worker is chosen (linked from the worker list).
    assert b'data-filter-title="worker"' not in content
    assert b"?worker=" not in content
    chosen = admin_client.get(CHANGELIST, {"worker": WORKER}).content
    assert b'data-filter-title="worker"' in chosen
    block = chosen.split(b'data-filter-title="worker"')[1].split(b"</details>")[0]
    selected = re.search(rb'<li class="selected">\s*<a href="[^"]*">([^<]*)</a>', block)
    assert selected is not None
    assert selected.group(1).decode() == WORKER


@pytest.mark.parametrize("prefix", ["", "#", " #", " 0"])
def test_search_by_job_id(admin_client: Client, states: dict[str, int], prefix: str) -> None:
    job_id = states["dead"]
    response = admin_client.get(CHANGELIST, {"q": f"{prefix}{job_id}"})
    assert shown_ids(response) == {job_id}


def test_search_by_dedup_key_is_exact(admin_client: Client, states: dict[str, int]) -> None:
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "dedup-key-1"})) == {states["pending"]}
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "dedup-key"})) == set()


def test_search_by_part_of_the_task_path(admin_client: Client, states: dict[str, int]) -> None:
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "tasks.conf"})) == {states["failed"]}
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "CONFIGURED"})) == {states["failed"]}
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "tests.tasks"})) == set(states.values())
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "no.such.task"})) == set()


def test_search_for_an_unknown_id_finds_nothing(
    admin_client: Client, states: dict[str, int]
) -> None:
    assert shown_ids(admin_client.get(CHANGELIST, {"q": str(max(states.values()) + 1000)})) == set()


def test_search_for_an_id_past_bigint_finds_nothing(
    admin_client: Client, states: dict[str, int]
) -> None:
    assert shown_ids(admin_client.get(CHANGELIST, {"q": "9" * 30})) == set()


def test_search_for_a_superscript_digit_does_not_crash(
    admin_client: Client, states: dict[str, int]
) -> None:
    response = admin_client.get(CHANGELIST, {"q": "²"})
    assert shown_ids(response) == set()


# --------------------------------------------------------------------------- dashboard


def test_dashboards_render_with_jobs_in_every_state(
    admin_client: Client, states: dict[str, int]
) -> None:
    for url in DASHBOARDS:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        content = response.content
        assert card(content, "ready") == "1", url
        assert card(content, "scheduled") == "1", url
        assert card(content, "running") == "3", url
        assert card(content, "expired") == "1", url
        assert card(content, "dead") == "1", url
        for name in ("running", "expired", "cancel_requested"):
            assert change_url(states[name]).encode() in content, url
        assert b"a quarter" in content


def test_dashboard_full_page_and_fragment(admin_client: Client, states: dict[str, int]) -> None:
    for url in (DASHBOARD, QUEUE_DASHBOARD):
        page = admin_client.get(url).content
        assert b"<html" in page
        assert b'id="leasejobs-dashboard"' in page
        assert b'data-refresh-url="?range=hour&amp;fragment=1"' in page
        assert b"django_leasejobs/dashboard.js" in page
        assert b"django_leasejobs/admin.css" in page

        fragment = admin_client.get(url, {"fragment": "1"}).content
        assert b"<html" not in fragment
        assert b'id="leasejobs-dashboard"' not in fragment
        assert b'id="lj-ready"' in fragment
        assert b'id="lj-queues"' in fragment


def test_dashboard_numbers(admin_client: Client) -> None:
    # default: 2 succeeded, 1 failed, 1 dead, 1 running, 1 expired, 1 scheduled, 2 ready.
    # high: 1 running, 1 ready. low: 1 cancelled (finished, neither success nor failure).
    succeeded_job()
    succeeded_job()
    failed_job(attempts=1)
    dead_job()
    low_cancelled = enqueue(add, queue_name="low")
    assert leases.cancel(low_cancelled) == leases.CancelResult.CANCELLED
    running = running_job()
    running_job(WORKER2, queue_name="high")
    expired = expired_job()
    scheduled_job()
    enqueue(add, run_after=timezone.now() - timedelta(minutes=10))  # the oldest ready job
    enqueue()
    enqueue(add, queue_name="high")
    make_worker("fresh:1:aaaaaa")
    make_worker("stale:2:bbbbbb", seen_ago=600)
    make_worker("stopped:3:cccccc", state=WorkerState.STOPPED)

    content = admin_client.get(DASHBOARD).content

    assert card(content, "ready") == "3"
    assert card(content, "running") == "3"
    assert card(content, "scheduled") == "1"
    assert card(content, "expired") == "1"
    assert card(content, "dead") == "1"
    assert card(content, "workers") == "1"
    assert card(content, "oldest") == "10m"
    assert card(content, "failure-rate") == "50.0%"  # failed + dead vs succeeded, last hour
    # queue: ready, scheduled, running, past lease, dead, ok, failed, rate, oldest
    # ready, scheduled, waiting steps, running, past lease, dead, succeeded, failed, ...
    assert queue_row(content, "default") == [
        "2", "1", "0", "2", "1", "1", "2", "2", "50.0%", "10m",
    ]  # fmt: skip
    assert queue_row(content, "high")[:9] == ["1", "0", "0", "1", "0", "0", "0", "0", "-"]
    assert queue_row(content, "low") == ["0", "0", "0", "0", "0", "0", "0", "0", "-", "-"]
    assert b'leasejobs-card leasejobs-alert"><span class="leasejobs-card-value" id="lj-dead"' in (
        content
    )
    assert b"?status__exact=dead" in content
    assert f"{CHANGELIST}?queue=high".encode() in content

    # The trend chart reads the rollup table, which these jobs (written without a
    # worker) left empty: no bars (tests/observability/test_rollups.py has them).
    assert b'<rect class="lj-ok"' not in content

    # Running jobs: the expired one is marked, the live one is not.
    rows = re.findall(rb"<tr( class=\"leasejobs-expired\")?><td><a href=\"([^\"]+)\">", content)
    marked = {href.decode(): bool(cls) for cls, href in rows}
    assert marked[change_url(expired)] is True
    assert marked[change_url(running)] is False

    # Workers: one online, two gone (stale heartbeat; stopped).
    assert content.count(b'leasejobs-status-succeeded">online<') == 1
    assert content.count(b'leasejobs-status-dead">gone<') == 2


def test_dashboard_when_nothing_happened(admin_client: Client) -> None:
    content = admin_client.get(DASHBOARD).content
    assert b"No jobs yet." in content
    assert b"Nothing is running." in content
    assert b"No worker has reported in the last hour." in content
    assert b'<rect class="lj-ok"' not in content
    assert b"<polyline" not in content
    for name in ("ready", "running", "scheduled", "expired", "dead", "workers"):
        assert card(content, name) == "0"
    assert card(content, "oldest") == "-"
    assert card(content, "failure-rate") == "-"


def test_dashboard_chart_has_bars_for_the_rollup_of_the_last_hour(admin_client: Client) -> None:
    now = leases.minute_of(leases.database_now())
    key = leases.RollupKey("default", now, "default", add.module_path)
    tally = leases.Tally()
    tally.count(key, "succeeded")
    leases.add_tally(tally, using="default")
    content = admin_client.get(DASHBOARD, {"fragment": "1"}).content
    assert content.count(b'<rect class="lj-ok"') == 1
    assert b'<rect class="lj-fail"' not in content
    # 60 minute slots, each with a <title>, in the outcome chart and the time chart.
    assert content.count(b'<g class="lj-step"><title>') == 2 * 60

    tally = leases.Tally()
    tally.count(key, "failed")
    leases.add_tally(tally, using="default")
    content = admin_client.get(DASHBOARD, {"fragment": "1"}).content
    assert b'<rect class="lj-fail"' in content


def test_queue_dashboard_is_listed_on_the_admin_index(admin_client: Client) -> None:
    content = admin_client.get(reverse("admin:index")).content
    assert QUEUE_DASHBOARD.encode() in content
    assert b"Queue dashboard" in content


# --------------------------------------------------------------------------- read only


def test_jobs_cannot_be_added_changed_or_deleted_by_hand(
    admin_client: Client, states: dict[str, int]
) -> None:
    job_id = states["failed"]
    before = Job.objects.values().get(pk=job_id)

    assert admin_client.get(reverse("admin:django_leasejobs_job_add")).status_code == 403
    assert admin_client.post(reverse("admin:django_leasejobs_job_add"), {}).status_code == 403
    changed = admin_client.post(
        change_url(job_id), {"status": "succeeded", "queue": "high", "priority": "5"}
    )
    assert changed.status_code == 403
    delete_url = reverse("admin:django_leasejobs_job_delete", args=[job_id])
    assert admin_client.get(delete_url).status_code == 403
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403

    assert Job.objects.values().get(pk=job_id) == before
    assert JobAttempt.objects.filter(job_id=job_id).count() == 2


def test_no_delete_selected_action(admin_client: Client, states: dict[str, int]) -> None:
    response = admin_client.get(CHANGELIST)
    assert action_names(response) == list(ACTION_PERMISSIONS)
    assert b"delete_selected" not in response.content

    done = post_action(admin_client, "delete_selected", [states["succeeded"]], post="yes")
    assert done.status_code == 302
    assert messages_of(done) == ["No action selected."]
    assert Job.objects.filter(pk=states["succeeded"]).exists()
    assert not LogEntry.objects.exists()


# --------------------------------------------------------------------------- actions


def test_retry_now_retries_failed_and_dead_and_skips_the_rest(
    admin_client: Client, states: dict[str, int]
) -> None:
    chosen = [states["failed"], states["dead"], states["succeeded"], states["running"]]

    response = post_action(admin_client, "retry_now", chosen)

    assert response.status_code == 302
    assert messages_of(response) == ["Retried 2 jobs. Skipped 2: 2 not failed or dead."]
    assert status_of(states["failed"]) == JobStatus.PENDING
    assert status_of(states["dead"]) == JobStatus.PENDING
    assert status_of(states["succeeded"]) == JobStatus.SUCCEEDED
    assert status_of(states["running"]) == JobStatus.RUNNING
    dead = Job.objects.get(pk=states["dead"])
    assert (dead.stall_count, dead.finished_at, dead.attempt) == (0, None, 1)
    assert dead.max_attempts >= 2  # room for at least one more attempt
    entries = log_entries(chosen, CHANGE)
    assert sorted(int(e.object_id) for e in entries) == sorted(chosen[:2])
    messages = {int(e.object_id): e.change_message for e in entries}
    assert messages == {
        states["failed"]: "Retried (was failed)",
        states["dead"]: "Retried (was dead)",
    }
    assert {e.user.username for e in entries} == {"admin"}
    # The retried jobs run again: a worker can claim them.
    claimed = leases.claim(WORKER, limit=10, lease_duration=LEASE)
    assert {states["failed"], states["dead"]} <= {c.id for c in claimed}


def test_retry_now_on_a_succeeded_job_only_reports_the_skip(
    admin_client: Client, states: dict[str, int]
) -> None:
    response = post_action(admin_client, "retry_now", [states["succeeded"]])
    assert messages_of(response) == ["Retried 0 jobs. Skipped 1: 1 not failed or dead."]
    assert status_of(states["succeeded"]) == JobStatus.SUCCEEDED
    assert not LogEntry.objects.exists()


def test_retry_skips_a_job_whose_dedup_key_another_active_job_holds(
    admin_client: Client,
) -> None:
    old = enqueue(add, key="report-7")
    c = claim(old)
    leases.fail(c.id, c.attempt, WORKER, error=error(), retry_delay=None)
    newer = enqueue(add, key="report-7")  # the key is free again: a new active job takes it
    assert newer != old

    response = post_action(admin_client, "retry_now", [old])

    assert messages_of(response) == [
        "Retried 0 jobs. Skipped 1: 1 because another active job holds their dedup key."
    ]
    assert status_of(old) == JobStatus.FAILED
    assert status_of(newer) == JobStatus.PENDING
    assert not LogEntry.objects.exists()


def test_requeue_dead_requeues_dead_letters_only(
    admin_client: Client, states: dict[str, int]
) -> None:
    chosen = [states["dead"], states["failed"], states["pending"]]

    response = post_action(admin_client, "requeue_dead", chosen)

    assert messages_of(response) == ["Requeued 1 job. Skipped 2: 2 not dead."]
    assert status_of(states["dead"]) == JobStatus.PENDING
    assert status_of(states["failed"]) == JobStatus.FAILED
    assert status_of(states["pending"]) == JobStatus.PENDING
    entries = log_entries(chosen, CHANGE)
    assert [(int(e.object_id), e.change_message) for e in entries] == [
        (states["dead"], "Requeued (was dead)")
    ]


def test_cancel_jobs_cancels_pending_flags_running_and_skips_finished(
    admin_client: Client, states: dict[str, int]
) -> None:
    chosen = [
        states["pending"],
        states["scheduled"],
        states["running"],
        states["cancel_requested"],
        states["succeeded"],
        states["cancelled"],
    ]

    response = post_action(admin_client, "cancel_jobs", chosen)

    assert messages_of(response) == [
        "Cancelled 3 jobs. Skipped 3: 3 already finished or already being cancelled."
    ]
    assert status_of(states["pending"]) == JobStatus.CANCELLED
    assert status_of(states["scheduled"]) == JobStatus.CANCELLED
    running = Job.objects.get(pk=states["running"])
    assert running.status == JobStatus.RUNNING
    assert running.cancel_requested is True
    assert running.locked_by == WORKER  # the lease stays: its worker stops the job
    assert status_of(states["succeeded"]) == JobStatus.SUCCEEDED
    entries = {int(e.object_id): e.change_message for e in log_entries(chosen, CHANGE)}
    assert entries == {
        states["pending"]: "Cancelled (was pending)",
        states["scheduled"]: "Cancelled (was pending)",
        states["running"]: "Cancel requested (running; its worker stops it)",
    }
    # The worker learns of the cancel at its next renewal.
    renewed = leases.renew(WORKER, [(running.pk, running.attempt)], lease_duration=LEASE)
    assert renewed.cancel_requested == {(running.pk, running.attempt)}


def test_cancel_on_a_finished_job_is_skipped(admin_client: Client, states: dict[str, int]) -> None:
    chosen = [states["failed"], states["dead"]]
    response = post_action(admin_client, "cancel_jobs", chosen)
    assert messages_of(response) == [
        "Cancelled 0 jobs. Skipped 2: 2 already finished or already being cancelled."
    ]
    assert status_of(states["failed"]) == JobStatus.FAILED
    assert status_of(states["dead"]) == JobStatus.DEAD
    assert not LogEntry.objects.exists()


def test_delete_finished_asks_first_and_deletes_nothing(
    admin_client: Client, states: dict[str, int]
) -> None:
    finished = [states[s] for s in ("succeeded", "failed", "dead", "cancelled")]
    active = [states[s] for s in ("pending", "running")]

    response = post_action(admin_client, "delete_finished", finished + active)

    assert response.status_code == 200
    assert response.templates[0].name == (
        "admin/django_leasejobs/job/delete_finished_confirmation.html"
    )
    content = response.content.decode()
    assert "delete 4 finished jobs, with their attempts?" in content
    assert "2 selected jobs are not finished (pending or running) and stay." in content
    listed = re.findall(r'<li><a href="([^"]+)">', content)
    assert listed == [change_url(i) for i in sorted(finished, reverse=True)]
    form = page_form(response)  # the finished jobs it counted, not the whole selection
    assert form["_selected_action"] == [str(i) for i in sorted(finished)]
    assert form["select_across"] == ["0"]
    assert form["post"] == ["yes"]
    assert "leasejobs_upto" not in form
    assert 'name="csrfmiddlewaretoken"' in content
    assert Job.objects.filter(pk__in=finished + active).count() == 6
    assert not LogEntry.objects.exists()
    assert messages_of(response) == []


def test_delete_finished_confirmed_deletes_finished_jobs_and_skips_active_ones(
    admin_client: Client, states: dict[str, int]
) -> None:
    finished = [states[s] for s in ("succeeded", "failed", "dead", "cancelled")]
    active = [states[s] for s in ("pending", "running")]
    reprs = {job.pk: str(job) for job in Job.objects.filter(pk__in=finished)}

    response = confirm_delete(admin_client, finished + active)

    assert response.status_code == 302
    assert messages_of(response) == [
        "Deleted 4 jobs. Skipped 2: 2 not finished (pending or running)."
    ]
    assert not Job.objects.filter(pk__in=finished).exists()
    assert not JobAttempt.objects.filter(job_id__in=finished).exists()
    assert Job.objects.filter(pk__in=active).count() == 2
    entries = log_entries(finished + active, DELETION)
    assert {int(e.object_id): e.object_repr for e in entries} == reprs


def test_delete_finished_keeps_a_job_retried_after_the_confirmation_page(
    admin_client: Client, states: dict[str, int]
) -> None:
    chosen = [states["failed"], states["succeeded"]]
    assert post_action(admin_client, "delete_finished", chosen).status_code == 200
    assert leases.retry(states["failed"]) == leases.RetryResult.RETRIED  # meanwhile

    response = confirm_delete(admin_client, chosen)

    assert messages_of(response) == [
        "Deleted 1 job. Skipped 1: 1 not finished (pending or running)."
    ]
    assert status_of(states["failed"]) == JobStatus.PENDING
    assert not Job.objects.filter(pk=states["succeeded"]).exists()


def test_delete_finished_uses_the_pruning_rule(states: dict[str, int]) -> None:
    """One rule for both: what the action deletes is what pruning calls finished."""
    from django_leasejobs import pruning

    deletable = set(Job.objects.filter(pruning.finished()).values_list("pk", flat=True))
    assert deletable == {states[s] for s in ("succeeded", "failed", "dead", "cancelled")}
    with pytest.raises(ValueError, match="not finished"):
        pruning.finished((JobStatus.SUCCEEDED, JobStatus.RUNNING))


def test_delete_finished_on_a_running_job_is_skipped_without_asking(
    admin_client: Client, states: dict[str, int]
) -> None:
    response = post_action(admin_client, "delete_finished", [states["expired"]])
    assert response.status_code == 302
    assert messages_of(response) == [
        "Deleted 0 jobs. Skipped 1: 1 not finished (pending or running)."
    ]
    assert status_of(states["expired"]) == JobStatus.RUNNING
    assert not LogEntry.objects.exists()


def test_delete_finished_across_all_selects_only_finished(
    admin_client: Client, states: dict[str, int]
) -> None:
    finished = [states[s] for s in ("succeeded", "failed", "dead", "cancelled")]
    asked = post_action(admin_client, "delete_finished", [states["pending"]], select_across="1")
    assert asked.status_code == 200
    assert b"delete 4 finished jobs" in asked.content
    assert b"6 selected jobs are not finished" in asked.content
    form = page_form(asked)  # few enough: their ids, not "select all" again
    assert form["_selected_action"] == [str(i) for i in sorted(finished)]
    assert form["select_across"] == ["0"]
    assert Job.objects.count() == len(states)

    response = confirm_on_page(admin_client, asked)

    assert messages_of(response) == ["Deleted 4 jobs."]
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert remaining == {
        states[s]
        for s in ("running", "expired", "cancel_requested", "scheduled", "pending", "waiting")
    }


def test_delete_finished_keeps_a_selected_job_that_finished_after_the_confirmation_page(
    admin_client: Client,
) -> None:
    """The page said the pending job stays: it stays, though it finished meanwhile."""
    done = succeeded_job()
    pending = enqueue()
    asked = post_action(admin_client, "delete_finished", [done, pending])
    assert b"1 selected job is not finished (pending or running) and stays." in asked.content
    finish(pending)  # meanwhile, a worker runs it

    response = confirm_on_page(admin_client, asked)

    assert messages_of(response) == ["Deleted 1 job."]
    assert not Job.objects.filter(pk=done).exists()
    assert status_of(pending) == JobStatus.SUCCEEDED
    assert [int(e.object_id) for e in LogEntry.objects.filter(action_flag=DELETION)] == [done]


@pytest.mark.parametrize("many", [False, True], ids=["ids", "bound"])
def test_delete_finished_across_all_keeps_jobs_that_finished_after_the_confirmation_page(
    admin_client: Client, settings: Any, many: bool
) -> None:
    """*Select all* deletes what its page counted, not what matches when it is confirmed.

    With more finished jobs than the form may post ids of (here a
    ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` of 13 leaves room for 3), the page posts back the
    highest id it counted and the database's time it read, instead.
    """
    if many:
        settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 13
    counted = [succeeded_job() for _ in range(4)]
    pending = enqueue()
    database_clock_past(counted)
    asked = post_action(admin_client, "delete_finished", [pending], select_across="1")
    assert b"delete 4 finished jobs" in asked.content
    finish(pending)  # meanwhile, a worker runs the pending job
    later = succeeded_job()  # and a new one

    response = confirm_on_page(admin_client, asked)

    assert messages_of(response) == ["Deleted 4 jobs."]
    assert set(Job.objects.values_list("pk", flat=True)) == {pending, later}
    deleted = LogEntry.objects.filter(action_flag=DELETION)
    assert sorted(int(e.object_id) for e in deleted) == counted
    form = page_form(asked)
    if many:
        assert form["_selected_action"] == [str(max(counted))]  # Django needs one
        assert form["select_across"] == ["1"]
        assert form["leasejobs_upto"] == [str(max(counted))]
    else:
        assert form["_selected_action"] == [str(i) for i in counted]
        assert form["select_across"] == ["0"]


def test_delete_finished_across_all_keeps_a_job_retried_and_finished_again(
    admin_client: Client, settings: Any
) -> None:
    """Bound by the page's time: a job finished again since the page was shown stays."""
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 11  # room for one id: the bound it is
    failed, done = failed_job(attempts=1), succeeded_job()
    database_clock_past([failed, done])
    asked = post_action(admin_client, "delete_finished", [done], select_across="1")
    assert leases.retry(failed) == leases.RetryResult.RETRIED
    finish(failed)

    response = confirm_on_page(admin_client, asked)

    assert messages_of(response) == ["Deleted 1 job."]
    assert status_of(failed) == JobStatus.SUCCEEDED
    assert not Job.objects.filter(pk=done).exists()
    assert page_form(asked)["select_across"] == ["1"]


@pytest.mark.parametrize(
    "changed",
    [
        {"leasejobs_upto": []},
        {"leasejobs_at": []},
        {"leasejobs_upto": ["x"]},
        {"leasejobs_at": ["yesterday"]},
        {"leasejobs_at": ["2026-01-01T00:00:00"]},  # no time zone
    ],
)
def test_delete_finished_across_all_without_the_pages_bound_deletes_nothing(
    admin_client: Client, settings: Any, changed: dict[str, list[str]]
) -> None:
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 11
    jobs = [succeeded_job(), succeeded_job()]
    asked = post_action(admin_client, "delete_finished", jobs[:1], select_across="1")
    assert page_form(asked)["select_across"] == ["1"]
    form = {k: v for k, v in {**page_form(asked), **changed}.items() if v}

    response = admin_client.post(CHANGELIST, form)

    assert response.status_code == 302
    assert messages_of(response) == [
        "Nothing was deleted: the confirmation did not say which jobs it showed. "
        "Choose the action again."
    ]
    assert Job.objects.filter(pk__in=jobs).count() == 2
    assert not LogEntry.objects.exists()


def test_delete_finished_confirmation_keeps_the_filters(
    admin_client: Client, states: dict[str, int]
) -> None:
    """The page's form posts back to the same address: a filtered "select all" stays filtered."""
    url = f"{CHANGELIST}?queue=low"
    data = {"action": "delete_finished", "_selected_action": [str(states["dead"])]}
    asked = admin_client.post(url, {**data, "index": "0", "select_across": "1"})
    assert b"delete 1 finished job, with its attempts?" in asked.content
    assert b'<form method="post">' in asked.content  # no action attribute: same address

    confirm_on_page(admin_client, asked, url)

    assert not Job.objects.filter(pk=states["dead"]).exists()
    assert Job.objects.filter(pk=states["succeeded"]).exists()


def test_delete_finished_confirmation_needs_the_csrf_token(admin_user: User) -> None:
    job_id = succeeded_job()
    client = client_for(admin_user, enforce_csrf_checks=True)
    assert client.get(CHANGELIST).status_code == 200  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    asked = post_action(client, "delete_finished", [job_id], csrfmiddlewaretoken=token)
    assert asked.status_code == 200

    assert confirm_delete(client, [job_id]).status_code == 403
    assert Job.objects.filter(pk=job_id).exists()

    assert confirm_delete(client, [job_id], csrfmiddlewaretoken=token).status_code == 302
    assert not Job.objects.filter(pk=job_id).exists()


def test_delete_finished_confirmation_without_the_permission_is_refused(
    states: dict[str, int],
) -> None:
    others = [p for p in ACTION_PERMISSIONS.values() if p != "purge_job"]
    client = client_for(staff_user("view_job", *others))

    response = confirm_delete(client, [states["succeeded"]])

    assert response.status_code == 302
    assert messages_of(response) == ["No action selected."]
    assert Job.objects.filter(pk=states["succeeded"]).exists()
    assert not LogEntry.objects.exists()


def action_target() -> dict[str, int]:
    """For each action, a job it would change."""
    return {
        "retry_now": failed_job(attempts=1),
        "requeue_dead": dead_job(),
        "delete_finished": succeeded_job(),
        "cancel_jobs": enqueue(),
    }


@pytest.mark.parametrize(
    ("action", "perm"),
    [pytest.param(action, perm) for action, perm in ACTION_PERMISSIONS.items()],
)
def test_action_works_with_only_its_permission(action: str, perm: str) -> None:
    targets = action_target()
    job_id = targets[action]
    before = status_of(job_id)
    client = client_for(staff_user("view_job", perm))

    assert action_names(client.get(CHANGELIST)) == [action]
    response = run_action(client, action, [job_id])

    assert response.status_code == 302
    [message] = messages_of(response)
    assert re.fullmatch(r"\w+ 1 job\.", message), message
    if action == "delete_finished":
        assert not Job.objects.filter(pk=job_id).exists()
        [entry] = log_entries([job_id], DELETION)
    else:
        assert status_of(job_id) != before
        [entry] = log_entries([job_id], CHANGE)
    assert entry.user.username == "staff"
    # The other targets are untouched.
    for other, other_id in targets.items():
        if other != action:
            assert Job.objects.filter(pk=other_id).exists()


@pytest.mark.parametrize(("action", "perm"), list(ACTION_PERMISSIONS.items()))
def test_action_without_its_permission_is_not_offered_and_does_not_run(
    action: str, perm: str
) -> None:
    targets = action_target()
    job_id = targets[action]
    before = Job.objects.values().get(pk=job_id)
    others = [p for p in ACTION_PERMISSIONS.values() if p != perm]
    client = client_for(staff_user("view_job", *others))

    offered = action_names(client.get(CHANGELIST))
    assert action not in offered
    assert len(offered) == 3
    response = run_action(client, action, [job_id])  # and the confirmation's POST

    assert response.status_code in (200, 302, 403)
    if response.status_code == 302:
        assert messages_of(response) == ["No action selected."]
    assert Job.objects.values().get(pk=job_id) == before
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("action", list(ACTION_PERMISSIONS))
def test_view_only_staff_gets_no_actions(action: str) -> None:
    targets = action_target()
    job_id = targets[action]
    before = Job.objects.values().get(pk=job_id)
    client = client_for(staff_user("view_job"))

    page = client.get(CHANGELIST)
    assert shown_ids(page) == set(targets.values())
    assert action_names(page) == []
    response = run_action(client, action, [job_id])

    assert response.status_code in (200, 302, 403)
    assert Job.objects.values().get(pk=job_id) == before
    assert not LogEntry.objects.exists()


def test_superuser_is_offered_every_action(admin_client: Client) -> None:
    assert action_names(admin_client.get(CHANGELIST)) == list(ACTION_PERMISSIONS)


def test_action_post_without_csrf_token_is_rejected(admin_user: User) -> None:
    job_id = enqueue()
    client = client_for(admin_user, enforce_csrf_checks=True)
    assert client.get(CHANGELIST).status_code == 200  # sets the CSRF cookie

    rejected = post_action(client, "cancel_jobs", [job_id])

    assert rejected.status_code == 403
    assert status_of(job_id) == JobStatus.PENDING
    assert not LogEntry.objects.exists()

    # The same POST with the token goes through.
    token = client.cookies["csrftoken"].value
    accepted = post_action(client, "cancel_jobs", [job_id], csrfmiddlewaretoken=token)
    assert accepted.status_code == 302
    assert status_of(job_id) == JobStatus.CANCELLED
    assert len(log_entries([job_id], CHANGE)) == 1


def test_leases_retry_puts_a_failed_job_back_to_pending() -> None:
    """The lease call behind retry_now and requeue_dead, on its own."""
    job_id = failed_job(attempts=2, max_attempts=2)  # its attempts are used up
    assert leases.retry(job_id) == leases.RetryResult.RETRIED
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.PENDING
    assert (job.attempt, job.max_attempts, job.finished_at) == (2, 3, None)


# --------------------------------------------------------------------------- workers


@pytest.fixture
def fleet() -> dict[str, Any]:
    online = make_worker(WORKER, queues=["default", "high"])
    gone = make_worker(WORKER2, seen_ago=600, host="host-b", pid=2002)
    stopped = make_worker("host-c:3003:cccccc", host="host-c", state=WorkerState.STOPPED)
    held = [running_job(WORKER), running_job(WORKER)]
    expire(held[1])  # past its lease but not reaped: still held
    other = running_job("host-z:9:zzzzzz")
    return {"online": online, "gone": gone, "stopped": stopped, "held": held, "other": other}


def worker_row(content: bytes, worker_id: str) -> bytes:
    rows = [row for row in content.split(b"<tr") if quote(worker_id).encode() in row]
    assert len(rows) == 1, f"{len(rows)} rows for {worker_id}"
    return rows[0]


def test_worker_changelist(admin_client: Client, fleet: dict[str, Any]) -> None:
    response = admin_client.get(WORKERS)
    assert shown_ids(response) == {WORKER, WORKER2, "host-c:3003:cccccc"}
    content = response.content

    online = worker_row(content, WORKER)
    assert b'alt="True"' in online
    assert b"default, high" in online
    link = (
        f'<a href="{CHANGELIST}?worker={WORKER.replace(":", "%3A")}'
        f'&amp;status__exact=running">2</a>'
    ).encode()
    assert link in online

    gone = worker_row(content, WORKER2)
    assert b'alt="False"' in gone
    assert b'<td class="field-jobs_held">0</td>' in gone

    stopped = worker_row(content, "host-c:3003:cccccc")
    assert b'alt="False"' in stopped  # stopped: gone even though seen just now


def test_jobs_held_link_lists_the_workers_running_jobs(
    admin_client: Client, fleet: dict[str, Any]
) -> None:
    response = admin_client.get(CHANGELIST, {"worker": WORKER, "status__exact": "running"})
    assert shown_ids(response) == set(fleet["held"])


def test_worker_change_view(admin_client: Client, fleet: dict[str, Any]) -> None:
    response = admin_client.get(worker_url(WORKER))
    assert response.status_code == 200
    content = response.content
    for job_id in fleet["held"]:
        assert f'<a href="{change_url(job_id)}">#{job_id} tests.tasks.add</a>'.encode() in content
    assert change_url(fleet["other"]).encode() not in content
    assert b'alt="True"' in content
    assert b'name="_save"' not in content

    gone = admin_client.get(worker_url(WORKER2))
    assert gone.status_code == 200
    assert b'alt="False"' in gone.content
    assert b"/admin/django_leasejobs/job/" not in gone.content.split(b'id="content-main"')[-1]


def test_worker_problems_show_in_the_list_the_page_and_a_filter(
    admin_client: Client, fleet: dict[str, Any]
) -> None:
    long = "gave up recording 2 attempt(s) since it started; last: job 7 attempt 1: " + "x" * 80
    Worker.objects.filter(pk=WORKER).update(problem=long)

    response = admin_client.get(WORKERS)
    troubled = worker_row(response.content, WORKER)
    assert b'class="leasejobs-problem"' in troubled
    assert f'title="{long}"'.encode() in troubled  # the whole report as the tooltip
    assert f"\u26a0 {long[:59]}\u2026".encode() in troubled
    assert b'<td class="field-problem_short">-</td>' in worker_row(response.content, WORKER2)

    assert shown_ids(admin_client.get(WORKERS, {"problem": "yes"})) == {WORKER}
    assert WORKER not in shown_ids(admin_client.get(WORKERS, {"problem": "no"}))
    assert long.encode() in admin_client.get(worker_url(WORKER)).content


def test_workers_cannot_be_added_or_changed(admin_client: Client, fleet: dict[str, Any]) -> None:
    assert admin_client.get(reverse("admin:django_leasejobs_worker_add")).status_code == 403
    response = admin_client.post(worker_url(WORKER), {"host": "elsewhere", "pid": "1"})
    assert response.status_code == 403
    assert Worker.objects.get(pk=WORKER).host == "host-a"


# --------------------------------------------------------------------------- malformed filters

# Raw query strings (as a browser or a bot sends them) on the job and worker lists.
NUL_QUERIES = [
    (CHANGELIST, "queue=a%00b", "queue"),
    (CHANGELIST, "task=%00", "task"),
    (CHANGELIST, "worker=w%00", "worker"),
    (CHANGELIST, "status__exact=%00", "status__exact"),
    (CHANGELIST, "has_errors=yes%00", "has_errors"),
    (CHANGELIST, "locked_by=%00", "locked_by"),
    (CHANGELIST, "q=%00", "q"),
    (CHANGELIST, "o=1%00", "o"),
    (CHANGELIST, "queue=default&key%00=1", "key\\x00"),
    (WORKERS, "host=%00", "host"),
    (WORKERS, "state__exact=running%00", "state__exact"),
    (WORKERS, "q=host%00", "q"),
]


@pytest.mark.parametrize(("url", "query", "name"), NUL_QUERIES)
def test_nul_in_a_filter_parameter_is_a_bad_request(
    admin_client: Client, request: pytest.FixtureRequest, url: str, query: str, name: str
) -> None:
    jobs = rows_for(request, url)
    response = admin_client.get(f"{url}?{query}")
    assert response.status_code == 400
    content = response.content.decode()
    assert "NUL character" in content
    assert f"The parameter &#x27;{name}&#x27;" in content
    assert f'href="{url}"' in content  # back to the list without filters
    assert Job.objects.count() == jobs  # the test's transaction is still usable


# Filters the database (or the driver) rejects only when the query runs.
REJECTED_QUERIES = [
    (CHANGELIST, "locked_by__regex=("),
    (CHANGELIST, "task_path__iregex=["),
    (CHANGELIST, "key__regex=(&status__exact=pending"),
    (CHANGELIST, "_facets=1&task_path__regex=("),
    (CHANGELIST, "id__range=1"),
    (WORKERS, "id__regex=("),
    (WORKERS, "host__iregex=[&state__exact=running"),
]


def rows_for(request: pytest.FixtureRequest, url: str) -> int:
    """Fill the list at ``url`` (jobs in every state, or a fleet of workers); count jobs."""
    request.getfixturevalue("states" if url == CHANGELIST else "fleet")
    return Job.objects.count()


@pytest.mark.parametrize(("url", "query"), REJECTED_QUERIES)
def test_a_filter_the_database_rejects_is_a_bad_request(
    admin_client: Client, request: pytest.FixtureRequest, url: str, query: str
) -> None:
    jobs = rows_for(request, url)
    response = admin_client.get(f"{url}?{query}")
    assert response.status_code == 400
    assert b"Bad filter" in response.content
    assert f'href="{url}"'.encode() in response.content
    # The failed query ran in a savepoint: the test's transaction goes on.
    assert Job.objects.count() == jobs


def test_the_400_names_the_database_error(admin_client: Client, states: dict[str, int]) -> None:
    response = admin_client.get(f"{CHANGELIST}?task_path__regex=(")
    assert response.status_code == 400
    assert b"The database rejected this filter" in response.content


# Malformed filters whose answer depends on the database or on Django, never 500.
NEVER_500_QUERIES = [
    (CHANGELIST, "attempt=abc"),
    (CHANGELIST, "attempt__gt=99999999999999999999999"),
    (CHANGELIST, "priority__in=1,99999999999999999999"),
    (CHANGELIST, "id=99999999999999999999999"),
    (CHANGELIST, "id__in=1,abc"),
    (CHANGELIST, "enqueued_at__gte=garbage"),
    (CHANGELIST, "kwargs__contains=x"),
    (CHANGELIST, "args__0__gt=x"),
    (CHANGELIST, "p=99999999999999999999999"),
    (CHANGELIST, "p=abc"),
    (CHANGELIST, "o=abc.-9"),
    (CHANGELIST, "queue=%ED%A0%80"),
    (CHANGELIST, "nonsense__field=1"),
    (CHANGELIST, "locked_by__regex=(&e=1"),
    (WORKERS, "pid=abc"),
    (WORKERS, "pid__gt=9999999999999999999999"),
    (WORKERS, "last_seen_at__gte=x"),
    (WORKERS, "queues__contains=x"),
]


@pytest.mark.parametrize(("url", "query"), NEVER_500_QUERIES)
def test_malformed_filters_never_answer_500(
    admin_client: Client, request: pytest.FixtureRequest, url: str, query: str
) -> None:
    jobs = rows_for(request, url)
    response = admin_client.get(f"{url}?{query}")
    assert response.status_code in {200, 302, 400}, response.status_code
    if response.status_code == 302:  # Django's own answer to a lookup it refuses
        assert response["Location"] == f"{url}?e=1"
    assert Job.objects.count() == jobs


@pytest.mark.django_db(transaction=True)
def test_bad_filter_in_autocommit_leaves_the_connection_usable(admin_client: Client) -> None:
    running_job()
    assert admin_client.get(f"{CHANGELIST}?locked_by__regex=(").status_code == 400
    assert admin_client.get(f"{CHANGELIST}?locked_by={WORKER}").status_code == 200


def test_bad_filter_with_atomic_requests_leaves_the_transaction_usable(
    admin_client: Client, states: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    assert admin_client.get(f"{CHANGELIST}?locked_by__regex=(").status_code == 400
    assert admin_client.get(f"{CHANGELIST}?queue=a%00b").status_code == 400
    response = admin_client.get(CHANGELIST, {"worker": WORKER})
    assert shown_ids(response) == {states["running"], states["expired"]}


def test_a_bad_filter_on_an_action_post_is_a_bad_request(
    admin_client: Client, states: dict[str, int]
) -> None:
    data = {"action": "cancel_jobs", "_selected_action": [str(states["pending"])], "index": "0"}
    response = admin_client.post(f"{CHANGELIST}?locked_by__regex=(", data)
    assert response.status_code == 400
    assert status_of(states["pending"]) == JobStatus.PENDING


def test_nul_in_a_selected_worker_id_is_a_bad_request(
    admin_client: Client, fleet: dict[str, Any]
) -> None:
    data = {"action": "delete_selected", "_selected_action": ["a\x00b"], "index": "0"}
    response = admin_client.post(WORKERS, data)
    assert response.status_code == 400
    assert Worker.objects.count() == 3


def test_nul_in_a_worker_id_in_the_url_is_not_found(
    admin_client: Client, fleet: dict[str, Any]
) -> None:
    for suffix in ("change/", "history/", "delete/"):
        response = admin_client.get(f"{WORKERS}a%00b/{suffix}")
        assert response.status_code == 302, suffix
        assert response["Location"] == reverse("admin:index")


@pytest.mark.parametrize("url", [DASHBOARD, QUEUE_DASHBOARD])
def test_nul_in_a_dashboard_parameter_is_harmless(admin_client: Client, url: str) -> None:
    assert admin_client.get(f"{url}?fragment=%00").status_code == 200


def test_good_filters_still_work_next_to_the_checks(
    admin_client: Client, states: dict[str, int]
) -> None:
    response = admin_client.get(f"{CHANGELIST}?locked_by__regex=^host-a&o=-1")
    assert shown_ids(response) == {states["running"], states["expired"]}


# --------------------------------------------------------------------------- one clock


@pytest.mark.parametrize("app_clock_off", [timedelta(days=1), -timedelta(days=1)], ids=str)
def test_online_lease_left_and_ages_use_the_database_clock(
    admin_client: Client, fleet: dict[str, Any], app_clock_off: timedelta
) -> None:
    """This process's clock a day off (ahead or behind): the admin shows the same, because
    it measures everything against the database's clock, as the workers do."""
    running = fleet["held"][0]  # a 30 s lease, taken just now (database clock)
    with freeze_time(timezone.now() + app_clock_off):
        jobs = admin_client.get(CHANGELIST).content
        job_page = admin_client.get(change_url(running)).content
        workers = admin_client.get(WORKERS).content
        worker_page = admin_client.get(worker_url(WORKER)).content

    row = job_row(jobs, running)
    assert re.search(rb"(2\d|30)s left", row), row  # not "expired", not a day
    assert b"started 0s ago" in row or b"started 1s ago" in row
    assert re.search(rb"(2\d|30)s left", job_page)
    assert b'alt="True"' in worker_row(workers, WORKER)  # seen just now: online
    assert b'alt="False"' in worker_row(workers, WORKER2)  # 10 minutes ago: gone
    assert re.search(rb">(0|1)s ago<", worker_row(workers, WORKER))
    assert b">10m ago<" in worker_row(workers, WORKER2)
    assert b'alt="True"' in worker_page


def test_a_row_read_without_the_database_time_asks_the_database(fleet: dict[str, Any]) -> None:
    from django.contrib.admin import site

    job = Job.objects.get(pk=fleet["held"][0])  # not through the admin's queryset
    with freeze_time(timezone.now() + timedelta(days=1)):
        left = site.get_model_admin(Job).lease_left(job)
    assert re.fullmatch(r"(2\d|30)s left", left), left


def job_row(content: bytes, job_id: int) -> bytes:
    """The changelist row of one job."""
    rows = [row for row in content.split(b"<tr") if f'value="{job_id}"'.encode() in row]
    assert len(rows) == 1, f"{len(rows)} rows for job {job_id}"
    return rows[0]


# --------------------------------------------------------------------------- progress


def test_progress_of_a_job_that_is_not_running_is_labelled_last_reported(
    admin_client: Client, states: dict[str, int]
) -> None:
    Job.objects.filter(pk=states["failed"]).update(progress=0.5, progress_message=IMG)
    Job.objects.filter(pk=states["succeeded"]).update(progress=1.0, progress_message="")

    content = admin_client.get(CHANGELIST).content

    failed = job_row(content, states["failed"])
    assert b"50% <small" in failed
    assert b"last reported: " + IMG_ESCAPED in failed  # escaped
    running = job_row(content, states["running"])
    assert b"25% a quarter" in running  # live progress: no label
    assert b"last reported" not in running
    succeeded = job_row(content, states["succeeded"])
    assert b'<progress value="1.000" max="1"></progress> 100%' in succeeded
    assert b"last reported" not in succeeded
    page = admin_client.get(change_url(states["failed"])).content
    assert b"last reported: " + IMG_ESCAPED in page
    assert b"<img src=x" not in content + page


# --------------------------------------------------------------------------- columns


def test_the_job_list_shows_its_priority_columns_and_folds_the_rest(
    admin_client: Client, states: dict[str, int]
) -> None:
    content = admin_client.get(CHANGELIST).content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', content)
    assert columns == [
        "id",
        "task_name",
        "status_badge",
        "queue",
        "priority",
        "attempts_display",
        "progress_display",
        "when",
    ]
    running = job_row(content.encode(), states["running"])
    assert f"{WORKER} · ".encode() in running  # the lease holder, in the status
    assert b'<span title="tests.tasks.add">add</span>' in running  # full path on hover
    assert b"enqueued " in job_row(content.encode(), states["pending"])
    assert b"runs in 60m" in job_row(content.encode(), states["scheduled"])
    assert b"finished " in job_row(content.encode(), states["succeeded"])
    dead = job_row(content.encode(), states["dead"])
    assert b"1 stalled</small>" in dead


def test_the_worker_list_columns(admin_client: Client, fleet: dict[str, Any]) -> None:
    content = admin_client.get(WORKERS).content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', content)
    assert columns == [
        "id",
        "queue_list",
        "pool_size",
        "last_seen",
        "online",
        "jobs_held",
        "problem_short",
    ]
    assert "process \u00d74".encode() in worker_row(content.encode(), WORKER)
    page = admin_client.get(worker_url(WORKER)).content
    for field in ("host", "pid", "started_at"):
        assert f"field-{field}".encode() in page


# --------------------------------------------------------------------------- escaping


@pytest.fixture
def hostile() -> dict[str, Any]:
    """Jobs and a worker carrying markup in every field the admin shows."""
    failed = enqueue(add)
    c = claim(failed)
    leases.fail(
        c.id,
        c.attempt,
        WORKER,
        error=leases.ErrorInfo(f"evil.{SCRIPT}Error", SCRIPT, f"Traceback\n  {SCRIPT}\n"),
        retry_delay=None,
    )
    running = running_job(SCRIPT)
    job = Job.objects.get(pk=running)
    leases.set_progress(running, job.attempt, SCRIPT, leases.Progress(0.5, IMG))
    make_worker(SCRIPT, host=SCRIPT, queues=[SCRIPT, IMG], problem=f"gave up {SCRIPT}")
    args = int(add.enqueue(SCRIPT, IMG).id)
    kwargs = int(configured.enqueue(x={SCRIPT: [IMG]}).id)
    bold = Job.objects.create(task_path=f"tests.tasks.{BOLD}", queue=SCRIPT, key=SCRIPT).pk
    return {"failed": failed, "running": running, "args": args, "kwargs": kwargs, "bold": bold}


def assert_escaped(response: HttpResponse, *expected: bytes) -> None:
    assert response.status_code == 200
    content = response.content
    assert b"<script>alert" not in content
    assert b"<img src=x" not in content
    assert b"<b>xss" not in content
    for escaped in expected:
        assert escaped in content, escaped


def test_changelist_escapes_job_data(admin_client: Client, hostile: dict[str, Any]) -> None:
    assert_escaped(admin_client.get(CHANGELIST), SCRIPT_ESCAPED, IMG_ESCAPED, BOLD_ESCAPED)
    assert_escaped(admin_client.get(CHANGELIST, {"worker": SCRIPT}), SCRIPT_ESCAPED)
    assert_escaped(admin_client.get(CHANGELIST, {"task": f"tests.tasks.{BOLD}"}), BOLD_ESCAPED)
    assert_escaped(admin_client.get(CHANGELIST, {"queue": SCRIPT}), SCRIPT_ESCAPED)
    assert_escaped(admin_client.get(CHANGELIST, {"q": SCRIPT}), SCRIPT_ESCAPED)
    # The markup is the bold job's key, the failed job's error and the running job's worker.
    found = shown_ids(admin_client.get(CHANGELIST, {"q": SCRIPT}))
    assert found == {hostile["bold"], hostile["failed"], hostile["running"]}


def test_change_views_escape_job_data(admin_client: Client, hostile: dict[str, Any]) -> None:
    assert_escaped(admin_client.get(change_url(hostile["failed"])), SCRIPT_ESCAPED)
    failed = admin_client.get(change_url(hostile["failed"])).content
    assert failed.count(SCRIPT_ESCAPED) >= 4  # last error, class, message, traceback
    assert_escaped(admin_client.get(change_url(hostile["running"])), SCRIPT_ESCAPED, IMG_ESCAPED)
    assert_escaped(admin_client.get(change_url(hostile["args"])), SCRIPT_ESCAPED, IMG_ESCAPED)
    assert_escaped(admin_client.get(change_url(hostile["kwargs"])), SCRIPT_ESCAPED, IMG_ESCAPED)
    assert_escaped(admin_client.get(change_url(hostile["bold"])), BOLD_ESCAPED, SCRIPT_ESCAPED)


def test_worker_pages_escape_worker_data(admin_client: Client, hostile: dict[str, Any]) -> None:
    assert_escaped(admin_client.get(WORKERS), SCRIPT_ESCAPED, IMG_ESCAPED)
    assert_escaped(admin_client.get(worker_url(SCRIPT)), SCRIPT_ESCAPED, IMG_ESCAPED)


def test_dashboards_escape_job_and_worker_data(
    admin_client: Client, hostile: dict[str, Any]
) -> None:
    for url in DASHBOARDS:
        assert_escaped(admin_client.get(url), SCRIPT_ESCAPED, IMG_ESCAPED)


# --------------------------------------------------------------------------- access


@pytest.mark.parametrize("url", DASHBOARDS)
def test_staff_with_view_job_sees_the_dashboard(url: str) -> None:
    client = client_for(staff_user("view_job"))
    response = client.get(url)
    assert response.status_code == 200
    assert b'id="lj-ready"' in response.content


@pytest.mark.parametrize("url", DASHBOARDS)
def test_staff_without_view_job_cannot_see_the_dashboard(url: str) -> None:
    client = client_for(staff_user("view_worker"))
    response = client.get(url)
    assert response.status_code in (302, 403)
    assert b'id="lj-ready"' not in response.content


def test_staff_without_view_job_has_no_dashboard_on_the_index() -> None:
    client = client_for(staff_user("view_worker"))
    content = client.get(reverse("admin:index")).content
    assert WORKERS.encode() in content
    assert QUEUE_DASHBOARD.encode() not in content
    assert client.get(CHANGELIST).status_code == 403


@pytest.mark.parametrize("url", [*DASHBOARDS, CHANGELIST, WORKERS])
def test_non_staff_and_anonymous_are_sent_to_the_login(url: str) -> None:
    user = staff_user("view_job", "view_worker", username="member", is_staff=False)
    for client in (client_for(user), Client()):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login") + "?next=")


def test_a_count_past_the_cap_reads_as_more_than_the_cap(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list counts at most ``CappedCountPaginator.CAP`` jobs (COUNT(*) over a million
    rows costs more than the page): past it, the count says so instead of CAP + 1."""
    from django_leasejobs.admin.jobs import CappedCountPaginator

    monkeypatch.setattr(CappedCountPaginator, "CAP", 3)
    for number in range(3):
        add.enqueue(number, 1)
    page = admin_client.get(CHANGELIST)
    text = html.unescape(re.sub(r"\s+", " ", page.content.decode()))
    assert page.context["cl"].result_count == 3
    assert "3 jobs" in text and "3+" not in text

    add.enqueue(3, 1)
    page = admin_client.get(CHANGELIST)
    text = html.unescape(re.sub(r"\s+", " ", page.content.decode()))
    assert page.context["cl"].result_count == 4  # one more than counted: "more than 3"
    assert "3+ jobs" in text, text
    assert "4 jobs" not in text
    assert page.context["cl"].paginator.num_pages == 1
