"""The settings and task modules a bench's worker processes import (a "shim").

``write(directory, name)`` writes ``<name>_settings.py`` (the test project's settings,
``DEBUG`` off as in production (the test project's default is on, which records every
query), quiet logging, no schedules, the bench's task module in ``IMPORTS``) and
``<name>_tasks.py`` (the tasks ``noop``, ``anoop``, ``record`` and ``arecord``) into
``directory``, and returns the two module names. Put ``directory`` first on the
``PYTHONPATH`` of the processes, with the test project's folder and the repository, and
name the settings in ``DJANGO_SETTINGS_MODULE``.

Environment variables the processes read (unset: nothing changes):

* ``LEASEJOBS_BENCH_OPTIONS``: a JSON object merged into the backend's ``OPTIONS``
  (``{"LEASE_DURATION": 4, "HEARTBEAT_INTERVAL": 1}``);
* ``LEASEJOBS_BENCH_LOG_INFO``: ``|``-separated starts of INFO messages of the
  ``django_leasejobs`` logger to log besides its warnings (``database round took``):
  the logger is then at INFO (``LEASEJOBS_BENCH_LOG_LEVEL``: DEBUG lets DEBUG messages
  with those starts through too) with a filter that drops every other record below
  WARNING;
* ``LEASEJOBS_BENCH_RUNS``: the file ``record`` appends to (``bench/overload.py``).
"""

from __future__ import annotations

from pathlib import Path

SETTINGS = """\
from testproject.settings import *  # noqa: F403

DEBUG = False
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django_leasejobs": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        # Django 6's own task logger sits under "django" (INFO in Django's defaults): two
        # INFO lines per job would reach the root's handler.
        "django.tasks": {"level": "WARNING"},
    },
}
TASKS["default"]["OPTIONS"]["SCHEDULES"] = {}  # noqa: F405
TASKS["default"]["OPTIONS"]["IMPORTS"] = [TASK_MODULE]  # noqa: F405

import json as _json  # noqa: E402
import os as _os  # noqa: E402

TASKS["default"]["OPTIONS"].update(  # noqa: F405
    _json.loads(_os.environ.get("LEASEJOBS_BENCH_OPTIONS") or "{}")
)
_INFO_STARTS = tuple(p for p in _os.environ.get("LEASEJOBS_BENCH_LOG_INFO", "").split("|") if p)
if _INFO_STARTS:

    def _warnings_and_some_info(record):
        return record.levelno >= 30 or record.getMessage().startswith(_INFO_STARTS)

    LOGGING["filters"] = {"bench_info": {"()": lambda: _warnings_and_some_info}}
    LOGGING["loggers"]["django_leasejobs"].update(
        level=_os.environ.get("LEASEJOBS_BENCH_LOG_LEVEL") or "INFO", filters=["bench_info"]
    )
"""

TASKS = """\
import asyncio
import os
import time

from django_leasejobs import task


@task
def noop():
    return None


@task
async def anoop():
    \"\"\"``noop`` as an ``async def`` task (a process-pool slot runs it on its event loop).\"\"\"
    return None


_runs = None


@task(takes_context=True)
def record(context, ms=0):
    \"\"\"Append "<job id> <attempt>" to $LEASEJOBS_BENCH_RUNS (one write, O_APPEND), then
    sleep ``ms`` milliseconds.\"\"\"
    global _runs
    if _runs is None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        _runs = os.open(os.environ["LEASEJOBS_BENCH_RUNS"], flags, 0o644)
    os.write(_runs, f"{context.task_result.id} {context.attempt}\\n".encode())
    if ms:
        time.sleep(ms / 1000)
    return None


@task(takes_context=True)
async def arecord(context, ms=0):
    \"\"\"``record`` as an ``async def`` task: it runs on a slot's event loop, beside others.\"\"\"
    global _runs
    if _runs is None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        _runs = os.open(os.environ["LEASEJOBS_BENCH_RUNS"], flags, 0o644)
    os.write(_runs, f"{context.task_result.id} {context.attempt}\\n".encode())
    if ms:
        await asyncio.sleep(ms / 1000)
    return None
"""


def modules(name: str) -> tuple[str, str]:
    """The settings and task module names of the shim ``name``."""
    return f"{name}_settings", f"{name}_tasks"


def write(directory: Path, name: str) -> tuple[str, str]:
    """Write the shim ``name`` into ``directory``; return its settings and task modules."""
    settings_module, task_module = modules(name)
    settings = SETTINGS.replace("[TASK_MODULE]", repr([task_module]))
    (directory / f"{settings_module}.py").write_text(settings)
    (directory / f"{task_module}.py").write_text(TASKS)
    return settings_module, task_module
