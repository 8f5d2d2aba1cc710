"""The workflow admin: the list (status and counts from the steps), the page (the graph as
inline SVG, the table of steps), its actions gated by ``cancel_workflow``, the job page's
workflow section, and ``leasejobs_status``'s waiting steps.

Workflows are written by the canvas (``django_leasejobs.workflows``) and run in-process
(``django_leasejobs.testing.run_jobs``); the one direct write gives a step a hostile
task path, as a row may carry whatever it was written with.
"""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_leasejobs.admin import workflow_graph
from django_leasejobs.admin import workflows as workflow_admin
from django_leasejobs.models import Job, JobStatus, Workflow
from django_leasejobs.testing import run_jobs
from django_leasejobs.workflows import chord, group, step
from tests import tasks_workflows as t
from tests.tasks import add

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOWS = "/admin/django_leasejobs/workflow/"
SCRIPT = "<script>alert(1)</script>"
SCRIPT_ESCAPED = b"&lt;script&gt;alert(1)&lt;/script&gt;"


# --------------------------------------------------------------------------- helpers


def a_chord(members: int = 3, *, failing: bool = False) -> tuple[int, list[int]]:
    """A chord of ``members`` steps and a callback: the workflow's id and its step ids
    (the callback last). ``failing``: the first member raises."""
    parts = [step(t.value, n) for n in range(members)]
    if failing:
        parts[0] = step(t.boom)
    result = chord(group(*parts), step(t.total)).enqueue()
    return int(result.id), [int(r.id) for r in result.steps]


def staff_user(*codenames: str, username: str = "staff") -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_leasejobs", codename__in=codenames
    )
    assert sorted(p.codename for p in perms) == sorted(codenames)
    user.user_permissions.add(*perms)
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page_url(workflow_id: int) -> str:
    return f"{WORKFLOWS}{workflow_id}/change/"


def job_url(job_id: int) -> str:
    return f"/admin/django_leasejobs/job/{job_id}/change/"


def svg_of(response: HttpResponse) -> str:
    assert response.status_code == 200, response.status_code
    found = re.search(
        r'<div class="leasejobs-scroll leasejobs-graph"><svg .*?</svg>',
        response.content.decode(),
        re.S,
    )
    assert found, "no drawing on the page"
    return found[0]


def action_names(response: HttpResponse) -> list[str]:
    form = response.context["action_form"]
    if form is None:
        return []
    return [name for name, _label in form.fields["action"].choices if name]


def post_action(client: Client, action: str, ids: list[int]) -> HttpResponse:
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0"}
    return client.post(WORKFLOWS, data)


def messages_of(response: HttpResponse) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def statuses(ids: list[int]) -> list[str]:
    found = dict(Job.objects.filter(pk__in=ids).values_list("id", "status"))
    return [found[i] for i in ids]


# --------------------------------------------------------------------------- the list


def test_the_list_shows_status_and_counts_per_status(admin_client: Client) -> None:
    fresh, _steps = a_chord()
    done, _steps = a_chord(2)
    run_jobs()  # runs both
    waiting, _steps = a_chord()

    page = admin_client.get(WORKFLOWS)

    assert page.status_code == 200
    rows = {row.pk: row for row in page.context["cl"].result_list}
    assert set(rows) == {fresh, done, waiting}
    content = page.content.decode()
    assert "successful" in content  # both ran
    assert "ready" in content  # the last one: no step started
    counts = workflow_admin.counts_of(rows[waiting])
    assert counts.by_status == {"pending": 3, "waiting": 1}
    assert workflow_admin.counts_of(rows[done]).by_status == {"succeeded": 3}


def test_the_list_reads_the_steps_of_a_page_in_one_query(admin_client: Client) -> None:
    a_chord()
    admin_client.get(WORKFLOWS)  # warm up (sessions, content types)
    with CaptureQueriesContext(connection) as one:
        assert admin_client.get(WORKFLOWS).status_code == 200
    for members in (2, 5, 8):
        a_chord(members)
    with CaptureQueriesContext(connection) as four:
        assert admin_client.get(WORKFLOWS).status_code == 200
    assert len(four) == len(one)


# --------------------------------------------------------------------------- the page


