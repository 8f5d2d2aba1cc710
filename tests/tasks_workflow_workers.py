"""Tasks of the workflow tests with real workers (tests/workflows/test_workflow_workers.py).

Every task leaves a line ``<kind> <job id> <attempt> <pid>`` in ``<marker_dir>/runs``
when it runs (appended with ``O_APPEND`` and fsynced, so lines from several processes do
not mix, and their order in the file is the order in which they were written): the tests
count runs from it and check their order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django_leasejobs import task

RUNS = "runs"
PAIR_WAIT = 2.0


def record(context: Any, marker_dir: str, kind: str) -> None:
    line = f"{kind} {context.job_id} {context.attempt} {os.getpid()}\n".encode()
    fd = os.open(Path(marker_dir) / RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_runs(marker_dir: str) -> list[tuple[str, int, int, int]]:
    """The lines the tasks left, in order: (kind, job id, attempt, pid)."""
    path = Path(marker_dir) / RUNS
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        kind, job_id, attempt, pid = line.split()
        rows.append((kind, int(job_id), int(attempt), int(pid)))
    return rows


@task(takes_context=True)
def member(context: Any, marker_dir: str, n: int, pair: str = "") -> int:
    """A chord member: records its run, returns ``n``.

    With ``pair`` (``"<chord>/<side>"``, side ``a`` or ``b``) it first meets its sibling:
    it leaves ``<chord>.<side>`` in ``marker_dir`` and waits (up to ``PAIR_WAIT`` s) for
    the sibling's, so that the two members of a chord return within milliseconds of each
    other, in two workers, and settle their callback at the same time. A member that
    waited in vain records ``unpaired`` and returns: workers need not claim in id order
    (on MariaDB a claim's SKIP LOCKED skips rows another worker's claim only examined),
    so a sibling may come much later, and a member must not hold its slot until then."""
    if pair:
        chord, side = pair.split("/")
        other = {"a": "b", "b": "a"}[side]
        (Path(marker_dir) / f"{chord}.{side}").touch()
        sibling = Path(marker_dir) / f"{chord}.{other}"
        deadline = time.monotonic() + PAIR_WAIT
        while not sibling.exists():
            if time.monotonic() > deadline:
                record(context, marker_dir, "unpaired")
                break
            time.sleep(0.001)
    record(context, marker_dir, "member")
    return n


@task(takes_context=True)
def callback(context: Any, marker_dir: str) -> list[Any]:
    """A chord callback: records its run, returns its parents' results."""
    record(context, marker_dir, "callback")
    return list(context.parent_results)


@task(takes_context=True, max_attempts=3)
def block_first_attempt(context: Any, marker_dir: str) -> int:
    """Records its run; its first attempt then blocks (up to 120 s) until the test kills
    the worker; a later attempt returns the attempt number at once."""
    record(context, marker_dir, "parent")
    if context.attempt == 1:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return int(context.attempt)


@task(takes_context=True)
def after_parent(context: Any, marker_dir: str) -> dict[str, Any]:
    """Records its run; returns its parents' results and its own attempt."""
    record(context, marker_dir, "child")
    return {"parents": list(context.parent_results), "attempt": context.attempt}


@task(takes_context=True)
def increment(context: Any, marker_dir: str, start: int | None = None) -> int:
    """Records its run; returns ``start + 1`` (the first step of a chain) or its one
    parent's result + 1."""
    record(context, marker_dir, "step")
    if start is not None:
        return start + 1
    [parent] = context.parent_results
    return int(parent) + 1


def _overrun(context: Any, marker_dir: str) -> None:
    """Run past the task's timeout: until the worker stops the attempt, at most 60 s. The
    process pool kills the slot; a thread sees ``context.lease_lost`` and records
    ``stopped`` before it returns."""
    deadline = time.monotonic() + 60
    while not context.lease_lost and time.monotonic() < deadline:
        time.sleep(0.01)
    if context.lease_lost:
        record(context, marker_dir, "stopped")


@task(takes_context=True, timeout=0.5, max_attempts=2)
def overrun_first_attempt(context: Any, marker_dir: str) -> int:
    """Records its run; its first attempt runs past its 0.5 s timeout, a later one returns
    the attempt number at once."""
    record(context, marker_dir, "overrun")
    if context.attempt == 1:
        _overrun(context, marker_dir)
    return int(context.attempt)


@task(takes_context=True, timeout=0.5, max_attempts=1)
def always_overrun(context: Any, marker_dir: str) -> None:
    """Records its run, then runs past its 0.5 s timeout (one attempt: it ends failed)."""
    record(context, marker_dir, "overrun")
    _overrun(context, marker_dir)


GO = "go"


@task(takes_context=True)
def wait_for_go(context: Any, marker_dir: str) -> int:
    """Records its run, waits (up to 60 s) until the test leaves ``<marker_dir>/go``, and
    returns the attempt number; a later attempt returns at once."""
    record(context, marker_dir, "parent")
    if context.attempt == 1:
        deadline = time.monotonic() + 60
        while not (Path(marker_dir) / GO).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return int(context.attempt)


HOLD = "hold"


@task(takes_context=True)
def held(context: Any, marker_dir: str, n: int) -> int:
    """Records its run; then waits (up to 120 s) while ``<marker_dir>/hold`` exists, so that
    a worker is busy with it when the test kills the worker; returns ``n``."""
    record(context, marker_dir, "held")
    deadline = time.monotonic() + 120
    while (Path(marker_dir) / HOLD).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return n
