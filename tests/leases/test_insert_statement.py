"""``leases.enqueue.insert_statement``: the one statement ``insert_job`` sends, which
bench/enqueue_split.py also sends raw.

Its values fill its placeholders whichever columns are None (each set of None columns is
a statement of its own), the NOTIFY channel last; sent as it is, it stores the job's
columns; and ``insert_job`` sends exactly it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from django_leasejobs.leases import enqueue
from django_leasejobs.leases.enqueue import insert_statement
from django_leasejobs.leases.values import NewJob
from django_leasejobs.models import Job, JobStatus

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="INSERT ... pg_notify"),
]

CHANNEL = "leasejobs_test_channel"

PLAIN = NewJob(
    backend="default",
    queue="default",
    task_path="tests.tasks.add",
    args=[1, 2],
    kwargs={},
    priority=0,
    max_attempts=3,
    max_stalls=3,
    timeout=None,
    key=None,
    retry_backoff=None,
    run_after=None,
)
"""A job whose optional columns are all None (most enqueues)."""

EVERYTHING = dataclasses.replace(
    PLAIN,
    queue="high",
    args=[],
    kwargs={"a": [1, {"b": None}]},
    priority=-5,
    max_attempts=9,
    max_stalls=1,
    timeout=2.5,
    key="insert-statement",
    retry_backoff={"base": 1.0, "factor": 2.0},
    run_after=datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC),
    task_options={"takes_context": True},
    trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    flow_group="key:tenant-1",
    concurrency_limit=2,
    rate_limit="10/m",
    metadata={"tenant": 1},
    result_ttl=timedelta(days=2),
    on_parent_failure="run",
)
"""A job with every producer column the enqueue path may set given a value (a workflow's
own columns aside: its steps are inserted with ``copy_jobs``)."""

STORED = [
    field.name
    for field in dataclasses.fields(NewJob)
    if field.name not in ("workflow_id", "waiting_on")
]


@pytest.mark.parametrize("row", [PLAIN, EVERYTHING], ids=["plain", "everything"])
def test_its_values_fill_its_placeholders_and_store_the_job(row: NewJob) -> None:
    statement = insert_statement(row, notify=CHANNEL, using="default")
    assert statement.sql.count("%s") == len(statement.params), statement
    assert statement.params[-1] == CHANNEL
    assert None not in statement.params  # a None column is left out, not bound
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, statement.params)
        job_id, enqueued_at, _ = cursor.fetchone()
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.PENDING
    assert job.enqueued_at == enqueued_at
    for name in STORED:
        if name == "run_after" and row.run_after is None:
            assert job.run_after == job.enqueued_at  # the database's now
            continue
        assert getattr(job, name) == getattr(row, name), name


def test_a_statement_per_set_of_none_columns() -> None:
    plain = insert_statement(PLAIN, notify=CHANNEL, using="default")
    everything = insert_statement(EVERYTHING, notify=CHANNEL, using="default")
    assert plain.sql != everything.sql
    assert insert_statement(PLAIN, notify="other", using="default").sql is plain.sql  # cached
    assert len(plain.params) < len(everything.params)


def test_insert_job_sends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, Sequence[Any]]] = []
    fetch_one = enqueue.fetch_one

    def recording(using: str, sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
        sent.append((sql, list(params)))
        return fetch_one(using, sql, params)

    monkeypatch.setattr(enqueue, "fetch_one", recording)
    for row in (PLAIN, EVERYTHING):
        enqueue.insert_job(row, notify=CHANNEL)
    assert sent == [
        (statement.sql, statement.params)
        for statement in (
            insert_statement(row, notify=CHANNEL, using="default") for row in (PLAIN, EVERYTHING)
        )
    ]
    assert Job.objects.count() == 2
