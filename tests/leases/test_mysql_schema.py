"""The schema and the clock on MySQL/MariaDB, and that they agree with PostgreSQL and SQLite.

Migration 0007 gives MySQL/MariaDB equivalents of ``Job.Meta``'s partial indexes and of
its partial unique constraint (a STORED generated column ``active_key`` with a UNIQUE
index; ``key`` with a binary collation), and ``DatabaseNow`` (``functions.py``) keeps
every SQL clock in UTC there, whatever the session's ``time_zone``.

The dedup-key tests run on every database: keys must behave the same everywhere. The
schema and clock tests are MySQL/MariaDB's.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.test import override_settings

from django_leasejobs import leases, stats
from django_leasejobs.compat import task_backends
from django_leasejobs.functions import DatabaseNow
from django_leasejobs.models import Job, JobAttempt, JobStatus, Worker
from django_leasejobs.pruning import prune
from tests.tasks import add

WORKER = "host-m:4242:mmmmmm"
LEASE = 60.0
CLOSE = timedelta(minutes=1)
"""How far a time written by the database may be from this process's UTC clock (a wrong
time zone is hours off)."""

IS_MYSQL = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.mysql"
mysql_only = pytest.mark.skipif(
    not IS_MYSQL,
    reason="MySQL/MariaDB only: the generated column, the stand-in indexes and the "
    "session time zone exist there alone (PostgreSQL and SQLite have partial indexes "
    "and their clock is UTC already)",
)
pytestmark = pytest.mark.django_db


def enqueue(key: str | None = None, **options: Any) -> int:
    task = add.using(key=key, **options) if key is not None else add.using(**options)
    return int(task.enqueue(1, 2).id)


def claim_all() -> list[leases.ClaimedJob]:
    return leases.claim(WORKER, limit=100, lease_duration=LEASE)


def error() -> leases.ErrorInfo:
    return leases.ErrorInfo("builtins.ValueError", "boom")


def new_job(key: str | None, status: str = JobStatus.PENDING) -> Job:
    lease = {"locked_by": WORKER, "locked_until": datetime.now(UTC)}
    return Job.objects.create(
        task_path="tests.tasks.add",
        key=key,
        status=status,
        **(lease if status == JobStatus.RUNNING else {}),
    )


# --------------------------------------------------------------------------- dedup keys
# On every database: the same answers from PostgreSQL's partial unique index, SQLite's,
# and MySQL/MariaDB's generated column.


@pytest.mark.parametrize("second", [JobStatus.PENDING, JobStatus.RUNNING])
@pytest.mark.parametrize("first", [JobStatus.PENDING, JobStatus.RUNNING])
def test_two_active_jobs_cannot_share_a_key(first: str, second: str) -> None:
    new_job("report-1", first)
    with pytest.raises(IntegrityError), transaction.atomic():
        new_job("report-1", second)


@pytest.mark.parametrize(
    "finished", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED]
)
def test_finished_jobs_and_jobs_without_a_key_hold_no_key(finished: str) -> None:
    new_job("report-2", finished)
    new_job("report-2", finished)
    new_job("report-2")  # the active one
    new_job(None)
    new_job(None)
    assert Job.objects.filter(key="report-2").count() == 3


def test_an_update_that_makes_a_job_active_again_is_refused_when_the_key_is_taken() -> None:
    old = new_job("report-3", JobStatus.FAILED)
    new_job("report-3")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=old.pk).update(status=JobStatus.PENDING)
    assert Job.objects.get(pk=old.pk).status == JobStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_the_key_through_enqueue_claim_finish_and_retry() -> None:
    first = enqueue("nightly")
    assert enqueue("nightly") == first  # deduplicated: the pending job holds the key
    [claimed] = claim_all()
    assert claimed.id == first
    assert enqueue("nightly") == first  # the running job still holds it
    assert leases.fail(claimed.id, claimed.attempt, WORKER, error=error(), retry_delay=None) == (
        JobStatus.FAILED
    )
    second = enqueue("nightly")  # free again
    assert second != first
    # The failed job cannot come back while the new one holds the key, on any path.
    assert leases.retry(first) == leases.RetryResult.KEY_TAKEN
    assert Job.objects.get(pk=first).status == JobStatus.FAILED
    [claimed] = claim_all()
    leases.complete(claimed.id, claimed.attempt, WORKER, result=3)
    assert leases.retry(first) == leases.RetryResult.RETRIED
    assert enqueue("nightly") == first
    assert leases.cancel(first) == leases.CancelResult.CANCELLED
    assert enqueue("nightly") not in {first, second}


@pytest.mark.django_db(transaction=True)
def test_bulk_enqueue_with_and_without_keys() -> None:
    held = enqueue("bulk-a")
    results = task_backends["default"].bulk_enqueue(
        [
            (add, [1, 1], {}),
            (add.using(key="bulk-a"), [1, 2], {}),
            (add.using(key="bulk-b"), [1, 3], {}),
            (add.using(key="bulk-b"), [1, 4], {}),
            (add, [1, 5], {}),
        ]
    )
    ids = [int(r.id) for r in results]
    assert ids[1] == held
    assert ids[2] == ids[3] != held
    assert len(set(ids)) == 4
    assert Job.objects.filter(key="bulk-b").count() == 1


KEYS_THAT_DIFFER = ["Report-A", "report-a", "REPORT-A", "réport-a", "report-a ", "report-\uff41"]
"""Keys that differ in case, accent, a trailing space, or width (a fullwidth a): distinct keys on
PostgreSQL and SQLite (text compares byte for byte), so on MySQL/MariaDB too (whose
usual collations are case-, accent- and, with PAD SPACE, trailing-space-insensitive)."""


def test_keys_compare_byte_for_byte_on_every_database() -> None:
    ids = [enqueue(key) for key in KEYS_THAT_DIFFER]
    assert len(set(ids)) == len(KEYS_THAT_DIFFER)
    assert [enqueue(key) for key in KEYS_THAT_DIFFER] == ids
    for key in KEYS_THAT_DIFFER:
        assert list(Job.objects.filter(key=key).values_list("key", flat=True)) == [key]


@pytest.mark.django_db(transaction=True)
def test_find_stale_reads_whole_rows() -> None:
    """``leases.find_stale`` reads ``SELECT j.*``: the generated column comes along as an
    extra attribute and does no harm."""
    job_id = enqueue("stale")
    [claimed] = claim_all()
    Job.objects.filter(pk=job_id).update(locked_until=DatabaseNow() - timedelta(seconds=5))
    [stale] = leases.find_stale()
    assert (stale.pk, stale.key, stale.status) == (job_id, "stale", JobStatus.RUNNING)
    assert [r.id for r in leases.reap().jobs] == [claimed.id]


# --------------------------------------------------------------------------- DatabaseNow


def test_database_now_is_now_everywhere_but_mysql() -> None:
    """The same SQL as ``Now()`` on PostgreSQL and SQLite; ``UTC_TIMESTAMP(6)`` on MySQL."""
    ours = str(Job.objects.filter(run_after__lte=DatabaseNow()).query)
    django = str(Job.objects.filter(run_after__lte=Now()).query)
    if IS_MYSQL:
        assert "UTC_TIMESTAMP(6)" in ours
        assert "CURRENT_TIMESTAMP" not in ours
        assert ours.replace("UTC_TIMESTAMP(6)", "CURRENT_TIMESTAMP(6)") == django
    else:
        assert ours == django


def test_the_dashboard_counts_minutes_whatever_the_time_zone() -> None:
    """Per-minute buckets are truncated in UTC: MySQL/MariaDB without time zone tables
    cannot convert to TIME_ZONE (CONVERT_TZ gives NULL), and the buckets are the same."""
    job = new_job(None, JobStatus.SUCCEEDED)
    Job.objects.filter(pk=job.pk).update(finished_at=DatabaseNow())
    with override_settings(TIME_ZONE="Asia/Kolkata"):  # +05:30
        health = stats.collect()
    assert sum(m.succeeded for m in health.per_minute) == 1
    assert health.totals.succeeded_last_hour == 1


# --------------------------------------------------------------------------- MySQL schema


def _index_columns() -> dict[str, tuple[bool, list[str]]]:
    """Each index of the job table: (unique, its columns in order, ' DESC' marked)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, COLLATION FROM "
            "information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s "
            "ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            [Job._meta.db_table],
        )
        found: dict[str, tuple[bool, list[str]]] = {}
        for name, non_unique, column, order in cursor.fetchall():
            _, columns = found.setdefault(name, (not int(non_unique), []))
            columns.append(column + (" DESC" if order == "D" else ""))
    return found


