"""The child process behind one process-pool slot.

A child is forked once and runs many jobs, one at a time. They come over a pipe in
batches (a list of ``(sequence number, JobSpec)``: one job, or several short ones at
once), and each outcome goes back over the same pipe as soon as its job ends, so no
finished job's outcome is ever held back in the child.

Which job runs is shared with the parent through :class:`SlotState` (shared memory
and a lock): before starting a job the child takes the lock, checks the job was not
taken back (``limit``), and records its number and start time. The parent takes the
same lock to take queued jobs back or to kill the running one, so it always knows
which job a kill hits, and a job it took back never starts.

Outcomes do not wake the parent one by one: the child rings a separate *bell* pipe
(the one the parent waits on) when it has nothing left to run, after a job that took
a while, and before a large message, so a batch of short jobs costs the parent one
wake-up.

The child lives in its own process group, so the parent can kill the job together
with anything it spawned (``killpg``). A watchdog thread reads a *lifeline* pipe whose
write end only the parent holds: when the parent dies, even by SIGKILL, the read
returns EOF and the watchdog kills the whole group, so a job never outlives its
worker and never overlaps a re-run of itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import queue
import signal
import struct
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Literal, Protocol

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..serialization import depth_limits
from ..tracing import flush_spans
from . import stacks
from .execution import (
    JobSpec,
    LostFlag,
    ProgressSink,
    connections_forgotten,
    execute,
    execute_async,
    in_own_thread,
    refresh_connections,
)

# Messages: child -> parent
MSG_READY = "ready"
MSG_PROGRESS = "progress"
MSG_OUTCOME = "outcome"
MSG_EXPIRED = "expired"

PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL
"""The messages between a worker and its slots are our own plain values (JSON results,
error texts, tuples of them): plain pickle, without multiprocessing's picklers, which
copy a table of extra reducers for every message and look each object up in it (a
third to a half of a message's cost)."""

RING_AFTER = 0.002
"""A job that ran at least this long rings the bell when it ends (a wake-up per job
costs little next to it); shorter ones ring only when the slot runs out of work."""
RING_BEFORE_BYTES = 16 * 1024
"""A message this large rings the bell once its length is written, before the rest: the
pipe may fill up, and the parent must come and read it."""

(
    STARTED,
    LIMIT,
    START_NS,
    SEEN,
    LOOP_NS,
    BLOCKED_NS,
    BLAMED_JOB,
    LOOP_THREAD,
) = range(8)
"""Indexes into :attr:`SlotState.values`."""
SLOT_VALUES = 8

MSG_CANCEL = "cancel"
"""Parent -> child: ``(MSG_CANCEL, lease)``, deliver ``CancelledError`` to that job's
coroutine. (Every other parent -> child message is a batch of jobs, or None: leave.)"""

LOOP_TICK = 0.05
"""How often a slot's event loop marks that it runs (``values[LOOP_NS]``), and its
monitor looks: a loop that did not mark since the monitor's last look is held, for as
long as the monitor saw (``values[BLOCKED_NS]``), by the job it names
(``values[BLAMED_JOB]``: the id of the job whose step held the loop at the last look;
a slot runs one attempt of a job at a time, so the parent knows which); the parent
kills the slot once that passes ``ASYNC_BLOCKING_LIMIT``. The loop's thread's id
(``values[LOOP_THREAD]``, the kernel's) lets the parent see that thread busy while the
loop does not tick: a native call that holds the GIL starves the monitor
(``pools/busy.py``)."""


@dataclass(frozen=True, slots=True)
class SlotState:
    """What the parent and a child share about the child's jobs (made before the fork).

    ``values[STARTED]``: the sequence number of the job the child started last (0:
    none yet; the jobs of an event loop start as they come, in order, and run at once);
    ``values[START_NS]``: when (``time.monotonic_ns()``, one clock for every process of
    the machine); ``values[SEEN]``: the last sequence number the child decided
    on (started, or passed over); ``values[LIMIT]``: the highest sequence number the
    child may start (the parent lowers it to take queued jobs back, and raises it again
    for new jobs only once the child has passed every job taken back: a job taken back
    never starts). Both sides write them only while holding ``lock``. The event loop's
    mark (``values[LOOP_NS]``), how long it has been held (``values[BLOCKED_NS]``) and
    by which job (``values[BLAMED_JOB]``; 0: none), and the
    loop's thread (``values[LOOP_THREAD]``) are written by the child alone, without it.
    """

    lock: Any  # multiprocessing.synchronize.Lock (fork context)
    values: Any  # multiprocessing.sharedctypes.RawArray('q', SLOT_VALUES)
    loop_jobs: int = 1
    """The most jobs the parent runs at once on the child's event loop
    (``ASYNC_CONCURRENCY``): the threads its sync jobs may need (``--sync-on-loop``)."""


Start = Literal["start", "taken back", "too late"]


def _may_start(state: SlotState, seq: int, start_by: float) -> Start:
    """Record ``seq`` as started, unless the parent took it back or its ``start_by``
    passed (the parent froze, or the jobs before it ran long)."""
    with state.lock:
        state.values[SEEN] = seq
        if seq > state.values[LIMIT]:
            return "taken back"
        now = time.monotonic_ns()
        if now > start_by * 1e9:
            return "too late"
        state.values[STARTED] = seq
        state.values[START_NS] = now
        return "start"


def _watch_lifeline(lifeline_fd: int) -> None:
    try:
        while os.read(lifeline_fd, 1):
            pass
    except OSError:
        pass
    # The parent is gone: take the job and everything it started down with us.
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _frame_header(size: int) -> bytes:
    """``multiprocessing.Connection``'s length prefix (what ``pools.frames.Frames`` reads)."""
    if size <= 0x7FFFFFFF:
        return struct.pack("!i", size)
    return struct.pack("!i", -1) + struct.pack("!Q", size)


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)  # all of it, but for a signal or a full pipe
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


