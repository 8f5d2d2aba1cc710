"""Rows for the alert tests, placed in time by the database's clock (never Python's)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.utils.timezone import now

from django_leasejobs import leases
from django_leasejobs.alert_spec import AlertRule, parse_alert_rules
from django_leasejobs.functions import DatabaseNow
from django_leasejobs.models import Job, JobStatus, Worker

TASK = "tests.tasks.add"


def ago(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(
        DatabaseNow() - Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def rule(**entry: Any) -> AlertRule:
    """One rule parsed from ``entry`` (with a name), failing on any problem."""
    entry.setdefault("name", "r")
    [parsed], problems = parse_alert_rules([entry])
    assert problems == []
    return parsed


def jobs(
    count: int,
    status: str,
    *,
    queue: str = "default",
    task: str = TASK,
    finished_ago: float | None = None,
    ready_ago: float | None = None,
) -> None:
    """``count`` jobs of ``status``: finished ``finished_ago`` seconds ago, or (pending)
    due ``ready_ago`` seconds ago (a negative number: not due yet). A finished one is
    also counted in the rollup table, in the minute it finished, as a worker counts it."""
    # A running job needs a lease (a check constraint); no measure reads its time.
    lease = {"locked_by": "someone", "locked_until": now() + timedelta(minutes=1)}
    created = Job.objects.bulk_create(
        [
            Job(task_path=task, args=[i], queue=queue, status=status, **lease)
            if status == JobStatus.RUNNING
            else Job(task_path=task, args=[i], queue=queue, status=status)
            for i in range(count)
        ]
    )
    rows = Job.objects.filter(pk__in=[job.pk for job in created])
    if finished_ago is not None:
        rows.update(finished_at=ago(finished_ago))
        counter = leases.ENDING_COUNTERS.get(status)
        if counter is not None:
            finished = leases.database_now() - timedelta(seconds=finished_ago)
            tally = leases.Tally()
            tally.count(
                leases.RollupKey("default", leases.minute_of(finished), queue, task), counter, count
            )
            leases.add_tally(tally, using="default")
    if ready_ago is not None:
        rows.update(run_after=ago(ready_ago))


def worker(
    worker_id: str, queues: list[str], *, seen_ago: float = 0, stopped: bool = False
) -> None:
    Worker.objects.create(
        id=worker_id,
        host="h",
        pid=1,
        queues=queues,
        pool="thread",
        concurrency=1,
        state="stopped" if stopped else "running",
    )
    Worker.objects.filter(pk=worker_id).update(last_seen_at=ago(seen_ago))