@mysql_only
def test_the_partial_indexes_have_stand_ins() -> None:
    indexes = _index_columns()
    assert indexes["leasejobs_job_active_key_unique"] == (True, ["active_key"])
    unique, claim = indexes["leasejobs_job_claim_idx"]
    assert not unique
    # MariaDB before 10.8 parses DESC and builds the part ascending.
    assert [c.removesuffix(" DESC") for c in claim] == [
        "status",
        "backend",
        "queue",
        "priority",
        "run_after",
        "id",
    ]
    mariadb, version = connection.mysql_is_mariadb, connection.mysql_version  # type: ignore[attr-defined]
    if not mariadb or version >= (10, 8):
        assert claim[3] == "priority DESC"
    assert indexes["leasejobs_job_running_idx"] == (False, ["status", "locked_by"])
    assert indexes["leasejobs_job_dead_idx"] == (False, ["status", "queue"])
    assert indexes["leasejobs_job_finished_idx"] == (False, ["status", "finished_at"])
    # The jobs of a key, finished ones too (unique_for): every row, no partial indexes here.
    assert indexes["leasejobs_job_key_idx"] == (False, ["key", "id"])
    # A workflow's steps (migration 0015); waiting steps go through the finished index.
    assert indexes["leasejobs_job_workflow_idx"] == (False, ["workflow_id"])
    # Nothing else: Django's unconditional versions of the partial indexes are gone.
    assert set(indexes) == {
        "PRIMARY",
        "leasejobs_job_active_key_unique",
        "leasejobs_job_claim_idx",
        "leasejobs_job_running_idx",
        "leasejobs_job_dead_idx",
        "leasejobs_job_finished_idx",
        "leasejobs_job_key_idx",
        "leasejobs_job_workflow_idx",
    }


