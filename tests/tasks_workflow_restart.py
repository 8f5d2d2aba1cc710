"""Tasks of tests/e2e/test_workflow_pg_restart.py: a long chain that counts up.

Each execution of ``count_up`` appends a "start", then once it read its parents'
results a "read", then (unless it dies first) an "end" record to the ledger named by
``LEDGER_ENV`` (one JSON object a line, fsynced), so the test can count executions per
step and attempt, whatever the database recorded.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django_leasejobs import task
from django_leasejobs.workflows import chain

LEDGER_ENV = "LEASEJOBS_TEST_WF_LEDGER"


def _ledger(context: Any, event: str, value: Any = None) -> None:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    record = {
        "job": int(context.job_id),
        "attempt": context.attempt,
        "pid": os.getpid(),
        "event": event,
        "t": time.time(),
        "value": value,
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@task(takes_context=True)
def count_up(
    context: Any, start: int | None = None, hold_before: float = 0.0, hold_after: float = 0.0
) -> int:
    """The first step returns ``start``; every other step its parent's result + 1. It
    sleeps ``hold_before`` seconds before reading its parents' results, ``hold_after``
    after (attempt 1 only: a test restarts the database meanwhile)."""
    _ledger(context, "start")
    if context.attempt == 1:
        time.sleep(hold_before)
    parents = context.parent_results
    _ledger(context, "read")
    value = int(start) if not parents else parents[0] + 1
    if context.attempt == 1:
        time.sleep(hold_after)
    _ledger(context, "end", value)
    return value


def enqueue_chain(
    steps: int, first: int = 1, holds: dict[str, dict[str, float]] | None = None
) -> list[int]:
    """Enqueue ``chain(count_up(first), count_up(), ...)`` of ``steps`` steps; return the
    steps' job ids in chain order. ``holds`` maps a step's index (as text: JSON) to its
    ``hold_before`` / ``hold_after``."""
    holds = holds or {}
    flow = chain(
        *(
            count_up.step(*([first] if n == 0 else []), **holds.get(str(n), {}))
            for n in range(steps)
        )
    )
    result = flow.enqueue()
    return [int(s.id) for s in result.steps]
