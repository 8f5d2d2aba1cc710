"""``manage.py prune_jobs``: age cut-off, statuses, attempts, schedule runs, batches, dry run,
bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO
from itertools import count as counter
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings

from django_leasejobs.models import (
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    RunKind,
    Schedule,
    ScheduleRun,
)
from tests.conftest import ListHandler

# Each batch commits on its own, as in production.
DB = pytest.mark.django_db(transaction=True)

FINISHED = (JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.FAILED, JobStatus.DEAD)


# --------------------------------------------------------------------------- helpers


def make_jobs(
    status: str, count: int = 1, *, old: bool = True, backend: str = "default"
) -> list[int]:
    finished = status in FINISHED
    ids = []
    for _ in range(count):
        job = Job.objects.create(
            task_path="tests.tasks.add",
            status=status,
            backend=backend,
            locked_by="w" if status == JobStatus.RUNNING else None,
            locked_until=Now() if status == JobStatus.RUNNING else None,
            finished_at=Now() if finished else None,
        )
        ids.append(job.pk)
    if old:
        # Database clock, like the command: finished (or, for active jobs, enqueued) long ago.
        changed = Job.objects.filter(pk__in=ids).update(
            finished_at=Now() - timedelta(days=10) if finished else None,
            enqueued_at=Now() - timedelta(days=10),
        )
        assert changed == count
    return ids


def prune(*args: str) -> str:
    out = StringIO()
    call_command("prune_jobs", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def remaining(ids: list[int]) -> set[int]:
    return set(Job.objects.filter(pk__in=ids).values_list("pk", flat=True))


# --------------------------------------------------------------------------- what is deleted


@DB
def test_old_finished_jobs_go_recent_ones_stay(leasejobs_log: ListHandler) -> None:
    old = make_jobs(JobStatus.SUCCEEDED, 2) + make_jobs(JobStatus.CANCELLED, 1)
    recent = make_jobs(JobStatus.SUCCEEDED, 2, old=False) + make_jobs(
        JobStatus.CANCELLED, 1, old=False
    )

    output = prune("--older-than", "7d")

    assert "pruned finished jobs count=3" in output.splitlines()
    assert remaining(old) == set()
    assert remaining(recent) == set(recent)
    records = [r for r in leasejobs_log.records if r.getMessage() == "pruned finished jobs count=3"]
    assert len(records) == 1
    record: Any = records[0]
    assert (record.count, record.batches) == (3, 1)
    assert record.older_than == 7 * 86400
    assert sorted(record.statuses) == ["cancelled", "succeeded"]


@DB
def test_the_age_is_compared_with_the_database_clock() -> None:
    ids = make_jobs(JobStatus.SUCCEEDED, 1, old=False)
    Job.objects.filter(pk__in=ids).update(finished_at=Now() - timedelta(hours=2))
    assert "pruned finished jobs count=0" in prune("--older-than", "3h").splitlines()
    assert "pruned finished jobs count=0" in prune("--older-than", "1w").splitlines()
    assert remaining(ids) == set(ids)
    assert "pruned finished jobs count=1" in prune("--older-than", "90m").splitlines()
    assert remaining(ids) == set()


@DB
def test_pending_and_running_jobs_are_never_deleted() -> None:
    active = make_jobs(JobStatus.PENDING, 2) + make_jobs(JobStatus.RUNNING, 2)
    # Even with a stray old finished_at, an active job is not finished.
    Job.objects.filter(pk__in=active).update(finished_at=Now() - timedelta(days=30))

    assert "pruned finished jobs count=0" in prune("--older-than", "1s", "--include-failed")
    assert remaining(active) == set(active)


@DB
def test_failed_and_dead_only_with_include_failed() -> None:
    done = make_jobs(JobStatus.SUCCEEDED, 1)
    failed = make_jobs(JobStatus.FAILED, 2) + make_jobs(JobStatus.DEAD, 2)

    assert "pruned finished jobs count=1" in prune("--older-than", "7d").splitlines()
    assert remaining(done) == set()
    assert remaining(failed) == set(failed)

    output = prune("--older-than", "7d", "--include-failed")
    assert "pruned finished jobs count=4" in output.splitlines()
    assert remaining(failed) == set()


@DB
def test_attempts_are_deleted_with_their_jobs() -> None:
    old = make_jobs(JobStatus.DEAD, 2)
    kept = make_jobs(JobStatus.DEAD, 1, old=False)
    for job_id in old + kept:
        for attempt in (1, 2):
            JobAttempt.objects.create(job_id=job_id, attempt=attempt, outcome=AttemptOutcome.ERROR)

    assert "pruned finished jobs count=2" in prune("--older-than", "7d", "--include-failed")

    assert not JobAttempt.objects.filter(job_id__in=old).exists()
    assert JobAttempt.objects.filter(job_id__in=kept).count() == 2


@DB
def test_other_backends_jobs_are_left_alone() -> None:
    mine = make_jobs(JobStatus.SUCCEEDED, 1)
    theirs = make_jobs(JobStatus.SUCCEEDED, 1, backend="other")
    assert "pruned finished jobs count=1" in prune("--older-than", "7d").splitlines()
    assert remaining(mine) == set()
    assert remaining(theirs) == set(theirs)


# --------------------------------------------------------------------------- batches


@DB
def test_deletes_in_batches_until_a_short_one(leasejobs_log: ListHandler) -> None:
    old = make_jobs(JobStatus.SUCCEEDED, 25)
    recent = make_jobs(JobStatus.SUCCEEDED, 3, old=False)

    output = prune("--older-than", "7d", "--batch-size", "10")

    assert "pruned finished jobs count=25" in output.splitlines()
    assert remaining(old) == set()
    assert remaining(recent) == set(recent)
    record: Any = next(r for r in leasejobs_log.records if r.getMessage().startswith("pruned"))
    assert (record.count, record.batches) == (25, 3)


@DB
def test_exact_multiple_of_the_batch_size() -> None:
    old = make_jobs(JobStatus.CANCELLED, 20)
    assert "pruned finished jobs count=20" in prune("--older-than", "7d", "--batch-size", "10")
    assert remaining(old) == set()


# --------------------------------------------------------------------------- dry run


@DB
def test_dry_run_counts_and_deletes_nothing(leasejobs_log: ListHandler) -> None:
    old = make_jobs(JobStatus.SUCCEEDED, 5) + make_jobs(JobStatus.FAILED, 2)
    for job_id in old:
        JobAttempt.objects.create(job_id=job_id, attempt=1, outcome=AttemptOutcome.ERROR)

    lines = prune("--older-than", "7d", "--dry-run", "--batch-size", "2").splitlines()
    assert lines == [
        "dry run: would prune finished jobs count=5 batches=3 statuses=succeeded,cancelled",
        "dry run: would prune schedule runs count=0",
        "dry run: would prune rollup rows count=0",
    ]
    output = prune("--older-than", "7d", "--dry-run", "--include-failed")
    assert "dry run: would prune finished jobs count=7 " in output

    assert remaining(old) == set(old)
    assert JobAttempt.objects.filter(job_id__in=old).count() == 7
    assert not [r for r in leasejobs_log.records if r.getMessage().startswith("pruned")]


# --------------------------------------------------------------------------- schedule runs


TICKS = (datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=n) for n in counter())


def make_runs(count: int, *, old: bool = True, backend: str = "default") -> list[int]:
    """Runs of a schedule (ticks, and one "run now" when ``count`` > 1), enqueued long ago
    (by the database's clock) unless not ``old``."""
    schedule, _ = Schedule.objects.get_or_create(
        backend=backend,
        name="nightly",
        defaults={"task_path": "tests.tasks.add", "expression": "0 3 * * *"},
    )
    ids = []
    for n in range(count):
        manual = n == 0 and count > 1
        run = ScheduleRun.objects.create(
            schedule=schedule,
            tick=None if manual else next(TICKS),
            kind=RunKind.MANUAL if manual else RunKind.TICK,
            job_id=n + 1,
        )
        ids.append(run.pk)
    if old:
        changed = ScheduleRun.objects.filter(pk__in=ids).update(
            enqueued_at=Now() - timedelta(days=10)
        )
        assert changed == count
    return ids


def runs_left(ids: list[int]) -> set[int]:
    return set(ScheduleRun.objects.filter(pk__in=ids).values_list("pk", flat=True))


@DB
def test_old_schedule_runs_go_the_schedules_stay(leasejobs_log: ListHandler) -> None:
    old = make_runs(5)
    recent = make_runs(2, old=False)
    theirs = make_runs(3, backend="other")
    schedules = list(Schedule.objects.order_by("pk").values_list("pk", "backend", "name"))

    output = prune("--older-than", "7d", "--batch-size", "2").splitlines()

    assert output == [
        "pruned finished jobs count=0",
        "pruned schedule runs count=5",
        "pruned rollup rows count=0",
    ]
    assert runs_left(old) == set()
    assert runs_left(recent) == set(recent)
    assert runs_left(theirs) == set(theirs)  # another backend's
    assert list(Schedule.objects.order_by("pk").values_list("pk", "backend", "name")) == schedules
    record: Any = next(
        r for r in leasejobs_log.records if r.getMessage() == "pruned schedule runs count=5"
    )
    assert (record.count, record.batches, record.backend) == (5, 3, "default")
    assert record.older_than == 7 * 86400


@DB
def test_schedule_runs_are_counted_in_a_dry_run() -> None:
    old = make_runs(3)
    make_runs(1, old=False)

    output = prune("--older-than", "7d", "--dry-run").splitlines()

    assert output[1] == "dry run: would prune schedule runs count=3"
    assert runs_left(old) == set(old)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("7", "expected a whole number with a unit s, m, h, d or w (e.g. 7d), got '7'"),
        ("x", "got 'x'"),
        ("-1d", "got '-1d'"),
        ("1.5d", "got '1.5d'"),
        ("0d", "expected an age > 0, got '0d'"),
    ],
)
def test_bad_older_than_values_are_rejected(value: str, message: str) -> None:
    with pytest.raises(CommandError) as excinfo:
        prune(f"--older-than={value}")
    assert "argument --older-than:" in str(excinfo.value)
    assert message in str(excinfo.value)