def test_the_page_draws_each_step_as_a_link_and_each_edge(admin_client: Client) -> None:
    workflow_id, steps = a_chord(3)

    page = admin_client.get(page_url(workflow_id))

    svg = svg_of(page)
    links = re.findall(r'<a href="([^"]+)" class="lj-node lj-node-(\w+)"', svg)
    assert sorted(links) == sorted(
        [(job_url(i), "pending") for i in steps[:-1]] + [(job_url(steps[-1]), "waiting")]
    )
    assert svg.count('class="lj-edge"') == 3
    assert "<script" not in svg
    assert "http" not in svg.replace("http://www.w3.org/2000/svg", "")  # no external asset
    # The table of steps: each step linked once more, with its parents counted.
    content = page.content.decode()
    for job_id in steps:
        assert content.count(f'href="{job_url(job_id)}"') == 2
    graph = workflow_graph.read_graph(Workflow.objects.get(pk=workflow_id))
    assert graph.layers == {**dict.fromkeys(steps[:-1], 0), steps[-1]: 1}
    assert graph.parents[steps[-1]] == 3


def test_the_page_reads_a_workflow_in_the_same_queries_whatever_its_size(
    admin_client: Client,
) -> None:
    small, _steps = a_chord(2)
    big, _steps = a_chord(40)
    admin_client.get(page_url(small))  # warm up
    with CaptureQueriesContext(connection) as few:
        admin_client.get(page_url(small))
    with CaptureQueriesContext(connection) as many:
        admin_client.get(page_url(big))
    assert len(many) == len(few)


def test_the_page_shows_a_finished_chord(admin_client: Client) -> None:
    workflow_id, steps = a_chord(3)
    run_jobs()
    svg = svg_of(admin_client.get(page_url(workflow_id)))
    assert svg.count("lj-node-succeeded") == len(steps)


def test_the_page_escapes_a_hostile_task_path(admin_client: Client) -> None:
    # The canvas only writes registered task paths; a row may carry anything all the same.
    workflow_id, steps = a_chord(2)
    Job.objects.filter(pk=steps[0]).update(task_path=f"evil.{SCRIPT}")

    page = admin_client.get(page_url(workflow_id))

    assert page.status_code == 200
    assert b"<script>alert" not in page.content
    assert SCRIPT_ESCAPED in svg_of(page).encode()
    assert page.content.count(SCRIPT_ESCAPED) >= 3  # node label, node title, table
    job_page = admin_client.get(job_url(steps[-1]))
    assert b"<script>alert" not in job_page.content
    assert SCRIPT_ESCAPED in job_page.content


def test_a_huge_workflow_gets_a_table_per_layer_instead_of_the_drawing(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_graph, "DRAW_LIMIT", 3)
    monkeypatch.setattr(workflow_admin, "TABLE_LIMIT", 2)
    workflow_id, _steps = a_chord(4)

    page = admin_client.get(page_url(workflow_id))

    assert page.status_code == 200
    content = page.content.decode()
    assert "leasejobs-graph" not in content
    assert "too many to draw" in content
    assert "leasejobs-layers" in content
    assert "and 3 more steps" in content


# --------------------------------------------------------------------------- actions


@pytest.mark.parametrize("action", ["cancel_workflows", "retry_failed"])
def test_actions_without_the_permission_are_not_offered_and_do_not_run(action: str) -> None:
    workflow_id, steps = a_chord(2, failing=True)
    run_jobs()
    before = list(Job.objects.filter(pk__in=steps).order_by("id").values())
    client = client_for(staff_user("view_workflow", "view_job"))

    assert action_names(client.get(WORKFLOWS)) == []
    response = post_action(client, action, [workflow_id])
    assert response.status_code in (200, 302, 403)

    page = client.get(page_url(workflow_id))
    assert page.status_code == 200
    assert b"Cancel workflow" not in page.content
    assert client.post(f"{WORKFLOWS}{workflow_id}/cancel/").status_code == 403
    assert client.post(f"{WORKFLOWS}{workflow_id}/retry/").status_code == 403
    assert list(Job.objects.filter(pk__in=steps).order_by("id").values()) == before
    assert not LogEntry.objects.exists()


def test_cancel_workflow_with_the_permission(admin_client: Client) -> None:
    workflow_id, steps = a_chord(3)
    _other, other_steps = a_chord(2)
    client = client_for(staff_user("view_workflow", "cancel_workflow"))

    assert action_names(client.get(WORKFLOWS)) == ["cancel_workflows", "retry_failed"]
    response = post_action(client, "cancel_workflows", [workflow_id])

    assert response.status_code == 302
    assert messages_of(response) == [
        "Cancelled 1 workflow: 4 steps cancelled, 0 running steps asked to stop."
    ]
    assert statuses(steps) == [JobStatus.CANCELLED] * 4
    assert JobStatus.CANCELLED not in statuses(other_steps)
    [entry] = LogEntry.objects.filter(action_flag=CHANGE)
    assert entry.object_id == str(workflow_id)


