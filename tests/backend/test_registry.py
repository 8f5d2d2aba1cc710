"""Task resolution is the security boundary: a job row only ever runs a declared Task."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from django_leasejobs import registry
from django_leasejobs.compat import InvalidTask, Task, task_backends
from django_leasejobs.exceptions import UnknownTask
from django_leasejobs.models import Job
from tests import tasks

HOSTILE_PATHS = [
    "os.system",
    "subprocess.run",
    "subprocess.Popen",
    "builtins.eval",
    "shutil.rmtree",
    "tests.tasks.not_a_task",
    "tests.tasks.NOT_A_TASK_EITHER",
    "tests.tasks.add.func",
    "tests.tasks.os.system",
    "nonexistent.module.func",
    "tests.nonexistent_module.func",
    "nodots",
    "",
    ".",
    "os.",
    ".system",
]


@pytest.fixture
def forbidden_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Record (instead of making) any call to os.system / subprocess.run / Popen."""
    calls: list[tuple[str, Any]] = []

    def recorder(name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            calls.append((name, args))

        return record

    monkeypatch.setattr(os, "system", recorder("os.system"))
    monkeypatch.setattr(subprocess, "run", recorder("subprocess.run"))
    monkeypatch.setattr(subprocess, "Popen", recorder("subprocess.Popen"))
    return calls


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_hostile_paths_are_unknown_tasks(path: str, forbidden_calls: list[Any]) -> None:
    with pytest.raises(UnknownTask) as excinfo:
        registry.resolve(path)
    assert repr(path) in str(excinfo.value)
    assert forbidden_calls == []
    assert isinstance(excinfo.value, InvalidTask)


def test_messages_say_why() -> None:
    with pytest.raises(UnknownTask, match="is not a task path"):
        registry.resolve("nodots")
    with pytest.raises(UnknownTask, match="is not a registered task"):
        registry.resolve("os.system")
    with pytest.raises(UnknownTask, match="is not a registered task"):
        registry.resolve("tests.tasks.not_a_task")
    with pytest.raises(UnknownTask, match="cannot be loaded") as excinfo:
        registry.resolve("tests.nonexistent_module.func")
    assert isinstance(excinfo.value.__cause__, ImportError)


def test_modules_outside_installed_apps_are_never_imported() -> None:
    for module in ("antigravity", "this", "tkinter.dnd"):
        assert module not in sys.modules, f"{module} imported before the test"
        with pytest.raises(UnknownTask):
            registry.resolve(f"{module}.fly")
        assert module not in sys.modules, f"resolving {module}.fly imported it"


def test_plain_function_in_a_task_module_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    monkeypatch.setattr(tasks, "not_a_task", lambda: called.append("called"))
    with pytest.raises(UnknownTask):
        registry.resolve("tests.tasks.not_a_task")
    assert called == []


@pytest.mark.parametrize(
    ("path", "declared"),
    [
        ("tests.tasks.add", tasks.add),
        ("tests.tasks.configured", tasks.configured),
        ("tests.tasks.async_echo", tasks.async_echo),
        ("tests.tasks.with_context", tasks.with_context),
        ("tests.tasks.plain_django_task", tasks.plain_django_task),
    ],
)
def test_registered_tasks_resolve_to_the_declared_object(path: str, declared: Task) -> None:
    assert registry.resolve(path) is declared
    assert registry.registered()[path] is declared


def test_using_copies_do_not_replace_the_declaration() -> None:
    copy = tasks.add.using(priority=7, queue_name="high")
    assert copy is not tasks.add
    assert registry.resolve("tests.tasks.add") is tasks.add
    assert registry.resolve("tests.tasks.add").priority == 0


def test_a_task_of_an_installed_app_is_found_by_importing_its_module() -> None:
    # The demo app's tasks module is importable (installed app); its tasks register on import.
    resolved = registry.resolve("demo.tasks.always_fails")
    assert resolved.module_path == "demo.tasks.always_fails"
    assert resolved is sys.modules["demo.tasks"].always_fails


def test_registered_is_a_copy() -> None:
    snapshot = registry.registered()
    snapshot["os.system"] = tasks.add
    with pytest.raises(UnknownTask):
        registry.resolve("os.system")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["os.system", "subprocess.run", "tests.tasks.not_a_task", "nodots"]
)
def test_get_result_of_a_hostile_row_raises_unknown_task(
    path: str, forbidden_calls: list[Any]
) -> None:
    job = Job.objects.create(task_path=path, args=["touch /tmp/leasejobs-pwned"])
    backend = task_backends["default"]
    with pytest.raises(UnknownTask):
        backend.get_result(str(job.pk))
    assert forbidden_calls == []
    assert not os.path.exists("/tmp/leasejobs-pwned")  # noqa: S108


@pytest.mark.django_db
def test_get_result_of_a_registered_row_works() -> None:
    job = Job.objects.create(task_path="tests.tasks.add", args=[1, 2])
    result = task_backends["default"].get_result(str(job.pk))
    assert result.task.func is tasks.add.func
    assert result.args == [1, 2]
