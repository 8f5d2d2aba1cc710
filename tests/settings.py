"""Settings for the test suite: the demo project's settings plus the ``tests`` app.

Database, by ``DATABASE_URL``:

* unset: a throwaway embedded PostgreSQL in a temporary directory, started by the
  process that imports these settings first and removed when it exits;
* PostgreSQL (or another server): pytest-django creates ``test_<NAME>`` there;
* SQLite: the test database is a file in a temporary directory (never in memory), so
  other connections, threads and subprocesses see the same database.

Subprocesses started by the tests get ``LEASEJOBS_TEST_SUBPROCESS=1`` and a
``DATABASE_URL`` naming the test database itself (``tests/conftest.py``): they use it
as it is, without renaming it or starting a server.
"""

import atexit
import os
import shutil
import tempfile

from django.core.exceptions import ImproperlyConfigured

from testproject.embedded_db import ensure_database_url

IN_TEST_SUBPROCESS = os.environ.get("LEASEJOBS_TEST_SUBPROCESS") == "1"

if not os.environ.get("DATABASE_URL"):
    if IN_TEST_SUBPROCESS:
        raise ImproperlyConfigured(
            "LEASEJOBS_TEST_SUBPROCESS=1 needs DATABASE_URL naming the test database "
            "(build the environment with the subprocess_env fixture)"
        )
    ensure_database_url(None, throwaway=True)

from testproject.settings import *  # noqa: E402, F403
from testproject.settings import DATABASES, INSTALLED_APPS, TASKS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests"]

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user creation

# A second alias of the same database (a test mirror: no database of its own), for the
# tests that check which alias a backend's DATABASE option sends the writes through.
DATABASES["leasejobs_mirror"] = {
    **DATABASES["default"],
    "TEST": {**DATABASES["default"].get("TEST", {}), "MIRROR": "default"},
}

# tests/e2e/test_pgbouncer.py points a subprocess's default alias at a pooler and passes the
# test database itself in LEASEJOBS_TEST_DIRECT_DATABASE_URL: the alias for LISTEN_DATABASE.
if os.environ.get("LEASEJOBS_TEST_DIRECT_DATABASE_URL"):
    import environ

    DATABASES["leasejobs_direct"] = environ.Env.db_url_config(
        os.environ["LEASEJOBS_TEST_DIRECT_DATABASE_URL"]
    )

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and not IN_TEST_SUBPROCESS:
    _sqlite_dir = tempfile.mkdtemp(prefix="leasejobs-sqlite-")
    _owner_pid = os.getpid()

    def _remove_sqlite_dir() -> None:
        if os.getpid() == _owner_pid:  # not in forked children
            shutil.rmtree(_sqlite_dir, ignore_errors=True)

    atexit.register(_remove_sqlite_dir)
    DATABASES["default"]["TEST"] = {
        **DATABASES["default"].get("TEST", {}),
        "NAME": os.path.join(_sqlite_dir, "test.sqlite3"),
    }

# tests/backend/test_checks.py adds database OPTIONS of another engine in a subprocess
# (leasejobs.W006): JSON in LEASEJOBS_TEST_DATABASE_OPTIONS, merged over default's.
if os.environ.get("LEASEJOBS_TEST_DATABASE_OPTIONS"):
    import json

    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        **json.loads(os.environ["LEASEJOBS_TEST_DATABASE_OPTIONS"]),
    }

# tests/worker/test_job_connections.py runs a worker whose connections persist between
# jobs: LEASEJOBS_TEST_CONN_MAX_AGE (seconds, or "none" for no limit) for default's.
if os.environ.get("LEASEJOBS_TEST_CONN_MAX_AGE"):
    _age = os.environ["LEASEJOBS_TEST_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "none" else int(_age)

# A second, real database for tests/e2e/test_two_databases.py (backends on two databases):
# the same server as default, its own database (on SQLite a second file). pytest-django
# creates its test database only when a test asks for the alias. Subprocesses get the
# test database's name in LEASEJOBS_TEST_SECOND_DATABASE_NAME (tests/conftest.py).
DATABASES["leasejobs_second"] = {
    **DATABASES["default"],
    "OPTIONS": dict(DATABASES["default"].get("OPTIONS") or {}),
    "TEST": {k: v for k, v in DATABASES["default"].get("TEST", {}).items() if k != "NAME"},
}
if os.environ.get("LEASEJOBS_TEST_SECOND_DATABASE_NAME"):
    DATABASES["leasejobs_second"]["NAME"] = os.environ["LEASEJOBS_TEST_SECOND_DATABASE_NAME"]
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and not IN_TEST_SUBPROCESS:
    DATABASES["leasejobs_second"]["NAME"] = os.path.join(_sqlite_dir, "second.sqlite3")
    DATABASES["leasejobs_second"]["TEST"]["NAME"] = os.path.join(_sqlite_dir, "test_second.sqlite3")
else:
    DATABASES["leasejobs_second"]["NAME"] = f"{DATABASES['default']['NAME']}_second"

# Worker tests start real `runworker` subprocesses with short timings: they pass the
# backend OPTIONS as JSON in LEASEJOBS_TEST_OPTIONS (merged over the defaults).
if os.environ.get("LEASEJOBS_TEST_ROOT_URLCONF"):
    ROOT_URLCONF = os.environ["LEASEJOBS_TEST_ROOT_URLCONF"]
if os.environ.get("LEASEJOBS_TEST_OPTIONS"):
    import json

    from testproject.settings import TASKS

    TASKS = {
        **TASKS,
        "default": {
            **TASKS["default"],
            "OPTIONS": {
                **TASKS["default"].get("OPTIONS", {}),
                **json.loads(os.environ["LEASEJOBS_TEST_OPTIONS"]),
            },
        },
    }

# More TASKS entries for a subprocess, as JSON in LEASEJOBS_TEST_TASKS (alias -> entry,
# added to or replacing the project's; tests/e2e/test_two_databases.py).
if os.environ.get("LEASEJOBS_TEST_TASKS"):
    import json

    TASKS = {**TASKS, **json.loads(os.environ["LEASEJOBS_TEST_TASKS"])}

# django.tasks' own log receivers (task_started, task_finished) print on stderr at this
# level in a subprocess (tests/worker/test_task_signal_costs.py). Django 6 names the logger
# "django.tasks", the backport "django_tasks".
if os.environ.get("LEASEJOBS_TEST_TASKS_LOG_LEVEL"):
    _TASKS_LOG_LEVEL = os.environ["LEASEJOBS_TEST_TASKS_LOG_LEVEL"]
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"stderr": {"class": "logging.StreamHandler"}},
        "loggers": {
            name: {"handlers": ["stderr"], "level": _TASKS_LOG_LEVEL, "propagate": False}
            for name in ("django.tasks", "django_tasks")
        },
    }
