"""The job list's bulk actions: every job matching the list's filters and search, behind
a confirmation page with the exact count, permission-gated per action, with ONE admin log
entry per action that names the action, the filter and the count.
"""

from __future__ import annotations

import html
import re
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.http import HttpResponse
from django.test import Client

from django_leasejobs import leases
from django_leasejobs.models import Job, JobStatus
from tests.helpers_leases import make_job, make_jobs

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/django_leasejobs/job/"
WORKER = "host-a:1:live"
SCRIPT = "<script>alert(1)</script>"


def bulk_url(action: str, **query: str) -> str:
    return f"{CHANGELIST}bulk/{action}/?{urlencode(query)}"


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_leasejobs", codename__in=["view_job", *codenames]
    )
    user.user_permissions.add(*perms)
    client = Client()
    client.force_login(user)
    return client


def form_of(page: HttpResponse) -> dict[str, str]:
    """The confirmation form's hidden fields, as it posts them."""
    assert page.status_code == 200, page.status_code
    found = re.search(r'<form method="post">(.*?)</form>', page.content.decode(), re.S)
    assert found, "no form on the page"
    return {
        name: html.unescape(value)
        for name, value in re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', found[1])
    }


def shown_count(page: HttpResponse) -> int:
    found = re.search(rb'id="lj-bulk-count" data-count="(\d+)"', page.content)
    assert found, page.content.decode()
    return int(found[1])


def confirm(client: Client, url: str, **fields: str) -> HttpResponse:
    """Open the confirmation page and press its button."""
    page = client.get(url)
    return client.post(url, {**form_of(page), **fields})


def messages_of(response: HttpResponse) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def bulk_entries() -> list[LogEntry]:
    return list(
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(Job), object_id__isnull=True
        ).order_by("pk")
    )


def running_job(queue: str) -> leases.ClaimedJob:
    """A job of ``queue`` held by ``WORKER`` with a live lease (claimed first: priority 100)."""
    job = make_job(queue=queue, priority=100)
    (claimed,) = leases.claim(WORKER, limit=1, lease_duration=600, queues=[queue])
    assert claimed.id == job.pk
    return claimed


def lease_of(job_id: int) -> tuple[str, str | None, int]:
    job = Job.objects.get(pk=job_id)
    return job.status, job.locked_by, job.attempt


# --------------------------------------------------------------------------- the list's links


def test_the_list_offers_the_bulk_actions_only_with_a_filter_or_search(
    admin_client: Client,
) -> None:
    assert b'id="lj-bulk"' not in admin_client.get(CHANGELIST).content
    assert b'id="lj-bulk"' not in admin_client.get(CHANGELIST, {"q": "  "}).content
    page = admin_client.get(CHANGELIST, {"status__exact": "dead", "p": "1", "o": "1"}).content
    links = re.findall(rb'<a class="button" href="([^"]+)">', page)
    assert [html.unescape(link.decode()) for link in links] == [
        f"{CHANGELIST}bulk/{name}/?status__exact=dead"
        for name in (
            "retry",
            "requeue-dead",
            "cancel",
            "set-queue",
            "set-priority",
            "delete-finished",
        )
    ]


def test_the_list_offers_only_the_actions_the_user_may_take() -> None:
    client = staff("retry_job")
    page = client.get(CHANGELIST, {"queue": "mail"}).content.decode()
    assert f"{CHANGELIST}bulk/retry/?queue=mail" in page
    assert "bulk/cancel/" not in page and "bulk/delete-finished/" not in page


@pytest.mark.parametrize(
    ("action", "codename"),
    [
        ("retry", "retry_job"),
        ("requeue-dead", "requeue_job"),
        ("cancel", "cancel_job"),
        ("set-queue", "change_job"),
        ("set-priority", "change_job"),
        ("delete-finished", "purge_job"),
    ],
)
def test_each_action_needs_its_permission(action: str, codename: str) -> None:
    dead = make_job(queue="mail", status="dead").pk
    without = staff("retry_job" if codename != "retry_job" else "cancel_job")
    url = bulk_url(action, queue="mail")
    assert without.get(url).status_code == 403
    assert without.post(url, {"upto": str(dead), "queue": "x", "priority": "1"}).status_code == 403
    assert Job.objects.get(pk=dead).status == "dead"
    assert bulk_entries() == []
    User.objects.all().delete()
    allowed = staff(codename)
    assert allowed.get(url).status_code == 200


