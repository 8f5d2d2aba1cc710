"""The watchdog thread: finds jobs to stop by the local clock alone.

It never touches the database, so it keeps working when the database does not answer:
every ``TICK`` it reads the lease table and posts to the main loop's inbox the jobs
whose last renewal is older than the lease it asked for less ``HEARTBEAT_INTERVAL`` (the
worker fences itself before the database-side lease expires; ``lease_length.py``) and
those past their timeout.
A job whose outcome is being written is left alone: the fenced write decides.
"""

from __future__ import annotations

import threading
import time

from .inbox import LeaseLost, TimedOut
from .threads import ThreadContext, WorkerThread

TICK = 0.1
"""Seconds between two looks at the lease table."""


class Watchdog(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "watchdog")

    def loop(self) -> None:
        while not self.stop_event.wait(TICK):
            self.check()

    def check(self) -> None:
        ctx = self.ctx
        for found in ctx.table.overdue(time.monotonic()):
            if found.kind == "lease":
                ctx.inbox.post(LeaseLost(found.lease, found.detail, found.generation))
            else:
                ctx.inbox.post(TimedOut(found.lease, found.detail, found.generation))
