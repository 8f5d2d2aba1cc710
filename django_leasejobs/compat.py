"""One import point for the django.tasks API: Django 6 core or the django-tasks backport.

Type checkers see Django 6's ``django.tasks`` (django-stubs types it); at run time
Django 5.2 gets the same names from the ``django_tasks`` backport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    USING_BACKPORT = False
else:
    try:  # Django 6.0+
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
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started

        USING_BACKPORT = False
    except ImportError:  # Django 5.2 with the django-tasks backport
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
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started

        # The backport calls it InvalidTaskError up to 0.12 and InvalidTask (Django 6's
        # name) on its main branch: take whichever this release has.
        InvalidTask = getattr(_backport_exceptions, "InvalidTask", None)
        if InvalidTask is None:
            InvalidTask = _backport_exceptions.InvalidTaskError

        USING_BACKPORT = True

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "USING_BACKPORT",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
