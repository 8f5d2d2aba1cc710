"""Tasks of the workflow tests (tests/workflows/)."""

from __future__ import annotations

from typing import Any

from django_leasejobs import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def value(x: Any) -> Any:
    return x


@task(takes_context=True)
def collect(context: Any, *extra: Any) -> dict[str, Any]:
    """Returns its parents' results and its own arguments (nothing appended to them)."""
    return {"parents": context.parent_results, "args": list(extra)}


@task(takes_context=True)
def total(context: Any) -> int:
    return sum(context.parent_results)


@task(max_attempts=1)
def boom(message: str = "boom") -> None:
    raise ValueError(message)


@task(max_attempts=2, takes_context=True)
def fail_once(context: Any, marker: str) -> str:
    """Fails on its first attempt, succeeds on the second."""
    if context.attempt == 1:
        raise ValueError("first attempt fails")
    return marker


@task(max_attempts=1, takes_context=True)
def fail_first(context: Any, marker: str) -> str:
    """Fails for good on its first attempt; succeeds when an operator retries it."""
    if context.attempt == 1:
        raise ValueError("first attempt fails")
    return marker


@task(takes_context=True)
def finaliser(context: Any) -> dict[str, Any]:
    return {
        "parent_results": context.parent_results,
        "failed": [(p.job_id, p.status, p.task_path) for p in context.failed_parents],
    }


@task
def start_pipeline(first: int) -> str:
    """Enqueues a workflow from inside a job (what a schedule's task does); returns its id."""
    from django_leasejobs.workflows import chain, step

    return chain(step(value, first), step(total)).enqueue().id
