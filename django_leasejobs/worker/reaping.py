"""The reaper thread: the worker's background reap pass, on its own connection.

Every ``STALE_LOCK_INTERVAL`` seconds (``0``: never) it runs the pass of
``manage.py reap_stale_locks``: jobs whose lease expired go back to ``pending`` (or end,
after too many stalls), then their log line, ``NOTIFY`` and ``job_reaped`` signals. Every
worker runs it, so crashed workers' jobs come back without a cron job; concurrent passes
reap each job once (``leases.reap``).

It has its own thread and connection so that a slow pass (a busy database server, a
large backlog of expired leases, a rollup row another transaction holds) never delays
the heartbeat's next renewal: under overload a pass can take seconds, and a renewal that
waits behind it could cost the worker its leases. It touches nothing of the main loop's.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError

from ..reaper import reap_once
from .threads import ThreadContext, WorkerThread

logger = logging.getLogger("django_leasejobs")


class Reaper(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "reaper")

    def loop(self) -> None:
        while not self.stop_event.wait(self.ctx.options.stale_lock_interval):
            self.reap()

    def reap(self) -> None:
        """One reap pass; a database error is logged and the connection reset (the next
        pass reconnects)."""
        ctx = self.ctx
        started = time.monotonic()
        try:
            reaped = reap_once(
                stale_lock_age=ctx.options.stale_lock_age,
                backend=ctx.backend.alias,
                using=ctx.database,
                reaper=ctx.worker_id,
                rollups=ctx.options.rollups,
            )
        except DatabaseError as exc:
            logger.warning(
                "background reap failed: %s",
                exc,
                extra={"worker": ctx.worker_id, "error": str(exc)},
            )
            self._reset_connection()
            return
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "reap pass: %d reaped",
                len(reaped),
                extra={
                    "worker": ctx.worker_id,
                    "count": len(reaped),
                    "duration": round(time.monotonic() - started, 6),
                },
            )
