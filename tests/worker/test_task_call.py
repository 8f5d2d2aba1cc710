"""How a slot calls a task (issue 32): a sync task of django.tasks' own ``Task`` class is
called as its function, without ``Task.call``'s ``iscoroutinefunction`` at every call; an
``async def`` one, or one of a class with its own ``call``, goes through ``call``."""

from __future__ import annotations

from typing import Any

from django_leasejobs.compat import Task
from django_leasejobs.leases import ClaimedJob
from django_leasejobs.worker.execution import JobSpec, _calls_plainly, execute
from tests import tasks


class _OwnCall(Task):  # type: ignore[misc]
    """A site's Task class with a ``call`` of its own (same layout: no new slots)."""

    __slots__ = ()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return ("own call", super().call(*args, **kwargs))


def _with_own_call(task: Any) -> Any:
    copy = Task.__new__(_OwnCall)
    for name in Task.__dataclass_fields__:
        object.__setattr__(copy, name, getattr(task, name))
    return copy


def _spec(task_path: str, args: list[Any]) -> JobSpec:
    job = ClaimedJob(1, 1, task_path, "default", 0, args, {}, None, 1, None)
    return JobSpec(job=job, worker_id="w", backend="default", database="default")


def test_only_a_sync_task_of_the_plain_class_is_called_as_its_function() -> None:
    assert _calls_plainly(tasks.add)
    assert not _calls_plainly(tasks.async_echo)
    assert not _calls_plainly(_with_own_call(tasks.add))
    assert _with_own_call(tasks.add).call(1, 2) == ("own call", 3)


def test_sync_and_async_tasks_run_to_their_value() -> None:
    done = execute(_spec("tests.tasks.add", [2, 3]))
    assert done.ok and done.result == 5
    awaited = execute(_spec("tests.tasks.async_echo", [{"a": 1}]))
    assert awaited.ok and awaited.result == {"a": 1}
