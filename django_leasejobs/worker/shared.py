"""What the main loop shares with the worker's threads: the lease table and its status.

The main loop owns job state. The heartbeat and the watchdog need a little of it: which
leases to renew (with the jobs' progress), when each was last renewed and for how long,
which jobs run since when and with what timeout. That lives here, in one small table behind its own
lock, and nowhere else: the threads read it, record renewals in it, and post what they
found to the loop's inbox (``inbox.py``); they never touch the loop's objects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ..leases import Progress

Lease = tuple[int, int]


@dataclass(eq=False, slots=True)
class _Held:
    renewed_at: float
    """Monotonic time the last successful renewal was sent (or the claim)."""
    deadline: float
    """Seconds after ``renewed_at`` at which the worker calls the lease lost: the lease
    that statement asked for, less the table's margin."""
    generation: int
    """Which entry for this lease: a job given back and claimed again at the same attempt
    is a new one, so a message about the old one cannot touch it."""
    progress: Progress | None = None
    started_at: float | None = None
    """When it was handed to a slot (its timeout counts from then); None while waiting."""
    timeout: float | None = None
    recording: bool = False
    """Its outcome is being written: a renewal that skips its locked row is no news,
    and it is not stopped any more."""
    let_go: bool = False
    """Presumed lost: not renewed any more."""
    stop_posted: bool = False
    """The watchdog asked the loop to stop it already."""


@dataclass(frozen=True, slots=True)
class Overdue:
    """A job the watchdog found overdue: its lease (no renewal in time) or its timeout."""

    lease: Lease
    kind: Literal["lease", "timeout"]
    detail: str
    generation: int


@dataclass(frozen=True, slots=True)
class Silence:
    """How long a lease went without a renewal, past its local deadline."""

    seconds: float
    deadline: float


@dataclass(frozen=True, slots=True)
class Renewal:
    """A lease to renew: its job's latest progress, and its entry's generation."""

    progress: Progress | None
    generation: int


class LeaseTable:
    """The leases this worker holds, shared between the main loop (which adds, changes
    and removes entries) and its heartbeat and watchdog threads.

    A lease counts as lost ``margin`` seconds (``HEARTBEAT_INTERVAL``) before the lease
    its last claim or renewal asked for runs out: the worker stops its job while the
    database still holds the lease for it."""

    def __init__(self, margin: float) -> None:
        self.margin = margin
        self._lock = threading.Lock()
        self._held: dict[Lease, _Held] = {}
        self._generations = 0

    # -- written by the main loop ---------------------------------------------------

    def add(self, leases: Iterable[Lease], now: float, seconds: float) -> None:
        """Hold ``leases``, claimed by a statement sent at ``now`` for ``seconds``."""
        deadline = seconds - self.margin
        with self._lock:
            held, generation = self._held, self._generations
            for lease in leases:
                generation += 1
                held[lease] = _Held(now, deadline, generation)
            self._generations = generation

    def generation(self, lease: Lease) -> int:
        """The generation of ``lease``'s entry (0: not in the table)."""
        with self._lock:
            held = self._held.get(lease)
            return 0 if held is None else held.generation

    def remove(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease, None)

    def handed_over(self, lease: Lease, now: float, timeout: float | None) -> float:
        """Note that ``lease``'s job went to a slot; return when (monotonic) the worker
        will call the lease lost unless a renewal comes (0.0 when it is not held)."""
        with self._lock:
            held = self._held.get(lease)
            if held is None:
                return 0.0
            held.started_at, held.timeout = now, timeout
            return held.renewed_at + held.deadline

    def taken_back(self, lease: Lease) -> None:
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.started_at = None

    def recording(self, lease: Lease) -> None:
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.recording = True

    def let_go(self, lease: Lease) -> None:
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.let_go = True

    def set_progress(self, lease: Lease, progress: Progress) -> None:
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.progress = progress

    def renewed_at(self, lease: Lease) -> float:
        """When ``lease`` was last renewed (0.0 when it is not in the table)."""
        with self._lock:
            held = self._held.get(lease)
            return 0.0 if held is None else held.renewed_at

    def silence(self, lease: Lease, now: float) -> Silence | None:
        """How long ``lease`` went unrenewed, when that is past its local deadline (a
        lease not in the table is as good as lost)."""
        with self._lock:
            held = self._held.get(lease)
            if held is None:
                return Silence(now, 0.0)
            if now - held.renewed_at <= held.deadline:
                return None
            return Silence(now - held.renewed_at, held.deadline)

    # -- read and written by the heartbeat ----------------------------------------------

    def to_renew(self) -> dict[Lease, Renewal]:
        """Every lease not presumed lost, with its job's latest progress."""
        with self._lock:
            return {
                lease: Renewal(h.progress, h.generation)
                for lease, h in self._held.items()
                if not h.let_go
            }

    def being_recorded(self) -> set[Lease]:
        with self._lock:
            return {lease for lease, h in self._held.items() if h.recording}

    def renewed(self, leases: dict[Lease, int], at: float, seconds: float) -> None:
        """``leases`` (lease: generation) were renewed for ``seconds`` by a statement
        sent at ``at``."""
        deadline = seconds - self.margin
        with self._lock:
            for lease, generation in leases.items():
                held = self._held.get(lease)
                if held is not None and held.generation == generation:
                    held.renewed_at, held.deadline = at, deadline

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    # -- read by the watchdog --------------------------------------------------------------

    def overdue(self, now: float) -> list[Overdue]:
        """Jobs to stop, each reported once: no renewal within the local deadline (not
        while its outcome is being written: the fence decides then), or past its
        timeout."""
        found = []
        with self._lock:
            for lease, held in self._held.items():
                if held.let_go or held.recording or held.stop_posted:
                    continue
                silent = now - held.renewed_at
                if silent > held.deadline:
                    detail = (
                        f"no successful renewal for {silent:.1f}s (local deadline "
                        f"{held.deadline:g}s): cut off from the database, or the worker "
                        "was paused"
                    )
                    found.append(Overdue(lease, "lease", detail, held.generation))
                elif (
                    held.started_at is not None
                    and held.timeout is not None
                    and now - held.started_at > held.timeout
                ):
                    detail = f"after {now - held.started_at:.1f}s"
                    found.append(Overdue(lease, "timeout", detail, held.generation))
                else:
                    continue
                held.stop_posted = True
        return found


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """What the main loop publishes for the heartbeat's registry row and idle lookups."""

    state: str = "running"
    """``running`` or ``stopping``"""
    problem: str = ""
    listening: bool = False
    skip_tasks: tuple[str, ...] = ()
    """the tasks it stands aside from (``Recorder.skipped_tasks``): idle lookups skip them"""


class StatusBoard:
    """The main loop's latest ``WorkerStatus`` (it publishes; the heartbeat reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status = WorkerStatus()

    def publish(self, status: WorkerStatus) -> None:
        with self._lock:
            self._status = status

    def read(self) -> WorkerStatus:
        with self._lock:
            return self._status
