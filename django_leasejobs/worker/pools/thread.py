"""The thread pool: jobs run in threads of the worker (``--pool thread``).

A thread cannot be killed: a stopped job is only flagged (``context.lease_lost``), its
slot stays busy until it returns, and the fence rejects its writes. An ``async def``
job's coroutine is sent ``CancelledError`` too (``coroutine.py``); one that swallows it
runs on under the same rule.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..child import RING_AFTER
from ..execution import JobSpec, LostFlag, Outcome, execute, in_own_thread
from .coroutine import SlotCoroutine
from .events import Event, Lease, ProgressEvent, Retracted, Room, Started, StopAction


@dataclass(eq=False)
class _ThreadSlot:
    index: int
    work: threading.Condition
    """Notified when jobs are handed to this thread, or the pool shuts down (on the
    pool's lock: a hand-over wakes its own thread only)."""
    queue: deque[JobSpec] = field(default_factory=deque)
    """Jobs handed to this thread that it has not started, in order."""
    current: Lease | None = None
    started_at: float = 0.0
    abandoned: bool = False
    """Its running job was stopped: it takes no more jobs until that job returns."""
    stalled: bool = False
    """Its running job ran long with jobs queued behind it (taken back): it gets no more
    until that job returns."""
    announced: Lease | None = None
    """The job handed to it while it was idle (the worker announces that one's start)."""
    coroutine: SlotCoroutine | None = None
    """Its running job's coroutine (an ``async def`` job), for a stop to cancel."""


class ThreadPool:
    """Runs jobs in threads. A thread cannot be killed: a lost lease only flags it."""

    kind: Literal["thread"] = "thread"

    def __init__(self, size: int, *, wake: Callable[[], None], stop_grace: float = 0.0) -> None:
        self.size = size
        self._wake = wake
        self.stop_grace = stop_grace
        """At shutdown, how long the coroutines sent ``CancelledError`` get to end
        (``LOCK_LOST_GRACE``) before the worker leaves without them."""
        self._lock = threading.Lock()
        self._slots = [_ThreadSlot(i, threading.Condition(self._lock)) for i in range(size)]
        self._events: list[Event] = []
        self._flags: dict[Lease, LostFlag] = {}
        self._abandoned: set[Lease] = set()
        self._closing = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for slot in self._slots:
            thread = threading.Thread(
                target=self._run, args=(slot,), name=f"leasejobs-slot-{slot.index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _next(self, slot: _ThreadSlot, ended: Outcome | None) -> tuple[JobSpec, LostFlag] | None:
        """Report ``ended`` (the outcome of the job this thread ran last, if any) and take
        the next job this thread may start, in one hold of the pool's lock (a job whose
        ``start_by`` passed goes back to the worker); None when the pool shuts down."""
        with slot.work:
            if ended is not None:
                self._ended(slot, ended)
            while True:
                while not slot.queue and not self._closing:
                    slot.work.wait()
                if not slot.queue:
                    return None
                spec = slot.queue.popleft()
                now = time.monotonic()
                if now <= spec.start_by:
                    slot.current = spec.job.lease
                    slot.started_at = now
                    if slot.announced != spec.job.lease:  # it waited behind another job
                        self._events.append(Started((spec.job.lease,)))
                        if not slot.queue:  # the main loop stops looking in often
                            self._wake()
                    return spec, self._flags[spec.job.lease]
                self._flags.pop(spec.job.lease, None)
                self._events.append(Retracted((spec.job.lease,)))
                self._wake()

    def _ended(self, slot: _ThreadSlot, outcome: Outcome) -> None:
        """The job ``slot`` ran has ended (lock held): its outcome goes to the worker,
        unless the job was stopped (its outcome is void); the slot is free again. Rings the
        worker unless more short jobs follow in this slot (``RING_AFTER``)."""
        slot.current = slot.coroutine = None
        slot.abandoned = slot.stalled = False
        self._flags.pop(outcome.lease, None)
        if outcome.lease in self._abandoned:
            self._abandoned.discard(outcome.lease)
        else:
            self._events.append(outcome)
        if not slot.queue or outcome.duration >= RING_AFTER:
            self._wake()

    def _run(self, slot: _ThreadSlot) -> None:
        def progress(lease: Lease, fraction: float | None, message: str | None) -> None:
            with self._lock:
                self._events.append(ProgressEvent(lease, fraction, message))
            self._wake()

        ended: Outcome | None = None
        while (taken := self._next(slot, ended)) is not None:
            spec, flag = taken
            lease = spec.job.lease
            if spec.coroutine:
                coroutine = SlotCoroutine(self._lock)
                with self._lock:
                    slot.coroutine = coroutine
                    if flag.is_set():
                        coroutine.cancelled = True  # stopped as it started: cancelled as it begins
                ended = in_own_thread(lease, coroutine.run, spec, progress, flag)
            else:
                ended = in_own_thread(lease, execute, spec, progress_sink=progress, lost_flag=flag)

    def shutdown(self) -> None:
        """Let the threads leave; wait up to ``stop_grace`` for those whose coroutine was
        sent ``CancelledError`` (its ``finally`` runs). A job that does not stop is left
        running: the worker's exit ends it."""
        with self._lock:
            self._closing = True
            for slot in self._slots:
                slot.work.notify()
            ending = [
                thread
                for slot, thread in zip(self._slots, self._threads, strict=True)
                if slot.coroutine is not None and slot.coroutine.cancelled
            ]
        deadline = time.monotonic() + self.stop_grace
        for thread in ending:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def free_slots(self) -> int:
        with self._lock:
            return sum(1 for s in self._slots if s.current is None and not s.queue)

    def rooms(self, depth: int) -> list[Room]:
        with self._lock:
            rooms = []
            for slot in self._slots:
                held = len(slot.queue) + (slot.current is not None)
                if not slot.abandoned and not slot.stalled and held < depth:
                    rooms.append(Room(slot.index, depth - held, held == 0))
            return rooms

    def loop_rooms(self) -> list[Room]:
        return []  # an ``async def`` job takes a thread of its own, as a sync one does

    def loop_room(self) -> int:
        return 0

    def running(self) -> list[Lease]:
        with self._lock:
            return list(self._flags)

    def pipelined(self) -> bool:
        return any(s.queue for s in self._slots)

    def submit(self, slot_index: int, specs: list[JobSpec]) -> bool:
        with self._lock:
            for spec in specs:
                self._flags[spec.job.lease] = LostFlag()
            slot = self._slots[slot_index]
            idle = slot.current is None and not slot.queue
            if idle:
                slot.announced = specs[0].job.lease
            slot.queue.extend(specs)
            slot.work.notify()
        return idle

    def waitables(self) -> list[int]:
        return []

    def collect(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def _retract(self, slot: _ThreadSlot, first: int) -> None:
        """Take back the queued jobs of ``slot`` from index ``first`` on (lock held)."""
        taken = []
        while len(slot.queue) > first:
            spec = slot.queue.pop()
            self._flags.pop(spec.job.lease, None)
            taken.append(spec.job.lease)
        if taken:
            self._events.append(Retracted(tuple(reversed(taken))))

    def retract_stalled(self, after: float) -> None:
        now = time.monotonic()
        with self._lock:
            for slot in self._slots:
                if slot.queue and slot.current is not None and now - slot.started_at > after:
                    self._retract(slot, 0)
                    slot.stalled = True

    def stop_job(self, lease: Lease, *, graceful: bool, lease_lost: bool = False) -> StopAction:
        """Flag the running job (``context.lease_lost``), and send an ``async def`` one's
        coroutine ``CancelledError``; the thread runs on, its outcome is void. A job still
        queued is taken back (``Retracted``).

        The slot stays busy until the thread returns, so the pool never runs more
        jobs than it has threads; the jobs queued behind the flagged one are taken back.
        """
        with self._lock:
            for slot in self._slots:
                if slot.current == lease:
                    if lease in self._abandoned:
                        return "none"
                    self._abandoned.add(lease)
                    slot.abandoned = True
                    self._retract(slot, 0)
                    self._flags[lease].set()
                    if slot.coroutine is not None:
                        slot.coroutine.cancel()
                        return "cancelled"
                    return "flagged"
                for index, spec in enumerate(slot.queue):
                    if spec.job.lease == lease:
                        self._retract(slot, index)
                        return "retracted"
        return "none"

    def escalate(self) -> float | None:
        return None
