"""Workflows: chains, groups and chords of tasks, written to the database at once and
run by the workers in order (docs/workflows.md).

    from django_leasejobs.workflows import chain, chord, group, step

    result = chain(step(fetch, url), chord(group(*(step(parse, n) for n in range(3))),
                                             step(summarise))).enqueue()

A step waits (status ``waiting``, not claimable) until every step before it succeeded;
the write that records the last parent's success releases it, in the same transaction.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async

from ..canvas import Canvas, Chain, Chord, Group, Step, chain, chord, group, step
from ..compat import DEFAULT_TASK_BACKEND_ALIAS
from ..exceptions import ParentFailed, WorkflowDoesNotExist
from ..leases import ParentOutcome, WorkflowCancel, backend_database
from ..leases import cancel_workflow as _cancel_workflow
from ..leases import retry_failed_steps as _retry_failed_steps
from ..workflow_results import WorkflowResult, read_workflow

__all__ = [
    "Canvas",
    "Chain",
    "Chord",
    "Group",
    "ParentFailed",
    "ParentOutcome",
    "Step",
    "WorkflowCancel",
    "WorkflowDoesNotExist",
    "WorkflowResult",
    "aget_workflow",
    "cancel_workflow",
    "chain",
    "chord",
    "get_workflow",
    "group",
    "retry_failed_steps",
    "step",
]


def get_workflow(
    workflow_id: str | int, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS
) -> WorkflowResult:
    """The workflow ``workflow_id`` of ``backend`` with every step's TaskResult;
    :class:`WorkflowDoesNotExist` when there is none."""
    return read_workflow(backend, workflow_id)


async def aget_workflow(
    workflow_id: str | int, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS
) -> WorkflowResult:
    """:func:`get_workflow` from async code: the queries run off the event loop."""
    return await sync_to_async(read_workflow, thread_sensitive=True)(backend, workflow_id)


def cancel_workflow(
    workflow_id: str | int, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS
) -> WorkflowCancel:
    """Cancel every step that has not finished: waiting and pending steps at once, running
    ones as a running job is cancelled (their workers stop them)."""
    return _cancel_workflow(int(workflow_id), using=backend_database(backend))


def retry_failed_steps(workflow_id: str | int, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> int:
    """Run again every step that ended without succeeding (and the steps that ended unrun
    because of it, which wait for it again); returns how many steps were retried."""
    return _retry_failed_steps(int(workflow_id), using=backend_database(backend))
