"""The batched writes' per-row values, whatever they hold.

On PostgreSQL the batched path sends each column of per-row values as one array
(``leases.dialect.Dialect.rows_from``): the SQL is the same for any number of rows.
Values with the characters an array's text gives meaning to (quotes, backslashes,
braces, commas, the word NULL) must arrive exactly as a VALUES list would bring them,
on every path of every database.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_leasejobs import leases
from django_leasejobs.leases import Completion, ErrorInfo, Failure, Progress
from django_leasejobs.models import AttemptOutcome, JobStatus
from tests.helpers_leases import LEASE, attempt_rows, claim_one, make_jobs, row

pytestmark = pytest.mark.usefixtures("lease_path")

db = pytest.mark.django_db(transaction=True)

WORKER = "worker-arrays"
AWKWARD = [
    'a "quoted" word',
    "back\\slash \\\\ and \\",
    "{braces}, commas, (parens)",
    "NULL",
    "",
    " padded ",
    "new\nline\ttab",
    "ünïcödé ✓ 𝄞",
    "'single' and ''doubled''",
    '\\"',
]
RESULTS: list[Any] = [
    *AWKWARD,
    {"k": 'v "q" \\ {x}', "n": [1, 2.5, None, True]},
    None,
    "null",
    0,
    -1.5,
    1e-05,
    [],
    {},
    2**70,
]


def claimed(count: int) -> list[leases.ClaimedJob]:
    return [claim_one(WORKER, job_id) for job_id in make_jobs(count)]


@db
def test_awkward_results_are_stored_as_given() -> None:
    jobs = claimed(len(RESULTS))
    done = leases.complete_many(
        WORKER, [Completion(*job.lease, result) for job, result in zip(jobs, RESULTS, strict=True)]
    )
    assert set(done.written) == {job.lease for job in jobs}
    for job, result in zip(jobs, RESULTS, strict=True):
        assert row(job.id)["result"] == result
        assert row(job.id)["status"] == JobStatus.SUCCEEDED


@db
def test_awkward_errors_are_stored_as_given() -> None:
    jobs = claimed(len(AWKWARD))
    failures = [
        Failure(*job.lease, ErrorInfo(f"x.{text}", text, text), None, decision=text)
        for job, text in zip(jobs, AWKWARD, strict=True)
    ]
    done = leases.fail_many(WORKER, failures)
    assert done.written == {job.lease: JobStatus.FAILED for job in jobs}
    for job, text, failure in zip(jobs, AWKWARD, failures, strict=True):
        [attempt] = attempt_rows(job.id)
        assert (attempt.error_class, attempt.error_message, attempt.traceback) == (
            f"x.{text}",
            text,
            text,
        )
        assert (attempt.decision, attempt.outcome) == (text, AttemptOutcome.ERROR)
        assert attempt.started_at == job.last_attempted_at
        assert row(job.id)["last_error"] == failure.error.last_error


@db
def test_awkward_progress_and_mixed_numbers_renew() -> None:
    jobs = claimed(len(AWKWARD) + 2)
    # An int fraction among floats, and leases without progress, in one renewal.
    fractions: list[float | None] = [1, 0.25, *([0.5] * (len(AWKWARD) - 1)), None]
    messages: list[str | None] = [*AWKWARD, None, None]
    progress = {
        job.lease: None if fraction is None else Progress(fraction, message)
        for job, fraction, message in zip(jobs, fractions, messages, strict=True)
    }
    renewed = leases.renew(WORKER, progress, lease_duration=LEASE)
    assert renewed.held == {job.lease for job in jobs}
    for job, fraction, message in zip(jobs, fractions, messages, strict=True):
        stored = row(job.id)
        assert stored["progress"] == fraction
        assert stored["progress_message"] == ("" if fraction is None else message or "")


@db
def test_a_retry_delay_of_every_kind() -> None:
    jobs = claimed(3)
    error = ErrorInfo("builtins.ValueError", "boom")
    delays: list[float | None] = [0, 1.5, None]
    done = leases.fail_many(
        WORKER,
        [Failure(*job.lease, error, delay) for job, delay in zip(jobs, delays, strict=True)],
    )
    assert [done.written[job.lease] for job in jobs] == [
        JobStatus.PENDING,
        JobStatus.PENDING,
        JobStatus.FAILED,
    ]


@pytest.fixture
def raw_statements() -> Iterator[list[tuple[str, Any]]]:
    """The SQL and parameters as leases sends them (before the driver binds them)."""
    sent: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield sent


@pytest.mark.skipif(connection.vendor != "postgresql", reason="arrays on PostgreSQL only")
@db
def test_on_postgresql_the_sql_is_the_same_for_any_number_of_rows(
    lease_path: str, raw_statements: list[tuple[str, Any]]
) -> None:
    if lease_path != "batched":
        pytest.skip("the portable path keeps the statements MySQL/MariaDB run")
    error = ErrorInfo("builtins.ValueError", "boom")
    sent: dict[str, list[tuple[str, Any]]] = {}
    for size in (1, 20):
        jobs = claimed(2 * size)
        raw_statements.clear()
        leases.complete_many(WORKER, [Completion(*job.lease, size) for job in jobs[:size]])
        leases.fail_many(WORKER, [Failure(*job.lease, error, 1.0) for job in jobs[size:]])
        leases.renew(WORKER, [], lease_duration=LEASE)
        sent[str(size)] = list(raw_statements)
    assert [sql for sql, _ in sent["1"]] == [sql for sql, _ in sent["20"]]
    assert all(len(params) <= 10 for _, params in sent["20"])
