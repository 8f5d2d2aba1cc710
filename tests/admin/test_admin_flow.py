"""Flow control in the admin: the queue list and its pause/resume actions, the
dashboard's paused badge and limits, and the job page's "Why is it not running?".

Queue-wide limits are declared in ``TASKS["default"]["OPTIONS"]`` (overridden here);
jobs reach their states through the lease protocol only (``django_leasejobs.leases``),
the flow claim recording the rate-limited starts.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_leasejobs import leases, queues
from django_leasejobs.compat import task_backends
from django_leasejobs.conf import BACKEND_PATH
from django_leasejobs.models import Job, JobStatus, Queue
from tests.tasks import add

pytestmark = pytest.mark.django_db

WORKER = "host-a:1001:aaaaaa"
LEASE = 30.0

QUEUES = "/admin/django_leasejobs/queue/"
DASHBOARDS = [
    "/admin/django_leasejobs/queuedashboard/",
    "/admin/django_leasejobs/queuedashboard/?fragment=1",
    "/admin/django_leasejobs/job/dashboard/?fragment=1",
]

SCRIPT = "<script>alert(1)</script>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
IMG = "<img src=x onerror=alert(1)>"
IMG_ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"

OPTIONS = {
    "QUEUE_LIMITS": {"imports": 2, IMG: 1},
    "QUEUE_RATE_LIMITS": {"emails": "3/m"},
}
TASKS = {
    "default": {
        "BACKEND": BACKEND_PATH,
        "QUEUES": ["default", "high", "low", "imports", "emails", IMG],
        "OPTIONS": OPTIONS,
    }
}
KNOWN = ["default", "emails", "high", "imports", "low", IMG]


@pytest.fixture(autouse=True)
def limits() -> Iterator[None]:
    with override_settings(TASKS=TASKS):  # django.tasks forgets its backends on the change
        yield


# --------------------------------------------------------------------------- helpers


def enqueue(queue: str = "default", **using: Any) -> Job:
    result = add.using(queue_name=queue, **using).enqueue(1, 2)
    return Job.objects.get(pk=int(result.id))


def claim(queue: str, count: int = 1) -> list[int]:
    """Claim ``count`` jobs of ``queue`` as a worker of the backend does (its flow rules)."""
    rules = task_backends["default"].config.flow
    claimed = leases.claim(WORKER, limit=count, lease_duration=LEASE, queues=[queue], flow=rules)
    assert len(claimed) == count, f"claimed {len(claimed)} of {count} from {queue}"
    return [c.id for c in claimed]


def staff_user(*codenames: str, username: str = "staff") -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_leasejobs", codename__in=codenames
    )
    assert sorted(p.codename for p in perms) == sorted(set(codenames))
    user.user_permissions.add(*perms)
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def action_names(response: HttpResponse) -> list[str]:
    form = response.context["action_form"]
    if form is None:
        return []
    return [name for name, _label in form.fields["action"].choices if name]


def row(name: str) -> Queue:
    return Queue.objects.get(backend="default", name=name)


def post_action(client: Client, action: str, names: Iterable[str]) -> HttpResponse:
    ids = [str(row(name).pk) for name in names]
    return client.post(QUEUES, {"action": action, "_selected_action": ids, "index": "0"})


def messages_of(response: HttpResponse) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def log_entries() -> list[LogEntry]:
    queue_type = ContentType.objects.get_for_model(Queue)
    return list(LogEntry.objects.filter(content_type=queue_type, action_flag=CHANGE).order_by("pk"))


def text(html: str) -> str:
    """The visible text of an HTML snippet, whitespace folded."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def listed(response: HttpResponse) -> dict[str, list[str]]:
    """The queue list's rows: queue name -> the visible text of each of its cells."""
    assert response.status_code == 200, response.status_code
    rows = {}
    body = response.content.decode()
    for tr in re.findall(r'<tr>\s*<td class="action-checkbox">(.*?)</tr>', body, re.S):
        cells = [text(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, re.S)]
        rows[cells[0]] = cells[1:]
    return rows


