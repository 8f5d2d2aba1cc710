"""The jobs a worker holds, as its main loop sees them (only the main loop touches them)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from ..compat import AnyTask, AnyTaskResult
from ..leases import ClaimedJob
from ..models import JobAttempt
from .shared import LeaseTable

Lease = tuple[int, int]
StopReason = Literal["lease_lost", "timeout", "cancelled", "shutdown"]


@dataclass(eq=False, slots=True)
class RunningJob:
    """One claimed attempt, from its claim until its outcome is written (or let go)."""

    job: ClaimedJob
    task: AnyTask | None
    started: float
    """Monotonic: when it was claimed, then when it was handed to a slot."""
    on_loop: bool = False
    """It runs on a slot's event loop beside others (process pool): an ``async def`` job,
    or any job with ``--sync-on-loop``."""
    coroutine: bool = False
    """Its task is an ``async def`` one (decided once, as the loop takes the claim)."""
    dispatched: bool = False
    """Handed to a slot. A prefetched job waits in ``JobBook.ready`` until then (and goes
    back there if its slot gives it back before it started)."""
    announced: bool = False
    """Its start was announced (log, ``job_started``, ``task_started``): once per attempt."""
    task_result: AnyTaskResult | None = None
    """The django.tasks view sent with ``task_started``; copied for ``task_finished``."""
    stop_reason: StopReason | None = None
    recording: bool = False
    """Its outcome is queued for writing: it is not stopped any more."""
    write_failures: int = 0
    """Database rounds that carried its outcome and failed as a whole (a
    connection-level error). A slow or failing write is retried while the lease holds."""
    write_failed_at: float = 0.0
    """When the last of those rounds ended (monotonic)."""
    write_error: str = ""
    """What the last of those rounds failed with."""
    failed_alone: int = 0
    """Rounds of its own (``recorder.ISOLATE_AFTER``) that failed as a whole."""
    lease_gone: bool = False
    """A renewal matched no row while its outcome waited: the lease is no longer this
    worker's, and the fenced write would be refused."""
    finished_at: datetime | None = None
    """The job's ``finished_at`` as the round wrote it (for ``task_finished``)."""
    history: list[JobAttempt] | None = None
    """The job's attempt rows after the round wrote its outcome (for ``task_finished``
    of a job with earlier attempts; None when not needed)."""


class JobBook:
    """Every attempt the worker holds, and the claimed ones waiting for a slot. Keeps the
    lease table (``shared.py``) in step: a job is in both, or in neither."""

    def __init__(self, table: LeaseTable) -> None:
        self.table = table
        self.running: dict[Lease, RunningJob] = {}
        self.ready: deque[RunningJob] = deque()
        """Claimed (prefetched) jobs waiting for a free slot, oldest first."""
        self.finished = 0
        """Attempts that ran and ended (whatever their outcome), for ``--max-jobs``."""

    def add(self, runnings: list[RunningJob], leased_at: float, seconds: float) -> None:
        """Hold ``runnings``, whose leases of ``seconds`` the database counts from no
        earlier than ``leased_at`` (monotonic: when their claim was sent)."""
        held = self.running
        for running in runnings:
            held[running.job.lease] = running
        self.table.add([running.job.lease for running in runnings], leased_at, seconds)

    def forget(self, running: RunningJob, *, ran: bool = True) -> None:
        lease = running.job.lease
        self.running.pop(lease, None)
        self.table.remove(lease)
        if ran:
            self.finished += 1

    def get(self, lease: Lease) -> RunningJob | None:
        return self.running.get(lease)

    def __len__(self) -> int:
        return len(self.running)
