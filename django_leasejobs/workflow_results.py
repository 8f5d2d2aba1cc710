"""A workflow as its caller sees it: ``WorkflowResult``, the status of the whole graph
from its steps' statuses, and the TaskResult of every step."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from .compat import TaskResult, TaskResultStatus, task_backends
from .models import ACTIVE_STATUSES, JobStatus


def workflow_status(statuses: Iterable[str], *, started: bool) -> TaskResultStatus:
    """The status of a workflow from its steps' job statuses: SUCCESSFUL when every step
    succeeded; FAILED when none is left to run and one did not succeed; else RUNNING once
    a step started (``started``: one ran, or is running), READY before."""
    seen = list(statuses)
    if all(status == JobStatus.SUCCEEDED for status in seen):
        return TaskResultStatus.SUCCESSFUL
    if not any(status in ACTIVE_STATUSES for status in seen):
        return TaskResultStatus.FAILED
    return TaskResultStatus.RUNNING if started else TaskResultStatus.READY


@dataclass(kw_only=True)
class WorkflowResult:
    """What ``enqueue()`` of a workflow returns, and ``get_workflow(id)`` finds again."""

    id: str
    backend: str
    status: TaskResultStatus
    steps: list[TaskResult] = field(default_factory=list)
    """The TaskResult of every step, in the order the workflow lists them (a chain's
    first part first, a group's members in their order)."""

    @property
    def is_finished(self) -> bool:
        return self.status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)

    def refresh(self) -> None:
        """Read the workflow and every step again."""
        fresh = read_workflow(self.backend, self.id)
        self.status, self.steps = fresh.status, fresh.steps

    async def arefresh(self) -> None:
        """:meth:`refresh` from async code: the queries run off the event loop, in the
        thread Django gives the sync code of the current request (``thread_sensitive``)."""
        await sync_to_async(self.refresh, thread_sensitive=True)()


def read_workflow(backend: str, workflow_id: str | int) -> WorkflowResult:
    """The workflow ``workflow_id`` of the task backend ``backend`` (a LeaseJobs backend)."""
    reader = getattr(task_backends[backend], "get_workflow", None)
    if reader is None:
        raise TypeError(f"TASKS[{backend!r}] is not a LeaseJobs backend: it has no workflows.")
    found: WorkflowResult = reader(workflow_id)
    return found
