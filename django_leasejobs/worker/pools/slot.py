"""One slot of the process pool: its child, the pipes to it, and what they share."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ..child import SlotState
from .busy import LoopWatch
from .events import Event, Lease
from .frames import Frames


@dataclass(frozen=True, slots=True)
class CancelSent:
    """A ``CancelledError`` sent to a job on a slot's event loop."""

    due: float
    """When (monotonic) its grace ends: the slot is killed if the job still runs then."""
    grace: float
    """Its grace (seconds)."""
    ending: str
    """What the kill's reason says it did ("did not end", "lost its lease and did not
    end") within its grace."""


@dataclass(eq=False)
class ProcessSlot:
    index: int
    process: BaseProcess
    conn: Connection
    lifeline_w: int
    bell_r: int
    state: SlotState
    queue: deque[tuple[int, Lease]] = field(default_factory=deque)
    """(sequence number, lease) of the jobs handed to the child and not yet reported,
    in the order it runs them."""
    next_seq: int = 1
    reported_upto: int = 0
    """The highest sequence number known to have started (reported as ``Started``, or
    handed to the slot while it was idle)."""
    taken_back_upto: int = 0
    """The highest sequence number taken back from this slot. Until its child has passed
    it (``SEEN``), the slot gets no new job: a new job raises ``LIMIT``, which would let
    the child start the jobs taken back (run by another slot meanwhile). After a long job
    that also keeps jobs from queueing behind it again."""
    ready: bool = False
    """Its child said it is ready (``MSG_READY``): no job is handed to it before."""
    on_loop: bool = False
    """The jobs it holds run at once on its child's event loop (``JobSpec.on_loop``; set
    as an idle slot is handed jobs)."""
    cancels: dict[Lease, CancelSent] = field(default_factory=dict)
    """Jobs on its event loop sent a ``CancelledError``, with when their grace ends: the
    slot is killed if one still runs then."""
    culprit: tuple[Lease, str] | None = None
    """The job whose fault the slot's kill was, and why: the other jobs its event loop
    ran die as collateral (released without counting an attempt)."""
    fault: str | None = None
    """Why the slot was killed when no job could be named (every job its event loop ran
    dies *killed*, counted, as in a crash)."""
    loop_watch: LoopWatch = field(default_factory=LoopWatch)
    """The worker's own look at its event loop (``busy.py``)."""
    term_sent_at: float | None = None
    killed: bool = False
    events: list[Event] = field(default_factory=list)
    conn_fd: int = -1
    sentinel: int = -1
    frames: Frames = field(init=False)

    def __post_init__(self) -> None:
        self.frames = Frames(self.conn.fileno())

    @property
    def pid(self) -> int:
        pid = self.process.pid
        if pid is None:  # never: a slot is made from a started process
            raise RuntimeError(f"slot {self.index} has no process")
        return pid

    @property
    def open(self) -> bool:
        """Takes jobs: ready, and not being stopped (after a SIGTERM the group's SIGKILL
        is owed)."""
        return self.ready and self.term_sent_at is None and not self.killed


LOCK_WAIT = 2.0
"""How long the parent waits for a slot's lock (held by the child for a few
instructions as it starts a job; longer only if it died holding it)."""


@contextlib.contextmanager
def held(slot: ProcessSlot) -> Iterator[Any]:
    """The slot's shared values with its lock held; None if the lock cannot be had (the
    child died while holding it: its death is reported by collect())."""
    if not slot.state.lock.acquire(timeout=LOCK_WAIT):
        yield None
        return
    try:
        yield slot.state.values
    finally:
        slot.state.lock.release()


def take(queue: deque[tuple[int, Lease]], lease: Lease) -> bool:
    """Remove ``lease`` from a slot's queue (it ended); False if it was not there."""
    for index, (_, held) in enumerate(queue):
        if held == lease:
            del queue[index]
            return True
    return False
