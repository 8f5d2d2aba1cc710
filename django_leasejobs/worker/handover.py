"""Handing claimed jobs to slots, reading what the slots report, and stopping jobs.

Owned by the main loop (nothing else calls it). Claimed jobs wait in ``JobBook.ready``
until a slot has room; short ones go several to a slot at once (``Dispatcher``). A job
is stopped by the loop alone, on a message from the heartbeat or the watchdog, for a
cancel, or at shutdown; one that waits in ``ready`` is never started, one queued in a
slot is taken back (``Retracted``), one that runs is killed (or, in the thread pool,
flagged).
"""

from __future__ import annotations

import logging
import time
from inspect import iscoroutinefunction

from .. import registry
from ..compat import AnyTask
from ..exceptions import UnknownTask
from ..leases import ClaimedJob, Progress
from .dispatch import PREFETCH_MAX_WAIT, Dispatcher
from .execution import JobSpec, Outcome
from .jobs import JobBook, RunningJob, StopReason
from .pools import Event, Pool, ProgressEvent, Retracted, Room, SlotDied, Started
from .recorder import Recorder
from .reporter import Reporter
from .rounds import Ending

logger = logging.getLogger("django_leasejobs")

Lease = tuple[int, int]


class Handover:
    def __init__(
        self,
        *,
        pool: Pool,
        book: JobBook,
        dispatcher: Dispatcher,
        recorder: Recorder,
        reporter: Reporter,
        database: str,
        sync_on_loop: bool = False,
    ) -> None:
        self.pool = pool
        self.book = book
        self.dispatcher = dispatcher
        self.recorder = recorder
        self.reporter = reporter
        self.database = database
        self.slot_freed = False
        """A slot reported an outcome or died since the loop last looked (claim again)."""
        self.loops = pool.kind == "process"
        """Jobs may run many at once on the slots' event loops (process pool): ``async
        def`` ones, and sync ones too with ``sync_on_loop``."""
        self.sync_on_loop = sync_on_loop
        """Sync jobs ride the slots' event loops too, each in a thread (``--sync-on-loop``)."""
        self._async_tasks: dict[str, bool] = {}
        """Whether each task path's task is an ``async def`` one (asked once per path)."""

    # -- claimed jobs in, to slots ------------------------------------------------------

    def take_claimed(self, claimed: list[ClaimedJob], claim_sent: float, lease: float) -> None:
        """Jobs a round claimed for ``lease`` seconds, as the loop takes them. Their local
        lease clock starts when the claim was sent (``claim_sent``, monotonic), as a
        renewal's does: the database counts the lease from the statement, which came no
        earlier."""
        now = time.monotonic()
        on_loop = 0
        ready: list[RunningJob] = []
        unknown: list[tuple[RunningJob, Ending]] = []
        for job in claimed:
            try:
                task: AnyTask | None = registry.resolve(job.task_path)
            except UnknownTask as exc:
                if registry.is_task_path(job.task_path):
                    # Not deployed to this worker yet: give it back for one that knows it.
                    running = RunningJob(job=job, task=None, started=now)
                    unknown.append((running, Ending("unknown", str(exc))))
                    continue
                task = None  # a malformed row: the slot reports the clear error
            except Exception:  # a module that fails to import
                task = None  # the slot reports the clear error; nothing is called
            running = RunningJob(job=job, task=task, started=now)
            if task is not None:  # (a task that did not resolve fails alone, in a slot)
                # On a slot's event loop: an ``async def`` job in the process pool, or
                # any job there with ``--sync-on-loop``.
                running.coroutine = self._is_async(job.task_path, task)
                if self.loops and (self.sync_on_loop or running.coroutine):
                    running.on_loop = True
                    on_loop += 1
            ready.append(running)
        self.book.add([*ready, *(running for running, _ in unknown)], claim_sent, lease)
        for running, ending in unknown:
            self.recorder.record(running, ending)
        self.book.ready.extend(ready)
        if self.loops:
            self.dispatcher.note_claimed(len(claimed), on_loop)
        self.dispatch()

    def _is_async(self, task_path: str, task: AnyTask) -> bool:
        known = self._async_tasks.get(task_path)
        if known is None:
            known = self._async_tasks[task_path] = iscoroutinefunction(task.func)
        return known

    def dispatch(self) -> None:
        """Hand waiting jobs to slots with room; route jobs stopped while they waited.

        One job per slot, or with a backlog of short jobs several (``pipeline_depth``),
        spread evenly over the slots; each slot gets its jobs in one hand-over.
        """
        ready = self.book.ready
        self._route_stopped_heads()
        if not ready:
            return
        if ready[0].on_loop or self.dispatcher.loop_share > 0:
            self._dispatch_by_kind()
            return
        rooms = self.pool.rooms(self.dispatcher.pipeline_depth(len(ready)))
        share = -(-len(ready) // max(1, len(rooms)))  # ceil: spread the backlog
        for room in rooms:
            specs = self._take_ready(room, share)
            if specs:
                if len(specs) > 1 and logger.isEnabledFor(logging.DEBUG):
                    logger.debug(
                        "handed %d jobs to slot %d at once (job/attempt, in order: %s)",
                        len(specs),
                        room.slot,
                        " ".join(f"{spec.job.id}/{spec.job.attempt}" for spec in specs),
                        extra={"worker": self.reporter.worker_id, "count": len(specs)},
                    )
                if self.pool.submit(room.slot, specs):  # the first one starts at once
                    self._announce(self.book.running[specs[0].job.lease])
            if not ready:
                return

    def _dispatch_by_kind(self) -> None:
        """Hand waiting jobs over while ``async def`` jobs come (one is first in line, or
        the last claim brought some): each of those to the least busy event loop with
        room (or an idle slot), each other one alone to an idle slot; in order, a job
        that finds no room leaving its place to the next job. (Otherwise ``dispatch``
        hands ordinary jobs over as before, short ones several to a slot, and stops at
        an async one.)"""
        ready = self.book.ready
        loop_room = {room.slot: room.jobs for room in self.pool.loop_rooms()}
        idle = [room.slot for room in self.pool.rooms(1)]
        given: dict[int, list[JobSpec]] = {}
        waiting: list[RunningJob] = []
        while ready and (idle or any(loop_room.values())):
            self._route_stopped_heads()
            if not ready:
                break
            running = ready.popleft()
            slot: int | None = None
            if running.on_loop:
                candidates = [s for s, room in loop_room.items() if room > 0]
                if candidates:
                    slot = max(candidates, key=lambda s: loop_room[s])
                    loop_room[slot] -= 1
                    if slot in idle:
                        idle.remove(slot)
            elif idle:
                slot = idle.pop(0)
                loop_room.pop(slot, None)
            if slot is None:
                waiting.append(running)
                continue
            given.setdefault(slot, []).append(self._hand_over(running))
        ready.extendleft(reversed(waiting))
        for slot, specs in given.items():
            if self.pool.submit(slot, specs):  # it was idle: the first job starts at once
                self._announce(self.book.running[specs[0].job.lease])

    def _route_stopped_heads(self) -> None:
        """Pop the jobs at the head of ``ready`` that must not start: stopped while they
        waited, or waiting on a lease the worker itself would call lost."""
        ready = self.book.ready
        while ready:
            running = ready[0]
            silence = self.book.table.silence(running.job.lease, time.monotonic())
            if running.stop_reason is None and silence is not None:
                # The worker was frozen or cut off while the job waited (and the watchdog
                # has not run since): its lease may be another worker's by now. Never start
                # a job on a lease the worker itself would call lost.
                self.stop(
                    running.job.lease,
                    "lease_lost",
                    f"no successful renewal for {silence.seconds:.1f}s while it waited for a "
                    f"slot (local deadline {silence.deadline:g}s): the worker was paused or "
                    "cut off",
                )
            if running.stop_reason is None:
                return
            ready.popleft()
            self._stopped(running, "was stopped before it started")

    def _take_ready(self, room: Room, share: int) -> list[JobSpec]:
        """Jobs from the head of ``ready`` for one slot: up to ``share`` of them, as many
        as it has room for; a job with a timeout only as the first job of an idle slot."""
        ready = self.book.ready
        specs: list[JobSpec] = []
        while ready and len(specs) < min(room.jobs, share):
            self._route_stopped_heads()
            if not ready:
                break
            running = ready[0]
            if running.on_loop:  # (the next dispatch hands it to an event loop)
                break
            if running.job.timeout is not None and (specs or not room.idle):
                break
            ready.popleft()
            specs.append(self._hand_over(running))
        return specs

    def _hand_over(self, running: RunningJob) -> JobSpec:
        """What a slot gets for ``running``, as it is handed over (its clocks start)."""
        job = running.job
        now = time.monotonic()
        self.dispatcher.handed_over(now - running.started)
        running.dispatched = True
        running.started = now
        lost_at = self.book.table.handed_over(job.lease, now, job.timeout)
        # The rule of _route_stopped_heads, kept by the slot for queued jobs.
        return JobSpec(
            job=job,
            worker_id=self.reporter.worker_id,
            backend=self.reporter.backend.alias,
            database=self.database,
            start_by=lost_at,
            on_loop=running.on_loop,
            coroutine=running.coroutine,
        )

    def _announce(self, running: RunningJob) -> None:
        """Announce that an attempt started (once: a job handed to an idle slot as it is
        handed over, one queued behind others when its slot reports it started, or with
        its outcome at the latest). A job taken back before it started is never
        announced, so giving it back leaves nothing announced for its attempt."""
        if not running.announced:
            running.announced = True
            self.reporter.started(running)

    def give_back_stale(self) -> None:
        """Prefetched jobs stuck behind long jobs go back to pending for other workers."""
        ready = self.book.ready
        if not ready or ready[0].stop_reason is not None:
            return
        now = time.monotonic()
        if now - ready[0].started < PREFETCH_MAX_WAIT:
            return
        self.dispatcher.gave_back()
        self.reporter.prefetch_returned(len(ready), now - ready[0].started)
        self.give_back_ready()
        self.dispatch()

    def give_back_ready(self) -> None:
        """Prefetched jobs that never started go back to pending (the loop routes them)."""
        for running in self.book.ready:
            if running.stop_reason is None:
                running.stop_reason = "shutdown"

    def oldest_wait_end(self) -> float | None:
        """When (monotonic) the oldest waiting job is due to be given back, if one waits."""
        ready = self.book.ready
        if ready and ready[0].stop_reason is None:
            return ready[0].started + PREFETCH_MAX_WAIT
        return None

    # -- stopping jobs ------------------------------------------------------------------

    def stop(
        self, lease: Lease, reason: StopReason, detail: str = "", *, confirmed: bool = False
    ) -> None:
        """Stop a job the worker holds (not one whose outcome is being recorded).

        ``confirmed``: the database said the lease is gone (a renewal matched no row)."""
        running = self.book.get(lease)
        if running is not None and running.recording and confirmed:
            # Its outcome waits to be written, and the lease is no longer this worker's:
            # stop renewing it. A write under way decides (the fence refuses it); one that
            # failed is not tried again (``Recorder.plan``).
            self.book.table.let_go(lease)
            running.lease_gone = True
            return
        if running is None or running.stop_reason is not None or running.recording:
            return
        running.stop_reason = reason
        if reason == "lease_lost":
            self.book.table.let_go(lease)
        self.reporter.stopping(running, reason, detail)
        if not running.dispatched:
            return  # it waits in ``ready``: the loop routes it there, never starts it
        graceful = reason != "shutdown"
        # "retracted": its slot gives it back (a Retracted event) and dispatch routes it
        # from ``ready``; "killing": its slot's death (or, on an event loop, its outcome
        # of the CancelledError) is the next event; "flagged" / "cancelled": its thread
        # runs on, fenced (its coroutine sent CancelledError), and the slot's outcome of
        # it is void.
        action = self.pool.stop_job(lease, graceful=graceful, lease_lost=reason == "lease_lost")
        if action == "flagged":
            self._stopped(running, "was stopped; its thread runs on, fenced")
        elif action == "cancelled":
            self._stopped(running, "was sent CancelledError; its thread runs on, fenced")

    def stop_all(self, reason: StopReason) -> None:
        for lease in [lease for lease, r in self.book.running.items() if r.stop_reason is None]:
            self.stop(lease, reason, "worker shutting down")

    def _stopped(self, running: RunningJob, description: str) -> None:
        reason = running.stop_reason
        if reason == "lease_lost" and (running.dispatched or running.announced):
            # The lease may be someone else's: nothing to write; the job is stopped.
            self.book.forget(running, ran=True)
        elif reason == "lease_lost":
            # Never started, and only presumed lost (no renewal in time, the worker was
            # starved or cut off): give it back, fenced. If the lease is still this
            # worker's the job is pending again at once, its attempt unused; if not, the
            # give-back matches no row.
            self.recorder.record(running, Ending("unclaim", description))
        elif not running.dispatched and not running.announced:
            # Never started: given back, its attempt unused. (One announced but given
            # back unstarted, as its idle slot died or a stop took it back, keeps its
            # attempt: it is released or cancelled below, like a job that ran.)
            self.recorder.record(running, Ending("unclaim", description))
        elif reason == "timeout":
            self.recorder.record(running, Ending("timeout", description))
        elif reason == "cancelled":
            self.recorder.record(running, Ending("cancelled", description))
        else:
            self.recorder.record(running, Ending("shutdown", description))

    # -- what the slots report ----------------------------------------------------------

    def handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Retracted):
                self._back_to_ready(event)
            elif isinstance(event, Started):
                for lease in event.leases:
                    started = self.book.get(lease)
                    if started is not None:
                        self._announce(started)
            elif isinstance(event, ProgressEvent):
                if event.lease in self.book.running:
                    progress = Progress(event.fraction, event.message)
                    self.book.table.set_progress(event.lease, progress)
            else:
                self._ended(event)

    def _ended(self, event: Outcome | SlotDied) -> None:
        running = self.book.get(event.lease)
        if running is None:
            return
        self.slot_freed = True
        self.dispatcher.slot_freed()
        self._announce(running)  # it started (if its start was not reported yet)
        if isinstance(event, Outcome):
            self.dispatcher.note_duration(event.duration)
            if event.cancelled and running.stop_reason is not None:
                self._stopped(running, "it ended after the CancelledError it was sent")
                return
            # A real outcome wins even when a stop raced it: the job did finish. (A
            # lost lease is still safe: the fence rejects the write.)
            self.recorder.record(running, event)
            return
        if running.stop_reason is not None:  # stopped itself: that ending, whoever's fault
            self._stopped(running, event.exit_description)
        elif event.collateral_of is not None:
            (job_id, attempt), why = event.collateral_of
            self.reporter.collateral(running, (job_id, attempt), why)
            self.recorder.record(
                running,
                Ending(
                    "collateral",
                    f"its slot's process {event.exit_description} because {why}; "
                    "released to run again, no attempt counted",
                ),
            )
        else:
            self.recorder.record(running, Ending("killed", event.exit_description))

    def _back_to_ready(self, event: Retracted) -> None:
        """Jobs a slot gave back before they started: first in line again, in order."""
        jobs = [r for r in (self.book.get(lease) for lease in event.leases) if r is not None]
        for running in jobs:
            running.dispatched = False
            self.book.table.taken_back(running.job.lease)
        self.book.ready.extendleft(reversed(jobs))
        self.slot_freed = True  # (a slot has room again)
