"""Run N ``runworker`` processes for the demo and restart any that dies, until stopped.

Stopping (SIGTERM, SIGINT or SIGHUP) sends every worker one SIGTERM, so each finishes
its running jobs (or releases them after its shutdown timeout) before exiting. A second
SIGINT (Ctrl-C again) sends another SIGTERM, which makes the workers stop their jobs
now and release them; a repeated SIGTERM or SIGHUP changes nothing (a closing terminal
sends SIGHUP twice, and scripts/demo sends SIGTERM after the terminal's own signal).

The workers run in sessions of their own, so the terminal's signals reach this process
only (a worker must get one SIGTERM, not the terminal's signal plus ours). On Linux they
also get SIGTERM if this process dies without stopping them (SIGKILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

_PR_SET_PDEATHSIG = 1


def _term_when_parent_dies() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when this process dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # died before the prctl: nobody would tell us
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Command(BaseCommand):
    help = "Demo only: keep N workers running (restarting crashed ones) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args: Any, workers: int, concurrency: int, **options: Any) -> None:
        # The signal handler only sets these flags; the main thread acts on them. (A
        # handler runs in the main thread, between two bytecodes: one that took a lock
        # the main thread holds, threading.Event's for one, would deadlock.)
        flags = _Flags()
        procs: dict[int, subprocess.Popen[bytes]] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not flags.stop:
                flags.stop = True
            elif signum == signal.SIGINT:  # Ctrl-C again: the workers stop their jobs now
                flags.force = True

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, on_signal)
        manage = [sys.executable, sys.argv[0]]
        generation = dict.fromkeys(range(workers), 0)
        preexec = _term_when_parent_dies()

        def start(slot: int) -> None:
            generation[slot] += 1
            name = f"demo-worker-{slot + 1}.{generation[slot]}"
            procs[slot] = subprocess.Popen(
                [*manage, "runworker", "--concurrency", str(concurrency), "--worker-id", name],
                start_new_session=True,  # the terminal's signals reach us only (see above)
                preexec_fn=preexec,
            )

        def terminate() -> None:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)

        for slot in range(workers):
            if not flags.stop:
                start(slot)
        while not _sleep_until_stopped(flags, RESTART_CHECK):
            for slot, proc in list(procs.items()):
                if proc.poll() is not None:
                    with contextlib.suppress(OSError):  # the terminal may be gone
                        self.stderr.write(
                            f"worker {slot + 1} exited ({proc.returncode}); starting a new "
                            "one (its jobs come back when their leases expire)"
                        )
                    start(slot)
        terminate()
        forced = False
        deadline = time.monotonic() + 60
        while any(proc.poll() is None for proc in procs.values()):
            if time.monotonic() >= deadline:
                for proc in procs.values():
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                break
            if flags.force and not forced:
                forced = True
                terminate()
            time.sleep(FLAG_POLL)


RESTART_CHECK = 1.0
"""Seconds between two looks for a worker that died."""

FLAG_POLL = 0.1
"""Seconds between two looks at the signal flags."""


class _Flags:
    """What the signal handler asks for: ``stop`` (the first signal), ``force`` (a
    second Ctrl-C). Plain attributes: setting one takes no lock."""

    stop = False
    force = False


def _sleep_until_stopped(flags: _Flags, seconds: float) -> bool:
    """Sleep up to ``seconds`` in short steps (a signal cannot wake ``time.sleep`` early,
    it resumes after the handler), returning early with True once ``flags.stop`` is
    set; False when the time is up without it."""
    deadline = time.monotonic() + seconds
    while not flags.stop:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(FLAG_POLL, left))
    return True
