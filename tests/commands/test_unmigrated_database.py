"""A database the app's migrations never reached: ``runworker`` (with ``--burst``, with
``--processes``) exits at once with the fix, and so do the other commands; a database
that cannot be reached is tried for ``--wait-for-database`` seconds, then exit code 2.

Real ``manage.py`` subprocesses on a scratch database of the run's server (a database of
a private name, created empty here; on SQLite a new file), never a mock.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testproject.embedded_db import settings_to_database_url

# The test database must exist (pytest-django sets up only those a django_db test asks
# for): the scratch databases are created beside it, and the subprocesses' settings name it.
pytestmark = pytest.mark.django_db

# Before this check existed, a worker on such a database never stopped: a timeout
# turns a hang into a failure, generously (each run below takes about a second).
TIMEOUT = 60

ALL_MIGRATIONS = sorted(
    path.stem
    for path in (Path(__file__).resolve().parents[2] / "django_leasejobs" / "migrations").glob(
        "0*.py"
    )
)


@pytest.fixture
def fresh_database(django_db_blocker: Any, tmp_path: Path) -> Iterator[str]:
    """The ``DATABASE_URL`` of a database that exists and is empty: never migrated, not
    even Django's ``django_migrations`` table; on the server of the test database, created
    and dropped through a connection of its own (outside the test's transaction)."""
    from django.db import connection, connections

    settings_dict = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        yield settings_to_database_url({**settings_dict, "NAME": str(tmp_path / "fresh.sqlite3")})
        return
    name = f"leasejobs_fresh_{os.getpid()}_{secrets.token_hex(4)}"
    quoted = connection.ops.quote_name(name)
    drop = f"DROP DATABASE IF EXISTS {quoted}"
    if connection.vendor == "postgresql":
        drop += " WITH (FORCE)"  # a worker the test failed to stop may still hold it

    def execute(sql: str) -> None:
        admin = connections.create_connection("default")  # autocommit, its own session
        try:
            with django_db_blocker.unblock(), admin.cursor() as cursor:
                cursor.execute(sql)
        finally:
            admin.close()

    execute(f"CREATE DATABASE {quoted}")
    try:
        yield settings_to_database_url({**settings_dict, "NAME": name})
    finally:
        execute(drop)


@pytest.fixture
def on_fresh(subprocess_env: dict[str, str], fresh_database: str) -> dict[str, str]:
    return {**subprocess_env, "DATABASE_URL": fresh_database}


def assert_refused_with_the_fix(done: Any, missing: list[str]) -> None:
    assert done.returncode == 2, done.stderr
    assert 'run "manage.py migrate"' in done.stderr, done.stderr
    assert "database 'default' is not migrated" in done.stderr
    count = len(missing)
    assert f"{count} migration{'s' if count != 1 else ''} of django_leasejobs not applied" in (
        done.stderr
    )
    assert f"({', '.join(missing)})" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--burst"],
        ["--burst", "--processes", "2"],
        [],
        ["--processes", "2"],
    ],
    ids=["burst", "burst-processes-2", "forever", "forever-processes-2"],
)
def test_runworker_on_a_database_never_migrated_exits_at_once_with_the_fix(
    run_manage: Any, on_fresh: dict[str, str], args: list[str]
) -> None:
    started = time.monotonic()
    done = run_manage(["runworker", "--concurrency", "1", *args], env=on_fresh, timeout=TIMEOUT)
    took = time.monotonic() - started
    assert_refused_with_the_fix(done, ALL_MIGRATIONS)
    # No retries: waiting does not migrate a database.
    assert "cannot be reached" not in done.stderr
    assert took < TIMEOUT / 2, took
    # Nothing started: no worker, no supervisor (the check runs before the fork).
    output = done.stdout + done.stderr
    assert "started: backend=" not in output
    assert "supervisor" not in output
    assert "database error in the worker" not in output


def test_runworker_names_only_the_migrations_not_applied(
    run_manage: Any, on_fresh: dict[str, str]
) -> None:
    """A site that upgraded the package but not its database: the new migration only."""
    last, before = ALL_MIGRATIONS[-1], ALL_MIGRATIONS[-2]
    migrated = run_manage(["migrate", "django_leasejobs", before], env=on_fresh, timeout=300)
    assert migrated.returncode == 0, migrated.stderr
    done = run_manage(["runworker", "--burst", "--concurrency", "1"], env=on_fresh, timeout=TIMEOUT)
    assert_refused_with_the_fix(done, [last])


def test_runworker_notices_tables_missing_under_recorded_migrations(
    run_manage: Any, on_fresh: dict[str, str]
) -> None:
    """Migrations recorded as applied (``--fake``) on a database without the tables:
    ``migrate`` alone would not create them, and the message says so."""
    faked = run_manage(["migrate", "django_leasejobs", "--fake"], env=on_fresh, timeout=300)
    assert faked.returncode == 0, faked.stderr
    done = run_manage(["runworker", "--burst", "--concurrency", "1"], env=on_fresh, timeout=TIMEOUT)
    assert done.returncode == 2, done.stderr
    assert "database 'default' lacks the tables" in done.stderr
    assert "leasejobs_job" in done.stderr
    assert '"manage.py migrate django_leasejobs zero --fake"' in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["reap_stale_locks"],
        ["prune_jobs", "--older-than", "1d"],
        ["leasejobs_status"],
        ["leasejobs_queue", "list"],
        ["leasejobs_schedules"],
    ],
    ids=lambda command: command[0],
)
def test_other_commands_on_a_database_never_migrated_name_the_fix(
    run_manage: Any, on_fresh: dict[str, str], command: list[str]
) -> None:
    done = run_manage(command, env=on_fresh, timeout=TIMEOUT)
    assert_refused_with_the_fix(done, ALL_MIGRATIONS)


def unreachable_database_url() -> str:
    """A ``DATABASE_URL`` of this run's vendor that nothing answers: a free local port
    (PostgreSQL, MySQL), a file in a directory that does not exist (SQLite)."""
    from django.db import connection

    settings_dict = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        return settings_to_database_url(
            {**settings_dict, "NAME": f"/nonexistent-{secrets.token_hex(4)}/db.sqlite3"}
        )
    with socket.socket() as probe:  # a port just free; nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return settings_to_database_url({**settings_dict, "HOST": "127.0.0.1", "PORT": str(port)})


@pytest.mark.parametrize("processes", ["1", "2"])
def test_runworker_tries_an_unreachable_database_for_a_while_then_exits_2(
    run_manage: Any, subprocess_env: dict[str, str], processes: str
) -> None:
    env = {**subprocess_env, "DATABASE_URL": unreachable_database_url()}
    args = ["runworker", "--burst", "--concurrency", "1", "--processes", processes]
    started = time.monotonic()
    done = run_manage([*args, "--wait-for-database", "2"], env=env, timeout=TIMEOUT)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert "database 'default' cannot be reached (" in done.stderr, done.stderr
    assert "cannot be reached at start (attempt 1), trying again in 0.5 s" in done.stderr
    assert "Traceback" not in done.stderr
    assert "started: backend=" not in done.stdout + done.stderr
    assert 2 <= took < TIMEOUT / 2, took