@DB
def test_without_older_than_jobs_without_a_retention_stay() -> None:
    ids = make_jobs(JobStatus.SUCCEEDED, 2)
    runs = make_runs(2)

    output = prune().splitlines()

    assert "pruned finished jobs count=0" in output
    assert "pruned schedule runs count=0" in output  # runs go by --older-than only
    assert remaining(ids) == set(ids)
    assert runs_left(runs) == set(runs)


@pytest.mark.parametrize("value", ["0", "-5", "ten"])
def test_bad_batch_size_is_rejected(value: str) -> None:
    with pytest.raises(CommandError, match="argument --batch-size"):
        prune("--older-than", "7d", f"--batch-size={value}")


def test_unknown_backend_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="nope"):
        prune("--older-than", "7d", "--backend", "nope")


def test_bad_older_than_from_the_command_line_exits_with_usage(run_manage: Any) -> None:
    done = run_manage(["prune_jobs", "--older-than", "7"])
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert "argument --older-than:" in done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- outages


def unreachable_database_url() -> str:
    if connection.vendor == "sqlite":
        return "sqlite:////nonexistent-leasejobs-dir/x.sqlite3"
    return "postgres://postgres@127.0.0.1:1/nope"  # nothing listens on port 1


def test_unreachable_database_exits_2(run_manage: Any, subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "DATABASE_URL": unreachable_database_url()}
    env["LEASEJOBS_TEST_SUBPROCESS"] = "1"

    done = run_manage(["prune_jobs", "--older-than", "7d"], env=env)

    assert done.returncode == 2
    assert "database 'default' unreachable or failing:" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr
    assert "pruned finished jobs" not in done.stdout


