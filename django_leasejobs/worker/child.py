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

import contextlib
import os
import signal
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal

from django.db import close_old_connections, connections

from ..tracing import flush_spans
from .execution import JobSpec, execute

# Messages: child -> parent
MSG_READY = "ready"
MSG_PROGRESS = "progress"
MSG_OUTCOME = "outcome"
MSG_EXPIRED = "expired"

RING_AFTER = 0.002
"""A job that ran at least this long rings the bell when it ends (a wake-up per job
costs little next to it); shorter ones ring only when the slot runs out of work."""
RING_BEFORE_BYTES = 16 * 1024
"""A message this large rings the bell once its length is written, before the rest: the
pipe may fill up, and the parent must come and read it."""

STARTED, LIMIT, START_NS, SEEN = 0, 1, 2, 3
"""Indexes into :attr:`SlotState.values`."""
SLOT_VALUES = 4


@dataclass(frozen=True, slots=True)
class SlotState:
    """What the parent and a child share about the child's jobs (made before the fork).

    ``values[STARTED]``: the sequence number of the job the child started last (0:
    none yet); ``values[START_NS]``: when (``time.monotonic_ns()``, one clock for every
    process of the machine); ``values[SEEN]``: the last sequence number the child decided
    on (started, or passed over); ``values[LIMIT]``: the highest sequence number the
    child may start (the parent lowers it to take queued jobs back, and raises it again
    for new jobs only once the child has passed every job taken back: a job taken back
    never starts). Both sides write them only while holding ``lock``.
    """

    lock: Any  # multiprocessing.synchronize.Lock (fork context)
    values: Any  # multiprocessing.sharedctypes.RawArray('q', SLOT_VALUES)


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
    """``multiprocessing.Connection``'s length prefix (what ``pools._Frames`` reads)."""
    if size <= 0x7FFFFFFF:
        return struct.pack("!i", size)
    return struct.pack("!i", -1) + struct.pack("!Q", size)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
    # Connections inherited from the parent belong to the parent: forget them unclosed.
    for alias in connections:
        connections[alias].connection = None  # type: ignore[union-attr]
    threading.Thread(
        target=_watch_lifeline, args=(lifeline_fd,), name="leasejobs-lifeline", daemon=True
    ).start()

    def ring() -> None:
        with contextlib.suppress(BlockingIOError):  # full: it rings already
            os.write(bell_fd, b"!")

    def send(message: Any, *, ring_after: bool) -> None:
        data = ForkingPickler.dumps(message)
        if len(data) < RING_BEFORE_BYTES:
            conn.send_bytes(data)
        else:
            # The pipe may fill up before the parent reads: its length first, then the
            # bell (the parent finds something to read, and reads the rest as it comes).
            _write_all(conn.fileno(), _frame_header(len(data)))
            ring()
            _write_all(conn.fileno(), data)
        if ring_after:
            ring()

    def progress(lease: tuple[int, int], fraction: float | None, message: str | None) -> None:
        send((MSG_PROGRESS, lease, fraction, message), ring_after=True)

    send((MSG_READY, os.getpid()), ring_after=True)  # the parent waits on the bell
    code = 0
    try:
        while True:
            try:
                batch: Any = conn.recv()
            except EOFError:
                break
            if batch is None:
                break
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
                close_old_connections()
                outcome = execute(spec, progress_sink=progress)
                idle = last and not conn.poll(0)
                send((MSG_OUTCOME, outcome), ring_after=idle or outcome.duration >= RING_AFTER)
    except BaseException:
        code = 1
    finally:
        try:
            flush_spans()
            connections.close_all()
        finally:
            os._exit(code)
