"""``Worker``: the main loop that claims jobs, hands them to slots and records outcomes.

Threads of one worker process:

* main loop (this module): claims up to the free slots in one statement, dispatches,
  records outcomes (fenced), sleeps until a slot reports, a NOTIFY arrives, or the
  poll interval passes;
* heartbeat (``heartbeat.py``): renews every lease of this worker in one UPDATE;
* watchdog (``heartbeat.py``): never touches the database; stops jobs whose lease is
  lost by the local deadline, whose timeout passed, and escalates SIGTERM to SIGKILL;
* reaper (``heartbeat.py``): the set-based reap every ``STALE_LOCK_INTERVAL``;
* listener (``listener.py``, PostgreSQL): ``LISTEN leasejobs`` to wake the main loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from types import FrameType
from typing import Any, Literal

from django.db import DatabaseError, connections
from django.db.models.functions import Now
from django.utils.crypto import get_random_string

from .. import leases, registry
from ..backend import LeaseJobsBackend
from ..compat import Task, task_backends, task_finished, task_started
from ..exceptions import UnknownTask
from ..leases import ClaimedJob, ErrorInfo, LeaseLost, Progress
from ..models import AttemptOutcome, Job, JobStatus, WorkerState
from ..models import Worker as WorkerRow
from ..retry import Backoff
from ..signals import job_failed, job_started, job_succeeded, lease_lost
from .execution import JobSpec, Outcome
from .heartbeat import Heartbeat, Reaper, Watchdog
from .listener import Listener
from .pools import Event, ProcessPool, ProgressEvent, ThreadPool

logger = logging.getLogger("django_leasejobs")

Lease = tuple[int, int]
StopReason = Literal["lease_lost", "timeout", "cancelled", "shutdown"]


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


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{get_random_string(6)}"


@dataclass(eq=False)
class RunningJob:
    job: ClaimedJob
    task: Task | None
    started: float
    last_renewed: float
    progress: Progress | None = None
    stop_reason: StopReason | None = None
    stop_detail: str = ""
    recording: bool = False
    """The main loop is writing this attempt's outcome: a renewal that misses it is no news."""


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
        self._retry_writes: list[tuple[RunningJob, Any]] = []
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
        """
        settings_dict = connections.settings[self.database]
        if settings_dict.get("ENGINE", "").rsplit(".", 1)[-1] != "postgresql":
            return
        options = settings_dict.setdefault("OPTIONS", {})
        defaults = {
            "connect_timeout": 10,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": int(self.options.lease_duration * 1000),
        }
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
        signal.send_robust(
            sender=LeaseJobsBackend,
            job_id=job.id,
            backend=self.backend.alias,
            attempt=job.attempt,
            worker_id=self.worker_id,
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
            previous = {
                s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
            }
        self.pool.start()  # fork the slots before any other thread exists
        try:
            self.register()
            self._start_threads()
            logger.info(
                "worker %s started: backend=%s queues=%s pool=%s concurrency=%d lease=%gs "
                "heartbeat=%gs reaper=%gs lock_lost=%s",
                self.worker_id,
                self.backend.alias,
                ",".join(self.queues) if self.queues else "*",
                self.pool.kind,
                self.config.concurrency,
                self.options.lease_duration,
                self.options.heartbeat_interval,
                self.options.stale_lock_interval,
                self.options.lock_lost_behavior,
                extra={
                    "worker": self.worker_id,
                    "backend": self.backend.alias,
                    "queues": list(self.queues or []),
                    "pool": self.pool.kind,
                    "concurrency": self.config.concurrency,
                    "pid": os.getpid(),
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

    def _start_threads(self) -> None:
        self._threads = [
            Heartbeat(self, self._stop_threads),
            Watchdog(self, self._stop_threads),
        ]
        if self.options.stale_lock_interval > 0:
            self._threads.append(Reaper(self, self._stop_threads))
        if connections[self.database].vendor == "postgresql":
            self._threads.append(Listener(self, self._stop_threads))
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
                .update(state=WorkerState.STOPPED, stopped_at=Now(), last_seen_at=Now())
            ),
        )

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        db_failures = 0
        while True:
            self._handle_events(self.pool.collect())
            self._handle_thread_stops()
            try:
                self._retry_pending_writes()
                claimed = self._claim_if_possible()
                db_failures = 0
            except DatabaseError as exc:
                db_failures += 1
                claimed = 0
                self._database_trouble(exc, db_failures)
            with self.lock:
                busy = len(self.running)
            if self.stopping:
                if self.force or (
                    self.shutdown_deadline is not None
                    and time.monotonic() >= self.shutdown_deadline
                ):
                    self._stop_all("shutdown")
                if busy == 0 and not self._retry_writes:
                    return
            elif self._done_by_limits(claimed, busy):
                self.stopping = True
                self.shutdown_deadline = time.monotonic() + self.config.shutdown_timeout
                continue
            if claimed and self.pool.free_slots() > 0 and not self.stopping:
                continue  # a full batch: there may be more ready jobs right now
            timeout = self.options.poll_interval
            if db_failures:
                timeout = min(5.0, 0.2 * 2**db_failures) * random.uniform(0.8, 1.2)  # noqa: S311
            elif self._retry_writes or self.stopping:
                timeout = min(timeout, 0.2)
            wait([*self.pool.waitables(), self._wake_r], timeout)
            self._drain_wake()

    def _done_by_limits(self, claimed: int, busy: int) -> bool:
        if self.config.max_jobs is not None and self.finished_jobs >= self.config.max_jobs:
            return True
        return self.config.burst and claimed == 0 and busy == 0

    def _database_trouble(self, exc: Exception, failures: int) -> None:
        logger.warning(
            "database error in the main loop (attempt %d), reconnecting: %s",
            failures,
            exc,
            extra={"worker": self.worker_id, "error": str(exc)},
        )
        with contextlib.suppress(DatabaseError):
            connections[self.database].close()

    def _claim_if_possible(self) -> int:
        if self.stopping:
            return 0
        limit = self.pool.free_slots()
        if self.config.max_jobs is not None:
            with self.lock:
                busy = len(self.running)
            limit = min(limit, self.config.max_jobs - self.finished_jobs - busy)
        if limit <= 0:
            return 0
        claimed = leases.claim(
            self.worker_id,
            limit=limit,
            lease_duration=self.options.lease_duration,
            backend=self.backend.alias,
            queues=self.queues,
            using=self.database,
        )
        now = time.monotonic()
        for job in claimed:
            try:
                task: Task | None = registry.resolve(job.task_path)
            except UnknownTask:
                task = None  # the slot reports the clear error; nothing is called
            running = RunningJob(job=job, task=task, started=now, last_renewed=now)
            with self.lock:
                self.running[job.lease] = running
            self._announce_start(running)
            self.pool.submit(
                JobSpec(
                    job=job,
                    worker_id=self.worker_id,
                    backend=self.backend.alias,
                    database=self.database,
                )
            )
        return len(claimed)

    # ------------------------------------------------------------------ stopping jobs

    def stop(self, lease: Lease, reason: StopReason, detail: str = "") -> None:
        """Stop a running job (any thread). Lease loss also fires ``lease_lost``."""
        with self.lock:
            running = self.running.get(lease)
            if running is None or running.stop_reason is not None or running.recording:
                return
            running.stop_reason = reason
            running.stop_detail = detail
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
        graceful = reason != "shutdown"
        stopped = self.pool.stop_job(lease, graceful=graceful)
        if stopped and not self.pool.can_kill:
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
            if isinstance(event, Outcome):
                # A real outcome wins even when a stop raced it: the job did finish. (A
                # lost lease is still safe: the fence rejects the write.)
                self._record(running, event)
            elif running.stop_reason is not None:
                self._job_stopped(running, event.exit_description)
            else:
                self._record(running, ("killed", event.exit_description))

    def _job_stopped(self, running: RunningJob, description: str) -> None:
        reason = running.stop_reason
        if reason == "lease_lost":
            self._forget(running)  # the lease belongs to someone else: nothing to write
        elif reason == "timeout":
            self._record(running, ("timeout", description))
        elif reason == "cancelled":
            self._record(running, ("cancelled", description))
        else:
            self._record(running, ("shutdown", description))

    def _forget(self, running: RunningJob) -> None:
        with self.lock:
            self.running.pop(running.job.lease, None)
        self.finished_jobs += 1

    def _retry_pending_writes(self) -> None:
        pending, self._retry_writes = self._retry_writes, []
        for index, (running, what) in enumerate(pending):
            try:
                self._write(running, what)
            except DatabaseError:
                self._retry_writes.extend(pending[index:])
                raise

    def _record(self, running: RunningJob, what: Any) -> None:
        try:
            self._write(running, what)
        except DatabaseError as exc:
            self._retry_writes.append((running, what))
            self._database_trouble(exc, 1)

    def _write(self, running: RunningJob, what: Any) -> None:
        """Write how an attempt ended, fenced; forget the job once written (or void)."""
        job = running.job
        with self.lock:
            running.recording = True
        lease_age = time.monotonic() - running.last_renewed
        if lease_age > self.options.local_lease_deadline:
            logger.error(
                "giving up recording job %s attempt %s: its lease is presumed lost",
                job.id,
                job.attempt,
                extra=self._log_extra(job),
            )
            self._forget(running)
            return
        try:
            if isinstance(what, Outcome):
                self._write_outcome(running, what)
            else:
                kind, description = what
                self._write_stop(running, kind, description)
        except LeaseLost as exc:
            logger.error(
                "lease lost for job %s attempt %s: %s",
                job.id,
                job.attempt,
                exc,
                extra=self._log_extra(job, transition=exc.transition),
            )
            self._send(lease_lost, job, reason=str(exc))
        self._forget(running)

    def _retry_delay(self, running: RunningJob) -> float:
        policy: Backoff | None = None
        if running.job.retry_backoff is not None:
            policy = Backoff.from_value(running.job.retry_backoff)
        elif running.task is not None:
            policy = getattr(running.task, "retry_backoff", None)
        return (policy or self.options.retry_backoff).delay(running.job.attempt)

    def _write_outcome(self, running: RunningJob, outcome: Outcome) -> None:
        job = running.job
        if outcome.ok:
            leases.complete(
                job.id, job.attempt, self.worker_id, result=outcome.result, using=self.database
            )
            logger.info(
                "job %s attempt %s succeeded in %.3fs",
                job.id,
                job.attempt,
                outcome.duration,
                extra=self._log_extra(job, duration=round(outcome.duration, 6)),
            )
            self._send(job_succeeded, job, task_path=job.task_path, duration=outcome.duration)
            self._announce_finish(running, JobStatus.SUCCEEDED, outcome.result)
            return
        error = outcome.error or ErrorInfo("django_leasejobs.exceptions.JobFailure")
        delay = self._retry_delay(running) if outcome.retryable else None
        status = leases.fail(
            job.id,
            job.attempt,
            self.worker_id,
            error=error,
            retry_delay=delay,
            outcome=AttemptOutcome.ERROR,
            using=self.database,
        )
        self._after_failure(running, status, error, outcome.duration, delay)

    def _write_stop(self, running: RunningJob, kind: str, description: str) -> None:
        job = running.job
        duration = time.monotonic() - running.started
        if kind == "shutdown":
            leases.release(job.id, job.attempt, self.worker_id, using=self.database)
            logger.warning(
                "released job %s attempt %s back to pending at shutdown",
                job.id,
                job.attempt,
                extra=self._log_extra(job, duration=round(duration, 6)),
            )
            return
        if kind == "cancelled":
            leases.mark_cancelled(job.id, job.attempt, self.worker_id, using=self.database)
            self._after_failure(
                running,
                JobStatus.CANCELLED,
                ErrorInfo("django_leasejobs.exceptions.JobCancelled", "cancelled while running"),
                duration,
                None,
            )
            return
        if kind == "timeout":
            error = ErrorInfo(
                "django_leasejobs.exceptions.JobTimeout",
                f"attempt ran past its timeout of {job.timeout:g}s and {description}",
            )
            outcome = AttemptOutcome.TIMEOUT
        else:
            error = ErrorInfo(
                "django_leasejobs.exceptions.JobKilled",
                f"the job's process {description}",
            )
            outcome = AttemptOutcome.KILLED
        delay = self._retry_delay(running)
        status = leases.fail(
            job.id,
            job.attempt,
            self.worker_id,
            error=error,
            retry_delay=delay,
            outcome=outcome,
            using=self.database,
        )
        self._after_failure(running, status, error, duration, delay)

    def _after_failure(
        self,
        running: RunningJob,
        status: str,
        error: ErrorInfo,
        duration: float,
        delay: float | None,
    ) -> None:
        job = running.job
        logger.warning(
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
        self._send(job_failed, job, task_path=job.task_path, status=status, error=error)
        self._announce_finish(running, status, None)

    # ------------------------------------------------------------------ django.tasks signals

    def _task_result(self, running: RunningJob, status: str, result: Any) -> Any:
        job = running.job
        row = Job(
            pk=job.id,
            backend=self.backend.alias,
            queue=job.queue,
            task_path=job.task_path,
            args=job.args,
            kwargs=job.kwargs,
            priority=job.priority,
            status=status,
            attempt=job.attempt,
            last_worker=self.worker_id,
            result=result,
        )
        return self.backend.result_from_job(row, task=running.task, attempts=[])

    def _announce_start(self, running: RunningJob) -> None:
        job = running.job
        logger.info(
            "job %s attempt %s started: %s",
            job.id,
            job.attempt,
            job.task_path,
            extra=self._log_extra(job),
        )
        self._send(job_started, job, task_path=job.task_path)
        if running.task is not None:
            task_started.send_robust(
                type(self.backend), task_result=self._task_result(running, JobStatus.RUNNING, None)
            )

    def _announce_finish(self, running: RunningJob, status: str, result: Any) -> None:
        if running.task is not None and status != JobStatus.PENDING:
            task_finished.send_robust(
                type(self.backend), task_result=self._task_result(running, status, result)
            )
