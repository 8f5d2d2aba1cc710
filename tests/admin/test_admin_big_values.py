"""Big values stay out of pages (issue 28): the job list and page show at most
``big_values.SHOWN`` characters of each argument list, result, checkpoint, error,
traceback and progress message, with the value's size and a permission-gated link that
downloads it whole; the pages never read such a value whole from the database.

The 50 MB job is 50 MiB of argument on PostgreSQL and SQLite; on MySQL/MariaDB the
server's ``max_allowed_packet`` bounds one statement, so there it is the largest that
fits (1 MiB under the packet: 15 MiB with MariaDB's default of 16 MiB).

No timing is asserted here (speed targets live in bench/admin_big_values.py).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.template.defaultfilters import filesizeformat
from django.test import Client
from django.urls import reverse

from django_leasejobs import leases
from django_leasejobs.admin import big_values
from django_leasejobs.models import Job, JobAttempt
from tests.admin.test_admin import (
    CHANGELIST,
    SCRIPT,
    SCRIPT_ESCAPED,
    WORKER,
    assert_escaped,
    change_url,
    claim,
    client_for,
    enqueue,
    error,
    staff_user,
)
from tests.tasks import add, configured

pytestmark = pytest.mark.django_db

MiB = 1024 * 1024
PAGE_LIMIT = 200_000
"""The goal: a job page (or list) with a 50 MB value is under 200 kB."""
READ_LIMIT = 200_000
"""What the database may send Django for such a page (it sends 4 KiB per value)."""


def big_size() -> int:
    """50 MiB, or on MySQL/MariaDB what one statement may carry (1 MiB under
    ``max_allowed_packet``)."""
    if connection.vendor != "mysql":
        return 50 * MiB
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        (packet,) = cursor.fetchone()
    return min(50 * MiB, int(packet) - MiB)


def download_url(job_id: int, name: str) -> str:
    return reverse("admin:django_leasejobs_job_download", args=[job_id, name])


def attempt_download_url(job_id: int, attempt_id: int, name: str) -> str:
    return reverse("admin:django_leasejobs_job_attempt_download", args=[job_id, attempt_id, name])


def size_shown(size: int) -> bytes:
    """How the page writes a size ("50.0 MB"), as HTML."""
    return html.escape(str(filesizeformat(size))).encode()


@pytest.fixture
def read_bytes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The bytes the database sends Django while the test runs: the text and binary
    values of every row fetched (8 for any other value), counted at Django's cursor."""
    counted = [0]

    def count(rows: Any) -> Any:
        for row in rows or ():
            for value in row:
                counted[0] += len(value) if isinstance(value, str | bytes | memoryview) else 8
        return rows

    def fetchone(self: CursorWrapper) -> Any:
        row = self.cursor.fetchone()
        count([row] if row is not None else [])
        return row

    def fetchmany(self: CursorWrapper, size: int = 0) -> Any:
        return count(self.cursor.fetchmany(size) if size else self.cursor.fetchmany())

    def fetchall(self: CursorWrapper) -> Any:
        return count(self.cursor.fetchall())

    monkeypatch.setattr(CursorWrapper, "fetchone", fetchone, raising=False)
    monkeypatch.setattr(CursorWrapper, "fetchmany", fetchmany, raising=False)
    monkeypatch.setattr(CursorWrapper, "fetchall", fetchall, raising=False)
    yield counted


@pytest.fixture
def big() -> str:
    return "x" * big_size()


@pytest.fixture
def big_job(big: str) -> int:
    """A job (enqueued as any other) whose one argument is the 50 MB string."""
    return int(add.enqueue(big, 1).id)


# --------------------------------------------------------------------------- the goal


def test_the_page_of_a_job_with_a_50_mb_argument_is_small(
    admin_client: Client, big_job: int, big: str, read_bytes: list[int]
) -> None:
    response = admin_client.get(change_url(big_job))
    assert response.status_code == 200
    content = response.content
    assert len(content) < PAGE_LIMIT, len(content)
    size = len(json.dumps([big, 1]))
    assert size_shown(size) in content  # "50.0 MB"
    assert b", showing the first " + size_shown(big_values.SHOWN) in content
    assert download_url(big_job, "args").encode() in content
    # The beginning of the value is shown, cut
    assert b"[&quot;" + b"x" * 100 in content
    # What fits is shown whole, without a link
    assert download_url(big_job, "kwargs").encode() not in content
    assert read_bytes[0] < READ_LIMIT, read_bytes[0]