@mysql_only
def test_active_key_is_a_stored_generated_column_and_key_compares_bytes() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, EXTRA, COLLATION_NAME, GENERATION_EXPRESSION FROM "
            "information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s "
            "AND COLUMN_NAME IN ('key', 'active_key')",
            [Job._meta.db_table],
        )
        columns = {row[0]: row[1:] for row in cursor.fetchall()}
    extra, collation, expression = columns["active_key"]
    assert "STORED GENERATED" in extra.upper()
    assert "pending" in expression and "running" in expression
    assert collation == columns["key"][1]
    assert collation in {"utf8mb4_0900_bin", "utf8mb4_nopad_bin", "utf8mb4_bin"}
    # The generated column follows every write: ORM, raw SQL of leases/.
    job = new_job("gen")
    with connection.cursor() as cursor:
        sql = f"SELECT active_key FROM {Job._meta.db_table} WHERE id = %s"
        cursor.execute(sql, [job.pk])
        assert cursor.fetchone() == ("gen",)
        Job.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED)
        cursor.execute(sql, [job.pk])
        assert cursor.fetchone() == (None,)


@mysql_only
def test_flow_groups_and_rate_scopes_compare_bytes() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND ((TABLE_NAME = 'leasejobs_job' AND "
            "COLUMN_NAME IN ('key', 'flow_group')) OR "
            "(TABLE_NAME = 'leasejobs_rate_start' AND COLUMN_NAME = 'scope'))"
        )
        collations = {(t, c): collation for t, c, collation in cursor.fetchall()}
    key = collations.pop(("leasejobs_job", "key"))
    assert collations == {
        ("leasejobs_job", "flow_group"): key,
        ("leasejobs_rate_start", "scope"): key,
    }
    # Groups differing in case or accents are different groups, as on PostgreSQL.
    Job.objects.create(task_path="tests.tasks.add", flow_group="key:A", concurrency_limit=1)
    assert not Job.objects.filter(flow_group="key:a").exists()


@mysql_only
def test_defaults_are_the_utc_clock() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_DEFAULT FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'leasejobs\\_%%' "
            "AND COLUMN_DEFAULT LIKE '%%TIMESTAMP%%'"
        )
        defaults = {(t, c): d.lower() for t, c, d in cursor.fetchall()}
    assert defaults == {
        ("leasejobs_job", "run_after"): "utc_timestamp(6)",
        ("leasejobs_job", "enqueued_at"): "utc_timestamp(6)",
        ("leasejobs_attempt", "finished_at"): "utc_timestamp(6)",
        ("leasejobs_worker", "started_at"): "utc_timestamp(6)",
        ("leasejobs_worker", "last_seen_at"): "utc_timestamp(6)",
        ("leasejobs_schedule", "created_at"): "utc_timestamp(6)",
        ("leasejobs_schedule", "updated_at"): "utc_timestamp(6)",
        ("leasejobs_queue", "changed_at"): "utc_timestamp(6)",
        ("leasejobs_rate_start", "started_at"): "utc_timestamp(6)",
        ("leasejobs_schedule_run", "enqueued_at"): "utc_timestamp(6)",
        ("leasejobs_workflow", "created_at"): "utc_timestamp(6)",
    }


# --------------------------------------------------------------------------- MySQL clock


