"""What error trackers would see of failed jobs, captured inside a real ``runworker``.

Imported by the worker (``IMPORTS``) in tests/observability/test_worker_failure_reports.py. When the
environment names a file, this module adds to the ``django_leasejobs`` logger a handler
that reads a failure's record as Sentry's logging integration does (``record.exc_info``:
the exception, then its ``__cause__`` chain; the record's extras) and formats it as any
``logging.Formatter`` would, and connects ``job_failed`` / ``task_finished`` receivers
that look at the exception they are given and at the one being handled. Each writes one
JSON line to the file. It also holds a task whose exception's message is huge.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from django.dispatch import receiver

from django_leasejobs import task
from django_leasejobs.compat import task_finished
from django_leasejobs.signals import job_failed

CAPTURE_FILE_ENV = "LEASEJOBS_TEST_FAILURE_CAPTURE"


@task(max_attempts=2, backoff={"base": 0, "jitter": 0})
def raise_huge_message() -> None:
    raise ValueError("x" * 1_000_000)


def exception_chain(exc: BaseException | None) -> list[dict[str, str]]:
    """The exception and its causes, each as an error tracker names it."""
    chain = []
    while exc is not None:
        kind = type(exc)
        chain.append({"module": kind.__module__, "type": kind.__qualname__, "value": str(exc)})
        exc = exc.__cause__ or exc.__context__
    return chain


def _write(entry: dict[str, Any]) -> None:
    path = os.environ.get(CAPTURE_FILE_ENV)
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({**entry, "pid": os.getpid()}) + "\n")


class TrackerHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if not record.exc_info or getattr(record, "job_id", None) is None:
            return
        exc = record.exc_info[1]
        _write(
            {
                "kind": "log",
                "job_id": record.job_id,  # type: ignore[attr-defined]
                "level": record.levelname,
                "status": getattr(record, "status", None),
                "chain": exception_chain(exc),
                "remote_traceback": getattr(exc, "remote_traceback", None),
                "formatted": logging.Formatter("%(levelname)s %(message)s").format(record),
            }
        )


@receiver(job_failed, dispatch_uid="tests.failure_capture.job_failed")
def on_job_failed(sender: Any, job_id: int, exception: Any, status: str, **kwargs: Any) -> None:
    _write(
        {
            "kind": "job_failed",
            "job_id": job_id,
            "status": status,
            "chain": exception_chain(exception),
            "remote_traceback": exception.remote_traceback,
            "handled": sys.exc_info()[1] is exception,
        }
    )


@receiver(task_finished, dispatch_uid="tests.failure_capture.task_finished")
def on_task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    if not str(task_result.id).isdigit():
        return  # another backend's result (Django's ImmediateBackend in the testing kit's tests)
    handled = sys.exc_info()[1]
    _write(
        {
            "kind": "task_finished",
            "job_id": int(task_result.id),
            "status": str(task_result.status),
            "chain": exception_chain(handled),
            "remote_traceback": getattr(handled, "remote_traceback", None),
        }
    )


if os.environ.get(CAPTURE_FILE_ENV):
    logging.getLogger("django_leasejobs").addHandler(TrackerHandler())
