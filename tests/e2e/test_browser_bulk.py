"""The job list's bulk action in a real browser, at 1366 px with the navigation sidebar
open and on a 390 px phone: filter the list, follow *Retry* above it, read the exact count
on the confirmation page (which fits the window), confirm, and find the jobs retried and
one admin log entry.

The browser fixtures are those of tests/e2e/test_browser.py (the system's Chromium;
without it the tests are skipped, except under CI, ``CI=true``, where they fail).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model

from django_leasejobs.models import Job
from tests.browser import PageProblems, log_in, page_overflow
from tests.e2e.test_browser import browser, phone, shots  # noqa: F401  (fixtures)
from tests.helpers_leases import make_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "browser-bulk-password"


@pytest.mark.parametrize("device", ["browser", "phone"])
def test_the_bulk_retry_confirms_the_exact_count_and_fits_the_window(
    live_server: Any,
    request: pytest.FixtureRequest,
    device: str,
    shots: Path,  # noqa: F811
) -> None:
    context = request.getfixturevalue(device)
    get_user_model().objects.create_superuser("boss", "boss@example.com", PASSWORD)
    dead = make_jobs(57, status="dead", queue="mail")  # more than one page of the list
    make_jobs(3, status="succeeded", queue="mail")
    others = make_jobs(4, status="dead", queue="default")
    page = context.new_page()
    problems = PageProblems(page)
    log_in(page, live_server.url, "boss", PASSWORD)
    page.goto(f"{live_server.url}/admin/django_leasejobs/job/?queue=mail")
    page.locator("#lj-bulk").get_by_role("link", name="Retry", exact=True).click()
    page.wait_for_url(re.compile(r"/bulk/retry/\?queue=mail$"))
    assert page.locator("#lj-bulk-count").inner_text() == "57"
    assert "queue: mail" in page.inner_text("#lj-bulk-filter")
    assert "3 other matching jobs (of 60) stay as they are." in page.inner_text("#lj-bulk-summary")
    assert page_overflow(page) == 0
    button = page.locator("#lj-bulk-confirm")
    width = page.viewport_size["width"] if page.viewport_size else 0
    assert button.evaluate("b => b.getBoundingClientRect().right") <= width
    page.screenshot(path=shots / f"bulk_confirmation_{device}.png", full_page=True)
    button.click()
    page.wait_for_selector(".messagelist .success")
    assert "57 jobs retried" in page.inner_text(".messagelist .success")
    assert page.url.endswith("/admin/django_leasejobs/job/?queue=mail")
    assert set(Job.objects.filter(pk__in=dead).values_list("status", flat=True)) == {"pending"}
    assert set(Job.objects.filter(pk__in=others).values_list("status", flat=True)) == {"dead"}
    (entry,) = LogEntry.objects.filter(object_id__isnull=True)
    assert entry.change_message == "Bulk retry of every job matching queue: mail: 57 jobs retried."
    assert problems.items == []
