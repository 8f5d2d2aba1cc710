"""How one worker process is configured (``runworker``'s options)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Literal

from django.utils.crypto import get_random_string

SAME_STOP_WINDOW = 1.0
"""A worker under a supervisor takes a second stop signal this soon (seconds) after the
first for the same request heard twice (a process manager that signals the whole group
while the supervisor passes the signal on), not for "again, now". The supervisor holds
back a second stop signal of its own until this much time has passed."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    backend: str = "default"
    queues: tuple[str, ...] | None = None
    """Queues to take jobs from; None = every queue of the backend (``QUEUES``)."""
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    pool: Literal["process", "thread"] = "process"
    burst: bool = False
    max_jobs: int | None = None
    worker_id: str | None = None
    shutdown_timeout: float = 30.0
    prefetch: int | None = None
    """At most this many jobs claimed beyond the free slots while jobs are short (twice
    that during a drain: ``driver.MAX_IN_FLIGHT``); None = 64 per slot, at most 512; 0
    turns prefetching off."""
    scheduler: bool | None = None
    """Run the scheduler thread; None = unless ``burst`` (only when there are schedules)."""
    async_concurrency: int | None = None
    """``async def`` jobs a slot runs at once; None: the backend's ``ASYNC_CONCURRENCY``."""
    sync_on_loop: bool = False
    """Process pool: sync jobs ride the slots' event loops too, each in a thread of its
    slot, up to ``async_concurrency`` jobs at once per slot (``--sync-on-loop``)."""
    supervised: bool = False
    """Forked by ``runworker --processes`` (``supervisor.py``): a stop signal repeated
    within ``SAME_STOP_WINDOW`` is the same request heard twice, not "again, now"."""

    @property
    def runs_schedules(self) -> bool:
        return (not self.burst) if self.scheduler is None else self.scheduler

    @property
    def prefetch_max(self) -> int:
        if self.prefetch is None:
            return min(64 * self.concurrency, 512)
        return self.prefetch


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{get_random_string(6)}"
