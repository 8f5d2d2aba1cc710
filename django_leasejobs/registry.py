"""Task resolution: a job row runs only a Task object that was declared as a task.

Every Task that a LeaseJobs backend validates (that is, every ``@task``-decorated
function bound to it) is recorded here under its module path. A row is resolved
by looking that path up; the only import a row can cause is the module of the
path, and only when it belongs to an installed app. Nothing found in that module
is called unless it is a registered Task: ``os.system``, a plain function, a class
or a missing module all fail with :class:`UnknownTask`.
"""

from __future__ import annotations

import threading
from importlib import import_module
from typing import TYPE_CHECKING

from django.apps import apps
from django.utils.module_loading import autodiscover_modules

from .exceptions import UnknownTask

if TYPE_CHECKING:
    from .compat import Task

_tasks: dict[str, Task] = {}
_lock = threading.Lock()


def register(task: Task) -> None:
    """Record a declared task (first declaration wins; ``.using()`` copies are ignored)."""
    path = task.module_path
    if path not in _tasks:
        with _lock:
            _tasks.setdefault(path, task)


def registered() -> dict[str, Task]:
    return dict(_tasks)


def autodiscover(extra_modules: tuple[str, ...] = ()) -> None:
    """Import every installed app's ``tasks`` module, then the configured IMPORTS."""
    autodiscover_modules("tasks")
    for module in extra_modules:
        import_module(module)


def _importable_module(module: str) -> bool:
    return any(
        module == config.name or module.startswith(config.name + ".")
        for config in apps.get_app_configs()
    )


def is_task_path(path: str) -> bool:
    """``path`` has the shape of a task's path (``package.module.function``): code that
    declares it may exist somewhere, deployed or not."""
    module, _, name = path.rpartition(".")
    return bool(module and name)


def resolve(path: str) -> Task:
    """The registered Task for a row's ``task_path``, or :class:`UnknownTask`."""
    found = _tasks.get(path)
    if found is not None:
        return found
    if not is_task_path(path):
        raise UnknownTask(f"{path!r} is not a task path (expected 'package.module.function').")
    module = path.rpartition(".")[0]
    if _importable_module(module):
        try:
            import_module(module)
        except ImportError as exc:
            raise UnknownTask(f"Task {path!r} cannot be loaded: module {module!r}: {exc}") from exc
        found = _tasks.get(path)
        if found is not None:
            return found
    raise UnknownTask(
        f"{path!r} is not a registered task. Only functions declared with @task "
        "(django.tasks, django_tasks or django_leasejobs) in an installed app's module "
        "(or a module listed in OPTIONS['IMPORTS']) can run; nothing else is imported or called."
    )
