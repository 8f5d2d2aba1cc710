"""Slots that run jobs: long-lived child processes (default) or threads.

Both pools give the main loop the same small interface: submit a job to a free
slot, wait for events (outcomes, progress, dead children), and stop a job. The
process pool can really stop a job (signals to its process group); the thread
pool can only flag it (``context.lease_lost``) and rely on the fence.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import select
import signal
import struct
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

from django.db import connections

from .child import (
    LIMIT,
    MSG_EXPIRED,
    MSG_OUTCOME,
    MSG_PROGRESS,
    RING_AFTER,
    SEEN,
    SLOT_VALUES,
    START_NS,
    STARTED,
    SlotState,
    child_main,
)
from .execution import JobSpec, Outcome, error_info, execute

SLOT_EXIT_WAIT = 5.0
"""At shutdown, how long idle slots get (all together) to leave on their own."""

logger = logging.getLogger("django_leasejobs")

Lease = tuple[int, int]


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    lease: Lease
    fraction: float | None
    message: str | None


@dataclass(frozen=True, slots=True)
class SlotDied:
    """A child died while running a job, without reporting an outcome."""

    lease: Lease
    exit_description: str


@dataclass(frozen=True, slots=True)
class Retracted:
    """Jobs handed to a slot that never started there (taken back, or the slot died
    first): they go back to the worker's queue of ready jobs."""

    leases: tuple[Lease, ...]


@dataclass(frozen=True, slots=True)
class Started:
    """Jobs a slot started that were queued behind another one (the first job handed
    to an idle slot starts at once: the worker announces it as it hands it over)."""

    leases: tuple[Lease, ...]


@dataclass(frozen=True, slots=True)
class Room:
    """A slot that can take jobs now."""

    slot: int
    jobs: int
    """How many more it can hold."""
    idle: bool
    """It holds none: the first job it gets starts at once."""


Event = Outcome | ProgressEvent | SlotDied | Retracted | Started

StopAction = Literal["killing", "flagged", "retracted", "none"]
"""What ``stop_job`` did: signalled the job's process (its slot's death follows),
flagged its thread (it runs on, fenced), took it back before it started
(``Retracted`` follows), or nothing (it ended already, or is not in the pool)."""


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exited (status unknown)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with status {exitcode}"


@dataclass(eq=False)
class _ProcessSlot:
    index: int
    process: Any  # multiprocessing.Process (fork context)
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
    term_sent_at: float | None = None
    killed: bool = False
    events: list[Event] = field(default_factory=list)
    conn_fd: int = -1
    sentinel: int = -1
    frames: _Frames = field(init=False)

    def __post_init__(self) -> None:
        self.frames = _Frames(self.conn.fileno())

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def open(self) -> bool:
        """Takes jobs: not being stopped (after a SIGTERM the group's SIGKILL is owed)."""
        return self.term_sent_at is None and not self.killed


