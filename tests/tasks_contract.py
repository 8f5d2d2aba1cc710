"""Tasks for tests/backend/test_tasks_contract.py: one per kind of outcome."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from django.dispatch import receiver

from django_leasejobs import task
from django_leasejobs.compat import task_finished, task_started

ONCE = {"max_attempts": 1}


@task(max_attempts=2, backoff={"base": 0, "jitter": 0})
def fails_twice(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def report_context(context: Any) -> dict[str, Any]:
    """Return what the task's context says about the running job."""
    result = context.task_result

    def moment(value: Any) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "id": result.id,
        "status": str(result.status),
        "enqueued_at": moment(result.enqueued_at),
        "started_at": moment(result.started_at),
        "last_attempted_at": moment(result.last_attempted_at),
        "finished_at": moment(result.finished_at),
        "attempt": context.attempt,
    }


@task(**ONCE)
def raises_value_error() -> None:
    raise ValueError("plain failure")


@task(**ONCE)
def raises_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@task(**ONCE)
def raises_system_exit() -> None:
    sys.exit(3)


@task(**ONCE)
def returns_a_set() -> Any:
    return {1, 2}


@task(takes_context=True, timeout=0.5, **ONCE)
def overruns_its_timeout(context: Any) -> None:
    # Runs until the worker stops it (process pool: killed; thread pool: flagged).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not context.lease_lost:
        time.sleep(0.02)


@task(**ONCE)
def kills_itself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def plain_function() -> int:
    """Declared with Django's own decorator by the contract tests, on each Django line."""
    return 1


SIGNAL_FILE_ENV = "LEASEJOBS_TEST_TASK_SIGNALS"


def _moment(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def _record_result(kind: str, task_result: Any) -> None:
    """Append what a django.tasks signal carried to the file named by the environment."""
    path = os.environ.get(SIGNAL_FILE_ENV)
    if not path:
        return
    record = {
        "signal": kind,
        "id": task_result.id,
        "status": str(task_result.status),
        "enqueued_at": _moment(task_result.enqueued_at),
        "started_at": _moment(task_result.started_at),
        "last_attempted_at": _moment(task_result.last_attempted_at),
        "finished_at": _moment(task_result.finished_at),
        "errors": [[e.exception_class_path, e.traceback] for e in task_result.errors],
        "worker_ids": list(task_result.worker_ids),
        "pid": os.getpid(),
    }
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


@receiver(task_started, dispatch_uid="tests.tasks_contract.started")
def record_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _record_result("started", task_result)


@receiver(task_finished, dispatch_uid="tests.tasks_contract.finished")
def record_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _record_result("finished", task_result)
