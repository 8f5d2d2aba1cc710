"""``runworker --processes N``: N workers forked from one process that started Django once.

A worker's cold start is almost all imports and ``django.setup()`` (about 0.35 CPU-s).
N ``runworker`` commands pay it N times; the supervisor pays it once and forks each
worker from the prepared process (a few milliseconds each), before any thread or
database connection exists in it. Each forked worker is a whole worker: its own id,
registry row, connections, heartbeat and slots. The supervisor itself holds no
connection and runs no job; it only starts, watches and stops its workers:

* a stop signal (SIGTERM, SIGINT, SIGHUP) is passed on to every worker; a second one
  too, at least ``SECOND_STOP_AFTER`` later (the workers then stop their running jobs
  at once). The workers run in process
  groups of their own, so a terminal's Ctrl-C reaches the supervisor alone and each
  worker hears it once;
* a worker that ends while the supervisor is not stopping is started again (without
  ``--burst``), at once if it ran for a while or ended cleanly (``--max-jobs``), after a
  growing delay if it keeps failing at start;
* with ``--burst`` nothing is restarted: the supervisor ends when its last worker has;
* a worker whose supervisor dies is sent SIGTERM by the kernel (Linux), so no worker is
  left unsupervised.

The exit code is 0 when every worker ended with 0, else the first other code seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, replace
from types import FrameType

from django.db import connections

from .config import SAME_STOP_WINDOW, WorkerConfig
from .loop import Worker

logger = logging.getLogger("django_leasejobs")

SECOND_STOP_AFTER = 1.5 * SAME_STOP_WINDOW
"""A second stop signal is passed on no sooner than this after the first (seconds): a
margin over the window in which the workers take it for the first one heard twice."""

RESTART_AFTER_RUNNING = 30.0
"""A worker that ran this long before it failed is restarted at once (seconds)."""

FIRST_RESTART_DELAY = 0.5
MAX_RESTART_DELAY = 30.0

_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class Child:
    index: int
    pid: int
    started: float
    restart_delay: float


class Supervisor:
    def __init__(self, config: WorkerConfig, processes: int) -> None:
        self.config = config
        self.processes = processes
        self.children: dict[int, Child] = {}
        self.due: dict[int, float] = {}
        """Workers to start again: index -> when (monotonic)."""
        self.delays: dict[int, float] = {}
        self.stops_heard = 0
        """Stop signals the supervisor received (its handler counts them)."""
        self.stops_passed = 0
        """Stop signals passed on to the workers: the first at once, a second one no
        sooner than ``SECOND_STOP_AFTER`` after it."""
        self.first_stop_at = 0.0
        self.stop_signal = signal.SIGTERM
        self.exit_code = 0
        self._wake_r, self._wake_w = os.pipe()

    # ---------------------------------------------------------------- parent side

    def run(self) -> int:
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        previous_wakeup = signal.set_wakeup_fd(self._wake_w)
        previous = {s: signal.signal(s, self._on_signal) for s in self._stop_signals()}
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, _ignore)
        logger.info(
            "supervisor %d starts %d workers",
            os.getpid(),
            self.processes,
            extra={"pid": os.getpid(), "count": self.processes},
        )
        try:
            # No database connection may cross a fork: the workers open their own.
            connections.close_all()
            # What Django loaded once is shared by the forked workers: out of the cyclic
            # GC's passes, its pages stay shared (each worker freezes its own after it).
            gc.freeze()
            for index in range(self.processes):
                self._start(index, FIRST_RESTART_DELAY)
            while self.children or self.due:
                self._wait()
                self._pass_on_stops()
                self._reap()
                self._start_due()
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        logger.info(
            "supervisor %d stopped (exit code %d)",
            os.getpid(),
            self.exit_code,
            extra={"pid": os.getpid(), "exit_code": self.exit_code},
        )
        return self.exit_code

    @staticmethod
    def _stop_signals() -> list[signal.Signals]:
        stops = [signal.SIGTERM, signal.SIGINT]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            stops.append(signal.SIGHUP)
        return stops

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only counts: the loop passes it on (a handler that kills while the loop forks
        # would race it).
        self.stops_heard += 1
        if self.stops_heard == 1:
            self.stop_signal = signal.Signals(signum)

    def _wait(self) -> None:
        now = time.monotonic()
        waits = [max(0.0, when - now) for when in self.due.values()]
        if self._second_stop_held:
            waits.append(max(0.0, self.first_stop_at + SECOND_STOP_AFTER - now))
        with contextlib.suppress(InterruptedError):
            select.select([self._wake_r], [], [], min(waits) if waits else None)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 4096):
                pass

    @property
    def _second_stop_held(self) -> bool:
        return self.stops_heard > 1 and self.stops_passed == 1

    def _pass_on_stops(self) -> None:
        if self.stops_heard and not self.stops_passed:
            self.stops_passed = 1
            self.first_stop_at = time.monotonic()
            self.due.clear()  # nothing is started again once stopping
            logger.info(
                "supervisor %d: %s, stopping its workers",
                os.getpid(),
                self.stop_signal.name,
                extra={"pid": os.getpid(), "signal": self.stop_signal.name},
            )
            self._signal_all(self.stop_signal)
        if self._second_stop_held and time.monotonic() >= self.first_stop_at + SECOND_STOP_AFTER:
            self.stops_passed = 2
            self._signal_all(self.stop_signal)

    def _signal_all(self, signum: signal.Signals) -> None:
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self._ended(child, os.waitstatus_to_exitcode(status))

    def _ended(self, child: Child, code: int) -> None:
        ran = time.monotonic() - child.started
        restart = not self.stops_passed and not self.config.burst
        delay = 0.0
        if restart:
            quick_failure = code != 0 and ran < RESTART_AFTER_RUNNING
            delay = child.restart_delay if quick_failure else 0.0
            self.delays[child.index] = (
                min(child.restart_delay * 2, MAX_RESTART_DELAY)
                if quick_failure
                else FIRST_RESTART_DELAY
            )
            self.due[child.index] = time.monotonic() + delay
        elif code != 0 and self.exit_code == 0:
            # A worker that ends for good decides the exit code (a killed one: 128 + signal).
            self.exit_code = code if code > 0 else 128 - code
        how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        logger.log(
            logging.INFO if code == 0 else logging.WARNING,
            "supervisor %d: worker %d (pid %d) ended after %.1fs, %s%s",
            os.getpid(),
            child.index,
            child.pid,
            ran,
            how,
            f"; starting it again in {delay:.1f}s" if restart else "",
            extra={"pid": child.pid, "exit_code": code, "duration": ran, "restart": restart},
        )

    def _start_due(self) -> None:
        now = time.monotonic()
        for index, when in sorted(self.due.items()):
            if when <= now:
                del self.due[index]
                self._start(index, self.delays.get(index, FIRST_RESTART_DELAY))

    def _start(self, index: int, restart_delay: float) -> None:
        supervisor = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked worker (tests see it run)
            os._exit(self._child(index, supervisor))
        self.children[pid] = Child(index, pid, time.monotonic(), restart_delay)

    # ---------------------------------------------------------------- worker side

    def _child(self, index: int, supervisor: int) -> int:
        code = 1
        try:
            os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor alone
            signal.set_wakeup_fd(-1)
            for signum in (*self._stop_signals(), signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            _die_with(supervisor)
            config = self.config
            if config.worker_id is not None:
                config = replace(config, worker_id=f"{config.worker_id}-{index}")
            config = replace(config, supervised=True)
            code = Worker(config).run()
        except BaseException:
            logger.exception("worker %d of supervisor %d failed", index, supervisor)
        finally:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        return code


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD's handler: its only use is the byte the wake-up fd receives."""


def _die_with(supervisor: int) -> None:
    """Have the kernel send this worker SIGTERM when its supervisor dies (Linux); where
    it cannot, the worker outlives a killed supervisor like any ``runworker``."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
