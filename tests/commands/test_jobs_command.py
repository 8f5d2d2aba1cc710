"""``manage.py leasejobs_jobs ACTION``: every bulk action on the jobs matching its
filters, the count it prints, ``--dry-run``, and the errors that name the fix."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.models import Job
from tests.conftest import RunManage
from tests.helpers_leases import make_job, make_jobs

pytestmark = pytest.mark.django_db

WORKER = "host-c:1:live"


def jobs_command(*args: str) -> str:
    out = StringIO()
    call_command("leasejobs_jobs", *args, stdout=out)
    return out.getvalue().strip()


def statuses(ids: list[int]) -> set[str]:
    return set(Job.objects.filter(pk__in=ids).values_list("status", flat=True))


def running_job(queue: str = "high") -> leases.ClaimedJob:
    job = make_job(queue=queue, priority=100)
    (claimed,) = leases.claim(WORKER, limit=1, lease_duration=600, queues=[queue])
    assert claimed.id == job.pk
    return claimed


def test_retry_prints_the_count_it_acted_on() -> None:
    dead = make_jobs(5, status="dead", queue="high")
    failed = make_jobs(2, status="failed", queue="high")
    others = make_jobs(3, status="dead", queue="low")
    live = running_job()
    assert jobs_command("retry", "--queue", "high", "--batch-size", "2") == "7 jobs retried"
    assert statuses(dead + failed) == {"pending"}
    assert statuses(others) == {"dead"}
    assert Job.objects.get(pk=live.id).status == "running"


def test_requeue_dead_by_task_and_state() -> None:
    dead = make_jobs(2, status="dead")
    make_jobs(2, status="dead", task_path="tests.tasks.carry")
    out = jobs_command("requeue-dead", "--task", "tests.tasks.add", "--state", "dead")
    assert out == "2 jobs requeued"
    assert statuses(dead) == {"pending"}
    assert Job.objects.filter(status="dead").count() == 2


def test_cancel_says_how_many_were_running() -> None:
    pending = make_jobs(3, queue="high")
    live = running_job()
    out = jobs_command("cancel", "--queue", "high")
    assert out == (
        "4 jobs cancelled (1 of them running: cancel requested, their workers stop them)"
    )
    assert statuses(pending) == {"cancelled"}
    job = Job.objects.get(pk=live.id)
    assert (job.status, job.locked_by, job.cancel_requested) == ("running", WORKER, True)


def test_set_queue_and_set_priority() -> None:
    pending = make_jobs(3, queue="high")
    live = running_job()
    assert jobs_command("set-queue", "low", "--queue", "high") == "3 jobs moved"
    assert set(Job.objects.filter(pk__in=pending).values_list("queue", flat=True)) == {"low"}
    assert Job.objects.get(pk=live.id).queue == "high"
    assert jobs_command("set-priority", "-5", "--queue", "low") == "3 jobs re-prioritised"
    assert set(Job.objects.filter(pk__in=pending).values_list("priority", flat=True)) == {-5}


def test_delete_finished_with_a_search() -> None:
    wanted = [make_job(status="succeeded", kwargs={"customer_id": 4711}).pk for _ in range(3)]
    kept = make_job(status="succeeded", kwargs={"customer_id": 1}).pk
    pending = make_job(kwargs={"customer_id": 4711}).pk
    out = jobs_command("delete-finished", "--search", "kwargs.customer_id:4711")
    assert out == "3 jobs deleted"
    assert not Job.objects.filter(pk__in=wanted).exists()
    assert Job.objects.filter(pk__in=[kept, pending]).count() == 2


def test_since_and_until_take_an_age_or_a_time() -> None:
    old = make_job(status="dead").pk
    new = make_job(status="dead").pk
    Job.objects.filter(pk=old).update(enqueued_at=Now() - timedelta(days=3))
    assert jobs_command("retry", "--since", "1d") == "1 job retried"
    assert statuses([new]) == {"pending"}
    assert jobs_command("retry", "--until", "2000-01-01") == "0 jobs retried"
    assert jobs_command("retry", "--until", "2h") == "1 job retried"
    assert statuses([old]) == {"pending"}


def test_a_dry_run_counts_and_changes_nothing() -> None:
    dead = make_jobs(4, status="dead", queue="high")
    make_jobs(2, queue="high")
    out = jobs_command("retry", "--queue", "high", "--dry-run")
    assert out == "dry run: 4 jobs would be retried (of 6 matching backend default, queue high)"
    assert statuses(dead) == {"dead"}


def test_a_dedup_key_held_is_said_not_a_crash() -> None:
    make_job(key="k")
    make_job(key="k", status="dead")
    assert jobs_command("retry", "--state", "dead") == (
        "0 jobs retried; 1 left as they were: another active job holds their dedup key"
    )


def test_without_a_filter_it_asks_for_one_or_all() -> None:
    dead = make_jobs(2, status="dead")
    with pytest.raises(CommandError, match=r"Give at least one filter .* or --all"):
        jobs_command("retry")
    assert statuses(dead) == {"dead"}
    assert jobs_command("retry", "--all") == "2 jobs retried"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "--search", "args.first:1"], "starts with a position"),
        (["retry", "--since", "2024-01-02", "--until", "2024-01-01"], "must be before until"),
        (["set-queue", "nowhere", "--queue", "high"], "No queue 'nowhere' in TASKS"),
        (["retry", "--queue", "high", "--backend", "nope"], "No task backend 'nope'"),
    ],
)
def test_bad_input_names_the_fix(args: list[str], message: str) -> None:
    make_jobs(1, status="dead", queue="high")
    with pytest.raises(CommandError, match=message):
        jobs_command(*args)
    assert Job.objects.filter(status="dead").count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "--state", "dying"], "invalid choice: 'dying'"),
        (["retry", "--since", "yesterday"], "expected an ISO date or time"),
        (["set-priority", "500", "--all"], "expected a priority from -100 to 100"),
        (["retry", "--queue", "high", "--batch-size", "0"], "expected a whole number >= 1"),
        (["explode", "--all"], "invalid choice: 'explode'"),
    ],
)
def test_a_malformed_argument_is_a_usage_error(
    run_manage: RunManage, args: list[str], message: str
) -> None:
    result = run_manage(["leasejobs_jobs", *args])
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
