"""The process pool: long-lived child processes, each in its own process group.

A slot's child (``worker/child.py``) runs the jobs handed to it one after another;
the parent really stops a job (signals to its process group), and a child that dies
is replaced. See ``child.py`` for the protocol over the pipe and the shared state.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import threading
import time
import warnings
from typing import Literal

from django.db import connections

from ..child import (
    LIMIT,
    MSG_EXPIRED,
    MSG_OUTCOME,
    MSG_PROGRESS,
    MSG_READY,
    SEEN,
    SLOT_VALUES,
    START_NS,
    STARTED,
    SlotState,
    child_main,
)
from ..execution import JobSpec, Outcome
from .events import (
    Event,
    Lease,
    ProgressEvent,
    Retracted,
    Room,
    SlotDied,
    Started,
    StopAction,
    describe_exit,
)
from .frames import drain
from .slot import ProcessSlot, held, take

SLOT_READY_WAIT = 30.0
"""How long a starting worker waits for each new slot to say it is ready."""
SLOT_EXIT_WAIT = 5.0
"""At shutdown, how long idle slots get (all together) to leave on their own."""


class ProcessPool:
    kind: Literal["process"] = "process"

    def __init__(self, size: int, *, lock_lost_behavior: str, lock_lost_grace: float) -> None:
        self.size = size
        self.lock_lost_behavior = lock_lost_behavior
        self.lock_lost_grace = lock_lost_grace
        self._ctx = multiprocessing.get_context("fork")
        self._slots: list[ProcessSlot] = []
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
        for slot in self._slots:
            # A worker starts with its slots ready (a slow one becomes ready when its
            # message is read, as a replacement does).
            try:
                if slot.conn.poll(SLOT_READY_WAIT):
                    self._read_messages(slot, slot.events)
            except (EOFError, OSError):
                pass

    def _spawn(self, index: int) -> ProcessSlot:
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
        slot = ProcessSlot(
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
        # Not waited for here: a replacement is spawned from the main loop, which must not
        # stall while the child starts. It takes jobs once its MSG_READY is read.
        return slot

    def _replace(self, slot: ProcessSlot) -> None:
        self._close_slot(slot)
        self._slots[slot.index] = self._spawn(slot.index)

    def _close_slot(self, slot: ProcessSlot) -> None:
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

    def waitables(self) -> list[int]:
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
            drain(slot.bell_r)
            events.extend(slot.events)
            slot.events.clear()
            if slot.conn_fd in ready:
                # All of it: a read takes 64 KiB at most, and a message left behind could
                # be the MSG_EXPIRED of a job ``STARTED`` has passed.
                while self._read_messages(slot, events) and _readable(slot.conn_fd):
                    pass
            if slot.sentinel in ready and not slot.process.is_alive():
                self._slot_died(slot, events)
            elif slot.queue:
                self._report_started(slot, events, started_upto)
        with self._lock:
            events.extend(self._retracted)
            self._retracted = []
        return events

    def _read_messages(self, slot: ProcessSlot, events: list[Event]) -> bool:
        """Read the messages waiting in the slot's pipe (``Frames``: one system call for
        up to 64 KiB of them, not two per message); False at its end (the child is gone:
        its sentinel says so)."""
        try:
            messages = slot.frames.read()
        except (EOFError, OSError):
            return False
        for message in messages:
            if message[0] == MSG_OUTCOME:
                outcome: Outcome = message[1]
                with self._lock:
                    if take(slot.queue, outcome.lease):
                        events.append(outcome)
            elif message[0] == MSG_PROGRESS:
                _, lease, fraction, text = message
                events.append(ProgressEvent(lease, fraction, text))
            elif message[0] == MSG_EXPIRED:
                with self._lock:
                    if take(slot.queue, message[1]):
                        events.append(Retracted((message[1],)))
            elif message[0] == MSG_READY:
                slot.ready = True
        return True

    def _report_started(self, slot: ProcessSlot, events: list[Event], started: int) -> None:
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

    def _slot_died(self, slot: ProcessSlot, events: list[Event]) -> None:
        slot.process.join(timeout=1)
        # Outcomes it sent before it died count, all of them: one read takes 64 KiB at
        # most, and the pipe may hold more (a job that finished would be reported as died
        # with its slot, and run again).
        while _readable(slot.conn_fd) and self._read_messages(slot, events):
            pass
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

    def _retract_after(self, slot: ProcessSlot, last_kept: int) -> None:
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
                with held(slot) as values:
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
            with held(slot) as values:
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

    def _signal_group(self, slot: ProcessSlot, signum: int) -> None:
        slot.killed = signum == signal.SIGKILL
        try:
            os.killpg(slot.pid, signum)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.pid, signum)


def _readable(fd: int) -> bool:
    """Something (or the end) waits in ``fd`` now."""
    return bool(select.select([fd], [], [], 0)[0])