# --------------------------------------------------------------------------- result_ttl


def finished_ago(
    ago: timedelta,
    *,
    ttl: timedelta | None = None,
    queue: str = "default",
    status: str = JobStatus.SUCCEEDED,
) -> int:
    """A job finished ``ago`` (database clock) with its own ``result_ttl`` (or none)."""
    (job_id,) = make_jobs(status, old=False)
    Job.objects.filter(pk=job_id).update(finished_at=Now() - ago, result_ttl=ttl, queue=queue)
    return job_id


HOUR = timedelta(hours=1)
REPORTS_KEPT_A_DAY = {
    "default": {
        "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {"QUEUE_RESULT_TTL": {"reports": 86400}},
    }
}


@DB
def test_a_job_older_than_its_own_ttl_goes_without_older_than() -> None:
    expired = finished_ago(2 * HOUR, ttl=HOUR)
    kept = finished_ago(2 * HOUR, ttl=3 * HOUR)
    no_ttl = finished_ago(timedelta(days=30))

    assert "pruned finished jobs count=1" in prune().splitlines()
    assert remaining([expired, kept, no_ttl]) == {kept, no_ttl}


@DB
def test_a_jobs_own_ttl_wins_over_the_commands_default() -> None:
    kept_longer = finished_ago(2 * HOUR, ttl=timedelta(days=1))
    kept_shorter = finished_ago(2 * HOUR, ttl=HOUR)
    plain = finished_ago(2 * HOUR)

    assert "pruned finished jobs count=2" in prune("--older-than", "30m").splitlines()
    assert remaining([kept_longer, kept_shorter, plain]) == {kept_longer}