def test_retry_failed_steps_with_the_permission() -> None:
    workflow_id, steps = a_chord(2, failing=True)
    run_jobs()
    assert statuses(steps)[0] == JobStatus.FAILED
    assert statuses(steps)[-1] != JobStatus.SUCCEEDED
    client = client_for(staff_user("view_workflow", "cancel_workflow"))

    response = post_action(client, "retry_failed", [workflow_id])

    assert response.status_code == 302
    [message] = messages_of(response)
    assert message == "Retried 2 failed steps in 1 workflow."
    assert statuses(steps) == [JobStatus.PENDING, JobStatus.SUCCEEDED, JobStatus.WAITING]


def test_the_page_buttons_cancel_with_the_permission() -> None:
    workflow_id, steps = a_chord(2)
    client = client_for(staff_user("view_workflow", "cancel_workflow"))

    page = client.get(page_url(workflow_id))
    assert b"Cancel workflow" in page.content
    assert b"Retry failed steps" in page.content
    assert client.get(f"{WORKFLOWS}{workflow_id}/cancel/").status_code == 405
    response = client.post(f"{WORKFLOWS}{workflow_id}/cancel/")

    assert response.status_code == 302
    assert response["Location"] == page_url(workflow_id)
    assert statuses(steps) == [JobStatus.CANCELLED] * 3
    retried = client.post(f"{WORKFLOWS}{workflow_id}/retry/")
    assert messages_of(retried)[-1] == "Retried 3 failed steps in 1 workflow."


def test_the_page_buttons_need_the_csrf_token() -> None:
    workflow_id, steps = a_chord(2)
    user = staff_user("view_workflow", "cancel_workflow")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(f"{WORKFLOWS}{workflow_id}/cancel/").status_code == 403
    assert JobStatus.CANCELLED not in statuses(steps)


def test_workflows_cannot_be_added_changed_or_deleted(admin_client: Client) -> None:
    workflow_id, _steps = a_chord(2)
    assert admin_client.get(f"{WORKFLOWS}add/").status_code == 403
    assert admin_client.get(f"{WORKFLOWS}{workflow_id}/delete/").status_code == 403
    assert b'name="_save"' not in admin_client.get(page_url(workflow_id)).content


# --------------------------------------------------------------------------- the job page


def test_a_steps_page_shows_its_workflow_parents_and_children(admin_client: Client) -> None:
    workflow_id, steps = a_chord(3)
    run_jobs(max_jobs=1)  # the first member succeeded

    callback = admin_client.get(job_url(steps[-1])).content.decode()
    assert f'href="{page_url(workflow_id)}"' in callback
    parents = re.search(
        r'field-parents_display.*?<ul class="leasejobs-relatives">(.*?)</ul>', callback, re.S
    )
    assert parents, "no parents on the page"
    assert re.findall(r'href="([^"]+)"', parents[1]) == [job_url(i) for i in steps[:-1]]
    assert "leasejobs-status-succeeded" in parents[1]
    assert "leasejobs-status-pending" in parents[1]

    member = admin_client.get(job_url(steps[0])).content.decode()
    children = re.search(
        r'field-children_display.*?<ul class="leasejobs-relatives">(.*?)</ul>', member, re.S
    )
    assert children, "no children on the page"
    assert re.findall(r'href="([^"]+)"', children[1]) == [job_url(steps[-1])]
    assert "leasejobs-status-waiting" in children[1]


def test_a_plain_jobs_page_has_no_workflow_section(admin_client: Client) -> None:
    job_id = int(add.enqueue(1, 2).id)
    content = admin_client.get(job_url(job_id)).content
    assert b"field-parents_display" not in content
    assert b"field-workflow_link" not in content


def test_a_steps_page_reads_parents_and_children_with_one_query_each(
    admin_client: Client,
) -> None:
    _small, small_steps = a_chord(2)
    _big, big_steps = a_chord(30)
    admin_client.get(job_url(small_steps[-1]))  # warm up
    with CaptureQueriesContext(connection) as few:
        admin_client.get(job_url(small_steps[-1]))
    with CaptureQueriesContext(connection) as many:
        admin_client.get(job_url(big_steps[-1]))
    assert len(many) == len(few)


# --------------------------------------------------------------------------- leasejobs_status


def test_leasejobs_status_counts_waiting_steps() -> None:
    a_chord(3)
    a_chord(2)
    out = StringIO()
    call_command("leasejobs_status", "--json", stdout=out)
    data = json.loads(out.getvalue())
    [default] = [q for q in data["queues"] if q["queue"] == "default"]
    assert default["waiting"] == 2
    assert default["ready"] == 5
    assert data["totals"]["waiting"] == 2

    table = StringIO()
    call_command("leasejobs_status", stdout=table)
    lines = table.getvalue().splitlines()
    assert lines[0].split()[-1] == "waiting"
    [total] = [line for line in lines if line.startswith("all ")]
    assert total.split()[-1] == "2"
