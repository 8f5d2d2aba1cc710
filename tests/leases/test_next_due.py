"""``leases.seconds_to_next_due``: when an idle listening worker's next job comes due
(PostgreSQL; the other databases' workers poll and get 0)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.limits import key_group
from django_leasejobs.models import Job, Queue
from tests.helpers_leases import make_job

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE_FORMS = [None, ["default"], ["default", "other"]]


def due_in(queues: list[str] | None) -> float | None:
    return leases.seconds_to_next_due("default", queues)


def later(seconds: float, **fields: object) -> Job:
    job = make_job(**fields)
    Job.objects.filter(pk=job.pk).update(run_after=Now() + timedelta(seconds=seconds))
    return job


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    if connection.vendor != "postgresql":
        assert leases.seconds_to_next_due("default", None) == 0.0  # they poll
        pytest.skip("PostgreSQL only: workers elsewhere poll")


@pytest.mark.parametrize("queues", QUEUE_FORMS, ids=str)
def test_nothing_pending_is_none_and_a_later_job_gives_its_wait(queues: list[str] | None) -> None:
    assert due_in(queues) is None
    later(100)
    wait = due_in(queues)
    assert wait is not None and 90 < wait <= 100
    later(50, flow_group=key_group("k"), concurrency_limit=1)
    wait = due_in(queues)
    assert wait is not None and 40 < wait <= 50


@pytest.mark.parametrize("queues", QUEUE_FORMS, ids=str)
def test_a_due_job_of_either_lane_is_due_now(queues: list[str] | None) -> None:
    later(100)
    make_job(flow_group=key_group("k"), concurrency_limit=1)
    assert due_in(queues) == 0.0
    Job.objects.filter(flow_group__isnull=False).delete()
    make_job()
    assert due_in(queues) == 0.0


@pytest.mark.parametrize("queues", QUEUE_FORMS, ids=str)
def test_a_paused_queue_is_left_out(queues: list[str] | None) -> None:
    make_job()
    make_job(flow_group=key_group("k"), concurrency_limit=1)
    Queue.objects.create(backend="default", name="default", paused=True)
    assert due_in(queues) is None
    later(30, queue="other")
    wait = due_in(queues)
    if queues == ["default"]:
        assert wait is None
    else:
        assert wait is not None and 20 < wait <= 30


def test_another_backends_jobs_do_not_count() -> None:
    make_job(backend="other")
    assert due_in(None) is None


@pytest.mark.parametrize("queues", QUEUE_FORMS, ids=str)
def test_the_jobs_of_skipped_tasks_do_not_count(queues: list[str] | None) -> None:
    """A worker that stands aside from a task it does not know would not claim its due
    jobs: they must not make its next look come at once."""
    make_job(task_path="app.tasks.new")
    make_job(task_path="app.tasks.new", flow_group=key_group("k"), concurrency_limit=1)
    assert due_in(queues) == 0.0
    skipped = leases.seconds_to_next_due("default", queues, skip_tasks=["app.tasks.new"])
    assert skipped is None
    later(100)
    skipped = leases.seconds_to_next_due("default", queues, skip_tasks=["app.tasks.new"])
    assert skipped is not None and 90 < skipped <= 100