def test_the_download_is_the_whole_value(
    admin_client: Client, big_job: int, big: str, read_bytes: list[int]
) -> None:
    response = admin_client.get(download_url(big_job, "args"))
    assert read_bytes[0] > len(big)  # the counter sees a value read whole
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="job-{big_job}-args.json"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert json.loads(response.content) == [big, 1]


def test_the_job_list_with_a_50_mb_job_is_small(
    admin_client: Client, big_job: int, read_bytes: list[int]
) -> None:
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    assert big_job in {job.pk for job in response.context["cl"].result_list}
    assert len(response.content) < PAGE_LIMIT
    assert read_bytes[0] < READ_LIMIT, read_bytes[0]


# --------------------------------------------------------------------------- every value


def test_result_checkpoint_error_and_traceback_are_cut_with_their_size_and_download(
    admin_client: Client, read_bytes: list[int]
) -> None:
    result = {"rows": ["r" * 100] * 2000}  # about 200 KB
    checkpoint = list(range(50_000))
    job_id = enqueue(configured, "small")
    c = claim(job_id)
    leases.save_checkpoint(c.id, c.attempt, WORKER, checkpoint)
    long_traceback = "Traceback (most recent call last):\n" + "  frame\n" * 10_000
    leases.fail(c.id, c.attempt, WORKER, error=error(tb=long_traceback), retry_delay=0)
    c = claim(job_id)
    leases.complete(c.id, c.attempt, WORKER, result=result)
    long_error = "E" * 100_000  # more than a worker stores: an error written otherwise
    Job.objects.filter(pk=job_id).update(last_error=long_error)
    attempt = JobAttempt.objects.get(job_id=job_id)
    JobAttempt.objects.filter(pk=attempt.pk).update(error_message=long_error)
    read_bytes[0] = 0

    content = admin_client.get(change_url(job_id)).content
    assert len(content) < PAGE_LIMIT
    assert read_bytes[0] < READ_LIMIT, read_bytes[0]
    links = {
        "result": download_url(job_id, "result"),
        "checkpoint": download_url(job_id, "checkpoint"),
        "last_error": download_url(job_id, "last_error"),
        "traceback": attempt_download_url(job_id, attempt.pk, "traceback"),
        "error_message": attempt_download_url(job_id, attempt.pk, "error_message"),
    }
    for name, url in links.items():
        assert url.encode() in content, name
    assert download_url(job_id, "args").encode() not in content  # it fits

    downloads = {name: admin_client.get(url) for name, url in links.items()}
    assert json.loads(downloads["result"].content) == result
    assert json.loads(downloads["checkpoint"].content) == checkpoint
    assert downloads["last_error"].content.decode() == long_error
    assert downloads["error_message"].content.decode() == long_error
    stored = JobAttempt.objects.get(pk=attempt.pk).traceback
    assert len(stored) > big_values.SHOWN
    assert downloads["traceback"].content.decode() == stored
    assert downloads["traceback"]["Content-Type"] == "text/plain; charset=utf-8"
    assert downloads["traceback"]["Content-Disposition"] == (
        f'attachment; filename="job-{job_id}-attempt-1-traceback.txt"'
    )
    # Each size shown is the size of its download
    for name, response in downloads.items():
        assert response.status_code == 200, name
        assert size_shown(len(response.content)) in content, name


def test_a_value_that_fits_is_shown_whole_without_a_link(admin_client: Client) -> None:
    # ["xx…x"] is the same JSON text on every database: SHOWN characters exactly
    fits = enqueue(add, "x" * (big_values.SHOWN - 4))
    longer = enqueue(add, "x" * (big_values.SHOWN - 3))
    page = admin_client.get(change_url(fits)).content
    assert download_url(fits, "args").encode() not in page
    assert b"showing the first" not in page
    assert b"&quot;" + b"x" * (big_values.SHOWN - 4) + b"&quot;" in page  # indented as before
    page = admin_client.get(change_url(longer)).content
    assert download_url(longer, "args").encode() in page
    assert b"x" * (big_values.SHOWN - 2) not in page


