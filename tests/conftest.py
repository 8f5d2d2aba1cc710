"""Shared fixtures: run real subprocesses (workers, manage.py) against the test database."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from testproject.embedded_db import settings_to_database_url

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTPROJECT_DIR = REPO_ROOT / "testproject"
MANAGE_PY = TESTPROJECT_DIR / "manage.py"

RunManage = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def _subprocess_env_base(django_db_setup: None, django_db_blocker: Any) -> dict[str, str]:
    # After django_db_setup, the connection's settings name the test database
    # (test_<name> on PostgreSQL, the temporary file on SQLite).
    from django.db import DatabaseError, connection, connections

    second = str(connections["leasejobs_second"].settings_dict["NAME"])
    if connection.vendor == "mysql":
        # A worker's system checks connect to every alias on MySQL/MariaDB (Django 6 asks
        # the server's version): when no test of this run asked for the second database,
        # it may not exist; the workers then take the default test database for it.
        with django_db_blocker.unblock():
            try:
                connections["leasejobs_second"].ensure_connection()
            except DatabaseError:
                second = str(connection.settings_dict["NAME"])
            finally:
                connections["leasejobs_second"].close()

    env = dict(os.environ)
    paths = [str(REPO_ROOT), str(TESTPROJECT_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=os.pathsep.join(paths),
        DATABASE_URL=settings_to_database_url(connection.settings_dict),
        # tests/settings.py's second database (its test database when a test asked for it)
        LEASEJOBS_TEST_SECOND_DATABASE_NAME=second,
        LEASEJOBS_TEST_SUBPROCESS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="session", autouse=True)
def _mirror_alias_ready(django_db_setup: None, django_db_blocker: Any) -> None:
    """Ask the database features of ``leasejobs_mirror`` (tests/settings.py: a second alias
    of the test database) once, as Django asked default's while it set the database up:
    system checks run by tests without database access (Django 6 checks JSONField
    support on every alias) then need no query."""
    from django.db import DatabaseError, connections

    with django_db_blocker.unblock():
        mirror = connections["leasejobs_mirror"]
        assert mirror.features.supports_json_field
        # The model checks read each alias's column types; on MySQL/MariaDB (Django 6)
        # those ask the server's version (cached on the connection): asked here, not by
        # whichever test without database access runs checks first.
        assert connections["default"].data_types and mirror.data_types
        mirror.close()
        # The same for the second database (tests/settings.py), set up or not: on SQLite
        # its file is in the run's temporary directory; on PostgreSQL the feature needs no
        # query; on MySQL a server without that database is left for checks to report.
        second = connections["leasejobs_second"]
        with contextlib.suppress(DatabaseError):
            assert second.features.supports_json_field
            assert second.data_types
        if second.vendor == "mysql" and "mysql_server_data" not in second.__dict__:
            # Its database does not exist (no test of this run asked for it), so the
            # checks could not ask its server's version: it is default's server.
            second.__dict__["mysql_server_data"] = connections["default"].mysql_server_data
        second.close()


@pytest.fixture
def subprocess_env(_subprocess_env_base: dict[str, str]) -> dict[str, str]:
    """Environment for a subprocess that must use this run's test database.

    The subprocess only sees what the test has COMMITTED: use
    ``@pytest.mark.django_db(transaction=True)`` when it must see the test's rows.
    The dict is a fresh copy; change it freely.
    """
    return dict(_subprocess_env_base)


@pytest.fixture
def run_manage(subprocess_env: dict[str, str]) -> RunManage:
    """``run_manage(args, env=None, timeout=60, check=False, input=None)``.

    Runs ``python testproject/manage.py <args>`` from the repository root with
    ``subprocess_env`` (or ``env``) and returns the CompletedProcess, text output
    captured. ``args`` is a sequence of strings or one shell-like string.
    """

    def run(
        args: Sequence[str] | str,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        argv = shlex.split(args) if isinstance(args, str) else list(args)
        return subprocess.run(
            [sys.executable, str(MANAGE_PY), *argv],
            cwd=REPO_ROOT,
            env=dict(env) if env is not None else subprocess_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
        )

    return run


@pytest.fixture
def workers(subprocess_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Start real ``runworker`` subprocesses (see tests/worker_harness.py); all killed after."""
    from tests.worker_harness import Workers

    factory = Workers(subprocess_env)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture
def marker_dir(tmp_path: Path) -> str:
    """A directory where worker test tasks leave evidence (tests/tasks_worker.py)."""
    path = tmp_path / "markers"
    path.mkdir()
    return str(path)


class ListHandler(logging.Handler):
    """Collects the records of one logger, whatever the project's LOGGING says."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def leasejobs_log() -> Iterator[ListHandler]:
    """Every record of the ``django_leasejobs`` logger during the test (it does not
    propagate in the project's LOGGING, so caplog alone would miss them)."""
    handler = ListHandler()
    logger = logging.getLogger("django_leasejobs")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


# -- the lease protocol's paths ------------------------------------------------------------


def lease_paths() -> list[str]:
    """The paths of ``django_leasejobs.leases`` that the database of this run can take:
    PostgreSQL both (its batched statements, and the portable ones MySQL/MariaDB use),
    SQLite its batched statements, MySQL/MariaDB the portable ones."""
    from django.db import connection

    return {"postgresql": ["batched", "portable"], "sqlite": ["batched"]}.get(
        connection.vendor, ["portable"]
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lease_path" in metafunc.fixturenames:
        metafunc.parametrize("lease_path", lease_paths(), indirect=True)


@pytest.fixture
def lease_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per path of the lease protocol on this database (the contract
    suite: ``docs/development.md``); the value is ``"batched"`` or ``"portable"``."""
    from django_leasejobs import leases

    if request.param == "portable":
        with leases.portable_path():
            yield request.param
    else:
        yield request.param


@pytest.fixture
def terminal_signals_default() -> Iterator[None]:
    """SIGHUP and SIGINT at their default actions while the test runs, so that the
    processes it starts inherit those and not this run's dispositions: under ``nohup``
    SIGHUP is ignored, and a run started in the background by a non-interactive shell
    (``bash .ci/run &``) ignores SIGINT. A process that starts with a signal ignored keeps
    ignoring it: runworker does so on purpose for SIGHUP, bash cannot even trap it, and
    Python raises no KeyboardInterrupt (runserver would not stop on ^C)."""
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    # Python's own handler in this process; a child's exec resets it to the default.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous_hup)
        signal.signal(signal.SIGINT, previous_int)


@pytest.fixture
def nothing_stored() -> Iterator[None]:
    """The test must leave the job and workflow tables and the enqueue signals as they
    were (a test with database access)."""
    from django_leasejobs.compat import task_enqueued
    from django_leasejobs.models import Job, Workflow
    from django_leasejobs.signals import job_enqueued

    sent: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    before = (Job.objects.count(), Workflow.objects.count())
    job_enqueued.connect(receiver, weak=False)
    task_enqueued.connect(receiver, weak=False)
    try:
        yield
    finally:
        job_enqueued.disconnect(receiver)
        task_enqueued.disconnect(receiver)
    assert (Job.objects.count(), Workflow.objects.count()) == before
    assert sent == []
