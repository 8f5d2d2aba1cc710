"""The scheduler thread every worker runs: enqueues the due ticks of the backend's schedules.

There is no leader: every worker's thread runs passes, and the fenced transition in
``schedules/transitions.py`` lets exactly one of them enqueue each tick. The thread
sleeps until the earliest next tick (by the database's clock), at most
``MAX_WAIT`` seconds, so that a resumed schedule catches up soon after.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError

from ..schedules.scheduler import run_pass
from .threads import ThreadContext, WorkerThread

logger = logging.getLogger("django_leasejobs")

MAX_WAIT = 10.0
"""Longest sleep between two passes (seconds): how soon a resumed schedule catches up."""
MIN_WAIT = 0.01


class Scheduler(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "scheduler")

    def loop(self) -> None:
        ctx = self.ctx
        wait = 0.0
        while not self.stop_event.wait(wait):
            try:
                report = run_pass(ctx.backend, scheduler=ctx.worker_id)
            except DatabaseError as exc:
                logger.warning(
                    "scheduler pass failed: %s",
                    exc,
                    extra={"worker": ctx.worker_id, "error": str(exc)},
                )
                self._reset_connection()
                wait = min(MAX_WAIT, max(ctx.options.poll_interval, 1.0))
                continue
            if report.next_due is None:
                wait = MAX_WAIT
            else:
                until = (report.next_due - report.now).total_seconds()
                wait = min(MAX_WAIT, max(MIN_WAIT, until))
