"""``Worker``: the main loop, the one owner of a worker's job state.

Threads of one worker process:

* main loop (this module): claims jobs (``driver.py`` runs each database round in the
  database thread), hands them to slots (``handover.py``, by the ``dispatch.py``
  policy), collects outcomes and records them in batches (``recorder.py``), and
  sleeps until a slot reports, its inbox has a message, or a timer is due. It is the
  only code that changes job state;
* database thread (``driver.py``, ``rounds.py``): the main loop's claims and outcome
  writes, one round at a time (during a drain the next round already waits there,
  claiming ahead); it returns results, never changes the loop's objects. On
  PostgreSQL a second one runs a round's claim beside its writes;
* heartbeat (``heartbeat.py``): renews every lease in one UPDATE, on its own
  connection, and does nothing else;
* housekeeping (``housekeeping.py``): the registry row, the reap pass every
  ``STALE_LOCK_INTERVAL``, the idle next-due lookup, on its own connection (a slow
  reap pass never delays a renewal);
* watchdog (``watchdog.py``): never touches the database; finds jobs whose lease is
  presumed lost by the local clock, or past their timeout;
* listener (``listener.py``, PostgreSQL): ``LISTEN leasejobs`` to wake the main loop;
* scheduler (``scheduler.py``): enqueues the due ticks of the backend's ``SCHEDULES``;
* alerts (``alert_watch.py``): evaluates the backend's ``ALERTS`` rules.

The threads share only the lease table and the status board (``shared.py``) with the
loop, and tell it what they found through its inbox (``inbox.py``).
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from types import FrameType

from django.db import connections

from .. import registry
from ..backend import LeaseJobsBackend
from ..compat import task_backends
from ..leases import storable_text
from .alert_watch import AlertWatch
from .config import WorkerConfig, default_worker_id
from .dispatch import Dispatcher
from .driver import RoundDriver
from .handover import Handover
from .heartbeat import Heartbeat
from .housekeeping import Housekeeping
from .inbox import (
    CancelRequested,
    Inbox,
    JobsMayBeReady,
    LeaseLost,
    Listening,
    Message,
    NextDue,
    RenewalWasSlow,
    StopAsked,
    TimedOut,
)
from .jobs import JobBook
from .lease_length import LeaseLength
from .lifecycle import Registration, harden_connections, install_signal_handlers, restore_signals
from .listener import Listener
from .pools import Pool, ProcessPool, ThreadPool
from .pools.process import LOST_LEASE_WAIT_SHARE
from .recorder import Recorder
from .reporter import Reporter
from .scheduler import Scheduler
from .shared import LeaseTable, StatusBoard, WorkerStatus
from .stopping import Shutdown
from .threads import ThreadContext, WorkerThread
from .watchdog import Watchdog

logger = logging.getLogger("django_leasejobs")

PIPELINE_RETRACT_AFTER = 0.05
"""Jobs queued behind one that has run this long (seconds) are taken back from its slot
and handed to another: a long job among short ones holds others back this long at most.
While a slot holds such jobs, the loop looks in on them this often."""

STOPPING_LOOK = 0.2
"""How often a stopping worker looks at its shutdown deadline (seconds)."""

BURST_PATIENCE = 5.0
"""How long (seconds) a ``--burst`` worker keeps looking, at each ``POLL_INTERVAL``, for a
due job its claims passed over (its row locked by another transaction, mostly for
milliseconds: ``RoundResult.passed_over``) before it exits all the same."""

__all__ = ["Worker", "WorkerConfig"]


class Worker:
    """One worker process. ``run()`` blocks until the worker stops and returns an exit code."""

    def __init__(self, config: WorkerConfig) -> None:
        backend = task_backends[config.backend]
        if not isinstance(backend, LeaseJobsBackend):
            raise TypeError(f"TASKS[{config.backend!r}] is not a LeaseJobsBackend")
        backend.require_valid_config()
        self.backend = backend
        self.options = options = backend.config
        self.database = backend.database
        self.config = config
        self.worker_id = config.worker_id or default_worker_id()
        queues = config.queues
        if queues is None and backend.queues:
            queues = tuple(sorted(backend.queues))
        self.queues = queues
        harden_connections(options, self.database)
        self.inbox = Inbox()
        self.table = LeaseTable(margin=options.heartbeat_interval)
        self.lease_length = LeaseLength(options.lease_duration, options.heartbeat_interval)
        self.status = StatusBoard()
        self.book = JobBook(self.table)
        self.pool: Pool
        if config.pool == "process":
            self.pool = ProcessPool(
                config.concurrency,
                lock_lost_behavior=options.lock_lost_behavior,
                lock_lost_grace=options.lock_lost_grace,
                async_concurrency=config.async_concurrency or options.async_concurrency,
                async_blocking_limit=options.async_blocking_limit,
                lost_lease_wait=LOST_LEASE_WAIT_SHARE * options.heartbeat_interval,
            )
        else:
            self.pool = ThreadPool(
                config.concurrency, wake=self.inbox.wake, stop_grace=options.lock_lost_grace
            )
        self.reporter = Reporter(self.worker_id, backend)
        self.dispatcher = Dispatcher(
            concurrency=config.concurrency,
            prefetch=config.prefetch_max,
            lease_duration=options.lease_duration,
        )
        self.recorder = Recorder(self.book, self.reporter, options.retry_backoff)
        self.handover = Handover(
            pool=self.pool,
            book=self.book,
            dispatcher=self.dispatcher,
            recorder=self.recorder,
            reporter=self.reporter,
            database=self.database,
            sync_on_loop=config.sync_on_loop,
        )
        self.rounds = RoundDriver(
            worker_id=self.worker_id,
            backend=backend.alias,
            database=self.database,
            queues=queues,
            options=options,
            lease_length=self.lease_length,
            wake=self.inbox.wake,
        )
        self.registration = Registration(
            worker_id=self.worker_id,
            backend=backend.alias,
            database=self.database,
            queues=queues,
            pool=self.pool.kind,
            concurrency=config.concurrency,
        )
        self.shutdown = Shutdown(config.shutdown_timeout, config.supervised)
        """When the signal that began the stop arrived."""
        self.listening = False
        """The listener's ``LISTEN`` is active: NOTIFY wakes this worker, so when idle it
        polls only every ``IDLE_POLL_INTERVAL`` and when its next delayed job comes due."""
        self._threads: list[WorkerThread] = []
        self._stop_threads = threading.Event()

    @property
    def problem(self) -> str:
        """What keeps this worker from working normally, '' when nothing: failing
        database rounds, attempts it gave up recording in the last ``PROBLEM_MEMORY``
        seconds, and leases stretched because renewals come back late (on its registry
        row: admin, ``leasejobs_status``)."""
        parts = [
            p
            for p in (self.rounds.problem, self.recorder.problem(), self.lease_length.problem())
            if p
        ]
        return storable_text("; ".join(parts), 2000)

    def thread_context(self) -> ThreadContext:
        return ThreadContext(
            worker_id=self.worker_id,
            backend=self.backend,
            database=self.database,
            queues=self.queues,
            options=self.options,
            inbox=self.inbox,
            table=self.table,
            lease_length=self.lease_length,
            status=self.status,
            registration=self.registration,
        )

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        registry.autodiscover(self.options.imports)
        # Django, the site and its tasks are loaded: their objects live as long as the
        # worker, so the cyclic GC leaves them out of its passes from now on (a no-op job
        # allocates enough to start one every few hundred jobs; each old-generation pass
        # walked the whole heap), and forked slots share their pages (no GC write to them).
        gc.freeze()
        # Its slots answer ``kill -USR1`` (the stack print) for themselves.
        previous = install_signal_handlers(self._on_signal)
        self.pool.start()  # fork the slots before any other thread exists
        try:
            sent = time.monotonic()
            self.registration.register()
            # How long that took is how long the first claims may take (lease_length.py).
            self.lease_length.trip_came_back(sent, time.monotonic(), self.options.lease_duration)
            # The main thread needs no connection until it deregisters: close the one it
            # registered with rather than hold it for the worker's life.
            connections[self.database].close()
            self._start_threads()
            self.reporter.worker_started(
                queues=self.queues,
                pool=self.pool.kind,
                concurrency=self.config.concurrency,
                options=self.options,
                schedules=self._scheduled,
            )
            self._main_loop()
        finally:
            self._stop_threads.set()
            for thread in self._threads:
                thread.wake()
            self.pool.shutdown()
            for thread in self._threads:
                thread.join(timeout=5)
            self.registration.deregister()
            restore_signals(previous)
            self.inbox.close()
            self.reporter.worker_stopped(self.book.finished)
        return 0

    @property
    def _scheduled(self) -> int:
        """How many schedules this worker's scheduler thread runs (0: none)."""
        return len(self.options.schedules) if self.config.runs_schedules else 0

    def _start_threads(self) -> None:
        self._threads = self.background_threads(self._stop_threads)
        for thread in self._threads:
            thread.start()

    def background_threads(self, stop: threading.Event) -> list[WorkerThread]:
        """The worker's background threads (not started), each stopping on ``stop``."""
        ctx = self.thread_context()
        threads: list[WorkerThread] = [
            Heartbeat(ctx, stop),
            Housekeeping(ctx, stop),
            Watchdog(ctx, stop),
        ]
        if connections[self.database].vendor == "postgresql":
            threads.append(Listener(ctx, stop))
        if self._scheduled:
            threads.append(Scheduler(ctx, stop))
        if self.options.alerts:
            threads.append(AlertWatch(ctx, stop))
        return threads

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.inbox.post(StopAsked(signal.Signals(signum).name, time.monotonic()))

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        """Feed slots, collect outcomes, and keep database rounds going (one at a time, or
        during a drain a second one waiting behind it).

        The loop itself never waits on the database: rounds (write the queued outcomes,
        then claim) run in the worker's database thread, and the loop keeps handing
        prefetched jobs to slots meanwhile. What arrives during a round is written by
        the next one, so outcomes are written in batches a few milliseconds apart.
        """
        self.rounds.open()
        try:
            while True:
                for message in self.inbox.take():
                    self._act_on(message)
                if self.pool.pipelined():
                    self.pool.retract_stalled(PIPELINE_RETRACT_AFTER)
                self.handover.handle(self.pool.collect())
                if self.handover.slot_freed:
                    self.handover.slot_freed = False
                    self.rounds.claim_wanted = True
                if self.shutdown.stopping:
                    self.handover.give_back_ready()
                self.handover.dispatch()
                self.handover.give_back_stale()
                if self.rounds.done():
                    self._finish_round()
                if self._start_round():
                    continue  # (it may already be done: look again before waiting)
                idle = not self.rounds.in_flight and not self.recorder.writes
                if self.shutdown.stopping:
                    if self.shutdown.jobs_must_stop():
                        self.handover.stop_all("shutdown")
                        if self.rounds.failures and not self.rounds.in_flight:
                            self.recorder.abandon()
                    if not self.book and idle:
                        return
                elif self._done_by_limits(idle):
                    self.shutdown.begin()
                    continue
                self._publish_status()
                self.inbox.wait(self.pool.waitables(), self._wait_timeout())
        finally:
            self.rounds.close()

    def _act_on(self, message: Message) -> None:
        if isinstance(message, LeaseLost | TimedOut):
            if self.table.generation(message.lease) != message.generation:
                return  # about an entry gone since (given back, claimed again)
            if isinstance(message, TimedOut):
                self.handover.stop(message.lease, "timeout", message.detail)
            else:
                self.handover.stop(
                    message.lease, "lease_lost", message.detail, confirmed=message.confirmed
                )
        elif isinstance(message, CancelRequested):
            self.handover.stop(message.lease, "cancelled", "an operator cancelled the job")
        elif isinstance(message, JobsMayBeReady):
            self.rounds.claim_wanted = True
        elif isinstance(message, Listening):
            self.listening = message.active
            self.rounds.claim_wanted = True  # jobs may have come while not listening
        elif isinstance(message, NextDue):
            idle = not self.book.ready
            self.rounds.heard(message, listening=self.listening, idle=idle)
        elif isinstance(message, RenewalWasSlow):
            self._pace(message.seconds, "renewal")
        elif isinstance(message, StopAsked):
            self._stop_asked(message)

    def _stop_asked(self, message: StopAsked) -> None:
        answer = self.shutdown.asked(message)
        if answer != "ignored":
            self.reporter.stop_asked(
                message.signal_name, self.shutdown.timeout, forced=answer == "forced"
            )

    def _done_by_limits(self, idle: bool) -> bool:
        max_jobs = self.config.max_jobs
        if max_jobs is not None and self.book.finished >= max_jobs:
            return True
        if not (self.config.burst and self.rounds.last_claimed == 0 and not self.book and idle):
            return False
        since = self.rounds.passed_over_since
        if since is None:
            return True
        waited = time.monotonic() - since
        if waited < BURST_PATIENCE:
            return False  # look again at the next poll
        self.reporter.burst_left_due(waited)
        return True

    def _publish_status(self) -> None:
        status = WorkerStatus(
            state="stopping" if self.shutdown.stopping else "running",
            problem=self.problem,
            listening=self.listening,
            skip_tasks=self.recorder.skipped_tasks(),
        )
        if status != self.status.read():
            self.status.publish(status)

    # ------------------------------------------------------------------ rounds

    def _start_round(self) -> bool:
        """Hand the queued outcomes and a claim to the database thread, if there is work;
        or, while a drain's claim is in flight, a round that claims ahead behind it
        (``driver.MAX_IN_FLIGHT``). True when a round started."""
        now = time.monotonic()
        if self.rounds.may_start(now):
            limit = self._claim_limit()
            claim_due = self.rounds.claim_due(now)
            if not self.recorder.writes and not (limit and claim_due):
                return False
            plan = self.recorder.plan(limit if claim_due else 0)
        elif self.rounds.may_start_ahead():
            # Claiming ahead is prefetching (none while rounds are slow, nor for long
            # jobs), and only a full-size claim is worth a round of its own.
            limit = self._claim_limit(rounds=self.rounds.in_flight + 1)
            if not limit:
                return False
            plan = self.recorder.plan(limit, ahead=True)
        else:
            return False
        if self.recorder.writes:
            # Outcomes wait beyond this round (a backlog, or rows to write again): hold
            # no leases beyond the free slots until they are written.
            plan.claim_limit = min(plan.claim_limit, self.pool.free_slots())
        if not plan.writes and not plan.claim_limit:
            return False
        self.rounds.start(plan, listening=self.listening, burst=self.config.burst)
        return True

    def _claim_limit(self, *, rounds: int = 1) -> int:
        if self.shutdown.stopping:
            return 0
        max_jobs = self.config.max_jobs
        jobs_left = (
            None
            if max_jobs is None
            else max_jobs - self.book.finished - len(self.book) - self.rounds.claiming
        )
        free_slots = self.pool.free_slots()
        if self.dispatcher.loop_share:
            # Room on the slots' event loops, as far as the last claim was async jobs.
            extra = self.pool.loop_room() - free_slots
            free_slots += int(self.dispatcher.loop_share * max(0, extra))
        return self.dispatcher.claim_limit(
            free_slots=free_slots,
            waiting=len(self.book.ready) + self.rounds.claiming,
            jobs_left=jobs_left,
            rounds=rounds,
        )

    def _finish_round(self) -> None:
        """Act on what the database said: the writes (``Recorder.finish``), the pace, and
        the claimed jobs, handed to slots."""
        plan, result, took = self.rounds.take()
        self.recorder.finish(plan, result)
        self._pace(took, "database round")
        if plan.writes and result.claimed is None and result.error is None:
            # Outcomes written without a claim (it came before, and found the rows
            # still running) may have freed a concurrency key or limit: an empty claim
            # made before them no longer says there is no work (--burst exits on it).
            self.rounds.last_claimed = None
            self.rounds.claim_wanted = True
        if result.claimed is not None:
            claimed = result.claimed
            self.lease_length.trip_came_back(
                result.claim_sent, time.monotonic(), result.claim_lease
            )
            self.reporter.claimed(len(claimed), plan.claim_limit)
            idle = self.rounds.claimed(
                len(claimed),
                plan.claim_limit,
                listening=self.listening,
                passed_over=result.passed_over,
            )
            if idle is not None:
                self.reporter.idle(idle, listening=self.listening, passed_over=result.passed_over)
            self.handover.take_claimed(claimed, result.claim_sent, result.claim_lease)

    def _pace(self, took: float, what: str) -> None:
        """Claim less while rounds or renewals are slow (``dispatch.SLOW_ROUND_SHARE``)."""
        if self.dispatcher.took(took, time.monotonic()):
            self.reporter.pace_changed(what, took, slow=self.dispatcher.rounds_slow)

    # ------------------------------------------------------------------ waiting

    def _wait_timeout(self) -> float:
        """How long the loop may sleep: until the next poll, a retry, a stop check, a
        prefetched job's give-back, an owed SIGKILL, or a look at pipelined slots."""
        now = time.monotonic()
        timeout = self.rounds.wait_timeout(now)
        if timeout <= 0 and not self.rounds.in_flight:
            # This pass could start no round (every slot busy, or outcomes waiting for a
            # renewal): a slot, the inbox or a finished round wakes the loop before then.
            timeout = self.options.poll_interval
        if self.shutdown.stopping:
            timeout = min(timeout, STOPPING_LOOK)
        wait_end = self.handover.oldest_wait_end()
        if wait_end is not None and not self.rounds.in_flight:
            timeout = min(timeout, max(0.0, wait_end - now))
        owed = self.pool.escalate()
        if owed is not None:
            timeout = min(timeout, owed)
        if self.pool.pipelined():
            # Short jobs queued behind another ring only when their slot runs out of work:
            # look in on them (their outcomes, a job that runs long) this often.
            timeout = min(timeout, PIPELINE_RETRACT_AFTER)
        return timeout
