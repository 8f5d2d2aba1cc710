"""Run N ``runworker`` processes for the demo and restart any that dies, until stopped.

Stopping (SIGTERM or SIGINT) sends every worker one SIGTERM, so each finishes its
running jobs (or releases them after its shutdown timeout) before exiting.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Demo only: keep N workers running (restarting crashed ones) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args: Any, workers: int, concurrency: int, **options: Any) -> None:
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        manage = [sys.executable, sys.argv[0]]
        procs: dict[int, subprocess.Popen[bytes]] = {}
        generation = dict.fromkeys(range(workers), 0)

        def start(slot: int) -> None:
            generation[slot] += 1
            name = f"demo-worker-{slot + 1}.{generation[slot]}"
            procs[slot] = subprocess.Popen(
                [*manage, "runworker", "--concurrency", str(concurrency), "--worker-id", name],
                start_new_session=True,  # Ctrl-C reaches us only; we stop them gracefully
            )

        for slot in range(workers):
            start(slot)
        while not stop.wait(1.0):
            for slot, proc in list(procs.items()):
                if proc.poll() is not None:
                    self.stderr.write(
                        f"worker {slot + 1} exited ({proc.returncode}); starting a new one "
                        "(its jobs come back when their leases expire)"
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
