"""An operator's cancel and retry write to the database of the job's backend.

``leases.cancel`` and ``leases.retry`` resolve the backend's ``DATABASE`` option
whoever calls them: a shell, a command, the admin (which reads jobs through its own
queryset's database). ``leasejobs_mirror`` (tests/settings.py) is a second alias of the
test database, so the statements show on the alias they went through.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasejobs import leases
from django_leasejobs.conf import BACKEND_PATH
from django_leasejobs.models import Job, JobStatus

from ..helpers_leases import make_job

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "leasejobs_mirror"])

TASKS = {
    "default": {"BACKEND": BACKEND_PATH, "QUEUES": ["default"], "OPTIONS": {}},
    "elsewhere": {
        "BACKEND": BACKEND_PATH,
        "QUEUES": ["default"],
        "OPTIONS": {"DATABASE": "leasejobs_mirror"},
    },
}


def writes(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith("UPDATE")
    ]


def through(alias: str, call: Any) -> tuple[Any, list[str], list[str]]:
    """``call()``'s result and the UPDATEs it sent through ``alias`` and through default."""
    with (
        CaptureQueriesContext(connections[alias]) as there,
        CaptureQueriesContext(connections["default"]) as default,
    ):
        result = call()
    return result, writes(there), writes(default)


@override_settings(TASKS=TASKS)
def test_cancel_and_retry_write_through_the_backends_database() -> None:
    pending = make_job(backend="elsewhere")
    result, there, default = through(
        "leasejobs_mirror", lambda: leases.cancel(pending.pk, backend="elsewhere")
    )
    assert result == leases.CancelResult.CANCELLED
    assert len(there) == 1 and default == []

    failed = make_job(backend="elsewhere", status=JobStatus.FAILED, attempt=1, max_attempts=1)
    result, there, default = through(
        "leasejobs_mirror", lambda: leases.retry(failed.pk, backend="elsewhere")
    )
    assert result == leases.RetryResult.RETRIED
    assert len(there) == 1 and default == []
    assert Job.objects.get(pk=failed.pk).status == JobStatus.PENDING


@override_settings(TASKS=TASKS)
def test_an_explicit_alias_wins_and_the_default_backend_uses_default() -> None:
    job = make_job()
    _, there, default = through("leasejobs_mirror", lambda: leases.cancel(job.pk))
    assert there == [] and len(default) == 1

    other = make_job(backend="elsewhere")
    _, there, default = through(
        "leasejobs_mirror", lambda: leases.cancel(other.pk, backend="elsewhere", using="default")
    )
    assert there == [] and len(default) == 1


def test_a_backend_that_is_not_configured_is_a_clear_error() -> None:
    job = make_job(backend="gone")
    with pytest.raises(ValueError, match=r"TASKS\['gone'\] is not a django-leasejobs backend"):
        leases.cancel(job.pk, backend="gone")
    assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING


@override_settings(TASKS=TASKS)
def test_admin_actions_write_through_the_jobs_backend_database(admin_client: Any) -> None:
    dead = make_job(backend="elsewhere", status=JobStatus.DEAD, attempt=1, stall_count=3)
    pending = make_job(backend="elsewhere")
    changelist = reverse("admin:django_leasejobs_job_changelist")

    for action, job in (("requeue_dead", dead), ("cancel_jobs", pending)):
        with (
            CaptureQueriesContext(connections["leasejobs_mirror"]) as there,
            CaptureQueriesContext(connections["default"]) as default,
        ):
            response = admin_client.post(
                changelist, {"action": action, "_selected_action": [job.pk]}, follow=True
            )
        assert response.status_code == 200
        assert len(writes(there)) == 1, (action, writes(there))
        assert not any("leasejobs_job" in sql for sql in writes(default)), writes(default)

    assert Job.objects.get(pk=dead.pk).status == JobStatus.PENDING
    assert Job.objects.get(pk=pending.pk).status == JobStatus.CANCELLED
