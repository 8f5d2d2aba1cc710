"""What every background thread of a worker shares: its context, and a restart on error.

A thread gets a ``ThreadContext``, never the ``Worker``: it reads the lease table and the
status board, and posts messages to the main loop's inbox (``shared.py``, ``inbox.py``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass

from django.db import DatabaseError, connections

from ..backend import LeaseJobsBackend
from ..conf import Options
from .inbox import Inbox
from .lease_length import LeaseLength
from .lifecycle import Registration
from .shared import LeaseTable, StatusBoard

logger = logging.getLogger("django_leasejobs")


def next_tick(due: float, every: float, now: float) -> float:
    """The next time of a tick due at ``due``; one that fell behind starts again from now."""
    following = due + every
    return following if following > now else now + every


@dataclass(frozen=True, slots=True)
class ThreadContext:
    worker_id: str
    backend: LeaseJobsBackend
    database: str
    queues: tuple[str, ...] | None
    options: Options
    inbox: Inbox
    table: LeaseTable
    lease_length: LeaseLength
    status: StatusBoard
    registration: Registration


class WorkerThread(threading.Thread):
    """A daemon thread that logs and restarts its ``loop`` after an unexpected error."""

    def __init__(self, ctx: ThreadContext, stop: threading.Event, name: str) -> None:
        super().__init__(name=f"leasejobs-{name}", daemon=True)
        self.ctx = ctx
        self.stop_event = stop

    def _reset_connection(self) -> None:
        with contextlib.suppress(DatabaseError):
            connections[self.ctx.database].close()

    def run(self) -> None:
        try:
            while True:
                try:
                    self.loop()
                    return
                except Exception:  # a bug or a hostile value: log it, never die
                    logger.exception(
                        "%s thread failed; restarting it",
                        self.name,
                        extra={"worker": self.ctx.worker_id},
                    )
                    self._reset_connection()
                    if self.stop_event.wait(1.0):
                        return
        finally:
            connections.close_all()

    def wake(self) -> None:
        """Cut short a wait that does not watch ``stop_event`` (called after it is set).
        Most threads wait on the event itself: nothing to do."""

    def loop(self) -> None:
        raise NotImplementedError
