"""Which database errors end a worker's round (``rounds.is_connection_error``).

A connection-level error ends the round, which is retried whole; any other error raised
while writing a batch is about a row, and the batch is written row by row. MySQL drivers
raise ``OperationalError`` for most server errors, ordinary row errors included (a
trigger's SIGNAL is 1644), so on MySQL and MariaDB the error code decides. On PostgreSQL
and SQLite every ``OperationalError`` and ``InterfaceError`` still counts.

The first tests provoke real errors on the real server (skipped elsewhere); the rest
classify errors built from PyMySQL's exception classes, as Django raises them, and run
on every database.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)

from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker.rounds import is_connection_error
from tests.helpers_leases import make_job, refusing_to_finish

mysql_only = pytest.mark.skipif(
    connection.vendor != "mysql",
    reason="provokes real MySQL/MariaDB server errors (SIGNAL, KILL CONNECTION, "
    "innodb_lock_wait_timeout); PostgreSQL and SQLite errors are classified by class",
)
# DDL (CREATE TRIGGER) commits implicitly on MySQL: no test transaction to roll back.
db = pytest.mark.django_db(transaction=True)


def raised(action: Callable[[], Any]) -> BaseException:
    """The exception ``action`` raises (it must raise one)."""
    try:
        action()
    except Exception as exc:
        return exc
    raise AssertionError(f"{action!r} raised nothing")


@contextlib.contextmanager
def other_connection(**changes: Any) -> Iterator[Any]:
    """A second connection to the test database (settings changed by ``changes``), closed
    on exit whatever became of it."""
    default = connections["default"]
    other = type(default)({**default.settings_dict, **changes}, alias="other")
    try:
        yield other
    finally:
        with contextlib.suppress(Exception):
            other.close()


def execute(wrapper: Any, sql: str, params: list[Any] | None = None) -> list[Any]:
    with wrapper.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def connection_id(wrapper: Any) -> int:
    return int(execute(wrapper, "SELECT CONNECTION_ID()")[0][0])


def code(exc: BaseException) -> Any:
    return exc.args[0] if exc.args else None


# --------------------------------------------------------------------------- about a row


@mysql_only
@db
def test_a_trigger_signal_is_about_the_row() -> None:
    job = make_job()
    with refusing_to_finish(job.pk):
        exc = raised(lambda: Job.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED))
    assert isinstance(exc, OperationalError) and code(exc) == 1644  # ER_SIGNAL_EXCEPTION
    assert not is_connection_error(exc)


@mysql_only
@db
def test_json_a_column_cannot_store_is_about_the_row() -> None:
    job = make_job()
    for document in ("[", "[" * 101 + "]" * 101):  # not JSON; deeper than either server takes
        exc = raised(
            lambda document=document: execute(
                connection, "UPDATE leasejobs_job SET args = %s WHERE id = %s", [document, job.pk]
            )
        )
        # MariaDB: the CHECK (JSON_VALID) fails, 4025, which Django raises as an
        # IntegrityError; MySQL: 3140 invalid JSON text, 3157 document too deep.
        assert isinstance(exc, DatabaseError) and code(exc) in {4025, 3140, 3157}, exc
        assert not is_connection_error(exc)


@mysql_only
@db
def test_a_duplicate_key_is_about_the_row() -> None:
    job = make_job()
    exc = raised(lambda: Job.objects.create(pk=job.pk, task_path="tests.tasks.add"))
    assert isinstance(exc, IntegrityError) and code(exc) == 1062  # ER_DUP_ENTRY
    assert not is_connection_error(exc)


# --------------------------------------------------------------------------- the connection


@mysql_only
@db
def test_a_connection_killed_while_idle_is_connection_level() -> None:
    with other_connection() as victim:
        execute(connection, f"KILL CONNECTION {connection_id(victim)}")
        lost = raised(lambda: execute(victim, "SELECT 1"))
        # PyMySQL: 2013 lost connection (mysqlclient may report 1927 or 4031 instead).
        assert isinstance(lost, OperationalError) and code(lost) in {2006, 2013, 1927}, lost
        assert is_connection_error(lost)
        gone = raised(lambda: execute(victim, "SELECT 1"))  # the driver knows it now
        assert isinstance(gone, InterfaceError | OperationalError), gone
        assert is_connection_error(gone)


@mysql_only
@db
def test_a_connection_killed_mid_statement_is_connection_level() -> None:
    with other_connection() as victim:
        victim_id = connection_id(victim)
        killer = threading.Timer(0.5, lambda: execute(connection, f"KILL CONNECTION {victim_id}"))
        killer.start()
        try:
            exc = raised(lambda: execute(victim, "SELECT SLEEP(10)"))
        finally:
            killer.join(10)
        assert isinstance(exc, OperationalError) and code(exc) in {2013, 1927}, exc
        assert is_connection_error(exc)


@mysql_only
@db
def test_a_server_that_cannot_be_reached_or_refuses_the_login_is_connection_level() -> None:
    with other_connection(HOST="127.0.0.1", PORT=1) as unreachable:
        exc = raised(unreachable.ensure_connection)
        assert isinstance(exc, OperationalError) and code(exc) == 2003, exc  # CR_CONN_HOST_ERROR
        assert is_connection_error(exc)
    with other_connection(USER="leasejobs_no_such_user", PASSWORD="x") as refused:
        exc = raised(refused.ensure_connection)
        assert isinstance(exc, OperationalError) and code(exc) == 1045, exc  # access denied
        assert is_connection_error(exc)


@mysql_only
@db
def test_a_lock_wait_timeout_ends_the_round_like_on_postgresql() -> None:
    job = make_job()
    with other_connection() as waiter:
        execute(waiter, "SET SESSION innodb_lock_wait_timeout = 1")
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=job.pk)
            exc = raised(
                lambda: execute(
                    waiter, "UPDATE leasejobs_job SET priority = 1 WHERE id = %s", [job.pk]
                )
            )
    assert isinstance(exc, OperationalError) and code(exc) == 1205, exc
    assert is_connection_error(exc)


@mysql_only
@db
def test_a_statement_timeout_ends_the_round_like_on_postgresql() -> None:
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        pytest.skip("MariaDB's max_statement_time; MySQL's MAX_EXECUTION_TIME is SELECT-only")
    exc = raised(
        lambda: execute(connection, "SET STATEMENT max_statement_time = 0.2 FOR SELECT SLEEP(5)")
    )
    assert isinstance(exc, OperationalError) and code(exc) == 1969, exc
    assert is_connection_error(exc)


# --------------------------------------------------------------------------- by code, any database


def as_django_raises(exc_class: type[Exception], driver_error: Exception) -> Exception:
    """``driver_error`` as Django's database layer raises it: its own class, the driver's
    args, ``from`` the driver's exception."""
    exc = exc_class(*driver_error.args)
    exc.__cause__ = driver_error
    return exc


