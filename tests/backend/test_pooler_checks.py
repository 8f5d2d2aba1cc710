"""``OPTIONS["LISTEN_DATABASE"]``: its checks (E002, E018, E019), and how the listener
decides that a connection is direct before it LISTENs (the pooler itself:
tests/test_pgbouncer.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core import checks
from django.core.checks import run_checks
from django.db import connection, connections
from django.test import override_settings

from django_leasejobs.compat import task_backends
from django_leasejobs.conf import (
    E_BAD_VALUE,
    E_LISTEN_DATABASE_NOT_POSTGRESQL,
    E_UNKNOWN_LISTEN_DATABASE,
    Options,
    parse_options,
)
from django_leasejobs.worker.listener import Listener, listen_connection_params, pooler_in_between
from tests.conftest import ListHandler

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"


def leasejobs_messages(options: dict[str, Any]) -> list[checks.CheckMessage]:
    tasks = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": options}}
    # Only this app's tags: the model checks of another alias would open a connection that
    # a test without database access may not (Django 6's JSONField check does).
    tags = [checks.Tags.compatibility, checks.Tags.security]
    with override_settings(TASKS=tasks):
        return [m for m in run_checks(tags=tags) if str(m.id).startswith("leasejobs.")]


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [str(m.id) for m in messages]


@pytest.fixture
def sqlite_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A second DATABASES alias on SQLite (no connection is ever opened)."""
    alias = "legacy_sqlite"
    databases = connections.configure_settings(
        {
            **connections.settings,
            alias: {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        }
    )
    monkeypatch.setitem(connections.settings, alias, databases[alias])
    if settings.DATABASES is not connections.settings:
        monkeypatch.setitem(settings.DATABASES, alias, databases[alias])
    yield alias
    with contextlib.suppress(AttributeError):
        del connections[alias]


def test_the_ids_are_stable() -> None:
    assert (E_UNKNOWN_LISTEN_DATABASE, E_LISTEN_DATABASE_NOT_POSTGRESQL) == (
        "leasejobs.E018",
        "leasejobs.E019",
    )


def test_unset_by_default() -> None:
    options, problems = parse_options({})
    assert options.listen_database is None
    assert problems == []


def test_an_alias_is_read() -> None:
    options, problems = parse_options({"LISTEN_DATABASE": "direct"})
    assert options == Options(listen_database="direct")
    assert problems == []


@pytest.mark.parametrize("value", ["", 5, None, ["default"]])
def test_e002_not_an_alias(value: Any) -> None:
    messages = leasejobs_messages({"LISTEN_DATABASE": value})
    assert ids(messages) == [E_BAD_VALUE]
    assert "LISTEN_DATABASE must be a database alias" in messages[0].msg


def test_e018_unknown_alias() -> None:
    messages = leasejobs_messages({"LISTEN_DATABASE": "direct"})
    assert ids(messages) == [E_UNKNOWN_LISTEN_DATABASE]
    assert messages[0].level == checks.ERROR
    assert messages[0].obj == "TASKS['default']"
    assert "'direct'" in messages[0].msg
    assert "default" in str(messages[0].hint)


def test_e019_not_postgresql(sqlite_alias: str) -> None:
    messages = leasejobs_messages({"LISTEN_DATABASE": sqlite_alias})
    assert ids(messages) == [E_LISTEN_DATABASE_NOT_POSTGRESQL]
    assert "'sqlite'" in messages[0].msg
    assert "LISTEN/NOTIFY" in messages[0].msg


def test_a_second_alias_of_the_test_database() -> None:
    """Silent on PostgreSQL; on another test database the alias is not PostgreSQL."""
    messages = leasejobs_messages({"LISTEN_DATABASE": "leasejobs_mirror"})
    expected = (
        []
        if connections["leasejobs_mirror"].vendor == "postgresql"
        else [E_LISTEN_DATABASE_NOT_POSTGRESQL]
    )
    assert ids(messages) == expected


# --------------------------------------------------------------------------- the listener


class CountingInbox:
    """Stands in for the worker's inbox: counts what the listener posts."""

    def __init__(self) -> None:
        self.posted: list[object] = []

    def post(self, message: object) -> None:
        self.posted.append(message)


def stand_in(options: Options, database: str = "default") -> SimpleNamespace:
    """What a Listener reads of its ``ThreadContext``."""
    return SimpleNamespace(
        options=options,
        database=database,
        worker_id="w-pooler",
        queues=None,
        inbox=CountingInbox(),
        backend=task_backends["default"],
    )


def test_disable_server_side_cursors_means_pooled_without_connecting(
    monkeypatch: pytest.MonkeyPatch, leasejobs_log: ListHandler
) -> None:
    """Django's documented setting for transaction pooling: the listener warns once with
    the fix and ends; the worker polls. (No database: the decision needs no connection.)"""
    monkeypatch.setitem(connections["default"].settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    worker = stand_in(Options(poll_interval=2.5))
    listener = Listener(worker, threading.Event())  # type: ignore[arg-type]
    listener.loop()  # returns: nothing to listen on
    [record] = [r for r in leasejobs_log.records if "not listening" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert (record.worker, record.database) == ("w-pooler", "default")  # type: ignore[attr-defined]
    assert "DISABLE_SERVER_SIDE_CURSORS" in record.getMessage()
    assert 'OPTIONS["LISTEN_DATABASE"]' in record.getMessage()
    assert "polls every 2.5s" in record.getMessage()
    assert worker.inbox.posted == []


@pytest.mark.django_db
def test_a_direct_connection_to_the_test_database_is_recognised() -> None:
    """TCP (DATABASE_URL on a server) or the embedded server's Unix socket: the server's
    session serves this very socket."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    with psycopg.connect(**listen_connection_params("default"), autocommit=True) as conn:
        assert pooler_in_between(conn) == ""