def dashboard_row(content: str, queue: str) -> str:
    found = re.search(r'<tr data-queue="' + re.escape(queue) + r'">(.*?)</tr>', content)
    assert found, f"no dashboard row for queue {queue}"
    return found.group(1)


def why(content: str) -> str:
    """The job page's "Why is it not running?" box, as text ('' when absent)."""
    found = re.search(
        r'<div class="leasejobs-waiting[^"]*"><strong>Why is it not running\?</strong>(.*?)</div>',
        content,
        re.S,
    )
    return html.unescape(text(found.group(1))) if found else ""


def job_page(client: Client, job: Job) -> str:
    response = client.get(reverse("admin:django_leasejobs_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


# --------------------------------------------------------------------------- the queue list

COLUMNS = ["backend", "state", "paused since", "queue limit", "rate limit", "pending", "ready"]


def test_the_list_shows_every_queue_of_settings_and_jobs(admin_client: Client) -> None:
    assert not Queue.objects.exists()  # no queue was ever paused: no rows yet
    response = admin_client.get(QUEUES)

    rows = listed(response)
    assert sorted(rows) == sorted([*KNOWN[:-1], IMG_ESCAPED])
    assert rows["default"] == ["default", "active", "-", "-", "-", "0", "0"]
    assert rows["imports"][3] == "0 / 2 running"
    assert rows["emails"][4] == "0 / 3 per minute"
    assert sorted(Queue.objects.values_list("name", flat=True)) == sorted(KNOWN)
    assert not Queue.objects.filter(paused=True).exists()
    # Listing again creates nothing more.
    admin_client.get(QUEUES)
    assert Queue.objects.count() == len(KNOWN)


def test_a_queue_known_only_by_its_jobs_is_listed(admin_client: Client) -> None:
    anything = {"default": {**TASKS["default"], "QUEUES": []}}  # any queue name is allowed
    with override_settings(TASKS=anything):
        enqueue("adhoc")
        enqueue("adhoc", run_after=timezone.now() + timedelta(hours=1))
        rows = listed(admin_client.get(QUEUES))
    assert rows["adhoc"] == ["default", "active", "-", "-", "-", "2", "1"]
    assert "imports" in rows  # from QUEUE_LIMITS


def test_the_list_shows_paused_queues_and_the_limits_in_use(admin_client: Client) -> None:
    enqueue("imports")
    enqueue("imports")
    enqueue("imports")
    claim("imports", 2)
    enqueue("emails")
    enqueue("emails")
    claim("emails")  # one start within the minute
    enqueue("low")
    assert queues.pause("low")

    response = admin_client.get(QUEUES)
    rows = listed(response)
    assert rows["low"][1] == "paused"
    assert re.fullmatch(r".+ \(.+ ago\)", rows["low"][2]), rows["low"][2]  # paused since
    assert rows["low"][5:] == ["1", "1"]
    assert rows["imports"][1:] == ["active", "-", "2 / 2 running", "-", "1", "1"]
    assert rows["emails"][3:] == ["-", "1 / 3 per minute", "1", "1"]
    content = response.content.decode()
    assert content.count("leasejobs-queue-paused") == 1
    assert "leasejobs-limit leasejobs-limit-full" in content  # imports: 2 of 2
    assert "django_leasejobs/flow.css" in content
    # The pending count links to the queue's pending jobs.
    assert "/admin/django_leasejobs/job/?queue=imports&amp;status__exact=pending" in content


def test_the_queue_page_is_read_only(admin_client: Client) -> None:
    queues.pause("imports")
    imports = row("imports")
    url = reverse("admin:django_leasejobs_queue_change", args=[imports.pk])
    content = admin_client.get(url).content.decode()
    assert "leasejobs-queue-paused" in content
    assert "0 / 2 running" in content
    assert admin_client.post(url, {"paused": ""}).status_code == 403
    assert row("imports").paused
    assert admin_client.get(QUEUES + "add/").status_code == 403
    delete = reverse("admin:django_leasejobs_queue_delete", args=[imports.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert "delete_selected" not in action_names(admin_client.get(QUEUES))


# --------------------------------------------------------------------------- actions


def test_pause_and_resume_with_the_permission_are_logged() -> None:
    client = client_for(staff_user("view_queue", "pause_queue"))
    response = client.get(QUEUES)
    assert action_names(response) == ["pause_queues", "resume_queues"]
    assert "Pause selected queues" in response.content.decode()

    response = post_action(client, "pause_queues", ["imports", "emails"])
    assert response.status_code == 302
    assert messages_of(response) == ["Paused 2 queues."]
    assert queues.is_paused("imports") and queues.is_paused("emails")
    assert row("imports").paused_at is not None

    response = post_action(client, "pause_queues", ["imports", "low"])
    assert messages_of(response)[-1] == "Paused 1 queue. Skipped 1: 1 already paused."

    response = post_action(client, "resume_queues", ["imports", "high"])
    assert messages_of(response)[-1] == "Resumed 1 queue. Skipped 1: 1 not paused."
    assert not queues.is_paused("imports")
    assert queues.is_paused("emails") and queues.is_paused("low")

    logged = [(e.user.username, e.object_repr, e.get_change_message()) for e in log_entries()]
    assert sorted(logged) == sorted(
        [
            ("staff", "imports", "Paused"),
            ("staff", "emails", "Paused"),
            ("staff", "low", "Paused"),
            ("staff", "imports", "Resumed"),
        ]
    )
    assert {e.object_id for e in log_entries()} == {
        str(row(name).pk) for name in ("imports", "emails", "low")
    }


@pytest.mark.parametrize("action", ["pause_queues", "resume_queues"])
def test_actions_without_the_permission_are_hidden_and_refused(action: str) -> None:
    queues.pause("emails")
    client = client_for(staff_user("view_queue", "view_job"))
    response = client.get(QUEUES)
    assert response.status_code == 200
    assert action_names(response) == []
    assert "Pause selected queues" not in response.content.decode()

    before = list(Queue.objects.values().order_by("pk"))
    response = post_action(client, action, ["imports", "emails"])  # forged

    assert response.status_code in (200, 302, 403)
    assert list(Queue.objects.values().order_by("pk")) == before
    assert not queues.is_paused("imports") and queues.is_paused("emails")
    assert not LogEntry.objects.exists()


def test_staff_without_view_permission_gets_no_queue_list() -> None:
    client = client_for(staff_user("view_job"))
    assert client.get(QUEUES).status_code == 403
    assert not Queue.objects.exists()


def test_a_queue_of_a_removed_backend_is_listed_but_not_changed(admin_client: Client) -> None:
    Queue.objects.create(backend="gone", name="old", paused=True)
    rows = listed(admin_client.get(QUEUES))
    assert rows["old"][:2] == ["gone", "paused its backend is not configured"]
    response = post_action(admin_client, "resume_queues", ["default"])
    assert messages_of(response) == ["Resumed 0 queues. Skipped 1: 1 not paused."]
    old = Queue.objects.get(backend="gone")
    response = admin_client.post(
        QUEUES, {"action": "resume_queues", "_selected_action": [str(old.pk)], "index": "0"}
    )
    assert messages_of(response)[-1] == (
        "Resumed 0 queues. Skipped 1: 1 because their task backend is not configured any more."
    )
    assert Queue.objects.get(backend="gone").paused


# --------------------------------------------------------------------------- dashboard


def test_the_dashboard_marks_paused_queues_and_shows_the_limits_in_use(
    admin_client: Client,
) -> None:
    enqueue("imports")
    enqueue("imports")
    claim("imports")
    enqueue("emails")
    claim("emails")
    enqueue("low")
    queues.pause("low")
    queues.pause("high")  # no job: listed for being paused

    for url in DASHBOARDS:
        response = admin_client.get(url)
        assert response.status_code == 200
        content = response.content.decode()
        low = dashboard_row(content, "low")
        assert "leasejobs-queue-paused" in low and ">paused</span>" in low, url
        assert "Paused since" in low
        assert "leasejobs-queue-paused" in dashboard_row(content, "high")
        assert "leasejobs-queue-paused" not in dashboard_row(content, "imports")
        assert text(dashboard_row(content, "imports")).endswith("1 / 2 running"), url
        assert text(dashboard_row(content, "emails")).endswith("1 / 3 per minute"), url
        assert text(dashboard_row(content, "low")).endswith("-")
        assert content.count("leasejobs-queue-paused") == 2
        assert "leasejobs-limit-full" not in content
        assert reverse("admin:django_leasejobs_queue_changelist") in content

    claim("imports")
    content = admin_client.get(DASHBOARDS[0]).content.decode()
    assert text(dashboard_row(content, "imports")).endswith("2 / 2 running")
    assert "leasejobs-limit leasejobs-limit-full" in dashboard_row(content, "imports")
    assert "django_leasejobs/flow.css" in content


def test_the_dashboard_links_the_queue_list_only_for_its_viewers() -> None:
    client = client_for(staff_user("view_job"))
    content = client.get(DASHBOARDS[0]).content.decode()
    assert reverse("admin:django_leasejobs_queue_changelist") not in content
    assert "1 / 2 running" not in content and "0 / 2 running" in content  # limited, idle


# --------------------------------------------------------------------------- job page


def test_a_ready_job_is_held_back_by_nothing(admin_client: Client) -> None:
    job = enqueue()
    content = job_page(admin_client, job)
    assert "Why is it not running?" in content
    assert why(content) == "Nothing holds it back: a worker takes it at its next claim."


def test_a_job_that_is_not_pending_has_no_waiting_box(admin_client: Client) -> None:
    job = enqueue()
    claim("default")
    content = job_page(admin_client, job)
    assert "Why is it not running?" not in content
    assert why(content) == ""


def test_a_job_in_a_paused_queue(admin_client: Client) -> None:
    job = enqueue("low")
    queues.pause("low")
    assert why(job_page(admin_client, job)) == "the queue 'low' is paused"


def test_a_job_behind_its_full_queue_limit(admin_client: Client) -> None:
    enqueue("imports")
    enqueue("imports")
    claim("imports", 2)
    job = enqueue("imports")
    assert why(job_page(admin_client, job)) == "the queue 'imports' is at its limit: 2 of 2 running"


def test_a_job_behind_its_full_key_limit(admin_client: Client) -> None:
    enqueue(concurrency_key="customer-7")
    claim("default")
    job = enqueue(concurrency_key="customer-7")
    content = job_page(admin_client, job)
    assert why(content) == "the limit of its key 'customer-7' is full: 1 of 1 running"
    # The flow columns, read only.
    assert "Flow control" in content
    assert "Concurrency key / group" in content
    assert "<code>customer-7</code>" in content
    assert re.search(r"field-concurrency_limit.*?<div class=\"readonly\">1</div>", content, re.S)


def test_a_job_behind_its_used_up_rate_limit(admin_client: Client) -> None:
    enqueue(rate_limit="1/m")
    claim("default")
    job = enqueue(rate_limit="1/m")
    content = job_page(admin_client, job)
    assert why(content) == (
        "the rate limit of the task tests.tasks.add is used up: 1 starts in the last period (1/m)"
    )
    assert "<code>task tests.tasks.add</code>" in content
    assert re.search(r"field-rate_limit.*?<div class=\"readonly\">1/m</div>", content, re.S)


def test_a_scheduled_job_and_a_job_waiting_for_its_retry(admin_client: Client) -> None:
    scheduled = enqueue(run_after=timezone.now() + timedelta(hours=1))
    assert re.fullmatch(
        r"scheduled: it may start in 3[56]\d\d s \(run_after\)",
        why(job_page(admin_client, scheduled)),
    )

    retried = enqueue()
    [job_id] = claim("default")
    error = leases.ErrorInfo("builtins.ValueError", "boom", "Traceback: boom")
    status = leases.fail(job_id, 1, WORKER, error=error, retry_delay=600)
    assert status == JobStatus.PENDING
    reason = why(job_page(admin_client, retried))
    assert re.fullmatch(
        r"waiting for a retry: attempt 1 did not succeed, the next one may start in "
        r"(59\d|600) s",
        reason,
    ), reason


def test_a_job_waiting_for_a_worker_that_knows_its_task(admin_client: Client) -> None:
    job = enqueue()
    [job_id] = claim("default")
    done = leases.defer_unknown(WORKER, {(job_id, 1): "not deployed here"}, grace=3600)
    assert (job_id, 1) in done.delays
    content = job_page(admin_client, job)
    found = re.search(
        r'<div class="leasejobs-waiting"><strong>.*?</strong><ul>(.*?)</ul>', content, re.S
    )
    assert found
    items = [html.unescape(item) for item in re.findall(r"<li>(.*?)</li>", found.group(1))]
    assert re.fullmatch(
        r"a worker that did not know its task 'tests.tasks.add' gave it back \d+ s after the "
        r"first such worker met it: it waits for a worker running code that declares the "
        r"task \(dead letter after UNKNOWN_TASK_GRACE, 3600 s\)",
        items[0],
    ), items
    assert re.fullmatch(r"it may be claimed again in [12] s", items[1]), items


def test_several_reasons_are_listed_together(admin_client: Client) -> None:
    job = enqueue("low", run_after=timezone.now() + timedelta(hours=1))
    queues.pause("low")
    content = job_page(admin_client, job)
    found = re.search(
        r'<div class="leasejobs-waiting"><strong>.*?</strong><ul>(.*?)</ul>', content, re.S
    )
    assert found
    items = re.findall(r"<li>(.*?)</li>", found.group(1))
    assert len(items) == 2
    assert items[1] == "the queue &#x27;low&#x27; is paused"


def test_a_job_of_a_backend_that_is_gone(admin_client: Client) -> None:
    job = enqueue()
    Job.objects.filter(pk=job.pk).update(backend="gone")
    assert why(job_page(admin_client, job)) == (
        'Its task backend "gone" is not configured: no worker here takes it.'
    )


# --------------------------------------------------------------------------- escaping


def test_html_in_queue_names_and_keys_is_escaped(admin_client: Client) -> None:
    enqueue(IMG)
    claim(IMG)
    held = enqueue(IMG, concurrency_key=SCRIPT)
    queues.pause(IMG)

    pages = [
        admin_client.get(QUEUES),
        admin_client.get(reverse("admin:django_leasejobs_queue_change", args=[row(IMG).pk])),
        admin_client.get(reverse("admin:django_leasejobs_job_change", args=[held.pk])),
        *(admin_client.get(url) for url in DASHBOARDS),
    ]
    for response in pages:
        assert response.status_code == 200
        content = response.content.decode()
        assert SCRIPT not in content
        assert IMG not in content
        assert IMG_ESCAPED in content or SCRIPT_ESCAPED in content

    job = pages[2].content.decode()
    reasons = why(job)
    assert "is paused" in reasons
    assert "is at its limit: 1 of 1 running" in reasons
    assert SCRIPT_ESCAPED in job  # the key, in the flow fields
    dashboard = pages[3].content.decode()
    assert "leasejobs-queue-paused" in dashboard_row(dashboard, IMG_ESCAPED)
