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
import threading
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
        stop = threading.Event()
        procs: dict[int, subprocess.Popen[bytes]] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not stop.is_set():
                stop.set()
            elif signum == signal.SIGINT:  # Ctrl-C again: the workers stop their jobs now
                for proc in procs.values():
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)

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

        for slot in range(workers):
            if not stop.is_set():
                start(slot)
        while not stop.wait(1.0):
            for slot, proc in list(procs.items()):
                if proc.poll() is not None:
                    with contextlib.suppress(OSError):  # the terminal may be gone
                        self.stderr.write(
                            f"worker {slot + 1} exited ({proc.returncode}); starting a new "
                            "one (its jobs come back when their leases expire)"
                        )
                    start(slot)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        for proc in procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
