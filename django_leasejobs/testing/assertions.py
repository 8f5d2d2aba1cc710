"""What was enqueued: the job rows, and assertions whose failure lists them."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..compat import Task
from ..models import Dependency, Job
from ..workflow_results import WorkflowResult
from .runner import lease_jobs_backend, queue_list

LISTED_AT_MOST = 50
"""Jobs a failure message lists (the count of the rest is given)."""

Statuses = str | Collection[str] | None


def task_path(task: Task | str) -> str:
    """A task's module path (``myapp.tasks.send_email``); a string is taken as one."""
    if isinstance(task, str):
        return task
    path = getattr(task, "module_path", None)
    if not isinstance(path, str):
        raise TypeError(f"expected a task or a task path, got {task!r}")
    return path


def enqueued_jobs(
    task: Task | str | None = None,
    *,
    backend: str = "default",
    status: Statuses = "pending",
    queues: str | Sequence[str] | None = None,
) -> list[Job]:
    """The job rows of ``backend`` (oldest first): of ``task`` (a task or its path; None:
    every task), in ``status`` (a status, a collection of them, or None for any) and in
    ``queues`` (a name or a list; None: every queue)."""
    lease_backend = lease_jobs_backend(backend)
    jobs = Job.objects.using(lease_backend.database).filter(backend=lease_backend.alias)
    if task is not None:
        jobs = jobs.filter(task_path=task_path(task))
    statuses = _statuses(status)
    if statuses is not None:
        jobs = jobs.filter(status__in=statuses)
    wanted = queue_list(queues)
    if wanted is not None:
        jobs = jobs.filter(queue__in=wanted)
    return list(jobs.order_by("id"))


def assert_enqueued(
    task: Task | str,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    count: int | None = 1,
    queue: str | None = None,
    priority: int | None = None,
    backend: str = "default",
    status: Statuses = "pending",
) -> list[Job]:
    """Assert that ``count`` jobs of ``task`` (None: at least one) match, and return them.

    A job matches when it is in ``status`` (default ``pending``: enqueued and not run
    yet; None for any) and, for each of ``args``, ``kwargs``, ``queue`` and
    ``priority`` that is given, has exactly that value (arguments as stored, so as JSON:
    a tuple matches a list). The failure message lists the backend's jobs in
    ``status``.
    """
    if count is not None and count < 0:
        raise ValueError(f"count must be >= 0 or None, got {count!r}")
    matching, described = _matching(task, args, kwargs, queue, priority, backend, status)
    if (len(matching) == count) if count is not None else bool(matching):
        return matching
    expected = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"Expected {expected} {_status_words(status)}job(s) of {described}, found "
        f"{len(matching)}.\n{_listing(backend, status)}"
    )


def assert_not_enqueued(
    task: Task | str,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    backend: str = "default",
    status: Statuses = "pending",
) -> None:
    """Assert that no job of ``task`` matches (same matching as :func:`assert_enqueued`)."""
    matching, described = _matching(task, args, kwargs, queue, priority, backend, status)
    if matching:
        raise AssertionError(
            f"Expected no {_status_words(status)}job of {described}, found "
            f"{len(matching)}:\n" + "\n".join(f"  {describe_job(job)}" for job in matching)
        )


