"""A job that runs in a thread of the worker (``--pool thread``, ``--sync-on-loop``) leaves
nothing of its database connections to the next job in that thread (``in_own_thread``):
whatever it opened is closed after it, even when it raised or left a transaction open.
In a process-pool slot, whose connections outlive its jobs, Django's
``close_old_connections()`` runs before each job once a job opened one
(``refresh_connections``), and not before. Real threads, real ``runworker`` processes,
the real database."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connections

from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker.execution import (
    Outcome,
    connections_forgotten,
    in_own_thread,
    refresh_connections,
)
from tests import tasks_worker

pytestmark = pytest.mark.django_db(transaction=True)

BURST_BOUND = 120

Lease = tuple[int, int]


def _in_a_thread(steps: list[Callable[[], None]]) -> None:
    """Run ``steps`` in order in one new thread (as a slot's thread runs jobs), then close
    what the thread still holds; re-raise a step's assertion here."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            for step in steps:
                step()
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    if failures:
        raise failures[0]


def _job(lease: Lease, body: Callable[[], None]) -> Callable[[], None]:
    def attempt() -> Outcome:
        body()
        return Outcome(lease, ok=True)

    return lambda: _ended(in_own_thread(lease, attempt), lease)


def _ended(outcome: Outcome, lease: Lease) -> None:
    assert outcome.lease == lease


def _opens_a_transaction() -> None:
    connection = connections["default"]
    connection.set_autocommit(False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _raises_after_a_query() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
    raise RuntimeError("after a query")


def _closed() -> None:
    assert connections["default"].connection is None


def _fresh() -> None:
    connection = connections["default"]
    assert connection.connection is None
    assert connection.get_autocommit()  # (connects: a new connection, in autocommit)
    assert not connection.in_atomic_block


def test_a_job_that_leaves_a_transaction_open_hands_the_next_job_a_fresh_connection() -> None:
    _in_a_thread([_job((1, 1), _opens_a_transaction), _closed, _job((2, 1), _fresh), _closed])


def test_a_job_that_raised_after_a_query_has_its_connection_closed_too() -> None:
    outcomes: list[Outcome] = []

    def attempt() -> Outcome:
        _raises_after_a_query()
        return Outcome((1, 1), ok=True)  # (never reached)

    _in_a_thread([lambda: outcomes.append(in_own_thread((1, 1), attempt)), _closed])
    assert not outcomes[0].ok
    assert outcomes[0].error is not None
    assert outcomes[0].error.message == "after a query"


def test_a_job_that_opened_nothing_leaves_the_threads_connections_alone() -> None:
    """Only what a job opened is closed after it (a job without a query pays no
    ``close_all``): a connection the thread held before the job is still open."""
    held: list[object] = []

    def open_outside_a_job() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
        held.append(connections["default"].connection)

    def still_held() -> None:
        assert connections["default"].connection is held[0]

    _in_a_thread([open_outside_a_job, _job((1, 1), lambda: None), still_held])


def _query() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")


def test_a_slot_closes_an_obsolete_connection_a_job_opened_before_the_next_job() -> None:
    """``CONN_MAX_AGE`` 0 (the tests' setting): the connection a job opened is obsolete
    by the next job, and closed before it."""
    _in_a_thread([connections_forgotten, _query, refresh_connections, _closed])


def test_a_slot_whose_jobs_opened_nothing_skips_the_look() -> None:
    """Until a job opens a connection there is nothing to look at: a connection the thread
    held before (which ``close_old_connections`` would close, being obsolete) is left
    alone, so the look costs a job nothing."""
    held: list[object] = []

    def open_and_forget() -> None:
        _query()
        held.append(connections["default"].connection)
        connections_forgotten()

    def still_held() -> None:
        assert connections["default"].connection is held[0]

    _in_a_thread([open_and_forget, refresh_connections, still_held])


def _slot_runs(workers, conn_max_age: str | None) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """Three jobs, one after another in one process slot; what each found."""
    ids = [int(tasks_worker.reuses_a_connection.enqueue().id) for _ in range(3)]
    env = {"LEASEJOBS_TEST_CONN_MAX_AGE": conn_max_age} if conn_max_age else None
    worker = workers.start(args=["--pool", "process", "--concurrency", "1", "--burst"], env=env)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    jobs = Job.objects.in_bulk(ids)
    assert {jobs[i].status for i in ids} == {JobStatus.SUCCEEDED}, worker.output
    runs = [jobs[i].result for i in ids]
    assert len({run["pid"] for run in runs}) == 1, runs  # one slot ran them all
    return runs


@pytest.mark.slow
def test_a_process_slot_never_hands_a_job_an_obsolete_connection(workers) -> None:  # type: ignore[no-untyped-def]
    runs = _slot_runs(workers, None)
    assert [run["reused"] for run in runs] == [False, False, False], runs


@pytest.mark.slow
def test_a_process_slot_keeps_a_persistent_connection_between_jobs(workers) -> None:  # type: ignore[no-untyped-def]
    """``CONN_MAX_AGE`` None: the connection the first job opened serves the next ones
    (the look before each job keeps what is sound)."""
    runs = _slot_runs(workers, "none")
    assert [run["reused"] for run in runs] == [False, True, True], runs
