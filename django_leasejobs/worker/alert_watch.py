"""The alert thread: evaluates the backend's ``ALERTS`` rules every ``ALERT_CHECK_INTERVAL``.

There is no leader: every worker's thread runs passes, and the fenced write of
``alerts/state.py`` lets at most one of them deliver each rule's alert per interval.
It has its own connection, so a slow measure never delays a renewal, and it touches no
job row and nothing of the ``Worker``: it reads, writes the small alert state table, and
sends the alerts' signals from this thread.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError

from ..alerts.evaluation import run_pass
from ..signals import alerts_evaluated
from .threads import ThreadContext, WorkerThread

logger = logging.getLogger("django_leasejobs")


class AlertWatch(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "alerts")

    def loop(self) -> None:
        ctx = self.ctx
        wait = 0.0  # the first pass at once: a worker that starts tells what it finds
        while not self.stop_event.wait(wait):
            wait = ctx.options.alert_check_interval
            started = time.monotonic()
            delivered = 0
            error: DatabaseError | None = None
            try:
                delivered = len(run_pass(ctx.backend, worker_id=ctx.worker_id).delivered)
            except DatabaseError as exc:
                error = exc
                logger.warning(
                    "alert pass failed: %s",
                    exc,
                    extra={"worker": ctx.worker_id, "error": str(exc)},
                )
                self._reset_connection()
            alerts_evaluated.send_robust(
                type(ctx.backend),
                backend=ctx.backend.alias,
                worker_id=ctx.worker_id,
                rules=len(ctx.options.alerts),
                delivered=delivered,
                duration=time.monotonic() - started,
                error=error,
            )
