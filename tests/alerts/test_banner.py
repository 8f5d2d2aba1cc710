"""The admin's banner: firing alerts above the queue dashboard and the job list."""

from __future__ import annotations

import pytest
from django.test import Client

from django_leasejobs.alerts import state
from django_leasejobs.models import AlertState
from tests.alerts.helpers import ago, rule

pytestmark = pytest.mark.django_db

PAGES = ["/admin/django_leasejobs/job/dashboard/", "/admin/django_leasejobs/job/"]
DEAD = rule(name="dead", kind="dead_letters", threshold=1, interval=600)
BACKLOG = rule(name="backlog", kind="backlog", threshold=10, interval=600)


def banner(client: Client, page: str) -> str:
    content = client.get(page).content.decode()
    start = content.find('id="lj-alerts"')
    return "" if start < 0 else content[start : content.index("</div>", start)]


@pytest.mark.parametrize("page", PAGES)
def test_a_firing_alert_is_shown_escaped_until_it_resolves(admin_client: Client, page: str) -> None:
    assert banner(admin_client, page) == ""
    state.ensure_rows("default", [DEAD, BACKLOG], "default")
    state.fire("default", DEAD, 3, "3 dead <script>alert(1)</script>", "default")
    shown = banner(admin_client, page)
    assert "An alert is firing" in shown
    assert "<strong>dead</strong> (dead_letters)" in shown
    assert "3 dead &lt;script&gt;alert(1)&lt;/script&gt;" in shown
    assert "<script>" not in shown and "backlog" not in shown

    state.fire("default", BACKLOG, 12, "12 ready", "default")
    assert "2 alerts are firing" in banner(admin_client, page)

    state.resolve("default", DEAD, 0, "clear", "default")
    shown = banner(admin_client, page)
    assert "An alert is firing" in shown and "3 dead" not in shown and "12 ready" in shown


@pytest.mark.parametrize("page", PAGES)
def test_a_firing_alert_is_shown_for_its_interval_only(admin_client: Client, page: str) -> None:
    state.ensure_rows("default", [BACKLOG], "default")
    state.fire("default", BACKLOG, 12, "12 ready", "default")
    assert "12 ready" in banner(admin_client, page)
    AlertState.objects.filter(name="backlog").update(firing_until=ago(1))
    assert banner(admin_client, page) == ""
