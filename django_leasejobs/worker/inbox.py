"""The main loop's inbox: what the worker's threads tell the one owner of job state.

The heartbeat, watchdog, listener and signal handlers never change the worker's state
themselves: they post one of the typed messages below, which wakes the main loop
(a byte on a pipe its selector waits on), and the loop acts on it in its next pass.
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
from dataclasses import dataclass

Lease = tuple[int, int]


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """Stop this job: the database no longer holds its lease for this worker (a renewal
    matched no row: ``confirmed``), or the worker would call it lost (no renewal in
    time)."""

    lease: Lease
    detail: str
    generation: int
    """The lease table's generation of the entry it is about (a job given back and
    claimed again at the same attempt is a new entry: an old message does not touch it)."""
    confirmed: bool = False


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """An operator asked to cancel this running job (seen by a renewal)."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class TimedOut:
    """This job ran past its timeout."""

    lease: Lease
    detail: str
    generation: int


@dataclass(frozen=True, slots=True)
class NextDue:
    """When the next pending job of the worker's queues comes due: seconds from the
    lookup (0 or less: due already), or None when none is pending."""

    seconds: float | None


@dataclass(frozen=True, slots=True)
class RenewalWasSlow:
    """A renewal of this worker's leases took this long (longer than the dispatch
    policy's ``SLOW_ROUND_SHARE`` of the lease): claim less."""

    seconds: float


@dataclass(frozen=True, slots=True)
class JobsMayBeReady:
    """A NOTIFY arrived for one of the worker's queues: claim on the next pass."""


@dataclass(frozen=True, slots=True)
class Listening:
    """The listener's ``LISTEN`` became active, or stopped being."""

    active: bool


@dataclass(frozen=True, slots=True)
class StopAsked:
    """A signal asked the worker to stop (the first: gracefully; again: now)."""

    signal_name: str
    at: float
    """When the signal arrived (``time.monotonic()`` in its handler)."""


Message = (
    LeaseLost
    | CancelRequested
    | TimedOut
    | NextDue
    | RenewalWasSlow
    | JobsMayBeReady
    | Listening
    | StopAsked
)


class Inbox:
    """Messages for the main loop, and the pipe that wakes it. Any thread may post, and so
    may a signal handler (it runs in the main thread between two steps of the loop, so
    nothing here takes a lock the loop could be holding: ``SimpleQueue`` is reentrant)."""

    def __init__(self) -> None:
        self._messages: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._notified = False
        """A ``JobsMayBeReady`` waits: a NOTIFY flood is one message."""
        self._rung = False
        """A wake-up byte was written since the loop last drained the pipe: another is
        not needed (a thread pool's slots wake the loop for every few jobs)."""
        self._readable = True
        """The last wait found the pipe readable (a byte written by a ``wake`` that found
        ``_rung`` set just before a drain cleared it): drain it, or every wait would
        return at once."""
        self.fileno, self._wake_w = os.pipe()
        self._selector: selectors.BaseSelector | None = None
        self._selected: list[int] = []
        os.set_blocking(self.fileno, False)
        os.set_blocking(self._wake_w, False)

    def post(self, message: Message) -> None:
        if isinstance(message, JobsMayBeReady):
            self._notified = True
        else:
            self._messages.put(message)
        self.wake()

    def wake(self) -> None:
        """Wake the main loop without a message (a slot or a database round has news).

        Called after the news is in place (a message posted, an event appended): if a
        byte was written since the loop last drained the pipe, the loop has yet to pass
        ``take`` and will see the news after it."""
        if self._rung:
            return
        self._rung = True
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def take(self) -> list[Message]:
        """Every message posted since the last call; clears the wake-up (the pipe
        drained, then the flag: news posted after the drain finds it set and writes
        nothing, and is read below or later in the same pass; news after the clear
        writes a byte)."""
        if self._rung or self._readable:
            with contextlib.suppress(BlockingIOError, OSError):
                while os.read(self.fileno, 4096):
                    pass
            self._rung = self._readable = False
        messages: list[Message] = []
        if self._notified:
            self._notified = False
            messages.append(JobsMayBeReady())
        with contextlib.suppress(queue.Empty):
            while True:
                messages.append(self._messages.get_nowait())
        return messages

    def wait(self, waitables: list[int], timeout: float) -> None:
        """Sleep until one of ``waitables`` (the slots' bells and sentinels) or this
        inbox is readable, or ``timeout`` passes.

        One selector is kept across calls (rebuilt when the pool replaces a slot):
        building one per pass costs more than the rest of a short job's bookkeeping.
        """
        if self._selector is None or self._selected != waitables:
            if self._selector is not None:
                self._selector.close()
            self._selector = selectors.DefaultSelector()
            for item in [*waitables, self.fileno]:
                self._selector.register(item, selectors.EVENT_READ)
            self._selected = waitables
        for key, _ in self._selector.select(timeout):
            if key.fileobj == self.fileno:
                self._readable = True

    def close(self) -> None:
        if self._selector is not None:
            self._selector.close()
        for fd in (self.fileno, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
