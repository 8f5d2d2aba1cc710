"""What a pool of slots tells the worker, and the one interface both pools implement.

The main loop owns the pool: it hands jobs to slots (``rooms`` and ``submit``), reads
what happened (``collect``: outcomes, progress, starts, dead slots, jobs taken back),
and stops jobs (``stop_job``). Nothing else calls a pool, so a pool's own lock only
guards what its slots (threads, or child processes through shared memory) share with it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal, Protocol

from ...hot_values import hot_value
from ..execution import JobSpec, Outcome

Lease = tuple[int, int]
"""(job id, attempt)"""


@hot_value
class ProgressEvent:
    lease: Lease
    fraction: float | None
    message: str | None


@dataclass(frozen=True, slots=True)
class SlotDied:
    """A child died while running a job, without reporting an outcome."""

    lease: Lease
    exit_description: str
    collateral_of: tuple[Lease, str] | None = None
    """The job on the same event loop whose fault the kill was, and why: this one is
    released without counting an attempt."""


@hot_value
class Retracted:
    """Jobs handed to a slot that never started there (taken back, or the slot died
    first): they go back to the worker's queue of ready jobs."""

    leases: tuple[Lease, ...]


@hot_value
class Started:
    """Jobs a slot started that were queued behind another one (the first job handed
    to an idle slot starts at once: the worker announces it as it hands it over)."""

    leases: tuple[Lease, ...]


@hot_value
class Room:
    """A slot that can take jobs now."""

    slot: int
    jobs: int
    """How many more it can hold."""
    idle: bool
    """It holds none: the first job it gets starts at once."""


Event = Outcome | ProgressEvent | SlotDied | Retracted | Started

StopAction = Literal["killing", "flagged", "cancelled", "retracted", "none"]
"""What ``stop_job`` did: signalled the job's process, or cancelled its coroutine on a
slot's event loop (its slot's death, or its outcome, follows); flagged its thread (it
runs on, fenced); flagged its thread and sent its coroutine ``CancelledError`` (thread
pool: the thread runs on, fenced, until the coroutine ends); took it back before it
started (``Retracted`` follows), or nothing (it ended already, or is not in the pool)."""


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


class Pool(Protocol):
    """Slots that run jobs: ``ProcessPool`` (can kill a job) or ``ThreadPool`` (can
    only flag one, ``context.lease_lost``, and rely on the fence)."""

    @property
    def kind(self) -> Literal["process", "thread"]:
        """What runs a job: a child process, or a thread of the worker."""

    def start(self) -> None:
        """Start the slots (the process pool forks before any other thread exists)."""

    def shutdown(self) -> None:
        """Stop the slots; a job still running in one is killed (process pool)."""

    def free_slots(self) -> int:
        """Slots that hold no job and take jobs."""

    def rooms(self, depth: int) -> list[Room]:
        """Slots that can take jobs now, each up to ``depth`` held."""

    def loop_rooms(self) -> list[Room]:
        """Slots that can take ``async def`` jobs to run at once on their event loop (the
        thread pool: none, its slots run them one at a time, as ``rooms`` offers)."""

    def loop_room(self) -> int:
        """How many more ``async def`` jobs the slots' event loops could run now."""

    def running(self) -> list[Lease]:
        """The leases of every job the slots hold (running or queued)."""

    def pipelined(self) -> bool:
        """Some slot holds a job whose start the worker has not heard of yet."""

    def submit(self, slot_index: int, specs: list[JobSpec]) -> bool:
        """Hand ``specs`` to one slot; True when the slot was idle (the first job
        starts at once; the others are reported as ``Started``)."""

    def waitables(self) -> list[int]:
        """File descriptors that become readable when a slot has news."""

    def collect(self) -> list[Event]:
        """Everything the slots reported since the last call."""

    def retract_stalled(self, after: float) -> None:
        """Take back jobs queued behind one that has run longer than ``after`` s."""

    def stop_job(self, lease: Lease, *, graceful: bool, lease_lost: bool = False) -> StopAction:
        """Stop the job holding ``lease`` (see ``StopAction``); ``lease_lost``: because
        its lease is gone (the process pool kills an event loop's job at once then)."""

    def escalate(self) -> float | None:
        """SIGKILL what a SIGTERM's grace left running; seconds until the next one."""