class ProcessPool:
    kind: Literal["process"] = "process"
    can_kill = True

    def __init__(self, size: int, *, lock_lost_behavior: str, lock_lost_grace: float) -> None:
        self.size = size
        self.lock_lost_behavior = lock_lost_behavior
        self.lock_lost_grace = lock_lost_grace
        self._ctx = multiprocessing.get_context("fork")
        self._slots: list[_ProcessSlot] = []
        self._lock = threading.RLock()
        # Which slots have something to say, in one system call per collect(): a
        # selector built per slot and per pass would cost more than a short job.
        self._poller = select.poll()
        self._owed_kills: list[tuple[int, float]] = []  # (process group, when) after SIGTERM
        self._retracted: list[Retracted] = []

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._slots = []
        for index in range(self.size):  # one by one: each child closes its elders' lifelines
            self._slots.append(self._spawn(index))

    def _spawn(self, index: int) -> _ProcessSlot:
        # The child gets no database connection from us: close ours (this thread's)
        # before forking; the child opens its own when a job needs one.
        connections.close_all()
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        lifeline_r, lifeline_w = os.pipe()
        bell_r, bell_w = os.pipe()
        os.set_blocking(bell_r, False)
        os.set_blocking(bell_w, False)
        state = SlotState(self._ctx.Lock(), self._ctx.RawArray("q", SLOT_VALUES))
        # The other slots' lifeline write ends and bells must not stay open in this
        # child, or a dead worker would go unnoticed by them. Closed ones (-1) are
        # skipped: their fd numbers may already be reused by the pipes just created.
        others = [fd for s in self._slots for fd in (s.lifeline_w, s.bell_r) if fd >= 0]
        process = self._ctx.Process(
            target=child_main,
            # The child closes its own copy of the write end too: otherwise it would hold
            # its lifeline open itself and never see the worker die.
            args=(child_conn, bell_w, state, lifeline_r, [lifeline_w, bell_r, *others]),
            name=f"leasejobs-slot-{index}",
            daemon=False,
        )
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a multi-threaded process. The child only
            # runs our code, resets what it inherited and never touches the parent's locks.
            warnings.simplefilter("ignore", DeprecationWarning)
            process.start()
        os.close(lifeline_r)
        os.close(bell_w)
        child_conn.close()
        if process.pid is not None:
            # Also set from this side: whichever of parent and child runs first wins.
            with contextlib.suppress(OSError):
                os.setpgid(process.pid, process.pid)
        slot = _ProcessSlot(
            index=index,
            process=process,
            conn=parent_conn,
            lifeline_w=lifeline_w,
            bell_r=bell_r,
            state=state,
        )
        slot.conn_fd = parent_conn.fileno()
        slot.sentinel = process.sentinel
        self._poller.register(slot.conn_fd, select.POLLIN)
        self._poller.register(slot.sentinel, select.POLLIN)
        try:
            if parent_conn.poll(30):
                parent_conn.recv()  # MSG_READY
        except (EOFError, OSError):
            pass
        return slot

    def _replace(self, slot: _ProcessSlot) -> None:
        self._close_slot(slot)
        self._slots[slot.index] = self._spawn(slot.index)

    def _close_slot(self, slot: _ProcessSlot) -> None:
        for fd in (slot.conn_fd, slot.sentinel):
            with contextlib.suppress(KeyError, ValueError):
                self._poller.unregister(fd)
        for name in ("lifeline_w", "bell_r"):
            fd = getattr(slot, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(slot, name, -1)
        slot.conn.close()
        slot.process.join(timeout=5)

    def shutdown(self) -> None:
        idle = [slot for slot in self._slots if not slot.queue]
        for slot in idle:
            with contextlib.suppress(OSError):
                slot.conn.send(None)
        # Let idle slots leave on their own (they flush what they owe, such as trace
        # spans) before their lifeline closes: a closed lifeline makes a slot SIGKILL
        # its own process group at once.
        deadline = time.monotonic() + SLOT_EXIT_WAIT
        for slot in idle:
            slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for slot in self._slots:
            if slot.queue:
                self._signal_group(slot, signal.SIGKILL)
            self._close_slot(slot)
        self._slots = []
        with self._lock:
            for pgid, _due in self._owed_kills:  # the worker leaves: nothing it ran stays
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            self._owed_kills = []

    # -- jobs ----------------------------------------------------------------------

    def free_slots(self) -> int:
        return sum(1 for s in self._slots if not s.queue and s.open)

    def rooms(self, depth: int) -> list[Room]:
        """Slots that can take jobs now, and how many each: up to ``depth`` queued."""
        with self._lock:
            return [
                Room(s.index, depth - len(s.queue), not s.queue)
                for s in self._slots
                if s.open and len(s.queue) < depth and s.taken_back_upto <= s.state.values[SEEN]
            ]

    def running(self) -> list[Lease]:
        with self._lock:
            return [lease for s in self._slots for _, lease in s.queue]

    def pipelined(self) -> bool:
        """Some slot holds jobs queued behind the one it runs, or runs one whose start
        has not been reported yet (the main loop looks in on them often)."""
        return any(
            len(s.queue) > 1 or (s.queue and s.queue[0][0] > s.reported_upto) for s in self._slots
        )

    def submit(self, slot_index: int, specs: list[JobSpec]) -> bool:
        """Hand ``specs`` to one slot, to run after what it holds already (a slot
        :meth:`rooms` offers: never one whose child has not yet passed the jobs taken back
        from it, which a raised ``LIMIT`` would let it start). True if the slot was idle:
        the first job starts at once, and the worker announces it; the others are
        reported as they start (``Started``)."""
        with self._lock:
            slot = self._slots[slot_index]
            if slot.taken_back_upto > slot.state.values[SEEN]:
                raise ValueError(f"slot {slot_index} has jobs taken back it has not passed yet")
            idle = not slot.queue
            if idle:
                slot.reported_upto = slot.next_seq
            batch = []
            for spec in specs:
                batch.append((slot.next_seq, spec))
                slot.queue.append((slot.next_seq, spec.job.lease))
                slot.next_seq += 1
            with slot.state.lock:
                slot.state.values[LIMIT] = slot.next_seq - 1
        with contextlib.suppress(OSError):  # it died: its sentinel says so; nothing started
            slot.conn.send(batch)
        return idle

    def waitables(self) -> list[Any]:
        return [s.bell_r for s in self._slots] + [s.sentinel for s in self._slots]

    def collect(self) -> list[Event]:
        """Read everything the slots reported; replace dead children."""
        events: list[Event] = []
        slots = list(self._slots)
        # How far each child got, read BEFORE the poll: a child sends MSG_EXPIRED for a job
        # it passes over (too late) before it records a later job as started, so every job
        # up to this number that did not start has its message in the pipe by now, read
        # below before any start is reported. (Read after the poll, it could name a job
        # passed over whose message came after the poll as started.)
        started = [int(slot.state.values[STARTED]) for slot in slots]
        ready = {fd for fd, _ in self._poller.poll(0)}
        for slot, started_upto in zip(slots, started, strict=True):
            _drain(slot.bell_r)
            events.extend(slot.events)
            slot.events.clear()
            if slot.conn_fd in ready:
                self._read_messages(slot, events)
            if slot.sentinel in ready and not slot.process.is_alive():
                self._slot_died(slot, events)
            elif slot.queue:
                self._report_started(slot, events, started_upto)
        with self._lock:
            events.extend(self._retracted)
            self._retracted = []
        return events

    def _read_messages(self, slot: _ProcessSlot, events: list[Event]) -> None:
        """Read every message waiting in the slot's pipe (``_Frames``: one system call
        for all of them, not two per message)."""
        try:
            messages = slot.frames.read()
        except (EOFError, OSError):
            return  # the child is gone: its sentinel says so
        for message in messages:
            if message[0] == MSG_OUTCOME:
                outcome: Outcome = message[1]
                with self._lock:
                    if _take(slot.queue, outcome.lease):
                        events.append(outcome)
            elif message[0] == MSG_PROGRESS:
                _, lease, fraction, text = message
                events.append(ProgressEvent(lease, fraction, text))
            elif message[0] == MSG_EXPIRED:
                with self._lock:
                    if _take(slot.queue, message[1]):
                        events.append(Retracted((message[1],)))
            # MSG_READY needs nothing.

    def _report_started(self, slot: _ProcessSlot, events: list[Event], started: int) -> None:
        """Report the queued jobs the child started since the last look, up to ``started``
        (a lock-free read of ``STARTED`` before the pipes were polled: the child only ever
        raises it). Their outcomes, read later, come after this event."""
        if started <= slot.reported_upto:
            return
        with self._lock:
            leases = tuple(
                lease for seq, lease in slot.queue if slot.reported_upto < seq <= started
            )
            slot.reported_upto = started
        if leases:
            events.append(Started(leases))

    def _slot_died(self, slot: _ProcessSlot, events: list[Event]) -> None:
        slot.process.join(timeout=1)
        self._read_messages(slot, events)  # outcomes it sent before it died count
        if slot.term_sent_at is not None and not slot.killed:
            # The job left on SIGTERM, but what it started may still run in its group:
            # the SIGKILL after the grace is still owed. (A group id is not reused while
            # the group has members, so killpg stays safe.)
            with self._lock:
                self._owed_kills.append((slot.pid, slot.term_sent_at + self.lock_lost_grace))
        with self._lock:
            started = int(slot.state.values[STARTED])  # the child is gone: no lock needed
            never_started = tuple(lease for seq, lease in slot.queue if seq > started)
            for seq, lease in slot.queue:
                if seq <= started:
                    events.append(SlotDied(lease, describe_exit(slot.process.exitcode)))
            slot.queue.clear()
        if never_started:
            events.append(Retracted(never_started))
        self._replace(slot)

    def _retract_after(self, slot: _ProcessSlot, last_kept: int) -> None:
        """Take back every queued job after sequence number ``last_kept`` (with the
        slot's lock held: the child starts none of them)."""
        slot.state.values[LIMIT] = last_kept
        taken = tuple(lease for seq, lease in slot.queue if seq > last_kept)
        if taken:
            slot.taken_back_upto = max(slot.taken_back_upto, slot.queue[-1][0])
            while slot.queue and slot.queue[-1][0] > last_kept:
                slot.queue.pop()
            self._retracted.append(Retracted(taken))

    def retract_stalled(self, after: float) -> None:
        """Take back the jobs queued behind one that has run longer than ``after``
        seconds, for other slots to run (their ``Retracted`` event comes with the next
        :meth:`collect`)."""
        now = time.monotonic_ns()
        with self._lock:
            for slot in self._slots:
                if len(slot.queue) < 2:
                    continue
                with _held(slot) as values:
                    if values is None:
                        continue
                    started = int(values[STARTED])
                    running_long = now - int(values[START_NS]) > after * 1e9
                    if started >= slot.queue[0][0] and running_long:
                        self._retract_after(slot, started)

    def stop_job(self, lease: Lease, *, graceful: bool) -> StopAction:
        """Stop the job holding ``lease``: SIGKILL its process group, or SIGTERM first;
        a job still queued in its slot is taken back instead (``Retracted``).

        With ``graceful`` (the "sigterm" lock-lost behaviour) the child gets SIGTERM
        and :meth:`escalate` SIGKILLs the group after the grace period. Jobs queued
        behind the stopped one are taken back: they never start in that slot.
        """
        with self._lock:
            found = next(
                ((s, seq) for s in self._slots for seq, held in s.queue if held == lease),
                None,
            )
            if found is None:
                return "none"
            slot, seq = found
            with _held(slot) as values:
                if values is None:
                    return "none"  # the child died holding its lock: collect() reports it
                started = int(values[STARTED])
                if seq > started:
                    self._retract_after(slot, seq - 1)
                    return "retracted"
                if seq < started:
                    return "none"  # it ended: its outcome is on the way
                # It runs (or just ended): nothing queued behind it starts here.
                self._retract_after(slot, seq)
                if graceful and self.lock_lost_behavior == "sigterm":
                    if slot.term_sent_at is None:
                        slot.term_sent_at = time.monotonic()
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(slot.pid, signal.SIGTERM)
                else:
                    self._signal_group(slot, signal.SIGKILL)
            return "killing"

    def escalate(self) -> float | None:
        """SIGKILL groups whose SIGTERM grace ran out; return seconds until the next one."""
        soonest: float | None = None
        now = time.monotonic()
        with self._lock:
            owed = []
            for pgid, due in self._owed_kills:
                if due <= now:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, signal.SIGKILL)
                else:
                    owed.append((pgid, due))
                    soonest = due - now if soonest is None else min(soonest, due - now)
            self._owed_kills = owed
            for slot in self._slots:
                if slot.term_sent_at is None or slot.killed:
                    continue
                left = slot.term_sent_at + self.lock_lost_grace - now
                if left <= 0:
                    self._signal_group(slot, signal.SIGKILL)
                else:
                    soonest = left if soonest is None else min(soonest, left)
        return soonest

    def _signal_group(self, slot: _ProcessSlot, signum: int) -> None:
        slot.killed = signum == signal.SIGKILL
        try:
            os.killpg(slot.pid, signum)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.pid, signum)

    def child_pids(self) -> list[int]:
        return [s.pid for s in self._slots]


