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
import queue
import select
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

from django.db import connections

from .child import MSG_OUTCOME, MSG_PROGRESS, child_main
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


Event = Outcome | ProgressEvent | SlotDied


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
    lease: Lease | None = None
    term_sent_at: float | None = None
    killed: bool = False
    events: list[Event] = field(default_factory=list)
    conn_fd: int = -1
    sentinel: int = -1

    @property
    def pid(self) -> int:
        return int(self.process.pid)


class ProcessPool:
    kind: Literal["process"] = "process"
    can_kill = True

    def __init__(self, size: int, *, lock_lost_behavior: str, lock_lost_grace: float) -> None:
        self.size = size
        self.lock_lost_behavior = lock_lost_behavior
        self.lock_lost_grace = lock_lost_grace
        self._ctx = multiprocessing.get_context("fork")
        self._slots: list[_ProcessSlot] = []
        self._lock = threading.Lock()
        # Which slots have something to say, in one system call per collect(): a
        # selector built per slot and per pass would cost more than a short job.
        self._poller = select.poll()
        self._owed_kills: list[tuple[int, float]] = []  # (process group, when) after SIGTERM

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
        # The other slots' lifeline write ends must not stay open in this child, or a
        # dead worker would go unnoticed by them. Closed ones (-1) are skipped: their fd
        # numbers may already be reused by the pipes just created.
        others = [s.lifeline_w for s in self._slots if s.lifeline_w >= 0]
        process = self._ctx.Process(
            target=child_main,
            # The child closes its own copy of the write end too: otherwise it would hold
            # its lifeline open itself and never see the worker die.
            args=(child_conn, lifeline_r, [lifeline_w, *others]),
            name=f"leasejobs-slot-{index}",
            daemon=False,
        )
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a multi-threaded process. The child only
            # runs our code, resets what it inherited and never touches the parent's locks.
            warnings.simplefilter("ignore", DeprecationWarning)
            process.start()
        os.close(lifeline_r)
        child_conn.close()
        if process.pid is not None:
            # Also set from this side: whichever of parent and child runs first wins.
            with contextlib.suppress(OSError):
                os.setpgid(process.pid, process.pid)
        slot = _ProcessSlot(index=index, process=process, conn=parent_conn, lifeline_w=lifeline_w)
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
        if slot.lifeline_w >= 0:
            with contextlib.suppress(OSError):
                os.close(slot.lifeline_w)
            slot.lifeline_w = -1
        slot.conn.close()
        slot.process.join(timeout=5)

    def shutdown(self) -> None:
        idle = [slot for slot in self._slots if slot.lease is None]
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
            if slot.lease is not None:
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
        return sum(1 for s in self._slots if s.lease is None)

    def running(self) -> list[Lease]:
        return [s.lease for s in self._slots if s.lease is not None]

    def submit(self, spec: JobSpec) -> None:
        slot = next(s for s in self._slots if s.lease is None)
        slot.lease = spec.job.lease
        slot.term_sent_at = None
        slot.killed = False
        try:
            slot.conn.send(spec)
        except OSError:
            # The child died while idle: the job is reported as a dead slot and retried.
            slot.events.append(SlotDied(spec.job.lease, "died before the job was sent"))

    def waitables(self) -> list[Any]:
        return [s.conn for s in self._slots] + [s.process.sentinel for s in self._slots]

    def collect(self) -> list[Event]:
        """Read everything the slots reported; replace dead children."""
        events: list[Event] = []
        ready = {fd for fd, _ in self._poller.poll(0)}
        for slot in list(self._slots):
            events.extend(slot.events)
            slot.events.clear()
            if slot.conn_fd in ready:
                self._read_messages(slot, events)
            if slot.sentinel in ready and not slot.process.is_alive():
                self._slot_died(slot, events)
        return events

    def _read_messages(self, slot: _ProcessSlot, events: list[Event]) -> None:
        """Read one message (the fd stays readable if more wait: the next pass reads it)."""
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            return  # the child is gone: its sentinel says so
        if message[0] == MSG_OUTCOME:
            outcome: Outcome = message[1]
            if outcome.lease == slot.lease:
                slot.lease = None
                events.append(outcome)
        elif message[0] == MSG_PROGRESS:
            _, lease, fraction, text = message
            events.append(ProgressEvent(lease, fraction, text))
        # MSG_READY needs nothing.

    def _slot_died(self, slot: _ProcessSlot, events: list[Event]) -> None:
        slot.process.join(timeout=1)
        if slot.term_sent_at is not None and not slot.killed:
            # The job left on SIGTERM, but what it started may still run in its group:
            # the SIGKILL after the grace is still owed. (A group id is not reused while
            # the group has members, so killpg stays safe.)
            with self._lock:
                self._owed_kills.append((slot.pid, slot.term_sent_at + self.lock_lost_grace))
        if slot.lease is not None:
            events.append(SlotDied(slot.lease, describe_exit(slot.process.exitcode)))
            slot.lease = None
        self._replace(slot)

    def stop_job(self, lease: Lease, *, graceful: bool) -> bool:
        """Stop the job holding ``lease``: SIGKILL its process group, or SIGTERM first.

        With ``graceful`` (the "sigterm" lock-lost behaviour) the child gets SIGTERM
        and :meth:`escalate` SIGKILLs the group after the grace period.
        """
        with self._lock:
            slot = next((s for s in self._slots if s.lease == lease), None)
            if slot is None:
                return False
            if graceful and self.lock_lost_behavior == "sigterm":
                if slot.term_sent_at is None:
                    slot.term_sent_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(slot.pid, signal.SIGTERM)
            else:
                self._signal_group(slot, signal.SIGKILL)
            return True

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


