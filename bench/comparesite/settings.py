"""Settings of the comparison project: django-leasejobs, django-tasks-db and django-ox side by side.

One database for all three (``COMPARE_DATABASE``: a JSON object of Django ``DATABASES``
keys, written by bench/compare.py), one ``TASKS`` alias per system, ``DEBUG`` off and
logging at WARNING so that no system pays for log lines. Connections are persistent
(``CONN_MAX_AGE = None``), as a production site would configure them: django-tasks-db's
worker and django-ox's task threads call ``close_old_connections()`` around every task,
which with Django's default of 0 reconnects to the database for every job.

``COMPARE_LEASEJOBS_OPTIONS`` (JSON) is merged over the leasejobs alias's ``OPTIONS``:
the recovery measurement starts workers with short lease timings through it.
"""

from __future__ import annotations

import json
import os

SECRET_KEY = "bench-compare-not-a-secret"  # noqa: S105 - a benchmark project, never deployed
DEBUG = False
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_leasejobs",
    "django_tasks_db",
    "django_ox",
    "comparesite",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        **json.loads(os.environ.get("COMPARE_DATABASE", '{"NAME": "leasejobs_compare"}')),
        "CONN_MAX_AGE": None,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

LEASEJOBS_OPTIONS = json.loads(os.environ.get("COMPARE_LEASEJOBS_OPTIONS") or "{}")

TASKS = {
    "leasejobs": {
        "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
        "QUEUES": ["default"],
        "OPTIONS": LEASEJOBS_OPTIONS,
    },
    "tasksdb": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default"],
    },
    "ox": {
        "BACKEND": "django_ox.backend.OxBackend",
        "QUEUES": ["default"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "level": "WARNING"},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        name: {"handlers": ["console"], "level": "WARNING", "propagate": False}
        for name in ("django", "django.tasks", "django_leasejobs", "django_tasks_db", "django_ox")
    },
}
