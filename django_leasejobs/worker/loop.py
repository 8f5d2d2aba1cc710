"""``Worker``: the main loop that claims jobs, hands them to slots and records outcomes.

Threads of one worker process:

* main loop (this module): claims up to the free slots (plus a small prefetch while
  jobs are short) in one statement, dispatches, records the outcomes that arrived
  meanwhile in batches (one fenced UPDATE for all successes, one for all failures),
  sleeps until a slot reports, a NOTIFY arrives, or the poll interval passes;
* database thread (``rounds.py``): the main loop's claims and outcome writes;
* heartbeat (``heartbeat.py``): renews every lease of this worker in one UPDATE, touches
  the worker's registry row, and runs the set-based reap every ``STALE_LOCK_INTERVAL``,
  on one connection;
* watchdog (``heartbeat.py``): never touches the database; stops jobs whose lease is
  lost by the local deadline, whose timeout passed, and escalates SIGTERM to SIGKILL;
* listener (``listener.py``, PostgreSQL): ``LISTEN leasejobs`` to wake the main loop;
* scheduler (``scheduler.py``): enqueues the due ticks of the backend's ``SCHEDULES``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import selectors
import signal
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any, Literal

from django.db import DatabaseError, connections
from django.utils.crypto import get_random_string

from .. import leases, registry
from ..backend import LeaseJobsBackend
from ..compat import (
    Task,
    TaskResult,
    TaskResultStatus,
    has_other_receivers,
    must_send,
    task_backends,
    task_finished,
    task_started,
)
from ..exceptions import TaskFailed, task_failure
from ..functions import DatabaseNow
from ..leases import (
    NOTIFY_CHANNEL,
    ClaimedJob,
    ErrorInfo,
    Failure,
    LeaseLost,
    Progress,
    storable_text,
)
from ..leases.rules import TIMEOUT_ERROR_CLASS
from ..logs import log_failure
from ..models import AttemptOutcome, JobAttempt, JobStatus, WorkerState
from ..models import Worker as WorkerRow
from ..results import STATUS_TO_RESULT, attempt_history
from ..retry import RETRIED, Verdict
from ..signals import job_failed, job_started, job_succeeded, jobs_claimed, lease_lost
from .execution import (
    JobSpec,
    Outcome,
    attempt_failure,
    error_as_task_error,
    running_result,
)
from .heartbeat import Heartbeat, NextDue, Watchdog
from .listener import Listener
from .pools import Event, ProcessPool, ProgressEvent, Retracted, Room, Started, ThreadPool
from .rounds import Ending, RoundContext, RoundPlan, RoundResult, Write, run_round
from .scheduler import Scheduler

logger = logging.getLogger("django_leasejobs")

Lease = tuple[int, int]
StopReason = Literal["lease_lost", "timeout", "cancelled", "shutdown"]

PREFETCH_WORK_SECONDS = 0.02
"""A worker prefetches about this much work per slot, judged by the recent jobs' mean run
time: enough to keep slots busy through a claim round trip, never enough to make a job
wait long behind others (jobs of 20 ms or longer are not prefetched at all)."""

MAX_ROUND_WRITES = 500
"""Outcomes one round writes at most (the rest wait for the next round): keeps every
statement well inside the databases' bound-parameter limits."""

PROBLEM_MEMORY = 600.0
"""How long a worker reports an attempt it gave up recording (on its registry row)."""

DUE_MARGIN = 0.02
"""An idle worker waiting for a delayed job to come due claims this long after its
``run_after`` (seconds), so that the claim does not come a hair too early."""

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

PIPELINE_RETRACT_AFTER = 0.05
"""Jobs queued behind one that has run this long (seconds) are taken back from its slot
and handed to another: a long job among short ones holds others back this long at most."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    backend: str = "default"
    queues: tuple[str, ...] | None = None
    """Queues to take jobs from; None = every queue of the backend (``QUEUES``)."""
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    pool: Literal["process", "thread"] = "process"
    burst: bool = False
    max_jobs: int | None = None
    worker_id: str | None = None
    shutdown_timeout: float = 30.0
    prefetch: int | None = None
    """At most this many jobs claimed beyond the free slots while jobs are short;
    None = 64 per slot, at most 512; 0 turns prefetching off."""
    scheduler: bool | None = None
    """Run the scheduler thread; None = unless ``burst`` (only when there are schedules)."""

    @property
    def runs_schedules(self) -> bool:
        return (not self.burst) if self.scheduler is None else self.scheduler


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{get_random_string(6)}"


@dataclass(eq=False)
class RunningJob:
    job: ClaimedJob
    task: Task | None
    started: float
    last_renewed: float
    dispatched: bool = False
    """Handed to a slot. A prefetched job waits in ``Worker.ready`` until then (and goes
    back there if its slot gives it back before it started)."""
    announced: bool = False
    """Its start was announced (log, ``job_started``, ``task_started``): once per attempt."""
    task_result: Any = None
    """The django.tasks view sent with ``task_started``; copied for ``task_finished``."""
    progress: Progress | None = None
    stop_reason: StopReason | None = None
    stop_detail: str = ""
    recording: bool = False
    """The main loop is writing this attempt's outcome: a renewal that misses it is no news."""
    recording_since: float | None = None
    """When the outcome was first queued for writing (monotonic): past the local lease
    deadline the worker gives it up instead of renewing the lease for ever."""
    finished_at: datetime | None = None
    """The job's ``finished_at`` as the round wrote it (for ``task_finished``)."""
    history: list[JobAttempt] | None = None
    """The job's attempt rows after the round wrote its outcome (for ``task_finished``
    of a job with earlier attempts; None when not needed)."""