LOCK_WAIT = 2.0
"""How long the parent waits for a slot's lock (held by the child for a few
instructions as it starts a job; longer only if it died holding it)."""


@contextlib.contextmanager
def _held(slot: _ProcessSlot) -> Iterator[Any]:
    """The slot's shared values with its lock held; None if the lock cannot be had (the
    child died while holding it: its death is reported by collect())."""
    if not slot.state.lock.acquire(timeout=LOCK_WAIT):
        yield None
        return
    try:
        yield slot.state.values
    finally:
        slot.state.lock.release()


def _take(queue: deque[tuple[int, Lease]], lease: Lease) -> bool:
    """Remove ``lease`` from a slot's queue (it ended); False if it was not there."""
    for index, (_, held) in enumerate(queue):
        if held == lease:
            del queue[index]
            return True
    return False


class _Frames:
    """The child-to-parent side of a slot's pipe, read in bulk.

    ``multiprocessing.Connection`` reads a message in two system calls (its length,
    then its bytes). With several outcomes waiting after a batch of short jobs, this
    reads whatever is there in one call and cuts it into messages (the same framing:
    a 4-byte big-endian length, or -1 and an 8-byte length for huge ones; a pickle).
    Only called when the pipe is readable. A message cut short is read to its end (the
    child is writing it); EOF ends the read with the messages that were whole.
    """

    CHUNK = 1 << 16

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()

    def read(self) -> list[Any]:
        """Every whole message waiting; raises EOFError when the child's end is closed
        and nothing was waiting."""
        self._fill()
        messages: list[Any] = []
        try:
            while self.buffer:
                frame = self._frame()
                if frame is None:
                    self._fill()  # the rest of a message is on its way
                    continue
                start, end = frame
                messages.append(pickle.loads(self.buffer[start:end]))  # noqa: S301 - our own child's messages
                del self.buffer[:end]
        except EOFError:
            if not messages:
                raise
        return messages

    def _fill(self) -> None:
        data = os.read(self.fd, self.CHUNK)
        if not data:
            raise EOFError
        self.buffer += data

    def _frame(self) -> tuple[int, int] | None:
        """Where the first message's pickle starts and ends, if it is whole."""
        if len(self.buffer) < 4:
            return None
        (size,) = struct.unpack_from("!i", self.buffer)
        start = 4
        if size == -1:
            if len(self.buffer) < 12:
                return None
            (size,) = struct.unpack_from("!Q", self.buffer, 4)
            start = 12
        end = start + size
        return (start, end) if len(self.buffer) >= end else None


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass


