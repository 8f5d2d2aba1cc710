"""Settings of the chaos soak (bench/chaos.py): one PostgreSQL database, short lease timings.

bench/chaos.py starts its own embedded PostgreSQL and passes the connection to every
process it starts through the environment:

* ``CHAOS_DATABASE``: a JSON object of Django ``DATABASES`` keys;
* ``CHAOS_APP_NAME``: the connection's ``application_name`` (the worker id for a worker,
  ``leasejobs-chaos-soak`` for the soak itself), so that a fault can spare the soak's own
  connection and the verdict can tell which worker lost a terminated connection;
* ``CHAOS_LEDGER``: the directory of the tasks' append-only ledger files.

The timings below are the soak's: a lease of 3 s renewed every 0.5 s, a reaper pass
every 0.5 s in every worker, and room for a healthy job to be hit by several faults
(``MAX_STALLS`` and ``MAX_ATTEMPTS`` 10) before it would end ``dead`` or ``failed``.
"""

from __future__ import annotations

import json
import os

import django

SECRET_KEY = "chaos-soak-not-a-secret"  # noqa: S105 - a benchmark project, never deployed
DEBUG = False
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = ["django.contrib.contenttypes", "django_leasejobs", "chaossite"]
if django.VERSION < (6, 0):  # django.tasks lives in the django-tasks backport
    INSTALLED_APPS.insert(1, "django_tasks")

SOAK_APP_NAME = "leasejobs-chaos-soak"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        **json.loads(os.environ.get("CHAOS_DATABASE", '{"NAME": "leasejobs_chaos"}')),
        "CONN_MAX_AGE": None,
    }
}
DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ.get(
    "CHAOS_APP_NAME", SOAK_APP_NAME
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

CHAOS_OPTIONS = {
    "LEASE_DURATION": 3.0,
    "HEARTBEAT_INTERVAL": 0.5,
    "STALE_LOCK_INTERVAL": 0.5,
    "MAX_STALLS": 10,
    "MAX_ATTEMPTS": 10,
    "POLL_INTERVAL": 0.5,
    "LOCK_LOST_GRACE": 1.0,
    "RETRY_BACKOFF": {"base": 0.2, "factor": 2, "cap": 2, "jitter": 0.2},
}

TASKS = {
    "default": {
        "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
        "QUEUES": ["default"],
        "OPTIONS": CHAOS_OPTIONS,
    }
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
        # WARNING: the worker logs every job at INFO; the soak keeps what went wrong.
        "django_leasejobs": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}
