"""The worker's signals as lines of a file, for tests to wait on (docs/development.md).

A ``runworker`` subprocess whose environment names a file in ``LEASEJOBS_TEST_EVENTS``
(``tests/worker_harness.py`` gives each worker its own) appends one JSON object per
signal of ours it sends: ``{"event": <signal name>, "pid": ..., <its keyword
arguments>}``, values that JSON cannot hold written as text (an exception, an
``ErrorInfo``), datetimes in ISO format and an ``Alert`` as an object of its fields.
``TestsConfig.ready`` connects the receivers only when the variable is set, so other
processes pay nothing.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from django.dispatch import Signal

from django_leasejobs import signals
from django_leasejobs.alerts import Alert

EVENTS_ENV = "LEASEJOBS_TEST_EVENTS"

WORKER_SIGNALS: dict[str, Signal] = {
    name: getattr(signals, name)
    for name in (
        "worker_started",
        "worker_stopping",
        "worker_stopped",
        "listening_changed",
        "prefetch_returned",
        "worker_idle",
        "jobs_claimed",
        "heartbeat_sent",
        "job_started",
        "job_succeeded",
        "job_failed",
        "lease_lost",
        "alerts_evaluated",
        "alert_fired",
        "alert_resolved",
    )
}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Alert):
        return {key: _jsonable(field) for key, field in asdict(value).items()}
    return str(value)


def connect(path: str) -> None:
    """Append every worker signal this process sends to ``path``, one JSON line each."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    lock = threading.Lock()
    for name, signal in WORKER_SIGNALS.items():

        def record(sender: Any, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            event = {"event": _name, "pid": os.getpid()}
            event.update((key, _jsonable(value)) for key, value in kwargs.items())
            line = (json.dumps(event) + "\n").encode()
            with lock:
                os.write(fd, line)

        signal.connect(record, weak=False, dispatch_uid=f"tests.worker_events.{name}")


def read(path: Path) -> list[dict[str, Any]]:
    """The events written to ``path`` so far, in order (a line still being written, the
    last one without its newline, is left for the next read)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")[:-1]
    return [json.loads(line) for line in lines if line]


def matching(path: Path, name: str | None = None, **match: Any) -> list[dict[str, Any]]:
    """The events of ``path`` named ``name`` (all when None) whose fields equal ``match``."""
    return [
        event
        for event in read(path)
        if (name is None or event["event"] == name)
        and all(event.get(key) == value for key, value in match.items())
    ]