@pytest.fixture(params=["+05:00", "-05:00"])
def session_time_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    """The connection's session ``time_zone`` set away from UTC for the test."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.time_zone")
        (before,) = cursor.fetchone()
        cursor.execute("SET time_zone = %s", [request.param])
        # The test means something: CURRENT_TIMESTAMP (Django's Now()) is hours off UTC.
        cursor.execute("SELECT CURRENT_TIMESTAMP(6), UTC_TIMESTAMP(6)")
        local, utc = cursor.fetchone()
        assert abs(local - utc) > timedelta(hours=4)
    try:
        yield request.param
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = %s", [before])


def assert_now(value: datetime | None) -> None:
    assert value is not None
    assert abs(value - datetime.now(UTC)) < CLOSE, value


@mysql_only
@pytest.mark.django_db(transaction=True)
def test_job_times_are_utc_whatever_the_session_time_zone(session_time_zone: str) -> None:
    now_job = enqueue()
    later_job = enqueue(run_after=datetime.now(UTC) + timedelta(hours=1))
    job = Job.objects.get(pk=now_job)
    assert_now(job.enqueued_at)
    assert_now(job.run_after)  # the column's default
    assert_now(Job.objects.get(pk=later_job).enqueued_at)
    assert list(Job.objects.ready().values_list("id", flat=True)) == [now_job]

    [claimed] = claim_all()
    assert claimed.id == now_job
    job = Job.objects.get(pk=now_job)
    assert_now(job.started_at)
    assert_now(job.last_attempted_at)
    assert_now(job.heartbeat_at)
    assert job.locked_until is not None
    assert abs(job.locked_until - datetime.now(UTC) - timedelta(seconds=LEASE)) < CLOSE
    assert not Job.objects.expired().exists()
    Job.objects.filter(pk=now_job).update(locked_until=DatabaseNow() - timedelta(seconds=1))
    assert list(Job.objects.expired().values_list("id", flat=True)) == [now_job]
    Job.objects.filter(pk=now_job).update(locked_until=DatabaseNow() + timedelta(minutes=5))

    leases.complete(claimed.id, claimed.attempt, WORKER, result=3)
    job = Job.objects.get(pk=now_job)
    assert job.status == JobStatus.SUCCEEDED
    assert_now(job.finished_at)

    attempt = JobAttempt.objects.create(job=job, attempt=9, outcome="error")
    assert_now(JobAttempt.objects.get(pk=attempt.pk).finished_at)

    health = stats.collect()
    assert [q.ready for q in health.queues] == [0]
    assert [q.scheduled for q in health.queues] == [1]
    assert health.totals.succeeded_last_hour == 1


@mysql_only
@pytest.mark.django_db(transaction=True)
def test_worker_rows_and_pruning_use_the_utc_clock(session_time_zone: str) -> None:
    Worker.objects.create(id="w1", host="h", pid=1, pool="thread", concurrency=1)
    worker = Worker.objects.get(pk="w1")
    assert_now(worker.started_at)
    assert_now(worker.last_seen_at)
    Worker.objects.filter(pk="w1").update(last_seen_at=DatabaseNow(), stopped_at=DatabaseNow())
    worker = Worker.objects.get(pk="w1")
    assert_now(worker.last_seen_at)
    assert_now(worker.stopped_at)

    recent = new_job(None, JobStatus.SUCCEEDED)
    old = new_job(None, JobStatus.SUCCEEDED)
    Job.objects.filter(pk=recent.pk).update(finished_at=datetime.now(UTC) - timedelta(minutes=30))
    Job.objects.filter(pk=old.pk).update(finished_at=datetime.now(UTC) - timedelta(hours=2))
    assert prune(older_than=timedelta(hours=1), dry_run=True).count == 1
    assert prune(older_than=timedelta(hours=1)).count == 1
    assert list(Job.objects.values_list("id", flat=True)) == [recent.pk]


@mysql_only
def test_enqueue_without_insert_returning_as_on_mysql_8(monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL 8 has no ``INSERT ... RETURNING`` (MariaDB has): bulk_enqueue then inserts
    one row at a time to learn each id. Emulated on MariaDB by turning the features off."""
    features = type(connection.features)
    monkeypatch.setattr(features, "can_return_rows_from_bulk_insert", False)
    monkeypatch.setattr(features, "can_return_columns_from_insert", False)
    backend = task_backends["default"]
    results = backend.bulk_enqueue([(add, [1, 2], {}), (add, [3, 4], {}), (add, [5, 6], {})])
    stored = {job.pk: job for job in Job.objects.all()}
    assert sorted(int(r.id) for r in results) == sorted(stored)
    for result in results:
        job = stored[int(result.id)]
        assert result.args == job.args
        assert result.enqueued_at is not None
    single = add.enqueue(7, 8)
    assert Job.objects.get(pk=int(single.id)).args == [7, 8]