def assert_workflow(
    workflow: WorkflowResult | str | int,
    *,
    status: str | None = "SUCCESSFUL",
    steps: Sequence[str] | None = None,
    backend: str = "default",
) -> WorkflowResult:
    """Assert how a workflow (its ``WorkflowResult`` or id) stands now, and return it
    read again.

    ``status``: the workflow's (``"SUCCESSFUL"``, ``"FAILED"``, ``"RUNNING"``,
    ``"READY"``: Django's ``TaskResultStatus``; None: any). ``steps``: each step's job
    status in the workflow's order (``["succeeded", "failed", "waiting"]``). The failure
    message lists every step with its parents.
    """
    lease_backend = lease_jobs_backend(backend)
    workflow_id = workflow.id if isinstance(workflow, WorkflowResult) else workflow
    found = lease_backend.get_workflow(workflow_id)
    step_ids = [int(result.id) for result in found.steps]
    jobs = {
        job.pk: job for job in Job.objects.using(lease_backend.database).filter(pk__in=step_ids)
    }
    ordered = [jobs[int(result.id)] for result in found.steps]
    problems = []
    if status is not None and str(found.status) != str(status).upper():
        problems.append(f"status {str(found.status)!r}, expected {str(status).upper()!r}")
    if steps is not None and [job.status for job in ordered] != list(steps):
        problems.append(
            f"step statuses {[job.status for job in ordered]!r}, expected {list(steps)!r}"
        )
    if problems:
        parents: dict[int, list[int]] = {}
        for parent, child in (
            Dependency.objects.using(lease_backend.database)
            .filter(child_id__in=list(jobs))
            .order_by("child_id", "position")
            .values_list("parent_id", "child_id")
        ):
            parents.setdefault(child, []).append(parent)
        lines = [
            f"  {number}. {describe_job(job)}"
            + (f" after {', '.join(f'#{p}' for p in parents[job.pk])}" if job.pk in parents else "")
            + (f"\n     {job.last_error.splitlines()[0]}" if job.last_error else "")
            for number, job in enumerate(ordered)
        ]
        raise AssertionError(
            f"Workflow #{found.id}: " + "; ".join(problems) + ".\n" + "\n".join(lines)
        )
    return found


def describe_job(job: Job) -> str:
    """One line about a job row: ``#12 myapp.tasks.send(1, to='a@b.c') queue='default'
    priority=0 status='pending'``."""
    args = job.args if isinstance(job.args, list) else [job.args]
    kwargs = job.kwargs if isinstance(job.kwargs, dict) else {"kwargs": job.kwargs}
    call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    return (
        f"#{job.pk} {job.task_path}({call}) queue={job.queue!r} priority={job.priority} "
        f"status={job.status!r}"
    )


def _matching(
    task: Task | str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    queue: str | None,
    priority: int | None,
    backend: str,
    status: Statuses,
) -> tuple[list[Job], str]:
    path = task_path(task)
    wanted: dict[str, Any] = {}
    if args is not None:
        wanted["args"] = _as_json(list(args))
    if kwargs is not None:
        wanted["kwargs"] = _as_json(dict(kwargs))
    if queue is not None:
        wanted["queue"] = queue
    if priority is not None:
        wanted["priority"] = priority
    jobs = enqueued_jobs(path, backend=backend, status=status)
    matching = [job for job in jobs if all(getattr(job, k) == v for k, v in wanted.items())]
    described = path + "".join(f" {name}={value!r}" for name, value in wanted.items())
    return matching, described


def _as_json(value: Any) -> Any:
    """``value`` as the row stores it (tuples become lists); unchanged if it is not JSON."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def _statuses(status: Statuses) -> list[str] | None:
    if status is None:
        return None
    return [status] if isinstance(status, str) else [str(s) for s in status]


def _status_words(status: Statuses) -> str:
    statuses = _statuses(status)
    return "" if statuses is None else "/".join(statuses) + " "


def _listing(backend: str, status: Statuses) -> str:
    jobs = enqueued_jobs(backend=backend, status=status)
    where = f"backend {backend!r}"
    if not jobs:
        return f"No {_status_words(status)}job in {where}."
    lines = [f"{_status_words(status).capitalize() or 'All '}jobs in {where}:"]
    lines += [f"  {describe_job(job)}" for job in jobs[:LISTED_AT_MOST]]
    if len(jobs) > LISTED_AT_MOST:
        lines.append(f"  ... and {len(jobs) - LISTED_AT_MOST} more")
    return "\n".join(lines)
