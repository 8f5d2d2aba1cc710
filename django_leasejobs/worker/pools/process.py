"""The process pool: long-lived child processes, each in its own process group.

A slot's child (``worker/child.py``) runs the jobs handed to it one after another;
the parent really stops a job (signals to its process group), and a child that dies
is replaced. See ``child.py`` for the protocol over the pipe and the shared state.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import warnings
from typing import Literal

from django.db import connections

from ...tracing import preload
from ..child import (
    BLAMED_JOB,
    BLOCKED_NS,
    LIMIT,
    MSG_CANCEL,
    MSG_EXPIRED,
    MSG_OUTCOME,
    MSG_PROGRESS,
    MSG_READY,
    PICKLE_PROTOCOL,
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
from .slot import CancelSent, ProcessSlot, held, take

SLOT_READY_WAIT = 30.0
"""How long a starting worker waits for each new slot to say it is ready."""
SLOT_EXIT_WAIT = 5.0
"""At shutdown, how long idle slots get (all together) to leave on their own."""
LOST_LEASE_WAIT_SHARE = 0.5
"""Under the "sigkill" lock-lost behaviour, a job on a slot's event loop whose lease is
lost gets ``CancelledError`` and this share of ``HEARTBEAT_INTERVAL`` (at most
``LOCK_LOST_GRACE``) to end, before its slot is killed with its neighbours: the worker
calls a lease lost a heartbeat before the database does (``LeaseTable``), so the job is
gone before another worker can take it, and the neighbours, whose leases are sound, do
not run again for one job's lost lease. A thread (a sync job with ``--sync-on-loop``)
is told (``context.lease_lost``) and has the same time to end."""

LOOP_LOOK = 0.25
"""While a slot's event loop runs jobs, the worker looks at least this often whether a
job blocks it (``ASYNC_BLOCKING_LIMIT``)."""


class ProcessPool:
    kind: Literal["process"] = "process"

    def __init__(
        self,
        size: int,
        *,
        lock_lost_behavior: str,
        lock_lost_grace: float,
        async_concurrency: int = 1,
        async_blocking_limit: float = math.inf,
        lost_lease_wait: float = math.inf,
    ) -> None:
        self.size = size
        self.lock_lost_behavior = lock_lost_behavior
        self.lock_lost_grace = lock_lost_grace
        self.lost_lease_wait = lost_lease_wait
        """How long a job on an event loop whose lease is lost gets to end on its
        ``CancelledError`` under the "sigkill" behaviour, before its slot is killed with
        its neighbours (``LOST_LEASE_WAIT_SHARE``)."""
        self.async_concurrency = async_concurrency
        self.async_blocking_limit = async_blocking_limit
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
        preload()  # what a slot imports lazily, imported once before any fork
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
        state = SlotState(
            self._ctx.Lock(), self._ctx.RawArray("q", SLOT_VALUES), self.async_concurrency
        )
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
        self._poller.register(slot.bell_r, select.POLLIN)
        # Not waited for here: a replacement is spawned from the main loop, which must not
        # stall while the child starts. It takes jobs once its MSG_READY is read.
        return slot

    def _replace(self, slot: ProcessSlot) -> None:
        self._close_slot(slot)
        self._slots[slot.index] = self._spawn(slot.index)

    def _close_slot(self, slot: ProcessSlot) -> None:
        for fd in (slot.conn_fd, slot.sentinel, slot.bell_r):
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

    def loop_room(self) -> int:
        """How many more ``async def`` jobs the slots could run now (idle slots count
        ``async_concurrency`` each)."""
        return sum(room.jobs for room in self.loop_rooms())

    def rooms(self, depth: int) -> list[Room]:
        """Slots that can take jobs now, and how many each: up to ``depth`` queued (never
        a slot whose event loop runs jobs)."""
        with self._lock:
            return [
                Room(s.index, depth - len(s.queue), not s.queue)
                for s in self._slots
                if s.open
                and len(s.queue) < depth
                and not (s.on_loop and s.queue)
                and s.taken_back_upto <= s.state.values[SEEN]
            ]

    def loop_rooms(self) -> list[Room]:
        """Slots that can take ``async def`` jobs now, and how many each: idle ones, and
        those whose event loop runs fewer than ``async_concurrency`` jobs (never one that
        is being stopped: a job it runs was sent a cancel)."""
        with self._lock:
            return [
                Room(s.index, self.async_concurrency - len(s.queue), not s.queue)
                for s in self._slots
                if s.open
                and (not s.queue or s.on_loop)
                and not s.cancels
                and len(s.queue) < self.async_concurrency
                and s.taken_back_upto <= s.state.values[SEEN]
            ]

    def running(self) -> list[Lease]:
        with self._lock:
            return [lease for s in self._slots for _, lease in s.queue]

    def pipelined(self) -> bool:
        """Some slot holds jobs queued behind the one it runs, or runs one whose start
        has not been reported yet (the main loop looks in on them often)."""
        return any(
            s.queue[-1][0] > s.reported_upto
            if s.on_loop
            else len(s.queue) > 1 or s.queue[0][0] > s.reported_upto
            for s in self._slots
            if s.queue
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
                slot.on_loop = specs[0].on_loop
            if any(spec.on_loop != slot.on_loop for spec in specs):
                raise ValueError(f"slot {slot_index} runs jobs of the other kind")
            batch = []
            for spec in specs:
                batch.append((slot.next_seq, spec))
                slot.queue.append((slot.next_seq, spec.job.lease))
                slot.next_seq += 1
            with slot.state.lock:
                slot.state.values[LIMIT] = slot.next_seq - 1
        with contextlib.suppress(OSError):  # it died: its sentinel says so; nothing started
            slot.conn.send_bytes(pickle.dumps(batch, PICKLE_PROTOCOL))
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
        # One system call for every pipe, bell and sentinel: a short job's bookkeeping
        # costs less than a few system calls more per pass.
        ready = {fd for fd, _ in self._poller.poll(0)}
        for slot, started_upto in zip(slots, started, strict=True):
            if slot.bell_r in ready:
                drain(slot.bell_r)
            if slot.events:
                events.extend(slot.events)
                slot.events.clear()
            if slot.conn_fd in ready:
                # All of it: a read takes 64 KiB at most, and a message left behind could
                # be the MSG_EXPIRED of a job ``STARTED`` has passed. A read that took
                # less emptied the pipe of what was written before it.
                while (
                    self._read_messages(slot, events)
                    and not slot.frames.emptied
                    and _readable(slot.conn_fd)
                ):
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
                    slot.cancels.pop(outcome.lease, None)
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
            exit_description = describe_exit(slot.process.exitcode)
            for seq, lease in slot.queue:
                if seq > started:
                    continue
                if slot.culprit is not None and lease != slot.culprit[0]:
                    # Its event loop's neighbour was killed with it: not its fault.
                    culprit, why = slot.culprit
                    events.append(SlotDied(lease, exit_description, (culprit, why)))
                elif slot.culprit is not None:
                    events.append(SlotDied(lease, f"{exit_description}: {slot.culprit[1]}"))
                elif slot.fault is not None:
                    events.append(SlotDied(lease, f"{exit_description}: {slot.fault}"))
                else:
                    events.append(SlotDied(lease, exit_description))
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
                if len(slot.queue) < 2 or slot.on_loop:
                    continue
                with held(slot) as values:
                    if values is None:
                        continue
                    started = int(values[STARTED])
                    running_long = now - int(values[START_NS]) > after * 1e9
                    if started >= slot.queue[0][0] and running_long:
                        self._retract_after(slot, started)

    def stop_job(self, lease: Lease, *, graceful: bool, lease_lost: bool = False) -> StopAction:
        """Stop the job holding ``lease``: SIGKILL its process group, or SIGTERM first;
        a job still queued in its slot is taken back instead (``Retracted``).

        With ``graceful`` (the "sigterm" lock-lost behaviour) the child gets SIGTERM
        and :meth:`escalate` SIGKILLs the group after the grace period. Jobs queued
        behind the stopped one are taken back: they never start in that slot.

        A job on a slot's event loop gets ``CancelledError`` instead, and
        ``LOCK_LOST_GRACE`` to end before the group is killed (its neighbours then
        released as collateral); a ``lease_lost`` one under the "sigkill" behaviour only
        ``lost_lease_wait``: its neighbours, whose leases are sound, run on if it ends.
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
                if not slot.on_loop:
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
            # Out of the child's lock: a cancel waiting on a full pipe must not keep the
            # child from taking it (and reading the pipe).
            return self._stop_on_loop(slot, lease, lease_lost=lease_lost)

    def _stop_on_loop(self, slot: ProcessSlot, lease: Lease, *, lease_lost: bool) -> StopAction:
        """Stop a job that runs on ``slot``'s event loop: send it ``CancelledError``, and
        kill the slot if it still runs after its grace (``LOCK_LOST_GRACE``; for a lost
        lease under the "sigkill" behaviour ``lost_lease_wait``)."""
        if slot.killed or lease in slot.cancels:
            return "killing"
        grace = self.lock_lost_grace
        if lease_lost and self.lock_lost_behavior != "sigterm":
            grace = min(grace, self.lost_lease_wait)
        ending = "lost its lease and did not end" if lease_lost else "did not end"
        slot.cancels[lease] = CancelSent(time.monotonic() + grace, grace, ending)
        with contextlib.suppress(OSError):  # it died: its sentinel says so
            slot.conn.send((MSG_CANCEL, lease))
        return "killing"

    def escalate(self) -> float | None:
        """SIGKILL groups whose SIGTERM grace ran out, and slots whose event loop a job
        blocks too long or that a cancelled job outlives its grace on; return seconds
        until the next look."""
        soonest: float | None = None
        now = time.monotonic()
        with self._lock:
            for slot in self._slots:
                if slot.on_loop and slot.queue and not slot.killed:
                    left = self._watch_loop(slot, now)
                    soonest = left if soonest is None else min(soonest, left)
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

    def _watch_loop(self, slot: ProcessSlot, now: float) -> float:
        """Kill ``slot`` if a job blocks its event loop past ``async_blocking_limit``, or a
        job sent a cancel outlived its grace; seconds until the next look (the pool's
        lock held)."""
        for lease, sent in slot.cancels.items():
            if sent.due <= now:
                slot.culprit = (
                    lease,
                    f"job {lease[0]} (attempt {lease[1]}) {sent.ending} within "
                    f"{sent.grace:g}s of its CancelledError",
                )
                self._signal_group(slot, signal.SIGKILL)
                return 0.0
        values = slot.state.values
        # The child's monitor counts a loop held in any way, if it gets the GIL to look;
        # the worker's look (busy.py) catches a busy loop that starves the monitor.
        blocked = max(
            int(values[BLOCKED_NS]) / 1e9, slot.loop_watch.held_busy(slot.pid, values, now)
        )
        if blocked <= self.async_blocking_limit:
            nearest = min((sent.due for sent in slot.cancels.values()), default=math.inf) - now
            return max(0.0, min(LOOP_LOOK, self.async_blocking_limit - blocked, nearest))
        blamed = int(values[BLAMED_JOB])
        # A slot runs one attempt of a job at a time: the queue says which.
        culprit = next((lease for _, lease in slot.queue if lease[0] == blamed), None)
        if culprit is None and len(slot.queue) == 1:  # the monitor could not look
            culprit = slot.queue[0][1]
        how = f"blocked the slot's event loop for {blocked:.1f}s"
        limit = f"ASYNC_BLOCKING_LIMIT {self.async_blocking_limit:g}s"
        if culprit is not None:
            job, attempt = culprit
            slot.culprit = (culprit, f"job {job} (attempt {attempt}) {how} ({limit})")
        else:
            slot.fault = f"a job {how} ({limit}); which one is unknown (the monitor could not look)"
        self._signal_group(slot, signal.SIGKILL)
        return 0.0

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
