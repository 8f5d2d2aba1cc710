"""The settings and task modules a bench's worker processes import (a "shim").

``write(directory, name)`` writes ``<name>_settings.py`` (the test project's settings,
quiet logging, no schedules, the bench's task module in ``IMPORTS``) and
``<name>_tasks.py`` (one task, ``noop``) into ``directory``, and returns the two module
names. Put ``directory`` first on the ``PYTHONPATH`` of the processes, with the test
project's folder and the repository, and name the settings in ``DJANGO_SETTINGS_MODULE``.
"""

from __future__ import annotations

from pathlib import Path

SETTINGS = """\
from testproject.settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django_leasejobs": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}
TASKS["default"]["OPTIONS"]["SCHEDULES"] = {}  # noqa: F405
TASKS["default"]["OPTIONS"]["IMPORTS"] = [TASK_MODULE]  # noqa: F405
"""

TASKS = """\
from django_leasejobs import task


@task
def noop():
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
