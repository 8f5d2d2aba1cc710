"""Tasks for tests/test_slot_protocol.py: each one notes its own start, then ends its way.

A job's first statement appends ``<hand-over token> <job id> <attempt> <pid>
<time.monotonic_ns()>`` to ``<marker_dir>/starts`` in one ``write()`` on a file opened
with ``O_APPEND`` (lines of concurrent slots never mix). The test reads that file to know
which hand-overs really started: from the job itself, not from the pool's bookkeeping.
The lease in the line is the one the job's context gives it (what the slot ran).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task

STARTS = "starts"
GATE_TIMEOUT = 30.0
"""A held job gives up after this long (only if a test died without opening its gate)."""


def note_start(context: Any, marker_dir: str, token: int) -> None:
    line = f"{token} {context.job_id} {context.attempt} {os.getpid()} {time.monotonic_ns()}\n"
    fd = os.open(Path(marker_dir) / STARTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def gate_path(marker_dir: str, token: int) -> Path:
    return Path(marker_dir) / f"gate-{token}"


@task(takes_context=True)
def quick(context: Any, marker_dir: str, token: int) -> int:
    """Ends at once with its token as the result."""
    note_start(context, marker_dir, token)
    return token


@task(takes_context=True)
def fail(context: Any, marker_dir: str, token: int) -> None:
    """Ends at once with an exception (the attempt's failure, not the slot's)."""
    note_start(context, marker_dir, token)
    raise RuntimeError(f"hand-over {token} fails")


@task(takes_context=True)
def hold(context: Any, marker_dir: str, token: int) -> str:
    """Runs until the test opens its gate: a job that stalls its slot. It does not look at
    ``context.lease_lost``: a stopped thread runs on (and keeps its slot) until the gate
    opens."""
    note_start(context, marker_dir, token)
    context.set_progress(0.5, f"holding {token}")
    gate = gate_path(marker_dir, token)
    deadline = time.monotonic() + GATE_TIMEOUT
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never opened")
        time.sleep(0.002)
    return "opened"


@task(takes_context=True)
def exit_slot(context: Any, marker_dir: str, token: int) -> None:
    """Ends its own process with ``os._exit(3)``: no outcome, no cleanup (process pool
    only; in a thread it would end the test run)."""
    note_start(context, marker_dir, token)
    os._exit(3)