def test_a_bulk_action_without_a_filter_is_refused(admin_client: Client) -> None:
    make_jobs(2, status="dead")
    response = admin_client.get(bulk_url("retry"))
    assert response.status_code == 400
    assert b"needs a filter or a search" in response.content
    assert admin_client.post(bulk_url("retry"), {"upto": "999"}).status_code == 400
    assert set(Job.objects.values_list("status", flat=True)) == {"dead"}


def test_an_unknown_action_or_a_malformed_filter_is_refused(admin_client: Client) -> None:
    assert admin_client.get(bulk_url("explode", queue="mail")).status_code == 403
    assert admin_client.get(bulk_url("retry", no_such_field="1")).status_code == 400


# --------------------------------------------------------------------------- each action


def test_retry_confirms_the_exact_count_then_acts_and_logs_once(admin_client: Client) -> None:
    dead = make_jobs(5, status="dead", queue="mail")
    failed = make_jobs(2, status="failed", queue="mail")
    pending = make_jobs(3, queue="mail")
    make_jobs(4, status="dead", queue="other")
    live = running_job("mail")
    url = bulk_url("retry", queue="mail")
    page = admin_client.get(url)
    assert shown_count(page) == 7
    text = page.content.decode()
    assert "queue: mail" in text
    assert "4 other matching jobs (of 11) stay as they are." in text
    response = admin_client.post(url, form_of(page))
    assert response.status_code == 302
    assert response["Location"] == f"{CHANGELIST}?queue=mail"
    assert set(Job.objects.filter(pk__in=dead + failed).values_list("status", flat=True)) == {
        "pending"
    }
    assert set(Job.objects.filter(queue="other").values_list("status", flat=True)) == {"dead"}
    assert set(Job.objects.filter(pk__in=pending).values_list("status", flat=True)) == {"pending"}
    assert lease_of(live.id) == ("running", WORKER, live.attempt)
    (entry,) = bulk_entries()
    assert entry.action_flag == CHANGE
    assert entry.change_message == "Bulk retry of every job matching queue: mail: 7 jobs retried."
    assert entry.object_repr == "7 jobs matching queue: mail"
    assert entry.user.username == "admin"
    assert messages_of(response) == ["Retry: 7 jobs retried (every job matching queue: mail)."]


def test_requeue_dead_with_a_search(admin_client: Client) -> None:
    wanted = [make_job(status="dead", kwargs={"customer_id": 4711}).pk for _ in range(3)]
    make_job(status="dead", kwargs={"customer_id": 4712})
    make_job(status="failed", kwargs={"customer_id": 4711})
    url = bulk_url("requeue-dead", q="kwargs.customer_id:4711")
    page = admin_client.get(url)
    assert shown_count(page) == 3
    assert "search: &quot;kwargs.customer_id:4711&quot;" in page.content.decode()
    admin_client.post(url, form_of(page))
    assert set(Job.objects.filter(pk__in=wanted).values_list("status", flat=True)) == {"pending"}
    assert Job.objects.filter(status="dead").count() == 1
    (entry,) = bulk_entries()
    assert entry.change_message == (
        'Bulk requeue-dead of every job matching search: "kwargs.customer_id:4711": '
        "3 jobs requeued."
    )


def test_cancel_asks_running_jobs_and_cancels_the_others(admin_client: Client) -> None:
    pending = make_jobs(3, queue="mail")
    live = running_job("mail")
    make_jobs(1, status="succeeded", queue="mail")
    url = bulk_url("cancel", queue="mail")
    assert shown_count(admin_client.get(url)) == 4
    confirm(admin_client, url)
    assert set(Job.objects.filter(pk__in=pending).values_list("status", flat=True)) == {"cancelled"}
    job = Job.objects.get(pk=live.id)
    assert (job.status, job.locked_by, job.attempt, job.cancel_requested) == (
        "running",
        WORKER,
        live.attempt,
        True,
    )
    (entry,) = bulk_entries()
    assert entry.change_message == (
        "Bulk cancel of every job matching queue: mail: 4 jobs cancelled (1 of them running: "
        "cancel requested, their workers stop them)."
    )


def test_change_queue_moves_jobs_not_started(admin_client: Client) -> None:
    pending = make_jobs(4, status="pending", queue="mail")
    make_jobs(2, status="failed", queue="mail")
    url = bulk_url("set-queue", queue="mail", status__exact="pending")
    page = admin_client.get(url)
    assert shown_count(page) == 4
    assert 'name="queue"' in page.content.decode()
    confirm(admin_client, url, queue="slow")
    assert set(Job.objects.filter(pk__in=pending).values_list("queue", flat=True)) == {"slow"}
    (entry,) = bulk_entries()
    assert entry.change_message == (
        "Bulk set-queue to queue 'slow' of every job matching status: Pending; queue: mail: "
        "4 jobs moved."
    )


