"""The dispatch policy: how many jobs to claim, prefetch and hand to a slot at once.

A plain object with no database, processes or clock of its own: the main loop tells it
what happened (a job's run time, a hand-over, a give-back, a round's duration) and asks
it how much to claim and how many jobs a slot may hold. Tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFETCH_WORK_SECONDS = 0.02
"""A worker prefetches about this much work per slot, judged by the recent jobs' mean run
time: enough to keep slots busy through a claim round trip, never enough to make a job
wait long behind others (jobs of 20 ms or longer are not prefetched at all)."""

PREFETCH_MAX_WAIT = 1.0
"""A prefetched job that waited this long for a slot (a long job came among short
ones, or the worker gets too little CPU for what it claimed) is given back for other
workers, prefetching pauses until a slot frees, and the worker's prefetch limit is
divided by ``PREFETCH_BACKOFF``."""

PREFETCH_BACKOFF = 4.0
"""How much a give-back of stale prefetched jobs shrinks the worker's prefetch limit.
Each prefetched job a slot then starts within ``PREFETCH_MAX_WAIT / 4`` raises it by
``PREFETCH_REGROWTH``, up to ``--prefetch``: a worker short of CPU (many workers on few
cores) settles on a prefetch it gets through in time, instead of claiming full batches,
giving them back a second later and claiming them again (bench/workers.py: 32 workers
on 2 cores gave back more jobs than the queue held)."""

PREFETCH_REGROWTH = 0.125

PIPELINE_WORK_SECONDS = 0.01
"""With a backlog of ready jobs, a slot holds up to about this much work (judged by the
recent jobs' mean run time) and runs it in a row: one hand-over, and one wake-up of the
main loop, for a batch of short jobs instead of one per job. Jobs of 10 ms or longer go
one at a time. A job with a timeout is only handed to an idle slot, first of its batch
(its clock starts when it is handed over)."""

PIPELINE_DEPTH = 64
"""Jobs a slot holds at most (the one it runs and those queued behind it)."""

SLOW_ROUND_SHARE = 0.1
"""A database round (from when the database thread began it until the main loop reads
its result) or a renewal that takes longer than this share of ``LEASE_DURATION`` makes
the worker claim for its free slots only, without prefetching, for one
``LEASE_DURATION`` after the last slow one: under overload it holds no more leases than
it can run, renew and record in time."""


@dataclass(eq=False)
class Dispatcher:
    concurrency: int
    prefetch: int
    """The most jobs claimed beyond the free slots (``--prefetch``); 0: never."""
    lease_duration: float
    mean_duration: float | None = None
    """Recent jobs' mean run time (an exponential moving average), None before the first."""
    prefetch_limit: float = -1.0
    """The prefetch this worker allows itself now (``PREFETCH_BACKOFF``)."""
    prefetch_paused: bool = False
    """A give-back paused prefetching until a slot frees."""
    rounds_slow: bool = False
    """A database round or a renewal was slow less than a lease ago (``SLOW_ROUND_SHARE``)."""
    slow_until: float = 0.0
    """Monotonic time until which ``rounds_slow`` holds."""
    loop_share: float = 0.0
    """The share of jobs for the slots' event loops (``async def`` ones, or every job with
    ``--sync-on-loop``) in the last claim that brought jobs: how much of the room on the
    loops to claim for next."""

    def __post_init__(self) -> None:
        if self.prefetch_limit < 0:
            self.prefetch_limit = float(self.prefetch)

    def prefetch_now(self) -> int:
        """How many jobs to hold beyond the free slots: about ``PREFETCH_WORK_SECONDS`` of
        work per slot at the recent jobs' mean run time, at most ``prefetch``."""
        mean = self.mean_duration
        if mean is None or not self.prefetch or self.prefetch_paused or self.rounds_slow:
            return 0
        per_slot = int(PREFETCH_WORK_SECONDS / max(mean, 1e-4))
        return min(self.prefetch, int(self.prefetch_limit), per_slot * self.concurrency)

    def claim_limit(
        self, *, free_slots: int, waiting: int, jobs_left: int | None, rounds: int = 1
    ) -> int:
        """How many jobs to claim now: the free slots and the prefetch, less the jobs
        waiting for a slot already or claimed by a round in flight (``waiting``), and no
        more than ``--max-jobs`` leaves. ``rounds``: the rounds in flight once this one
        starts. A round that waits in the database thread behind another may hold a
        prefetch for each (the jobs of the round before it run while it claims), and is
        worth a round of its own only for at least half a prefetch: below that, 0."""
        prefetch = self.prefetch_now()
        limit = free_slots + prefetch * rounds - waiting
        if jobs_left is not None:
            limit = min(limit, jobs_left)
        if rounds > 1 and (prefetch < 2 or limit < prefetch // 2):
            return 0
        return max(limit, 0)

    def pipeline_depth(self, waiting: int) -> int:
        """How many jobs a slot may hold now (``PIPELINE_WORK_SECONDS``)."""
        mean = self.mean_duration
        if mean is None or mean >= PIPELINE_WORK_SECONDS or waiting <= 1:
            return 1
        return min(PIPELINE_DEPTH, int(PIPELINE_WORK_SECONDS / max(mean, 1e-6)))

    def note_claimed(self, jobs: int, on_loop: int) -> None:
        """A claim brought ``jobs`` jobs, ``on_loop`` of them to run on the slots' event
        loops."""
        if jobs:
            self.loop_share = on_loop / jobs

    def note_duration(self, seconds: float) -> None:
        mean = self.mean_duration
        self.mean_duration = seconds if mean is None else 0.8 * mean + 0.2 * seconds

    def slot_freed(self) -> None:
        self.prefetch_paused = False

    def handed_over(self, waited: float) -> None:
        """A claimed job went to a slot after ``waited`` seconds: prompt hand-overs let
        the prefetch limit grow back."""
        if self.prefetch_limit < self.prefetch and waited < PREFETCH_MAX_WAIT / 4:
            self.prefetch_limit = min(float(self.prefetch), self.prefetch_limit + PREFETCH_REGROWTH)

    def gave_back(self) -> None:
        """Prefetched jobs waited too long and were given back."""
        self.prefetch_paused = True  # until a slot frees: else we would claim them again
        self.prefetch_limit = max(1.0, self.prefetch_limit / PREFETCH_BACKOFF)

    def is_slow(self, seconds: float) -> bool:
        return seconds > SLOW_ROUND_SHARE * self.lease_duration

    def took(self, seconds: float, now: float) -> bool:
        """Note how long a database round or a renewal took; True when the worker's pace
        changes (it stays slow for a lease after the last slow one)."""
        if self.is_slow(seconds):
            self.slow_until = now + self.lease_duration
        slow = now < self.slow_until
        changed = slow != self.rounds_slow
        self.rounds_slow = slow
        return changed
