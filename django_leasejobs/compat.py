"""One import point for the django.tasks API: Django 6 core or the django-tasks backport."""

from __future__ import annotations

try:  # Django 6.0+
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    USING_BACKPORT = False
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import (  # type: ignore[no-redef]
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (  # type: ignore[no-redef]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        TaskResultDoesNotExist,
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )

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
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