def test_change_priority_and_a_bad_value_asks_again(admin_client: Client) -> None:
    pending = make_jobs(3, queue="mail")
    live = running_job("mail")
    url = bulk_url("set-priority", queue="mail")
    for bad in ("", "high", "500"):
        again = confirm(admin_client, url, priority=bad)
        assert again.status_code == 200
        assert b'class="errorlist"' in again.content
    assert bulk_entries() == []
    confirm(admin_client, url, priority="-7")
    assert set(Job.objects.filter(pk__in=pending).values_list("priority", flat=True)) == {-7}
    assert Job.objects.get(pk=live.id).priority == 100
    (entry,) = bulk_entries()
    assert (
        "to priority -7" in entry.change_message and "3 jobs re-prioritised" in entry.change_message
    )


def test_delete_finished_deletes_and_logs_a_deletion(admin_client: Client) -> None:
    finished = make_jobs(4, status="succeeded", queue="mail")
    pending = make_jobs(2, queue="mail")
    live = running_job("mail")
    url = bulk_url("delete-finished", queue="mail")
    assert shown_count(admin_client.get(url)) == 4
    confirm(admin_client, url)
    assert not Job.objects.filter(pk__in=finished).exists()
    assert Job.objects.filter(pk__in=pending).count() == 2
    assert lease_of(live.id) == ("running", WORKER, live.attempt)
    (entry,) = bulk_entries()
    assert entry.action_flag == DELETION
    assert entry.change_message == (
        "Bulk delete-finished of every job matching queue: mail: 4 jobs deleted."
    )


# --------------------------------------------------------------------------- what is confirmed


def test_jobs_enqueued_after_the_confirmation_are_left_out(admin_client: Client) -> None:
    make_jobs(3, status="dead", queue="mail")
    url = bulk_url("retry", queue="mail")
    page = admin_client.get(url)
    later = make_jobs(2, status="dead", queue="mail")
    admin_client.post(url, form_of(page))
    assert set(Job.objects.filter(pk__in=later).values_list("status", flat=True)) == {"dead"}
    (entry,) = bulk_entries()
    assert "3 jobs retried" in entry.change_message


def test_a_post_without_the_confirmed_bound_changes_nothing(admin_client: Client) -> None:
    make_jobs(2, status="dead", queue="mail")
    response = admin_client.post(bulk_url("retry", queue="mail"), {})
    assert response.status_code == 302
    assert "did not say which jobs it counted" in messages_of(response)[0]
    assert set(Job.objects.values_list("status", flat=True)) == {"dead"}
    assert bulk_entries() == []


def test_a_dedup_key_held_is_reported_not_a_crash(admin_client: Client) -> None:
    make_job(key="k1", queue="mail")
    blocked = make_job(key="k1", status="dead", queue="mail").pk
    make_job(status="dead", queue="mail")
    response = confirm(admin_client, bulk_url("retry", queue="mail"))
    assert Job.objects.get(pk=blocked).status == "dead"
    assert "1 job retried; 1 left as they were" in messages_of(response)[0]
    (entry,) = bulk_entries()
    assert "1 left as they were: another active job holds their dedup key" in entry.change_message


def test_nothing_to_act_on_offers_no_button(admin_client: Client) -> None:
    make_jobs(2, queue="mail")
    page = admin_client.get(bulk_url("retry", queue="mail"))
    assert shown_count(page) == 0
    assert b'id="lj-bulk-confirm"' not in page.content


def test_user_data_on_the_confirmation_is_escaped(admin_client: Client) -> None:
    make_job(status="dead", task_path=SCRIPT)
    for query in ({"q": SCRIPT}, {"task": SCRIPT}):
        page = admin_client.get(bulk_url("retry", **query))
        assert page.status_code == 200
        assert SCRIPT.encode() not in page.content
        assert b"&lt;script&gt;" in page.content


def test_a_csrf_token_is_required() -> None:
    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    dead = make_job(status="dead", queue="mail").pk
    response = client.post(bulk_url("retry", queue="mail"), {"upto": str(dead)})
    assert response.status_code == 403
    assert Job.objects.get(pk=dead).status == JobStatus.DEAD