class ThreadPool:
    """Runs jobs in threads. A thread cannot be killed: a lost lease only flags it."""

    kind: Literal["thread"] = "thread"
    can_kill = False

    def __init__(self, size: int, *, wake: Any) -> None:
        self.size = size
        self._wake = wake
        self._inbox: queue.Queue[JobSpec | None] = queue.Queue()
        self._events: queue.Queue[Event] = queue.Queue()
        self._busy: dict[Lease, threading.Event] = {}
        self._abandoned: set[Lease] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.size):
            thread = threading.Thread(target=self._run, name=f"leasejobs-slot-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self) -> None:
        while True:
            spec = self._inbox.get()
            if spec is None:
                return
            lease = spec.job.lease
            with self._lock:
                flag = self._busy[lease]

            def progress(lease: Lease, fraction: float | None, message: str | None) -> None:
                self._events.put(ProgressEvent(lease, fraction, message))
                self._wake()

            try:
                outcome = execute(spec, progress_sink=progress, lost_flag=flag)
            except BaseException as exc:  # execute() never raises; if it did, not the slot
                outcome = Outcome(lease, ok=False, error=error_info(exc))
            finally:
                with contextlib.suppress(Exception):
                    connections.close_all()
            self._events.put(outcome)
            self._wake()

    def shutdown(self) -> None:
        for _ in self._threads:
            self._inbox.put(None)

    def free_slots(self) -> int:
        with self._lock:
            return self.size - len(self._busy)

    def running(self) -> list[Lease]:
        with self._lock:
            return list(self._busy)

    def submit(self, spec: JobSpec) -> None:
        with self._lock:
            self._busy[spec.job.lease] = threading.Event()
        self._inbox.put(spec)

    def waitables(self) -> list[Any]:
        return []

    def collect(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return events
            if isinstance(event, Outcome):
                with self._lock:
                    self._busy.pop(event.lease, None)
                    if event.lease in self._abandoned:
                        self._abandoned.discard(event.lease)
                        continue  # stopped earlier (lease lost, timeout...): the outcome is void
            events.append(event)

    def stop_job(self, lease: Lease, *, graceful: bool) -> bool:
        """Flag the job (``context.lease_lost``); the thread runs on, its outcome is void.

        The slot stays busy until the thread returns, so the pool never runs more
        jobs than it has threads.
        """
        with self._lock:
            flag = self._busy.get(lease)
            if flag is None or lease in self._abandoned:
                return False
            self._abandoned.add(lease)
        flag.set()
        return True

    def escalate(self) -> float | None:
        return None

    def child_pids(self) -> list[int]:
        return []
