"""``leases.due_now``: whether a due job is pending, read without a lock, on every database.

A ``--burst`` worker asks it after an empty claim: the claim reads past rows another
transaction holds locked (``SKIP LOCKED``), this lookup does not.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.limits import key_group
from django_leasejobs.models import Job, Queue
from tests.helpers_leases import LEASE, locked_elsewhere, make_job

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE_FORMS = [None, ["default"], ["default", "other"]]
LEASE_AHEAD = timedelta(seconds=LEASE)


def later(seconds: float, **fields: object) -> Job:
    job = make_job(**fields)
    Job.objects.filter(pk=job.pk).update(run_after=Now() + timedelta(seconds=seconds))
    return job


@pytest.mark.parametrize("queues", QUEUE_FORMS, ids=str)
def test_only_a_due_pending_job_of_either_lane_counts(queues: list[str] | None) -> None:
    assert not leases.due_now("default", queues)
    later(100)
    later(100, flow_group=key_group("k"), concurrency_limit=1)
    assert not leases.due_now("default", queues)
    flow = make_job(flow_group=key_group("k"), concurrency_limit=1)
    assert leases.due_now("default", queues)
    flow.delete()
    make_job(status="running", locked_by="w", attempt=1, locked_until=Now() + LEASE_AHEAD)
    assert not leases.due_now("default", queues)
    make_job()
    assert leases.due_now("default", queues)


@pytest.mark.parametrize("queues", QUEUE_FORMS, ids=str)
def test_paused_queues_other_backends_and_skipped_tasks_do_not_count(
    queues: list[str] | None,
) -> None:
    make_job(backend="other", queue="other")
    make_job(queue="default", flow_group=key_group("k"), concurrency_limit=1)
    Queue.objects.create(backend="default", name="default", paused=True)
    assert not leases.due_now("default", queues)
    make_job(queue="other", task_path="app.tasks.new")
    assert not leases.due_now("default", queues, skip_tasks=["app.tasks.new"])
    assert leases.due_now("default", queues) is (queues != ["default"])
    Queue.objects.filter(name="default").update(paused=False)
    assert leases.due_now("default", queues, skip_tasks=["app.tasks.new"])


def test_no_queue_is_never_due() -> None:
    make_job()
    assert not leases.due_now("default", [])


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no row lock another session could hold (it serialises writers)",
)
def test_a_row_the_claim_reads_past_is_due_all_the_same() -> None:
    job = make_job()
    with locked_elsewhere(job.pk):
        assert leases.claim("w1", limit=5, lease_duration=LEASE) == []
        assert leases.due_now("default", None)
        assert leases.due_now("default", ["default"])
    assert [claimed.id for claimed in leases.claim("w1", limit=5, lease_duration=LEASE)] == [job.pk]