def test_non_ascii_sizes_are_bytes(admin_client: Client) -> None:
    job_id = enqueue(add, "é" * 10_000)
    content = admin_client.get(change_url(job_id)).content
    download = admin_client.get(download_url(job_id, "args"))
    assert json.loads(download.content) == ["é" * 10_000]
    assert size_shown(len(download.content)) in content


def test_the_progress_message_is_cut_in_the_list_and_on_the_page(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every database stores 255 characters of a progress message: show fewer here.
    monkeypatch.setattr(big_values, "SHOWN", 20)
    job_id = enqueue(add)
    c = claim(job_id)
    message = "step 1 of 2: " + "m" * 200
    leases.set_progress(c.id, c.attempt, WORKER, leases.Progress(0.5, message))
    url = download_url(job_id, "progress_message").encode()
    for page in (
        admin_client.get(CHANGELIST).content,
        admin_client.get(change_url(job_id)).content,
    ):
        assert message[:20].encode() + "…".encode() in page
        assert message[:21].encode() not in page
        assert url in page
    assert admin_client.get(url.decode()).content.decode() == message


# --------------------------------------------------------------------------- safety


def test_a_cut_value_is_escaped(admin_client: Client) -> None:
    job_id = enqueue(add, SCRIPT + "x" * 10_000)
    response = admin_client.get(change_url(job_id))
    assert_escaped(response, SCRIPT_ESCAPED)
    assert download_url(job_id, "args").encode() in response.content
    download = admin_client.get(download_url(job_id, "args"))
    assert download["Content-Type"] == "application/json; charset=utf-8"
    assert download["Content-Disposition"].startswith("attachment;")
    assert json.loads(download.content) == [SCRIPT + "x" * 10_000]


def test_downloads_need_the_view_permission(big_job: int) -> None:
    url = download_url(big_job, "kwargs")
    viewer = client_for(staff_user("view_job", username="viewer"))
    assert viewer.get(url).status_code == 200
    other = client_for(staff_user("view_worker", username="other"))
    response = other.get(url)
    assert response.status_code == 403
    assert b"x" * 100 not in other.get(download_url(big_job, "args")).content
    anonymous = Client().get(url)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith(reverse("admin:login") + "?next=")


def test_attempt_downloads_need_the_view_permission() -> None:
    job_id = enqueue(add)
    c = claim(job_id)
    leases.fail(c.id, c.attempt, WORKER, error=error(), retry_delay=None)
    attempt = JobAttempt.objects.get(job_id=job_id)
    url = attempt_download_url(job_id, attempt.pk, "traceback")
    assert client_for(staff_user("view_job", username="viewer")).get(url).status_code == 200
    assert client_for(staff_user("view_worker", username="other")).get(url).status_code == 403
    assert Client().get(url).status_code == 302


def test_unknown_jobs_fields_and_values_are_404(admin_client: Client) -> None:
    job_id = enqueue(add)
    other = enqueue(add)
    c = claim(job_id)
    leases.fail(c.id, c.attempt, WORKER, error=error(), retry_delay=None)
    attempt = JobAttempt.objects.get(job_id=job_id)
    missing = [
        download_url(other + 1000, "args"),  # no such job
        download_url(job_id, "task_path"),  # not a value the pages cut
        download_url(job_id, "locked_by"),
        download_url(job_id, "trace_context"),
        download_url(job_id, "nonsense"),
        download_url(job_id, "result"),  # NULL
        download_url(job_id, "checkpoint"),  # NULL
        attempt_download_url(other, attempt.pk, "traceback"),  # another job's attempt
        attempt_download_url(job_id, attempt.pk + 1000, "traceback"),
        attempt_download_url(job_id, attempt.pk, "worker"),
    ]
    for url in missing:
        assert admin_client.get(url).status_code == 404, url
    assert admin_client.get(download_url(job_id, "args")).status_code == 200
