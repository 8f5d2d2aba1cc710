"""Readers of a big job table stay on its indexes, and the index of finished jobs holds
finished jobs only (migration 0023, issue 32).

On PostgreSQL a job's enqueue and claim write no entry into ``leasejobs_job_finished_idx``:
it is partial on ``finished_at IS NOT NULL`` (SQLite, MySQL and MariaDB keep it over
every row). Readers of pending and running jobs, which used
to read that index by its leading ``status``, read the partial indexes that hold them
instead (``models.PENDING_ROWS``, ``ACTIVE_ROWS``). On PostgreSQL each of them is
planned here against a table of mostly finished jobs with fresh statistics: none may
scan the table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_leasejobs import leases, queues, stats
from django_leasejobs.alert_spec import AlertKind, AlertRule
from django_leasejobs.alerts import measures
from django_leasejobs.models import ACTIVE_ROWS, FINISHED_STATUSES, PENDING_ROWS, Job, JobStatus
from tests.helpers_leases import job_table_scans

db = pytest.mark.django_db(transaction=True)
ON_POSTGRESQL = connection.vendor == "postgresql"
postgresql_only = pytest.mark.skipif(not ON_POSTGRESQL, reason="PostgreSQL's plans")

FINISHED = 40_000
PENDING = 400
RUNNING = 40


def _rows(status: str, count: int, extra: str = "", values: str = "") -> str:
    """An INSERT of ``count`` jobs in ``status``, spread over five queues."""
    return (
        "INSERT INTO leasejobs_job (backend, queue, priority, task_path, args, kwargs, "
        "status, attempt, max_attempts, max_stalls, stall_count, snoozes, run_after, "
        "cancel_requested, progress_message, last_error, last_worker, task_options, "
        f"enqueued_at{extra}) SELECT 'default', 'q' || (i % 5), 0, 'tests.tasks.add', "
        f"'[]', '{{}}', '{status}', 1, 3, 3, 0, 0, now(), FALSE, '', '', '', '{{}}', "
        f"now(){values} FROM generate_series(1, {count}) AS i"
    )


@pytest.fixture
def big_table() -> None:
    """Mostly finished jobs (a day of them), some pending (a tenth under a flow limit),
    a few running; statistics fresh."""
    with connection.cursor() as cursor:
        cursor.execute(
            _rows("succeeded", FINISHED, ", finished_at", ", now() - i * interval '2 s'")
        )
        cursor.execute(
            _rows(
                "pending",
                PENDING,
                ", flow_group",
                ", CASE WHEN i % 10 = 0 THEN 'key:k' END",
            )
        )
        cursor.execute(
            _rows(
                "running",
                RUNNING,
                ", locked_by, locked_until",
                ", 'w1', now() + interval '1 minute'",
            )
        )
        cursor.execute("ANALYZE leasejobs_job")


def _job_table_reads(run: Callable[[], object]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each SELECT of the job table that ``run`` sends, with the scans of its plan."""
    with CaptureQueriesContext(connection) as captured:
        run()
    reads = []
    for query in captured.captured_queries:
        sql = query["sql"]
        if not sql.lstrip().upper().startswith("SELECT") or '"leasejobs_job"' not in sql:
            continue
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
            [[plan]] = cursor.fetchall()
        reads.append((sql, job_table_scans(plan[0]["Plan"])))
    assert reads, "nothing read the job table"
    return reads


def _assert_no_table_scan(run: Callable[[], object]) -> None:
    for sql, scans in _job_table_reads(run):
        assert scans, sql
        assert all(kind != "Seq Scan" for kind, _ in scans), (scans, sql)


@db
@postgresql_only
def test_the_finished_index_holds_finished_jobs_only() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'leasejobs_job_finished_idx'"
        )
        [[definition]] = cursor.fetchall()
    assert definition.endswith("(status, finished_at) WHERE (finished_at IS NOT NULL)")


@db
@pytest.mark.parametrize(
    "rows, statuses",
    [(PENDING_ROWS, {JobStatus.PENDING}), (ACTIVE_ROWS, {JobStatus.PENDING, JobStatus.RUNNING})],
    ids=["pending", "active"],
)
def test_the_row_filters_match_their_statuses_on_every_database(
    rows: Any, statuses: set[str]
) -> None:
    """Each filter is its statuses, flow group or none (every database path)."""
    for status in [*FINISHED_STATUSES, JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING]:
        for flow_group in (None, "key:k"):
            running = status == JobStatus.RUNNING
            Job.objects.create(
                task_path="tests.tasks.add",
                status=status,
                flow_group=flow_group,
                locked_by="w1" if running else None,
                locked_until=leases.database_now() + timedelta(minutes=1) if running else None,
            )
    found = sorted(Job.objects.filter(rows).values_list("status", "flow_group"), key=str)
    expected = sorted(((s, g) for s in statuses for g in (None, "key:k")), key=str)
    assert found == expected


@db
@postgresql_only
@pytest.mark.usefixtures("big_table")
def test_the_dashboards_numbers_read_no_table_scan() -> None:
    health = stats.collect()
    assert sum(q.ready for q in health.queues) == PENDING
    _assert_no_table_scan(stats.collect)


@db
@postgresql_only
@pytest.mark.usefixtures("big_table")
def test_the_queue_overview_reads_no_table_scan() -> None:
    views = queues.overview()
    assert sum(v.pending for v in views) == PENDING
    _assert_no_table_scan(queues.overview)


@db
@postgresql_only
@pytest.mark.usefixtures("big_table")
@pytest.mark.parametrize("kind", ["backlog", "oldest_ready", "failure_rate", "dead_letters"])
def test_the_alert_measures_read_no_table_scan(kind: AlertKind) -> None:
    rule = AlertRule(name=kind, kind=kind, threshold=1, queue="q1")

    def measure() -> measures.Measure:
        return measures.measure(
            rule,
            backend="default",
            now=leases.database_now(),
            online_after=60,
            using="default",
            from_rollups=False,
        )

    if kind == "backlog":
        assert measure().value == PENDING / 5
    _assert_no_table_scan(measure)


@db
@postgresql_only
@pytest.mark.usefixtures("big_table")
def test_the_job_lists_filter_sidebar_reads_no_table_scan() -> None:
    get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.login(username="admin", password="pw")

    def changelist() -> None:
        response = client.get("/admin/django_leasejobs/job/")
        assert response.status_code == 200

    reads = _job_table_reads(changelist)
    sidebar = [(sql, scans) for sql, scans in reads if "DISTINCT" in sql.upper()]
    assert len(sidebar) >= 2, reads
    for sql, scans in sidebar:
        assert all(kind != "Seq Scan" for kind, _ in scans), (scans, sql)