class Sender(Protocol):
    """Writes one message to the parent's pipe (``ring_after``: then rings the bell)."""

    def __call__(self, message: Any, *, ring_after: bool) -> None: ...


class SlotLoop:
    """The jobs a slot's child runs many at once (``ASYNC_CONCURRENCY``): ``async def``
    ones on an event loop in a thread of its own (started with the first such job), each
    in an asyncio task named after its lease, sent ``CancelledError`` when the parent
    stops it; sync ones (``--sync-on-loop``) each in a thread of the slot's own
    (``SyncThreads``), off the loop.

    Outcomes and progress go to a sender thread, which writes them to the pipe: no job
    waits on a parent slow to read, and a burst of outcomes rings the parent's bell once.
    A monitor thread measures how long the loop has been held (``values[BLOCKED_NS]``)
    and names the job whose step holds it."""

    def __init__(self, state: SlotState, send: Sender) -> None:
        self.state = state
        self.loop = asyncio.new_event_loop()
        self.tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sync = SyncThreads(state.loop_jobs, self.outbox, self._progress)
        for target, name in (
            (self._run, "leasejobs-loop"),
            (self._monitor, "leasejobs-loop-monitor"),
            (lambda: self._send_all(send), "leasejobs-loop-sender"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()

    def start(self, specs: list[JobSpec]) -> None:
        """Start a batch of jobs: sync ones in their threads at once; coroutines on the
        loop, after one look at the database connection their ``sync_to_async`` calls
        share (broken or too old, it is closed)."""
        coroutines = [spec for spec in specs if spec.coroutine]
        for spec in specs:
            if not spec.coroutine:
                self.sync.start(spec)
        if coroutines:
            self.loop.call_soon_threadsafe(self._start, coroutines)

    def cancel(self, lease: tuple[int, int]) -> None:
        if not self.sync.stop(lease):
            self.loop.call_soon_threadsafe(self._cancel, lease)

    def _run(self) -> None:
        self.state.values[LOOP_THREAD] = threading.get_native_id()
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        self.loop.run_forever()

    def _tick(self) -> None:
        self.state.values[LOOP_NS] = time.monotonic_ns()
        self.loop.call_later(LOOP_TICK, self._tick)

    def _send_all(self, send: Sender) -> None:
        while True:
            message = self.outbox.get()
            # The last message of a burst rings: the parent reads them all at once.
            send(message, ring_after=self.outbox.empty())

    def _monitor(self) -> None:
        """Every ``LOOP_TICK``: if the loop did not tick since the last look, add the time
        since then (at most two ticks: a process the machine did not run for a while
        holds no loop) to ``BLOCKED_NS``, and blame the job whose step runs now; else
        clear both.

        The blame is looked at again at every look, not kept from the first: on a busy
        machine the loop may miss a tick while a sound job's step runs, and the step
        that then holds the loop for good may be another job's, in the same turn of the
        loop (no tick between them). A look that finds no job's step running (the loop
        in its own callbacks) keeps the last blame."""
        values = self.state.values
        tick_ns = int(LOOP_TICK * 1e9)
        last_mark, last_look, blocked = values[LOOP_NS], time.monotonic_ns(), 0
        while True:
            time.sleep(LOOP_TICK)
            now, mark = time.monotonic_ns(), values[LOOP_NS]
            if mark != last_mark:
                last_mark, blocked = mark, 0
                values[BLOCKED_NS] = values[BLAMED_JOB] = 0
            else:
                blocked += min(now - last_look, 2 * tick_ns)
                # Read from this thread: the task whose step runs now (it cannot
                # change while the loop is held in it).
                current = asyncio.current_task(self.loop)
                lease = _lease_of(current.get_name()) if current is not None else None
                if lease is not None:
                    values[BLAMED_JOB] = lease[0]
                values[BLOCKED_NS] = blocked
            last_look = now

    def _start(self, specs: list[JobSpec]) -> None:
        # First in the executor's queue, before any call of these jobs.
        self.loop.create_task(self._refresh_connections())
        for spec in specs:
            lease = spec.job.lease
            name = f"{TASK_NAME_PREFIX}{lease[0]}:{lease[1]}"
            self.tasks[lease] = self.loop.create_task(self._job(spec), name=name)

    @staticmethod
    async def _refresh_connections() -> None:
        with contextlib.suppress(Exception):  # (a broken connection: the jobs report it)
            await sync_to_async(close_old_connections)()

    def _cancel(self, lease: tuple[int, int]) -> None:
        task = self.tasks.get(lease)
        if task is not None:
            task.cancel()

    def _progress(self, lease: tuple[int, int], fraction: float | None, text: str | None) -> None:
        self.outbox.put((MSG_PROGRESS, lease, fraction, text))

    async def _job(self, spec: JobSpec) -> None:
        outcome = await execute_async(spec, progress_sink=self._progress)
        self.tasks.pop(spec.job.lease, None)
        self.outbox.put((MSG_OUTCOME, outcome))


class SyncThreads:
    """The threads that run a slot's sync jobs many at once (``--sync-on-loop``), off
    its event loop: a job goes to an idle thread, or to a new one while fewer than
    ``size`` exist (the most jobs the parent runs at once there: a job never waits for a
    thread after it started). Each outcome goes to ``outbox`` as its job ends.

    A stop sets the job's ``context.lease_lost`` and is otherwise waited out, since a
    thread cannot be stopped; its outcome then reads as stopped (``Outcome.cancelled``).
    One that outlives ``LOCK_LOST_GRACE`` has the parent kill the slot, as a coroutine
    that ignores its ``CancelledError`` does."""

    def __init__(self, size: int, outbox: queue.SimpleQueue[Any], progress: ProgressSink) -> None:
        self.size = max(1, size)
        self.outbox = outbox
        self.progress = progress
        self._jobs: queue.SimpleQueue[JobSpec] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._flags: dict[tuple[int, int], LostFlag] = {}
        """The jobs handed over and not ended, with their flags (under ``_lock``)."""
        self._threads = 0
        self._idle = 0
        """Threads waiting for a job that no job handed over has claimed yet."""

    def start(self, spec: JobSpec) -> None:
        with self._lock:
            self._flags[spec.job.lease] = LostFlag()
            if self._idle:
                self._idle -= 1
            elif self._threads < self.size:
                self._threads += 1
                name = f"leasejobs-loop-job-{self._threads}"
                threading.Thread(target=self._serve, name=name, daemon=True).start()
        self._jobs.put(spec)

    def stop(self, lease: tuple[int, int]) -> bool:
        """Tell the sync job ``lease`` to stop; False if no such job runs here."""
        with self._lock:
            flag = self._flags.get(lease)
        if flag is None:
            return False
        flag.set()
        return True

    def _serve(self) -> None:
        while True:
            spec = self._jobs.get()
            lease = spec.job.lease
            with self._lock:
                flag = self._flags[lease]
            outcome = in_own_thread(
                lease, execute, spec, progress_sink=self.progress, lost_flag=flag
            )
            with self._lock:
                del self._flags[lease]
                self._idle += 1  # before the outcome: the parent may send the next job
            if flag.is_set():
                outcome = replace(outcome, cancelled=True)
            self.outbox.put((MSG_OUTCOME, outcome))


TASK_NAME_PREFIX = "leasejobs-job:"


def _lease_of(name: str) -> tuple[int, int] | None:
    if not name.startswith(TASK_NAME_PREFIX):
        return None
    job, _, attempt = name[len(TASK_NAME_PREFIX) :].partition(":")
    return (int(job), int(attempt))


def child_main(
    conn: Connection, bell_fd: int, state: SlotState, lifeline_fd: int, close_fds: list[int]
) -> None:
    """Entry point of a forked slot process. Never returns normally."""
    with contextlib.suppress(OSError):  # the parent may have set it already
        os.setpgid(0, 0)
    for fd in close_fds:  # the parent's ends of other slots' pipes
        with contextlib.suppress(OSError):
            os.close(fd)
    # The parent's handlers (graceful shutdown) must not run here; a job may install its own.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    # ``kill -USR1 <slot pid>``: every thread's stack to standard error (a slot that hangs).
    signal.signal(signal.SIGUSR1, stacks.print_stacks)
    # Connections inherited from the parent belong to the parent: forget them unclosed.
    for alias in connections:
        connections[alias].connection = None  # type: ignore[union-attr]
    connections_forgotten()
    threading.Thread(
        target=_watch_lifeline, args=(lifeline_fd,), name="leasejobs-lifeline", daemon=True
    ).start()

    def ring() -> None:
        with contextlib.suppress(BlockingIOError):  # full: it rings already
            os.write(bell_fd, b"!")

    sending = threading.Lock()  # the event loop's thread sends too
    fd = conn.fileno()

    def send(message: Any, *, ring_after: bool) -> None:
        data = pickle.dumps(message, PICKLE_PROTOCOL)
        with sending:
            if len(data) < RING_BEFORE_BYTES:
                # Length and pickle in one write: ``Connection.send_bytes``'s framing
                # without its checks and copies (0.9 of its 2 us per message).
                _write_all(fd, _frame_header(len(data)) + data)
            else:
                # The pipe may fill up before the parent reads: its length first, then the
                # bell (the parent finds something to read, and reads the rest as it comes).
                _write_all(fd, _frame_header(len(data)))
                ring()
                _write_all(fd, data)
        if ring_after:
            ring()

    def progress(lease: tuple[int, int], fraction: float | None, message: str | None) -> None:
        send((MSG_PROGRESS, lease, fraction, message), ring_after=True)

    send((MSG_READY, os.getpid()), ring_after=True)  # the parent waits on the bell
    loop: SlotLoop | None = None
    code = 0
    try:
        while True:
            try:
                batch: Any = conn.recv()
            except EOFError:
                break
            if batch is None:
                break
            if batch[0] == MSG_CANCEL:
                if loop is not None:
                    loop.cancel(batch[1])
                continue
            to_loop: list[JobSpec] = []  # async jobs of this batch that may start
            for index, (seq, spec) in enumerate(batch):
                assert isinstance(spec, JobSpec)  # noqa: S101 - protocol invariant
                last = index == len(batch) - 1
                start = _may_start(state, seq, spec.start_by)
                if start == "too late":  # the parent gives it back, unstarted
                    send((MSG_EXPIRED, spec.job.lease), ring_after=True)
                    continue
                if start == "taken back":
                    if last and not conn.poll(0):
                        ring()
                    continue
                if spec.on_loop:
                    if loop is None:
                        depth_limits(spec.database)  # (looked up here: no query on the loop)
                        loop = SlotLoop(state, send)
                    to_loop.append(spec)
                    continue
                refresh_connections()
                outcome = execute(spec, progress_sink=progress)
                idle = last and not conn.poll(0)
                send((MSG_OUTCOME, outcome), ring_after=idle or outcome.duration >= RING_AFTER)
            if to_loop and loop is not None:
                loop.start(to_loop)
    except BaseException:
        code = 1
    finally:
        try:
            flush_spans()
            connections.close_all()
        finally:
            os._exit(code)
