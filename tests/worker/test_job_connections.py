"""A job that runs in a thread of the worker (``--pool thread``, ``--sync-on-loop``) leaves
nothing of its database connections to the next job in that thread (``in_own_thread``):
whatever it opened is closed after it, even when it raised or left a transaction open.
Real threads, the real database."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connections

from django_leasejobs.worker.execution import Outcome, in_own_thread

pytestmark = pytest.mark.django_db(transaction=True)

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