@dataclass(eq=False)
class _ThreadSlot:
    index: int
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


class ThreadPool:
    """Runs jobs in threads. A thread cannot be killed: a lost lease only flags it."""

    kind: Literal["thread"] = "thread"
    can_kill = False

    def __init__(self, size: int, *, wake: Any) -> None:
        self.size = size
        self._wake = wake
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._slots = [_ThreadSlot(i) for i in range(size)]
        self._events: list[Event] = []
        self._flags: dict[Lease, threading.Event] = {}
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

    def _next(self, slot: _ThreadSlot) -> tuple[JobSpec, threading.Event] | None:
        """The next job this thread may start (a job whose ``start_by`` passed goes back
        to the worker); None when the pool shuts down."""
        with self._work:
            while True:
                while not slot.queue and not self._closing:
                    self._work.wait()
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

    def _run(self, slot: _ThreadSlot) -> None:
        def progress(lease: Lease, fraction: float | None, message: str | None) -> None:
            with self._lock:
                self._events.append(ProgressEvent(lease, fraction, message))
            self._wake()

        while (taken := self._next(slot)) is not None:
            spec, flag = taken
            try:
                outcome = execute(spec, progress_sink=progress, lost_flag=flag)
            except BaseException as exc:  # execute() never raises; if it did, not the slot
                outcome = Outcome(spec.job.lease, ok=False, error=error_info(exc))
            finally:
                with contextlib.suppress(Exception):
                    connections.close_all()
            with self._lock:
                slot.current = None
                slot.abandoned = slot.stalled = False
                self._flags.pop(outcome.lease, None)
                if outcome.lease in self._abandoned:
                    # Stopped earlier (lease lost, timeout...): the outcome is void; the
                    # slot is free again.
                    self._abandoned.discard(outcome.lease)
                else:
                    self._events.append(outcome)
                quiet = bool(slot.queue) and outcome.duration < RING_AFTER
            if not quiet:
                self._wake()

    def shutdown(self) -> None:
        with self._work:
            self._closing = True
            self._work.notify_all()

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

    def running(self) -> list[Lease]:
        with self._lock:
            return list(self._flags)

    def pipelined(self) -> bool:
        return any(s.queue for s in self._slots)

    def submit(self, slot_index: int, specs: list[JobSpec]) -> bool:
        with self._work:
            for spec in specs:
                self._flags[spec.job.lease] = threading.Event()
            slot = self._slots[slot_index]
            idle = slot.current is None and not slot.queue
            if idle:
                slot.announced = specs[0].job.lease
            slot.queue.extend(specs)
            self._work.notify_all()
        return idle

    def waitables(self) -> list[Any]:
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

    def stop_job(self, lease: Lease, *, graceful: bool) -> StopAction:
        """Flag the running job (``context.lease_lost``); the thread runs on, its outcome
        is void. A job still queued is taken back (``Retracted``).

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
                    return "flagged"
                for index, spec in enumerate(slot.queue):
                    if spec.job.lease == lease:
                        self._retract(slot, index)
                        return "retracted"
        return "none"

    def escalate(self) -> float | None:
        return None

    def child_pids(self) -> list[int]:
        return []