class Worker:
    """One worker process. ``run()`` blocks until the worker stops and returns an exit code."""

    def __init__(self, config: WorkerConfig) -> None:
        backend = task_backends[config.backend]
        if not isinstance(backend, LeaseJobsBackend):
            raise TypeError(f"TASKS[{config.backend!r}] is not a LeaseJobsBackend")
        backend.require_valid_config()
        self.backend = backend
        self.options = backend.config
        self.database = backend.database
        self.config = config
        self.worker_id = config.worker_id or default_worker_id()
        queues = config.queues
        if queues is None and backend.queues:
            queues = tuple(sorted(backend.queues))
        self.queues = queues
        self._harden_connections()
        self.running: dict[Lease, RunningJob] = {}
        self.lock = threading.RLock()
        self.stopping = False
        self.force = False
        self.shutdown_deadline: float | None = None
        self.finished_jobs = 0
        if config.prefetch is None:
            self.prefetch = min(64 * config.concurrency, 512)
        else:
            self.prefetch = config.prefetch
        self.ready: deque[RunningJob] = deque()
        """Claimed (prefetched) jobs waiting for a free slot, oldest first."""
        self._mean_duration: float | None = None
        self._prefetch_paused = False
        self._prefetch_limit = float(self.prefetch)
        """The prefetch this worker allows itself now (``PREFETCH_BACKOFF``)."""
        self._writes: list[tuple[RunningJob, Write]] = []
        """Outcomes to record, written in batches by the next database round."""
        self._round_problem = ""
        self.given_up = 0
        """Attempts whose outcome could not be recorded at all (left to the reaper)."""
        self._last_give_up: tuple[float, str] | None = None
        self._round: tuple[RoundPlan, Future[RoundResult]] | None = None
        self._db: ThreadPoolExecutor
        self._db_failures = 0
        self._retry_at = 0.0
        self._next_poll = 0.0
        self._claim_wanted = True
        self._last_claimed: int | None = None
        self._flow_held_until = 0.0
        """Until then (monotonic), claims take jobs that obey no limit first, and make a
        flow claim only for the slots those leave: the last flow claim found due jobs
        held back by full limits (``leases.claim_round``)."""
        self.listening = False
        """The listener's ``LISTEN`` is active (set by the listener thread): NOTIFY wakes
        this worker, so when idle it polls only every ``IDLE_POLL_INTERVAL`` and when the
        next delayed job of its queues comes due; else every ``POLL_INTERVAL``."""
        self._next_due: float | None = None
        self._heard_due: NextDue | None = None
        """The heartbeat's last next-due lookup, not yet taken by the main loop."""
        """Seconds from the last empty claim to the earliest pending ``run_after`` of this
        worker's queues (None: none pending); only looked up while ``listening``."""
        self._selector: selectors.BaseSelector | None = None
        self._selected: list[Any] = []
        self._thread_stops: list[Lease] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.pool: ProcessPool | ThreadPool
        if config.pool == "process":
            self.pool = ProcessPool(
                config.concurrency,
                lock_lost_behavior=self.options.lock_lost_behavior,
                lock_lost_grace=self.options.lock_lost_grace,
            )
        else:
            self.pool = ThreadPool(config.concurrency, wake=self.wake)
        self._threads: list[Any] = []
        self._stop_threads = threading.Event()

    # ------------------------------------------------------------------ plumbing

    def _harden_connections(self) -> None:
        """Make a dead network path fail fast instead of hanging a thread for minutes.

        On PostgreSQL over TCP, the worker's connections get TCP keepalives, a
        ``tcp_user_timeout`` of one lease and a connect timeout, unless the site's
        ``DATABASES[...]["OPTIONS"]`` sets them. (libpq ignores them on Unix sockets.)
        That is ``DATABASE`` and, when set, ``LISTEN_DATABASE`` (the listener's
        connection parameters are read from the alias's settings).
        """
        defaults = {
            "connect_timeout": 10,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": int(self.options.lease_duration * 1000),
        }
        aliases = [self.database]
        if self.options.listen_database is not None:
            aliases.append(self.options.listen_database)
        for alias in aliases:
            settings_dict = connections.settings[alias]
            if settings_dict.get("ENGINE", "").rsplit(".", 1)[-1] != "postgresql":
                continue
            options = settings_dict.setdefault("OPTIONS", {})
            for key, value in defaults.items():
                options.setdefault(key, value)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _send(self, signal: Any, job: ClaimedJob, **extra: Any) -> None:
        """Send one of our job signals with the keys every one of them carries."""
        if not signal.receivers:
            return  # nobody listens: skip building the arguments (twice per job)
        signal.send_robust(
            sender=LeaseJobsBackend,
            job_id=job.id,
            backend=self.backend.alias,
            attempt=job.attempt,
            worker_id=self.worker_id,
            queue=job.queue,
            **extra,
        )

    def _log_extra(self, job: ClaimedJob, **more: Any) -> dict[str, Any]:
        return {
            "job_id": job.id,
            "attempt": job.attempt,
            "worker": self.worker_id,
            "queue": job.queue,
            "task": job.task_path,
            **more,
        }

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP and self.stopping:
            # A closing terminal sends SIGHUP twice (the shell forwards it, then the kernel
            # sends it when the shell exits): the hang-up asks for a graceful stop, never
            # a forced one.
            return
        if not self.stopping:
            self.stopping = True
            self.shutdown_deadline = time.monotonic() + self.config.shutdown_timeout
            logger.info(
                "%s: stop claiming, finish running jobs (up to %.0fs); again to force",
                name,
                self.config.shutdown_timeout,
                extra={"worker": self.worker_id, "signal": name},
            )
        else:
            self.force = True
            logger.warning(
                "%s again: stopping running jobs now and releasing them",
                name,
                extra={"worker": self.worker_id, "signal": name},
            )
        self.wake()

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        registry.autodiscover(self.options.imports)
        # Signal handlers only work in the main thread. Under ``--reload`` the worker runs
        # in a thread of Django's autoreloader, which handles the signals itself.
        previous = {}
        if threading.current_thread() is threading.main_thread():
            # SIGHUP (the terminal closed) stops gracefully too, unless it was ignored
            # when the worker started (nohup): then it stays ignored.
            stops = [signal.SIGTERM, signal.SIGINT]
            if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
                stops.append(signal.SIGHUP)
            previous = {s: signal.signal(s, self._on_signal) for s in stops}
        self.pool.start()  # fork the slots before any other thread exists
        try:
            self.register()
            # The main thread needs no connection until it deregisters: close the one it
            # registered with rather than hold it for the worker's life.
            connections[self.database].close()
            self._start_threads()
            logger.info(
                "worker %s started: backend=%s queues=%s pool=%s concurrency=%d lease=%gs "
                "heartbeat=%gs reaper=%gs lock_lost=%s schedules=%d",
                self.worker_id,
                self.backend.alias,
                ",".join(self.queues) if self.queues else "*",
                self.pool.kind,
                self.config.concurrency,
                self.options.lease_duration,
                self.options.heartbeat_interval,
                self.options.stale_lock_interval,
                self.options.lock_lost_behavior,
                self._scheduled,
                extra={
                    "worker": self.worker_id,
                    "backend": self.backend.alias,
                    "queues": list(self.queues or []),
                    "pool": self.pool.kind,
                    "concurrency": self.config.concurrency,
                    "pid": os.getpid(),
                    "lease_duration": self.options.lease_duration,
                    "heartbeat_interval": self.options.heartbeat_interval,
                    "stale_lock_interval": self.options.stale_lock_interval,
                    "lock_lost_behavior": self.options.lock_lost_behavior,
                    "schedules": self._scheduled,
                },
            )
            self._main_loop()
        finally:
            self._stop_threads.set()
            self.pool.shutdown()
            for thread in self._threads:
                thread.join(timeout=5)
            self._deregister()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)
            logger.info(
                "worker %s stopped after %d attempts",
                self.worker_id,
                self.finished_jobs,
                extra={"worker": self.worker_id, "count": self.finished_jobs},
            )
        return 0

    @property
    def _scheduled(self) -> int:
        """How many schedules this worker's scheduler thread runs (0: none)."""
        return len(self.options.schedules) if self.config.runs_schedules else 0

    def _start_threads(self) -> None:
        self._threads = [
            Heartbeat(self, self._stop_threads),
            Watchdog(self, self._stop_threads),
        ]
        if connections[self.database].vendor == "postgresql":
            self._threads.append(Listener(self, self._stop_threads))
        if self._scheduled:
            self._threads.append(Scheduler(self, self._stop_threads))
        for thread in self._threads:
            thread.start()

    def _with_reconnect(self, what: str, write: Any) -> None:
        """Run a registry write; after a dropped connection, reconnect and try once more."""
        for attempt in (1, 2):
            try:
                write()
                return
            except DatabaseError as exc:
                connections[self.database].close()
                if attempt == 2:
                    logger.warning(
                        "could not %s the worker: %s",
                        what,
                        exc,
                        extra={"worker": self.worker_id, "error": str(exc)},
                    )

    def register(self) -> None:
        self._with_reconnect(
            "register",
            lambda: WorkerRow.objects.using(self.database).update_or_create(
                pk=self.worker_id,
                defaults={
                    "backend": self.backend.alias,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "queues": list(self.queues or []),
                    "pool": self.pool.kind,
                    "concurrency": self.config.concurrency,
                    "state": WorkerState.RUNNING,
                    "stopped_at": None,
                },
            ),
        )

    def _deregister(self) -> None:
        self._with_reconnect(
            "deregister",
            lambda: (
                WorkerRow.objects.using(self.database)
                .filter(pk=self.worker_id)
                .update(
                    state=WorkerState.STOPPED, stopped_at=DatabaseNow(), last_seen_at=DatabaseNow()
                )
            ),
        )

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        """Feed slots, collect outcomes, and keep one database round going at a time.

        The loop itself never waits on the database: rounds (write the queued outcomes,
        then claim) run in the worker's database thread, and the loop keeps handing
        prefetched jobs to slots meanwhile. What arrives during a round is written by
        the next one, so outcomes are written in batches a few milliseconds apart.
        """
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leasejobs-db")
        try:
            while True:
                if self.pool.pipelined():
                    self.pool.retract_stalled(PIPELINE_RETRACT_AFTER)
                self._handle_events(self.pool.collect())
                self._handle_thread_stops()
                if self._heard_due is not None:
                    self._take_heard_due()
                if self.stopping:
                    self._give_back_ready()
                self._dispatch_ready()
                self._give_back_stale_ready()
                if self._round is not None and self._round[1].done():
                    self._finish_round()
                if self._round is None:
                    self._start_round()
                    if self._round is not None:
                        continue  # (it may already be done: look again before waiting)
                with self.lock:
                    busy = len(self.running)
                idle = self._round is None and not self._writes
                if self.stopping:
                    if self.force or (
                        self.shutdown_deadline is not None
                        and time.monotonic() >= self.shutdown_deadline
                    ):
                        self._stop_all("shutdown")
                        if self._db_failures and self._round is None:
                            self._abandon_writes()
                    if busy == 0 and idle:
                        return
                elif self._done_by_limits(busy, idle):
                    self.stopping = True
                    self.shutdown_deadline = time.monotonic() + self.config.shutdown_timeout
                    continue
                self._sleep(self._wait_timeout())
        finally:
            if self._round is not None:
                with contextlib.suppress(Exception):
                    self._round[1].result(timeout=self.options.lease_duration)
            self._db.submit(connections.close_all)
            self._db.shutdown(wait=True)
            if self._selector is not None:
                self._selector.close()

    def _sleep(self, timeout: float) -> None:
        """Wait until a slot reports, something wakes the loop, or ``timeout`` passes.

        One selector is kept across passes (rebuilt when the pool replaces a slot):
        building one per pass costs more than the rest of a short job's bookkeeping.
        """
        waitables = self.pool.waitables()
        if self._selector is None or self._selected != waitables:
            if self._selector is not None:
                self._selector.close()
            self._selector = selectors.DefaultSelector()
            for item in [*waitables, self._wake_r]:
                self._selector.register(item, selectors.EVENT_READ)
            self._selected = waitables
        self._selector.select(timeout)
        self._drain_wake()

    def _abandon_writes(self) -> None:
        """Shutdown time is up and the database keeps failing: leave without writing.

        The unwritten attempts keep their leases until those expire; the reaper then
        re-runs them (at-least-once), so nothing is lost, only done again.
        """
        for running, _ in self._writes:
            job = running.job
            logger.error(
                "could not record job %s attempt %s before shutdown (database errors); "
                "it runs again after its lease expires",
                job.id,
                job.attempt,
                extra=self._log_extra(job),
            )
            self._forget(running)
        self._writes = []

    def _wait_timeout(self) -> float:
        """How long the loop may sleep: until the next poll, backoff end or stop check."""
        if self.pool.pipelined():
            # Short jobs queued behind another ring only when their slot runs out of work:
            # look in on them (their outcomes, a job that runs long) this often.
            return min(PIPELINE_RETRACT_AFTER, self._wait_timeout_unpipelined())
        return self._wait_timeout_unpipelined()

    def _wait_timeout_unpipelined(self) -> float:
        if self._round is not None:
            return self.options.poll_interval  # the database thread wakes us when done
        now = time.monotonic()
        if self._db_failures:
            return max(0.0, self._retry_at - now)
        timeout = max(0.0, self._next_poll - now)
        if self.stopping:
            timeout = min(timeout, 0.2)
        if self.ready and self.ready[0].stop_reason is None:
            timeout = min(timeout, max(0.0, self.ready[0].started + PREFETCH_MAX_WAIT - now))
        return timeout

    def _done_by_limits(self, busy: int, idle: bool) -> bool:
        if self.config.max_jobs is not None and self.finished_jobs >= self.config.max_jobs:
            return True
        return self.config.burst and self._last_claimed == 0 and busy == 0 and idle

    def notify_jobs(self) -> None:
        """New jobs may be ready (a NOTIFY arrived): claim on the next pass (any thread)."""
        self._claim_wanted = True
        self.wake()

    def _prefetch_now(self) -> int:
        """How many jobs to hold beyond the free slots: about ``PREFETCH_WORK_SECONDS`` of
        work per slot at the recent jobs' mean run time, at most ``self.prefetch``."""
        mean = self._mean_duration
        if mean is None or not self.prefetch or self._prefetch_paused:
            return 0
        per_slot = int(PREFETCH_WORK_SECONDS / max(mean, 1e-4))
        return min(self.prefetch, int(self._prefetch_limit), per_slot * self.config.concurrency)

    def _claim_limit(self) -> int:
        if self.stopping:
            return 0
        limit = self.pool.free_slots() + self._prefetch_now() - len(self.ready)
        if self.config.max_jobs is not None:
            with self.lock:
                busy = len(self.running)
            limit = min(limit, self.config.max_jobs - self.finished_jobs - busy)
        return max(limit, 0)

    # ------------------------------------------------------------------ database rounds

    def _start_round(self) -> None:
        """Hand the queued outcomes and a claim to the database thread, if there is work."""
        now = time.monotonic()
        if self._db_failures and now < self._retry_at:
            return
        limit = self._claim_limit()
        claim_due = self._claim_wanted or now >= self._next_poll
        if not self._writes and not (limit and claim_due):
            return
        plan = self._plan(limit if claim_due else 0)
        if not plan.writes and not plan.claim_limit:
            return
        if plan.claim_limit:
            # No NOTIFY, no full batch: only the timer brought this claim.
            plan.look_first = self.listening and not (
                plan.writes or self._claim_wanted or self.config.burst
            )
            self._claim_wanted = False
        ctx = RoundContext(
            worker_id=self.worker_id,
            database=self.database,
            backend=self.backend.alias,
            queues=self.queues,
            lease_duration=self.options.lease_duration,
            flow=self.options.flow,
            main_lane_first=now < self._flow_held_until,
        )
        future = self._db.submit(self._run_round, plan, ctx)
        future.add_done_callback(lambda _: self.wake())  # runs once done() is true
        self._round = (plan, future)

    def _run_round(self, plan: RoundPlan, ctx: RoundContext) -> RoundResult:
        """One round, in the database thread; then what the idle wait needs.

        Jobs this round gave back (prefetched jobs, or released at shutdown) get a
        NOTIFY, so idle workers that wait on one take them at once. After an empty
        claim by a listening worker, one more query finds when its next delayed job
        comes due: a NOTIFY is sent at enqueue, not when ``run_after`` passes. A safety
        poll (``plan.look_first``) asks that first, and claims only when a job is due:
        an idle worker's poll is then one query, not two.
        """
        known_due: float | None = None
        if plan.look_first:
            with contextlib.suppress(Exception):  # (claim as usual, and look after it)
                known_due = self.seconds_to_next_due()
                if known_due is None or known_due > 0:
                    self._next_due = known_due
                    logger.debug(
                        "safety poll: no job due (%s), no claim",
                        "none pending" if known_due is None else f"next in {known_due:.3f}s",
                        extra={"worker": self.worker_id},
                    )
                    return RoundResult(claimed=[])
        result = run_round(plan, ctx)
        self._next_due = None
        if result.error is None:
            try:
                self._notify_given_back(plan, result)
                if self.listening and plan.claim_limit and result.claimed == []:
                    self._next_due = (
                        known_due if known_due is not None else self.seconds_to_next_due()
                    )
            except Exception as exc:  # the idle wait falls back to POLL_INTERVAL
                self._next_due = 0.0
                logger.warning(
                    "after a round (NOTIFY of given-back jobs, next-due lookup): %s; polling",
                    storable_text(exc, 500),
                    extra={"worker": self.worker_id, "error": storable_text(exc, 500)},
                )
                with contextlib.suppress(DatabaseError):
                    connections[self.database].close()
        return result

    def _notify_given_back(self, plan: RoundPlan, result: RoundResult) -> None:
        queues: set[str] = set()
        if result.unclaimed:
            queues.update(r.job.queue for r, _ in plan.unclaims if r.job.lease in result.unclaimed)
        for done, (running, what) in zip(result.singles_done, plan.singles, strict=False):
            if done and what.kind == "shutdown":
                queues.add(running.job.queue)
        if queues:
            leases.notify(NOTIFY_CHANNEL, sorted(queues), using=self.database)

    def seconds_to_next_due(self) -> float | None:
        """Seconds until the next pending job of this worker's queues comes due
        (``leases.seconds_to_next_due``; PostgreSQL: only a listening worker asks)."""
        return leases.seconds_to_next_due(self.backend.alias, self.queues, using=self.database)

    def _idle_wait(self) -> float:
        """How long an idle worker waits before it looks for work again (unless woken).

        Not listening: ``POLL_INTERVAL``. Listening: ``IDLE_POLL_INTERVAL`` (the safety
        poll), but never past the moment its next delayed job comes due; a job due
        already that the claim did not get (another worker's claim held it) is looked
        for again after ``POLL_INTERVAL``.
        """
        wait = self._until_next_look()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "no job ready; next look for work in %.3fs (%s)",
                wait,
                "listening" if self.listening else "polling",
                extra={"worker": self.worker_id, "duration": round(wait, 6)},
            )
        return wait

    def _until_next_look(self) -> float:
        poll = wait = self.options.poll_interval
        if self.listening:
            wait = self.options.idle_poll_interval
            due = self._next_due
            if due is not None:
                wait = min(wait, due + DUE_MARGIN if due > 0 else poll)
        return wait

    def heard_next_due(self, due: NextDue) -> None:
        """The heartbeat's tick of an idle listening worker looked up when the next job of
        its queues comes due (``seconds_to_next_due``; any thread): the main loop takes
        it as its safety poll."""
        self._heard_due = due
        self.wake()

    def _take_heard_due(self) -> None:
        """Act on the heartbeat's lookup: claim now if a job is due, else wait for the next
        one to come due, or ``IDLE_POLL_INTERVAL`` from now. Only while idle and listening:
        a busy loop claims (and looks) for itself."""
        heard, self._heard_due = self._heard_due, None
        if heard is None or not self.listening or self._round is not None or self.ready:
            return
        if self._claim_wanted or self._db_failures:
            return
        if heard.seconds is not None and heard.seconds <= 0:
            self._claim_wanted = True
        else:
            self._next_due = heard.seconds
            self._next_poll = time.monotonic() + self._until_next_look()

    def _plan(self, claim_limit: int) -> RoundPlan:
        """Sort the queued outcomes into a round; drop those whose lease is presumed lost."""
        writes = self._writes[:MAX_ROUND_WRITES]
        del self._writes[:MAX_ROUND_WRITES]
        # Earlier attempts' rows are only for receivers of the site's: Django's own log
        # receiver reads none of them.
        plan = RoundPlan(claim_limit=claim_limit, history=has_other_receivers(task_finished))
        now = time.monotonic()
        deadline = self.options.local_lease_deadline
        for running, what in writes:
            if now - running.last_renewed > deadline:
                self._give_up(running, "its lease is presumed lost (no renewal in time)")
                continue
            if running.recording_since is not None and now - running.recording_since > deadline:
                self._give_up(running, f"its outcome could not be written for {deadline:g}s")
                continue
            if isinstance(what, Outcome) and what.ok:
                plan.successes.append((running, what))
            elif isinstance(what, Ending) and what.kind == "unclaim":
                plan.unclaims.append((running, what))
            elif isinstance(what, Ending) and what.kind in ("shutdown", "cancelled"):
                plan.singles.append((running, what))
            else:  # a failed outcome, a killed process, a timeout
                failure, duration = self._failure(running, what)
                plan.failures.append((running, what, failure, duration))
        return plan

    def _finish_round(self) -> None:
        """Act on what the database said: log, signal, forget; queue again what was not
        written; hand claimed jobs to slots."""
        assert self._round is not None  # noqa: S101 - only called with a round
        plan, future = self._round
        self._round = None
        result: RoundResult = future.result()
        requeue: list[tuple[RunningJob, Write]] = []
        finishing = [r for r, _ in plan.successes] + [r for r, *_ in plan.failures]
        for running in finishing:
            running.finished_at = result.finished_at.get(running.job.lease)
            running.history = result.history.get(running.job.id)
        for running, outcome in plan.successes:
            if not result.wrote_successes or running.job.lease in result.skipped:
                requeue.append((running, outcome))
            else:
                self._guarded(running, self._after_success_write, running, outcome, result)
        for running, what, failure, duration in plan.failures:
            if not result.wrote_failures or running.job.lease in result.skipped:
                requeue.append((running, what))
            else:
                self._guarded(
                    running, self._after_failure_write, running, failure, duration, result
                )
        for index, (running, what) in enumerate(plan.singles):
            if index >= len(result.singles_done) or running.job.lease in result.skipped:
                requeue.append((running, what))
            elif result.singles_done[index]:
                self._guarded(running, self._after_single, running, what.kind)
            elif running.job.lease in result.unwritable:
                self._give_up(running, result.unwritable[running.job.lease])
            else:
                self._lost_on_write(running, "release" if what.kind == "shutdown" else "cancel")
        if result.unclaimed is None:
            requeue += plan.unclaims
        else:
            self._after_unclaim(plan.unclaims, result.unclaimed)
        self._writes[:0] = requeue
        if result.flow_held:
            self._flow_held_until = time.monotonic() + self.options.poll_interval
        if result.claimed is not None:
            self._take_claimed(result.claimed, plan.claim_limit)
        if result.error is not None:
            self._db_failures += 1
            delay = min(5.0, 0.2 * 2**self._db_failures) * random.uniform(0.8, 1.2)  # noqa: S311
            self._retry_at = time.monotonic() + delay
            error = storable_text(result.error, 500)
            self._round_problem = f"database rounds failing ({self._db_failures} in a row): {error}"
            logger.warning(
                "database error in the worker (attempt %d), reconnecting: %s",
                self._db_failures,
                error,
                extra={"worker": self.worker_id, "error": error},
            )
        else:
            self._db_failures = 0
            self._round_problem = ""

    def _after_success_write(
        self, running: RunningJob, outcome: Outcome, result: RoundResult
    ) -> None:
        lease = running.job.lease
        if lease in result.unwritable:
            self._give_up(running, result.unwritable[lease])
        elif lease in result.replaced:
            self._after_failure(
                running, result.statuses[lease], result.replaced[lease], outcome.duration, None
            )
            self._forget(running)
        else:
            self._after_success(running, outcome, lease in result.statuses)

    def _after_failure_write(
        self, running: RunningJob, failure: Failure, duration: float, result: RoundResult
    ) -> None:
        lease = running.job.lease
        status = result.statuses.get(lease)
        if lease in result.unwritable:
            self._give_up(running, result.unwritable[lease])
        elif status is None:
            self._lost_on_write(running, "fail")
        else:
            error = result.replaced.get(lease, failure.error)
            self._after_failure(running, status, error, duration, failure.retry_delay)
            self._forget(running)

    def _give_up(self, running: RunningJob, why: str) -> None:
        """Stop renewing an attempt whose outcome cannot be recorded at all.

        The heartbeat no longer renews it, so its lease expires and the reaper takes
        the job back (a stall), exactly as if this worker had died with it.
        """
        job = running.job
        self.given_up += 1
        self._last_give_up = (time.monotonic(), f"job {job.id} attempt {job.attempt}: {why}")
        logger.error(
            "could not record job %s attempt %s (%s); no longer renewing its lease, "
            "the reaper takes it back when it expires",
            job.id,
            job.attempt,
            why,
            extra=self._log_extra(job, error=why),
        )
        self._forget(running)

    @property
    def problem(self) -> str:
        """What keeps this worker from working normally, '' when nothing: failing
        database rounds, and attempts it gave up recording in the last
        ``PROBLEM_MEMORY`` seconds. The heartbeat puts it on the worker's registry row
        (admin, ``leasejobs_status``)."""
        parts = [self._round_problem] if self._round_problem else []
        if self._last_give_up is not None:
            when, what = self._last_give_up
            if time.monotonic() - when < PROBLEM_MEMORY:
                parts.append(
                    f"gave up recording {self.given_up} attempt(s) since it started "
                    f"(the reaper takes them back); last: {what}"
                )
        return storable_text("; ".join(parts), 2000)

    def _guarded(self, running: RunningJob, step: Any, *args: Any) -> None:
        """Run one job's bookkeeping step; whatever it raises stays with that job."""
        try:
            step(*args)
        except Exception as exc:
            job = running.job
            error = storable_text(exc, 500)
            logger.exception(
                "bookkeeping of job %s attempt %s failed: %s",
                job.id,
                job.attempt,
                error,
                extra=self._log_extra(job, error=error),
            )
            self._forget(running)

    def _take_claimed(self, claimed: list[ClaimedJob], limit: int) -> None:
        now = time.monotonic()
        self._last_claimed = len(claimed)
        jobs_claimed.send_robust(
            LeaseJobsBackend,
            backend=self.backend.alias,
            worker_id=self.worker_id,
            count=len(claimed),
            limit=limit,
        )
        if len(claimed) >= limit:
            self._claim_wanted = True  # a full batch: there may be more ready jobs now
        elif not claimed:
            self._next_poll = now + self._idle_wait()
        for job in claimed:
            try:
                task: Task | None = registry.resolve(job.task_path)
            except Exception:  # UnknownTask, or a module that fails to import
                task = None  # the slot reports the clear error; nothing is called
            running = RunningJob(job=job, task=task, started=now, last_renewed=now)
            with self.lock:
                self.running[job.lease] = running
            self.ready.append(running)
        self._dispatch_ready()

    def _dispatch_ready(self) -> None:
        """Hand waiting jobs to slots with room; route jobs stopped while they waited.

        One job per slot, or with a backlog of short jobs several (``_pipeline_depth``),
        spread evenly over the slots; each slot gets its jobs in one hand-over.
        """
        self._route_stopped_heads()
        if not self.ready:
            return
        rooms = self.pool.rooms(self._pipeline_depth())
        share = -(-len(self.ready) // max(1, len(rooms)))  # ceil: spread the backlog
        for room in rooms:
            specs = self._take_ready(room, share)
            if specs:
                if len(specs) > 1 and logger.isEnabledFor(logging.DEBUG):
                    logger.debug(
                        "handed %d jobs to slot %d at once (job/attempt, in order: %s)",
                        len(specs),
                        room.slot,
                        " ".join(f"{spec.job.id}/{spec.job.attempt}" for spec in specs),
                        extra={"worker": self.worker_id, "count": len(specs)},
                    )
                if self.pool.submit(room.slot, specs):  # the first one starts at once
                    self._announce_once(self.running[specs[0].job.lease])
            if not self.ready:
                return

    def _pipeline_depth(self) -> int:
        """How many jobs a slot may hold now (``PIPELINE_WORK_SECONDS``)."""
        mean = self._mean_duration
        if mean is None or mean >= PIPELINE_WORK_SECONDS or len(self.ready) <= 1:
            return 1
        return min(PIPELINE_DEPTH, int(PIPELINE_WORK_SECONDS / max(mean, 1e-6)))

    def _route_stopped_heads(self) -> None:
        """Pop the jobs at the head of ``ready`` that must not start: stopped while they
        waited, or waiting on a lease the worker itself would call lost."""
        deadline = self.options.local_lease_deadline
        while self.ready:
            running = self.ready[0]
            silent = time.monotonic() - running.last_renewed
            if running.stop_reason is None and silent > deadline:
                # The worker was frozen or cut off while the job waited (and the watchdog
                # has not run since): its lease may be another worker's by now. Never start
                # a job on a lease the worker itself would call lost.
                self.stop(
                    running.job.lease,
                    "lease_lost",
                    f"no successful renewal for {silent:.1f}s while it waited for a slot "
                    f"(local deadline {deadline:g}s): the worker was paused or cut off",
                )
            if running.stop_reason is None:
                return
            self.ready.popleft()
            self._job_stopped(running, "was stopped before it started")

    def _take_ready(self, room: Room, share: int) -> list[JobSpec]:
        """Jobs from the head of ``ready`` for one slot: up to ``share`` of them, as many
        as it has room for; a job with a timeout only as the first job of an idle slot."""
        specs: list[JobSpec] = []
        while self.ready and len(specs) < min(room.jobs, share):
            self._route_stopped_heads()
            if not self.ready:
                break
            running = self.ready[0]
            if running.job.timeout is not None and (specs or not room.idle):
                break
            self.ready.popleft()
            self._hand_over(running)
            specs.append(
                JobSpec(
                    job=running.job,
                    worker_id=self.worker_id,
                    backend=self.backend.alias,
                    database=self.database,
                    # The rule of _route_stopped_heads, kept by the slot for queued jobs.
                    start_by=running.last_renewed + self.options.local_lease_deadline,
                )
            )
        return specs

    def _hand_over(self, running: RunningJob) -> None:
        """Mark a job as handed to a slot (its start is announced when it starts)."""
        with self.lock:
            running.dispatched = True
            now = time.monotonic()
            if (
                self._prefetch_limit < self.prefetch
                and now - running.started < PREFETCH_MAX_WAIT / 4
            ):
                self._prefetch_limit = min(
                    float(self.prefetch), self._prefetch_limit + PREFETCH_REGROWTH
                )
            running.started = now

    def _announce_once(self, running: RunningJob) -> None:
        """Announce that an attempt started (once: a job handed to an idle slot as it is
        handed over, one queued behind others when its slot reports it started, or with
        its outcome at the latest). A job taken back before it started is never
        announced, so giving it back leaves nothing announced for its attempt."""
        if running.announced:
            return
        running.announced = True
        try:
            self._announce_start(running)
        except Exception as exc:  # the job runs all the same
            logger.exception(
                "announcing the start of job %s failed: %s",
                running.job.id,
                storable_text(exc, 500),
                extra=self._log_extra(running.job),
            )

    def _give_back_stale_ready(self) -> None:
        """Prefetched jobs stuck behind long jobs go back to pending for other workers."""
        if not self.ready or self.ready[0].stop_reason is not None:
            return
        now = time.monotonic()
        if now - self.ready[0].started < PREFETCH_MAX_WAIT:
            return
        self._prefetch_paused = True  # until a slot frees: else we would claim them again
        self._prefetch_limit = max(1.0, self._prefetch_limit / PREFETCH_BACKOFF)
        logger.info(
            "giving back %d prefetched jobs that waited %.1fs for a slot",
            len(self.ready),
            now - self.ready[0].started,
            extra={"worker": self.worker_id, "count": len(self.ready)},
        )
        self._give_back_ready()
        self._dispatch_ready()

    def _give_back_ready(self) -> None:
        """Stopping: prefetched jobs that never started go back to pending at once."""
        with self.lock:
            for running in self.ready:
                if running.stop_reason is None:
                    running.stop_reason = "shutdown"

    # ------------------------------------------------------------------ stopping jobs

    def stop(self, lease: Lease, reason: StopReason, detail: str = "") -> None:
        """Stop a running job (any thread). Lease loss also fires ``lease_lost``."""
        with self.lock:
            running = self.running.get(lease)
            if running is None or running.stop_reason is not None or running.recording:
                return
            running.stop_reason = reason
            running.stop_detail = detail
            dispatched = running.dispatched
        job = running.job
        if reason == "lease_lost":
            logger.error(
                "lease lost for job %s attempt %s: %s; stopping it",
                job.id,
                job.attempt,
                detail,
                extra=self._log_extra(job, reason=detail),
            )
            self._send(lease_lost, job, reason=detail)
        else:
            logger.warning(
                "stopping job %s attempt %s: %s %s",
                job.id,
                job.attempt,
                reason,
                detail,
                extra=self._log_extra(job, reason=reason),
            )
        if dispatched:  # else it waits in ``ready``: the main loop routes it, never starts it
            graceful = reason != "shutdown"
            # "retracted": its slot gives it back (a Retracted event) and the main loop
            # routes it from ``ready``; "killing": its slot's death is the next event.
            if self.pool.stop_job(lease, graceful=graceful) == "flagged":
                with self.lock:
                    self._thread_stops.append(lease)
        self.wake()

    def _stop_all(self, reason: StopReason) -> None:
        with self.lock:
            leases_now = [lease for lease, r in self.running.items() if r.stop_reason is None]
        for lease in leases_now:
            self.stop(lease, reason, "worker shutting down")

    def _handle_thread_stops(self) -> None:
        with self.lock:
            stops, self._thread_stops = self._thread_stops, []
        for lease in stops:
            running = self.running.get(lease)
            if running is not None:
                self._job_stopped(running, "was stopped; its thread runs on, fenced")

    # ------------------------------------------------------------------ outcomes

    def _handle_events(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Retracted):
                self._back_to_ready(event)
                continue
            if isinstance(event, Started):
                for lease in event.leases:
                    with self.lock:
                        started = self.running.get(lease)
                    if started is not None:
                        self._announce_once(started)
                continue
            if isinstance(event, ProgressEvent):
                with self.lock:
                    running = self.running.get(event.lease)
                    if running is not None:
                        running.progress = Progress(event.fraction, event.message)
                continue
            with self.lock:
                running = self.running.get(event.lease)
            if running is None:
                continue
            self._claim_wanted = True  # a slot is free again
            self._prefetch_paused = False
            self._announce_once(running)  # it started (if its start was not reported yet)
            if isinstance(event, Outcome):
                self._note_duration(event.duration)
                # A real outcome wins even when a stop raced it: the job did finish. (A
                # lost lease is still safe: the fence rejects the write.)
                self._record(running, event)
            elif running.stop_reason is not None:
                self._job_stopped(running, event.exit_description)
            else:
                self._record(running, Ending("killed", event.exit_description))

    def _back_to_ready(self, event: Retracted) -> None:
        """Jobs a slot gave back before they started: first in line again, in order."""
        with self.lock:
            back = [self.running.get(lease) for lease in event.leases]
            jobs = [running for running in back if running is not None]
            for running in jobs:
                running.dispatched = False
        self.ready.extendleft(reversed(jobs))
        self._claim_wanted = True  # (a slot has room again)

    def _note_duration(self, seconds: float) -> None:
        mean = self._mean_duration
        self._mean_duration = seconds if mean is None else 0.8 * mean + 0.2 * seconds

    def _job_stopped(self, running: RunningJob, description: str) -> None:
        reason = running.stop_reason
        if reason == "lease_lost":
            # The lease belongs to someone else: nothing to write.
            self._forget(running, ran=running.dispatched)
        elif not running.dispatched and not running.announced:
            # Never started: given back, its attempt unused. (One announced but given
            # back unstarted, as its idle slot died or a stop took it back, keeps its
            # attempt: it is released or cancelled below, like a job that ran.)
            self._record(running, Ending("unclaim", description))
        elif reason == "timeout":
            self._record(running, Ending("timeout", description))
        elif reason == "cancelled":
            self._record(running, Ending("cancelled", description))
        else:
            self._record(running, Ending("shutdown", description))

    def _forget(self, running: RunningJob, *, ran: bool = True) -> None:
        with self.lock:
            self.running.pop(running.job.lease, None)
        if ran:
            self.finished_jobs += 1

    def _record(self, running: RunningJob, what: Write) -> None:
        """Queue how an attempt ended; the next database round writes it (fenced)."""
        with self.lock:
            running.recording = True
            if running.recording_since is None:
                running.recording_since = time.monotonic()
        self._writes.append((running, what))

    # ------------------------------------------------------------------ after a round

    def _failure(self, running: RunningJob, what: Write) -> tuple[Failure, float]:
        """The Failure to write for an outcome that is not a success, and its duration."""
        job = running.job
        if isinstance(what, Outcome):
            error = what.error or ErrorInfo("django_leasejobs.exceptions.JobFailure")
            failure = self._decided(running, error, AttemptOutcome.ERROR, what.verdict)
            return failure, what.duration
        if what.kind == "timeout":
            error = ErrorInfo(
                TIMEOUT_ERROR_CLASS,
                f"attempt ran past its timeout of {job.timeout:g}s and {what.description}",
            )
            outcome = AttemptOutcome.TIMEOUT
        else:
            error = ErrorInfo(
                "django_leasejobs.exceptions.JobKilled", f"the job's process {what.description}"
            )
            outcome = AttemptOutcome.KILLED
        failure = self._decided(running, error, outcome, RETRIED)
        return failure, time.monotonic() - running.started

    def _decided(
        self, running: RunningJob, error: ErrorInfo, outcome: str, verdict: Verdict
    ) -> Failure:
        """The Failure of an attempt that ended with ``outcome`` (``attempt_failure``)."""
        return attempt_failure(
            running.job, running.task, error, outcome, verdict, self.options.retry_backoff
        )

    def _after_success(self, running: RunningJob, outcome: Outcome, written: bool) -> None:
        job = running.job
        if not written:
            self._lost_on_write(running, "complete")
            return
        if logger.isEnabledFor(logging.INFO):  # per job: skip building the extra keys
            logger.info(
                "job %s attempt %s succeeded in %.3fs",
                job.id,
                job.attempt,
                outcome.duration,
                extra=self._log_extra(job, duration=round(outcome.duration, 6)),
            )
        self._send(job_succeeded, job, task_path=job.task_path, duration=outcome.duration)
        self._announce_finish(running, JobStatus.SUCCEEDED, outcome.result)
        self._forget(running)

    def _after_single(self, running: RunningJob, kind: str) -> None:
        job = running.job
        duration = time.monotonic() - running.started
        if kind == "shutdown":
            logger.warning(
                "released job %s attempt %s back to pending at shutdown",
                job.id,
                job.attempt,
                extra=self._log_extra(job, duration=round(duration, 6)),
            )
        else:
            error = ErrorInfo("django_leasejobs.exceptions.JobCancelled", "cancelled while running")
            self._after_failure(running, JobStatus.CANCELLED, error, duration, None)
        self._forget(running)

    def _after_unclaim(
        self, batch: list[tuple[RunningJob, Any]], given_back: frozenset[Lease]
    ) -> None:
        if given_back:
            logger.info(
                "gave back %d prefetched jobs that never started",
                len(given_back),
                extra={"worker": self.worker_id, "count": len(given_back)},
            )
        for running, _ in batch:
            self._forget(running, ran=False)

    def _lost_on_write(self, running: RunningJob, transition: str) -> None:
        job = running.job
        exc = LeaseLost(job.id, job.attempt, self.worker_id, transition)
        logger.error(
            "lease lost for job %s attempt %s: %s",
            job.id,
            job.attempt,
            exc,
            extra=self._log_extra(job, transition=transition),
        )
        if running.stop_reason != "lease_lost":  # else stop() reported this loss already
            self._send(lease_lost, job, reason=str(exc))
        self._forget(running)

    def _after_failure(
        self,
        running: RunningJob,
        status: str,
        error: ErrorInfo,
        duration: float,
        delay: float | None,
    ) -> None:
        job = running.job
        failure = task_failure(
            error.exception_class_path,
            error.message,
            error.traceback,
            job.id,
            job.attempt,
            self.worker_id,
        )
        log_failure(
            logger,
            logging.ERROR if status == JobStatus.FAILED else logging.WARNING,
            failure,
            "job %s attempt %s failed (%s: %s) -> %s",
            job.id,
            job.attempt,
            error.exception_class_path,
            error.message[:200],
            status,
            extra=self._log_extra(
                job,
                duration=round(duration, 6),
                status=status,
                error=error.exception_class_path,
                retry_in=delay if status == JobStatus.PENDING else None,
            ),
        )
        # Sent while the failure is being handled, as Django's own runner sends
        # task_finished: receivers that log or report the exception being handled
        # (Django's django.tasks logger, error trackers) get the attempt's error.
        try:
            raise failure
        except TaskFailed:
            self._send(
                job_failed,
                job,
                task_path=job.task_path,
                status=status,
                error=error,
                exception=failure,
                duration=duration,
            )
            self._announce_finish(running, status, None, error)

    # ------------------------------------------------------------------ django.tasks signals

    def _task_result(self, running: RunningJob, status: str, result: Any) -> TaskResult:
        """The in-memory django.tasks view of this attempt, for the signals' receivers."""
        return running_result(
            running.job,
            running.task,  # type: ignore[arg-type] # only called when the task resolved
            self.backend.alias,
            self.worker_id,
            status=status,
            return_value=result,
        )

    def _announce_start(self, running: RunningJob) -> None:
        job = running.job
        if logger.isEnabledFor(logging.INFO):  # per job: skip building the extra keys
            logger.info(
                "job %s attempt %s started: %s",
                job.id,
                job.attempt,
                job.task_path,
                extra=self._log_extra(job),
            )
        self._send(
            job_started,
            job,
            task_path=job.task_path,
            enqueued_at=job.enqueued_at,
            claimed_at=job.last_attempted_at,
        )
        if running.task is not None and must_send(task_started, logging.INFO):
            running.task_result = self._task_result(running, JobStatus.RUNNING, None)
            task_started.send_robust(type(self.backend), task_result=running.task_result)

    def _announce_finish(
        self, running: RunningJob, status: str, result: Any, error: ErrorInfo | None = None
    ) -> None:
        if running.task is None or status == JobStatus.PENDING:
            return
        failed = STATUS_TO_RESULT[JobStatus(status)] == TaskResultStatus.FAILED
        if not must_send(task_finished, logging.ERROR if failed else logging.INFO):
            return
        finished = self._finished_result(running, status, result, error)
        task_finished.send_robust(type(self.backend), task_result=finished)

    def _finished_result(
        self, running: RunningJob, status: str, result: Any, error: ErrorInfo | None
    ) -> TaskResult:
        """The started job's TaskResult with its final status, when it finished, every
        attempt's error and worker (a copy: no second validation of the arguments,
        which costs more than the rest of a short job)."""
        if running.task_result is None:
            finished = self._task_result(running, status, result)
        else:
            finished = copy.copy(running.task_result)
        job = running.job
        if running.history is not None:
            errors, worker_ids = attempt_history(running.history, job.attempt, self.worker_id)
        else:  # a first attempt: nothing before it, so no query was needed
            errors = [] if error is None else [error_as_task_error(error)]
            worker_ids = [self.worker_id]
        object.__setattr__(finished, "status", STATUS_TO_RESULT[JobStatus(status)])
        object.__setattr__(finished, "finished_at", running.finished_at)
        object.__setattr__(finished, "errors", errors)
        object.__setattr__(finished, "worker_ids", worker_ids)
        if status == JobStatus.SUCCEEDED:
            object.__setattr__(finished, "_return_value", result)
        return finished
