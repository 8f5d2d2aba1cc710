"""Settings of the test/demo project, read from the environment with django-environ.

Environment variables:

* ``DATABASE_URL``: any django-environ database URL (``postgres://...``,
  ``sqlite:////abs/path.sqlite3``, ...). When unset, an embedded PostgreSQL server
  is started with its data in ``<repo>/.demo/pgdata`` and ``DATABASE_URL`` is set
  for child processes (see ``embedded_db``).
* ``SECRET_KEY``, ``DEBUG`` (default true), ``ALLOWED_HOSTS`` (comma separated).
* ``LEASEJOBS_DEMO_DATA``: where the demo's embedded PostgreSQL keeps its data.
* ``LEASEJOBS_DEMO_SCHEDULES``: ``1`` declares the demo's schedules (``DEMO_SCHEDULES``;
  ``scripts/demo`` sets it). Off by default: these settings are also the base of the
  test suite's, and every non-burst worker a test starts would run them.
"""

from pathlib import Path

import django
import environ

from .embedded_db import ensure_database_url

PROJECT_DIR = Path(__file__).resolve().parent.parent  # testproject/
REPO_ROOT = PROJECT_DIR.parent

env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-leasejobs-demo-only-do-not-deploy")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_leasejobs",
    "demo",
]
if django.VERSION < (6, 0):  # django.tasks lives in the django-tasks backport
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_leasejobs"), "django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# -- database ----------------------------------------------------------------------------

ensure_database_url(
    env.str("LEASEJOBS_DEMO_DATA", default=str(REPO_ROOT / ".demo" / "pgdata")),
    throwaway=False,
)
DATABASES = {"default": env.db_url("DATABASE_URL")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Workers, the admin and tests use several connections at once: take the write
    # lock when a transaction starts (no upgrade deadlocks), wait for it instead of
    # failing at once, and let readers run beside the writer (WAL).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL;",
        }
    )

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # MySQL / MariaDB through PyMySQL (the `mysql` extra), which stands in for mysqlclient.
    import pymysql

    pymysql.install_as_MySQLdb()
    DATABASES["default"].setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    # No TEST COLLATION: the test database gets the server's default utf8mb4 collation,
    # a case-insensitive one (utf8mb4_general_ci on MariaDB 10.x, utf8mb4_0900_ai_ci on
    # MySQL 8), which is what sites have. The dedup key column gets a binary collation of
    # its own in migration 0007 (docs/configuration.md, "MySQL and MariaDB").
    DATABASES["default"]["TEST"] = {**DATABASES["default"].get("TEST", {}), "CHARSET": "utf8mb4"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- tasks -------------------------------------------------------------------------------

TASKS = {
    "default": {
        "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
        "QUEUES": ["default", "high", "low"],
        "OPTIONS": {},
    }
}

# Periodic jobs of the demo (docs/schedules.md): declared only when the demo asks.
DEMO_SCHEDULES = {
    "demo-ping": {
        "task": "demo.tasks.ping",
        "every": 10,
        "kwargs": {"label": "every 10 seconds"},
        "queue": "low",
    },
    "demo-queue-report": {
        "task": "demo.tasks.queue_report",
        "cron": "*/2 * * * *",
        "timezone": "Europe/Berlin",
        "catch_up": "none",
    },
}
if env.bool("LEASEJOBS_DEMO_SCHEDULES", default=False):
    TASKS["default"]["OPTIONS"]["SCHEDULES"] = DEMO_SCHEDULES

# -- the rest ----------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = REPO_ROOT / ".demo" / "static"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "loggers": {
        "django_leasejobs": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