@DB
def test_a_queues_ttl_wins_over_the_default_and_a_jobs_own_over_the_queues() -> None:
    with override_settings(TASKS=REPORTS_KEPT_A_DAY):
        young_report = finished_ago(2 * HOUR, queue="reports")
        old_report = finished_ago(timedelta(days=2), queue="reports")
        own_ttl_report = finished_ago(2 * HOUR, queue="reports", ttl=HOUR)
        other_queue = finished_ago(2 * HOUR)

        assert "pruned finished jobs count=3" in prune("--older-than", "1h").splitlines()
        assert remaining([young_report, old_report, own_ttl_report, other_queue]) == {young_report}
        # Without --older-than the queue's retention applies all the same.
        older = finished_ago(timedelta(days=3), queue="reports")
        assert "pruned finished jobs count=1" in prune().splitlines()
        assert remaining([older, young_report]) == {young_report}


@DB
def test_a_ttl_keeps_failed_jobs_unless_include_failed() -> None:
    failed = finished_ago(2 * HOUR, ttl=HOUR, status=JobStatus.FAILED)
    dead = finished_ago(2 * HOUR, ttl=HOUR, status=JobStatus.DEAD)
    assert "pruned finished jobs count=0" in prune().splitlines()
    assert "pruned finished jobs count=2" in prune("--include-failed").splitlines()
    assert remaining([failed, dead]) == set()


@DB
def test_active_jobs_with_an_old_ttl_stay() -> None:
    active = make_jobs(JobStatus.PENDING, 1) + make_jobs(JobStatus.RUNNING, 1)
    Job.objects.filter(pk__in=active).update(
        result_ttl=timedelta(seconds=1), finished_at=Now() - timedelta(days=1)
    )
    assert "pruned finished jobs count=0" in prune("--include-failed").splitlines()
    assert remaining(active) == set(active)


@DB
def test_a_dry_run_counts_by_retention() -> None:
    ids = [finished_ago(2 * HOUR, ttl=HOUR), finished_ago(2 * HOUR, ttl=HOUR)]
    output = prune("--dry-run").splitlines()
    assert output[0].startswith("dry run: would prune finished jobs count=2 batches=1")
    assert remaining(ids) == set(ids)


@DB
def test_jobs_enqueued_with_result_ttl_are_pruned_by_it() -> None:
    from django_leasejobs import leases
    from tests.tasks import add, kept_an_hour

    kept = kept_an_hour.enqueue(1)
    plain = add.enqueue(1, 2)
    for _ in (kept, plain):
        claimed = leases.claim("w", limit=1, lease_duration=30)
        leases.complete(claimed[0].id, claimed[0].attempt, "w")
    Job.objects.update(finished_at=Now() - 2 * HOUR)

    assert "pruned finished jobs count=1" in prune().splitlines()
    assert remaining([int(kept.id), int(plain.id)]) == {int(plain.id)}