CONNECTION_LEVEL = {
    2002: "CR_CONNECTION_ERROR",
    2003: "CR_CONN_HOST_ERROR",
    2006: "CR_SERVER_GONE_ERROR",
    2013: "CR_SERVER_LOST",
    2055: "CR_SERVER_LOST_EXTENDED",
    1040: "ER_CON_COUNT_ERROR",
    1045: "ER_ACCESS_DENIED_ERROR",
    1053: "ER_SERVER_SHUTDOWN",
    1927: "ER_CONNECTION_KILLED (MariaDB)",
    3169: "ER_SESSION_WAS_KILLED (MySQL)",
    4031: "ER_CLIENT_INTERACTION_TIMEOUT (MySQL)",
    1205: "ER_LOCK_WAIT_TIMEOUT",
    1213: "ER_LOCK_DEADLOCK",
    1969: "ER_STATEMENT_TIMEOUT (MariaDB)",
    3024: "ER_QUERY_TIMEOUT (MySQL)",
}

ABOUT_A_ROW = {
    1644: "ER_SIGNAL_EXCEPTION",
    4025: "ER_CONSTRAINT_FAILED (MariaDB)",
    3819: "ER_CHECK_CONSTRAINT_VIOLATED (MySQL)",
    3140: "ER_INVALID_JSON_TEXT (MySQL)",
    3157: "ER_JSON_DOCUMENT_TOO_DEEP (MySQL)",
    1062: "ER_DUP_ENTRY",
    1406: "ER_DATA_TOO_LONG",
    1366: "ER_TRUNCATED_WRONG_VALUE_FOR_FIELD",
    1264: "ER_WARN_DATA_OUT_OF_RANGE",
    1292: "ER_TRUNCATED_WRONG_VALUE",
}


@pytest.mark.parametrize("errno", CONNECTION_LEVEL, ids=CONNECTION_LEVEL.get)
def test_connection_level_codes_end_the_round(errno: int) -> None:
    driver_error = pymysql.err.OperationalError(errno, CONNECTION_LEVEL[errno])
    assert is_connection_error(as_django_raises(OperationalError, driver_error))


@pytest.mark.parametrize("errno", ABOUT_A_ROW, ids=ABOUT_A_ROW.get)
@pytest.mark.parametrize(
    "django_class", [OperationalError, IntegrityError, DataError], ids=lambda c: c.__name__
)
def test_codes_about_a_row_never_end_the_round(errno: int, django_class: type[Exception]) -> None:
    # Which class a code arrives as depends on the driver and on Django's own mapping
    # (PyMySQL: OperationalError for 1644, 3819, 4025; Django makes 3819 and 4025
    # IntegrityErrors): none of them is the connection.
    driver_error = pymysql.err.OperationalError(errno, ABOUT_A_ROW[errno])
    assert not is_connection_error(as_django_raises(django_class, driver_error))


def test_a_mysql_driver_error_without_a_code_is_connection_level() -> None:
    # PyMySQL raises these while connecting (a failed authentication exchange).
    driver_error = pymysql.err.OperationalError("received unknown auth switch request")
    assert is_connection_error(as_django_raises(OperationalError, driver_error))
    # PyMySQL's InterfaceError(0, ''): the connection is closed.
    assert is_connection_error(as_django_raises(InterfaceError, pymysql.err.InterfaceError(0, "")))


def test_without_a_mysql_driver_behind_it_every_operational_error_counts() -> None:
    # PostgreSQL and SQLite: as before, whatever the message (psycopg and sqlite3 give
    # a message, not a code).
    assert is_connection_error(OperationalError("server closed the connection unexpectedly"))
    assert is_connection_error(OperationalError(1644, "a code, but no MySQL driver behind it"))
    assert is_connection_error(InterfaceError("connection already closed"))
    assert not is_connection_error(IntegrityError("duplicate key value"))
    assert not is_connection_error(DataError("value too long"))
    assert not is_connection_error(ValueError("not a database error"))
