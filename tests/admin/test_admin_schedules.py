"""The admin page of schedules and the dashboard's "Next scheduled runs" panel.

Schedules are declared in ``TASKS["default"]["OPTIONS"]["SCHEDULES"]`` (overridden
here); the page is read-only, its actions (pause, resume, run now) are gated by their
permissions and recorded in the admin log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.db.models.functions import Now
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import reverse

from django_leasejobs.conf import BACKEND_PATH
from django_leasejobs.models import Job, RunKind, Schedule, ScheduleRun
from django_leasejobs.schedules import operations

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/django_leasejobs/schedule/"
DASHBOARDS = [
    "/admin/django_leasejobs/queuedashboard/",
    "/admin/django_leasejobs/queuedashboard/?fragment=1",
    "/admin/django_leasejobs/job/dashboard/?fragment=1",
]

SCRIPT = "<script>alert(1)</script>"
SCRIPT_ESCAPED = b"&lt;script&gt;alert(1)&lt;/script&gt;"
IMG = "<img src=x onerror=alert(1)>"
IMG_ESCAPED = b"&lt;img src=x onerror=alert(1)&gt;"

SCHEDULES = {
    "nightly": {"task": "tests.tasks.add", "cron": "0 3 * * *", "args": [1, 2]},
    "every-minute": {"task": "tests.tasks.add", "every": 60, "args": [SCRIPT, IMG]},
    "held": {"task": "tests.tasks.add", "every": 300, "kwargs": {"a": 1, "b": 1}},
    "off": {"task": "tests.tasks.add", "every": 60, "args": [0, 0], "enabled": False},
}
TASKS = {
    "default": {
        "BACKEND": BACKEND_PATH,
        "QUEUES": ["default", "high", "low"],
        "OPTIONS": {"SCHEDULES": SCHEDULES},
    }
}

# The action each permission unlocks.
ACTION_PERMISSIONS = {
    "pause_schedules": "pause_schedule",
    "resume_schedules": "pause_schedule",
    "run_schedules_now": "run_schedule",
}


@pytest.fixture(autouse=True)
def declared() -> Iterator[None]:
    with override_settings(TASKS=TASKS):
        yield


def synced() -> dict[str, Schedule]:
    """Every declared schedule has its row (as after a worker's pass); "held" is paused,
    and "old-report" was removed from settings."""
    assert operations.pause("held")
    Schedule.objects.create(
        name="old-report", task_path="tests.tasks.add", expression="every 60s", last_job_id=None
    )
    return {row.name: row for row in Schedule.objects.all()}


def row(name: str) -> Schedule:
    return Schedule.objects.get(name=name)


def change_url(schedule: Schedule) -> str:
    return reverse("admin:django_leasejobs_schedule_change", args=[schedule.pk])


def job_url(job_id: int) -> str:
    return reverse("admin:django_leasejobs_job_change", args=[job_id])


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


def post_action(client: Client, action: str, names: Iterable[str]) -> HttpResponse:
    ids = [str(row(name).pk) for name in names]
    return client.post(CHANGELIST, {"action": action, "_selected_action": ids, "index": "0"})


def messages_of(response: HttpResponse) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def log_entries(flag: int = CHANGE) -> list[LogEntry]:
    schedule_type = ContentType.objects.get_for_model(Schedule)
    return list(LogEntry.objects.filter(content_type=schedule_type, action_flag=flag))


def listed_states(response: HttpResponse) -> dict[str, str]:
    from django_leasejobs.admin.schedules import state_of

    assert response.status_code == 200, response.status_code
    return {r.name: state_of(r).view.state for r in response.context["cl"].result_list}


# --------------------------------------------------------------------------- pages render


def test_the_changelist_creates_the_rows_of_new_schedules(admin_client: Client) -> None:
    assert not Schedule.objects.exists()  # declared, never seen by a worker: "new"

    response = admin_client.get(CHANGELIST)

    assert listed_states(response) == {
        "nightly": "active",
        "every-minute": "active",
        "held": "active",
        "off": "disabled",
    }
    content = response.content
    assert b"0 3 * * *" in content
    assert b"Every minute" in content
    assert b"tests.tasks.add" in content
    assert b"disabled in settings" in content


def test_changelist_shows_active_paused_disabled_and_removed(admin_client: Client) -> None:
    synced()
    response = admin_client.get(CHANGELIST)

    assert listed_states(response) == {
        "nightly": "active",
        "every-minute": "active",
        "held": "paused",
        "off": "disabled",
        "old-report": "removed",
    }
    content = response.content.decode()
    assert "leasejobs-schedule-removed" in content
    assert "removed from settings" in content
    assert "leasejobs-schedule-paused" in content
    # The next run of each active schedule is shown. (Not "(in ...)": "every-minute"
    # ticks on the minute, and a minute may turn between synced() and the request.)
    from django_leasejobs.admin.schedules import state_of

    next_ticks = {r.name: state_of(r).view.next_tick for r in response.context["cl"].result_list}
    for name in ("nightly", "every-minute"):
        tick = next_ticks[name]
        assert tick is not None, name
        assert f'<time datetime="{tick.isoformat()}">' in content, name


def test_change_view_renders_every_state(admin_client: Client) -> None:
    rows = synced()
    for name, schedule in rows.items():
        response = admin_client.get(change_url(schedule))
        assert response.status_code == 200, name
        assert name.encode() in response.content
    nightly = admin_client.get(change_url(rows["nightly"])).content
    assert b"At 03:00" in nightly  # cronsim's description
    assert b"catch_up=latest" in nightly
    held = admin_client.get(change_url(rows["held"])).content
    assert b"leasejobs-schedule-paused" in held
    assert b"&quot;b&quot;: 1" in held  # its keyword arguments, as JSON
    removed = admin_client.get(change_url(rows["old-report"])).content
    assert b"removed from settings" in removed


def test_html_in_names_task_paths_and_arguments_is_escaped(admin_client: Client) -> None:
    synced()
    # Rows that no settings could declare: removed ones, one of a backend that is gone.
    odd = Schedule.objects.create(name=SCRIPT, task_path=IMG, expression=SCRIPT, timezone=IMG)
    gone = Schedule.objects.create(backend="gone", name=IMG, task_path=SCRIPT, expression="x")

    pages = [
        admin_client.get(CHANGELIST),
        admin_client.get(change_url(odd)),
        admin_client.get(change_url(gone)),
        admin_client.get(change_url(row("every-minute"))),  # its args hold HTML
    ]
    for response in pages:
        assert response.status_code == 200
        assert SCRIPT.encode() not in response.content
        assert IMG.encode() not in response.content
        assert SCRIPT_ESCAPED in response.content or IMG_ESCAPED in response.content
    assert listed_states(pages[0])[SCRIPT] == "removed"
    assert listed_states(pages[0])[IMG] == "removed"


def test_last_run_and_recent_runs_link_to_the_jobs(admin_client: Client) -> None:
    synced()
    first = operations.run_now("nightly").job_id
    second = operations.run_now("nightly").job_id

    listing = admin_client.get(CHANGELIST).content.decode()
    assert f'<a href="{job_url(second)}">#{second}</a>' in listing
    assert "leasejobs-status-pending" in listing

    detail = admin_client.get(change_url(row("nightly"))).content.decode()
    assert detail.index(f"#{second}") < detail.index(f"#{first}")  # newest first
    assert job_url(first) in detail
    assert "Run now" in detail

    Job.objects.filter(pk=second).delete()  # pruned: no link, said so
    detail = admin_client.get(change_url(row("nightly"))).content.decode()
    assert job_url(second) not in detail
    assert "(deleted)" in detail


def test_recent_runs_are_capped(admin_client: Client) -> None:
    synced()
    nightly = row("nightly")
    ScheduleRun.objects.bulk_create(
        [ScheduleRun(schedule=nightly, kind=RunKind.MANUAL) for _ in range(25)]
    )
    detail = admin_client.get(change_url(nightly)).content.decode()
    assert detail.count("<td>Run now</td>") == 20


def test_overdue_schedules_are_marked(admin_client: Client) -> None:
    synced()
    Schedule.objects.filter(name="every-minute").update(last_tick=Now() - timedelta(hours=3))
    content = admin_client.get(CHANGELIST).content.decode()
    assert content.count("overdue by ") == 1
    assert "overdue by 3.0h" in content


# --------------------------------------------------------------------------- read only


def test_schedules_cannot_be_added_or_edited(admin_client: Client) -> None:
    rows = synced()
    assert admin_client.get(CHANGELIST + "add/").status_code == 403
    nightly = rows["nightly"]
    response = admin_client.post(change_url(nightly), {"name": "renamed", "task_path": "x"})
    assert response.status_code == 403
    assert row("nightly").task_path == "tests.tasks.add"
    assert "delete_selected" not in action_names(admin_client.get(CHANGELIST))


def test_only_removed_rows_can_be_deleted(admin_client: Client) -> None:
    rows = synced()
    delete = "admin:django_leasejobs_schedule_delete"
    active = reverse(delete, args=[rows["nightly"].pk])
    assert admin_client.post(active, {"post": "yes"}).status_code == 403
    assert Schedule.objects.filter(name="nightly").exists()

    removed = reverse(delete, args=[rows["old-report"].pk])
    assert admin_client.get(removed).status_code == 200
    assert admin_client.post(removed, {"post": "yes"}).status_code == 302
    assert not Schedule.objects.filter(name="old-report").exists()
    assert len(log_entries(DELETION)) == 1


# --------------------------------------------------------------------------- actions


def expected_change(action: str) -> tuple[str, Any]:
    """The schedule an action is tried on, and a probe of what it changes."""
    if action == "resume_schedules":
        return "held", lambda: row("held").paused
    if action == "pause_schedules":
        return "nightly", lambda: row("nightly").paused
    return "nightly", lambda: Job.objects.count()


@pytest.mark.parametrize(("action", "perm"), list(ACTION_PERMISSIONS.items()))
def test_action_works_with_its_permission(action: str, perm: str) -> None:
    synced()
    name, probe = expected_change(action)
    before = probe()
    client = client_for(staff_user("view_schedule", perm))

    offered = action_names(client.get(CHANGELIST))
    assert action in offered
    response = post_action(client, action, [name])

    assert response.status_code == 302
    [message] = messages_of(response)
    assert message.startswith(("Paused 1 schedule.", "Resumed 1 schedule.", "Ran 1 schedule.")), (
        message
    )
    assert probe() != before
    [entry] = log_entries()
    assert (entry.user.username, entry.object_id) == ("staff", str(row(name).pk))


@pytest.mark.parametrize(("action", "perm"), list(ACTION_PERMISSIONS.items()))
def test_action_without_its_permission_is_refused(action: str, perm: str) -> None:
    synced()
    name, _probe = expected_change(action)
    others = {p for p in ACTION_PERMISSIONS.values() if p != perm}
    client = client_for(staff_user("view_schedule", *others))

    assert action not in action_names(client.get(CHANGELIST))
    before = list(Schedule.objects.values().order_by("pk"))
    response = post_action(client, action, [name])

    assert response.status_code in (200, 302, 403)
    assert list(Schedule.objects.values().order_by("pk")) == before
    assert not Job.objects.exists()
    assert not ScheduleRun.objects.exists()
    assert not LogEntry.objects.exists()


def test_view_only_staff_sees_the_page_without_actions() -> None:
    synced()
    client = client_for(staff_user("view_schedule"))
    response = client.get(CHANGELIST)
    assert len(listed_states(response)) == 5
    assert action_names(response) == []
    assert client.get(change_url(row("held"))).status_code == 200


def test_staff_without_view_permission_gets_no_page() -> None:
    synced()
    client = client_for(staff_user("view_job"))
    assert client.get(CHANGELIST).status_code == 403


def test_run_now_enqueues_exactly_one_job_per_schedule(admin_client: Client) -> None:
    synced()
    response = post_action(admin_client, "run_schedules_now", ["nightly", "held"])

    jobs = list(Job.objects.order_by("pk"))  # in the list's order: by name
    assert len(jobs) == 2
    assert [(j.task_path, j.args, j.kwargs) for j in jobs] == [
        ("tests.tasks.add", [], {"a": 1, "b": 1}),
        ("tests.tasks.add", [1, 2], {}),
    ]
    runs = ScheduleRun.objects.order_by("pk")
    assert [(r.schedule.name, r.kind, r.tick, r.job_id) for r in runs] == [
        ("held", RunKind.MANUAL, None, jobs[0].pk),
        ("nightly", RunKind.MANUAL, None, jobs[1].pk),
    ]
    assert row("held").paused  # run now leaves a paused schedule paused
    assert messages_of(response) == [
        f"Ran 2 schedules. Enqueued jobs #{jobs[0].pk}, #{jobs[1].pk}."
    ]
    messages_logged = sorted(e.get_change_message() for e in log_entries())
    assert messages_logged == sorted(f"Run now: enqueued job #{j.pk}" for j in jobs)


def test_run_now_refuses_removed_and_disabled_schedules(admin_client: Client) -> None:
    synced()
    response = post_action(admin_client, "run_schedules_now", ["off", "old-report"])

    assert not Job.objects.exists()
    assert not ScheduleRun.objects.exists()
    assert not log_entries()
    assert messages_of(response) == [
        "Ran 0 schedules. Skipped 2: 1 disabled in settings; 1 removed from settings."
    ]


def test_pause_and_resume_skip_what_they_cannot_change(admin_client: Client) -> None:
    synced()
    response = post_action(admin_client, "pause_schedules", ["held", "nightly", "old-report"])
    assert messages_of(response) == [
        "Paused 1 schedule. Skipped 2: 1 already paused; 1 removed from settings."
    ]
    assert row("nightly").paused and row("held").paused
    response = post_action(admin_client, "resume_schedules", ["nightly", "every-minute"])
    assert messages_of(response)[-1] == "Resumed 1 schedule. Skipped 1: 1 not paused."
    assert not row("nightly").paused
    assert [e.get_change_message() for e in log_entries()] == ["Resumed", "Paused"]


# --------------------------------------------------------------------------- dashboard


def next_runs(content: bytes) -> list[str]:
    """The schedule names in the dashboard's "Next scheduled runs" table, in order."""
    table = re.search(rb'id="lj-next-runs">(.*?)</table>', content, re.S)
    assert table, "no next-runs panel"
    return [
        re.sub(r"<[^>]+>", "", cell)
        for cell in re.findall(r"<tr><td>(.*?)</td>", table[1].decode())
    ]


def test_dashboard_lists_the_next_runs_without_paused_ones(admin_client: Client) -> None:
    for url in DASHBOARDS:  # before any worker or admin page saw them: all "new"
        content = admin_client.get(url).content
        assert sorted(next_runs(content)) == ["every-minute", "held", "nightly"], url
    synced()
    for url in DASHBOARDS:
        response = admin_client.get(url)
        assert response.status_code == 200
        assert b"Next scheduled runs" in response.content
        assert sorted(next_runs(response.content)) == ["every-minute", "nightly"], url
        assert b'id="lj-schedules-overdue"' not in response.content
        assert change_url(row("nightly")).encode() in response.content
        assert b"(in " in response.content


def test_dashboard_warns_of_overdue_schedules(admin_client: Client) -> None:
    synced()
    Schedule.objects.filter(name="every-minute").update(last_tick=Now() - timedelta(hours=3))
    for url in DASHBOARDS:
        content = admin_client.get(url).content.decode()
        assert 'id="lj-schedules-overdue"' in content, url
        assert "every-minute</a> (3.0h late)" in content
        assert next_runs(content.encode())[0] == "every-minute"
        assert " ago)" in content


def test_dashboard_without_schedules_has_no_panel(admin_client: Client) -> None:
    with override_settings(TASKS={**TASKS, "default": {**TASKS["default"], "OPTIONS": {}}}):
        content = admin_client.get(DASHBOARDS[0]).content
    assert b"Next scheduled runs" not in content
    assert b"lj-next-runs" not in content
