"""One import point for the django.tasks API: Django 6 core or the django-tasks backport.

Type checkers see Django 6's ``django.tasks`` (django-stubs types it); at run time
Django 5.2 gets the same names from the ``django_tasks`` backport. Django 5.2 without the
backport (Python 3.12+ without the ``[django52]`` extra) raises ``MissingTasksBackport``,
which names the package to install, instead of a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, TypeAlias

import django
from django.core.exceptions import ImproperlyConfigured
from django.dispatch import Signal


class MissingTasksBackport(ImproperlyConfigured, ImportError):
    """Django 5.2 without the ``django-tasks`` backport: says what to install.

    An ``ImproperlyConfigured`` (Django's word for a broken setup) that is also an
    ``ImportError``, so code that guards the import with ``except ImportError`` still works.
    """


def _missing_backport_message() -> str:
    return (
        f"django-leasejobs needs django.tasks: Django 6.0+ has it, but Django "
        f"{django.get_version()} needs the django-tasks backport, which is not installed "
        f"(on Python {sys.version_info[0]}.{sys.version_info[1]}). Install it with "
        'pip install "django-leasejobs[django52]" (or pip install "django-tasks>=0.12,<0.13") '
        'and list "django_tasks" in INSTALLED_APPS, or upgrade to Django 6.'
    )


if TYPE_CHECKING or django.VERSION >= (6, 0):  # type checkers: Django 6 (django-stubs)
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks import exceptions as _task_exceptions
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )

    TASKS_LOGGER = "django.tasks"
    USING_BACKPORT = False
else:  # Django 5.2 with the django-tasks backport
    try:
        import django_tasks  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "django_tasks":
            raise
        raise MissingTasksBackport(_missing_backport_message(), name="django_tasks") from None

    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django_tasks import exceptions as _backport_exceptions
    from django_tasks import exceptions as _task_exceptions
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )

    TASKS_LOGGER = "django_tasks"

    # The backport calls it InvalidTaskError up to 0.12 and InvalidTask (Django 6's
    # name) on its main branch: take whichever this release has.
    InvalidTask = getattr(_backport_exceptions, "InvalidTask", None)
    if InvalidTask is None:
        InvalidTask = _backport_exceptions.InvalidTaskError

    USING_BACKPORT = True

BaseTaskTimeout: type[TimeoutError] = getattr(_task_exceptions, "TaskTimeout", TimeoutError)
"""Django's ``TaskTimeout`` once it has one (django/new-features#144), else
``TimeoutError``: the base of ``django_leasejobs.exceptions.TaskTimeout``."""

AnyTask: TypeAlias = "Task[..., Any]"
"""A task of any signature and return type (what the registry resolves a job's path to)."""
AnyTaskResult: TypeAlias = "TaskResult[Any, Any]"

_TASKS_LOG = logging.getLogger(TASKS_LOGGER)

_OWN_LOG_RECEIVERS = {
    id(task_enqueued): id(log_task_enqueued),
    id(task_started): id(log_task_started),
    id(task_finished): id(log_task_finished),
}


def has_other_receivers(signal: Signal) -> bool:
    """Whether ``signal`` (``task_enqueued``, ``task_started`` or ``task_finished``) has a
    receiver besides django.tasks' own log receiver."""
    own = _OWN_LOG_RECEIVERS.get(id(signal))
    # A receiver's lookup key starts with id(function) (a pair for a bound method). Run
    # twice per job: a plain loop, as a generator costs more than the rest of the check.
    for entry in signal.receivers:  # noqa: SIM110 - any() with a generator: slower (above)
        if entry[0][0] != own:
            return True
    return False


def must_send(signal: Signal, level: int) -> bool:
    """Whether sending ``signal`` could have any effect: a receiver of the site's, or
    django.tasks' own log receiver with its logger on for ``level`` (the level that
    receiver would log this result at).

    Building the ``TaskResult`` a task signal carries costs more than the rest of a short
    job's bookkeeping; with nobody to read it, the worker and ``enqueue()`` skip it.
    """
    if has_other_receivers(signal):
        return True
    return bool(signal.receivers) and _TASKS_LOG.isEnabledFor(level)


__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASKS_LOGGER",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "USING_BACKPORT",
    "AnyTask",
    "AnyTaskResult",
    "BaseTaskBackend",
    "BaseTaskTimeout",
    "InvalidTask",
    "MissingTasksBackport",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "has_other_receivers",
    "log_task_enqueued",
    "log_task_finished",
    "log_task_started",
    "must_send",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
