"""An ``async def`` job in a thread-pool slot: its coroutine runs on an event loop the
slot's thread owns, and the pool can deliver ``CancelledError`` into it from the main
loop's thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import connections

from ...serialization import depth_limits
from ..execution import JobSpec, LostFlag, Outcome, ProgressSink, execute_async


class SlotCoroutine:
    """The asyncio task of the ``async def`` job one thread-pool slot runs.

    ``run`` runs the attempt to its end on an event loop of the slot's thread (a daemon
    thread: a coroutine that never ends does not keep the worker from leaving). What the
    job hands to ``sync_to_async`` runs in a thread of the attempt's own
    (``ThreadSensitiveContext``), whose database connection is closed as it ends.
    ``cancel`` (from the pool, with its lock held) delivers ``CancelledError`` into the
    coroutine, at once or as it begins. Every field is guarded by the pool's lock.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.cancelled = False
        """It was sent ``CancelledError`` (or will be, as it begins)."""

    def cancel(self) -> None:
        """Deliver ``CancelledError`` into the coroutine (the pool's lock held)."""
        self.cancelled = True
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)

    def run(self, spec: JobSpec, progress: ProgressSink, flag: LostFlag) -> Outcome:
        depth_limits(spec.database)  # (looked up here: no query on the loop, for its result)
        with asyncio.Runner() as runner:
            return runner.run(self._attempt(spec, progress, flag))

    async def _attempt(self, spec: JobSpec, progress: ProgressSink, flag: LostFlag) -> Outcome:
        task = asyncio.current_task()
        with self._lock:
            self._loop, self._task = asyncio.get_running_loop(), task
            if self.cancelled and task is not None:
                task.cancel()  # stopped before it began: at its first await
        async with ThreadSensitiveContext():
            try:
                return await execute_async(spec, progress_sink=progress, lost_flag=flag)
            finally:
                with self._lock:
                    self._loop = self._task = None  # no cancel comes after this
                # (A cancel sent just before lands here: the connection is closed all
                # the same, in its thread.)
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(sync_to_async(connections.close_all)())
