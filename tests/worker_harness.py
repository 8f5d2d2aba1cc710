"""Start real ``manage.py runworker`` subprocesses for tests, watch them, clean them up.

Use the ``workers`` fixture (tests/conftest.py)::

    w = workers.start(options={"LEASE_DURATION": 2}, args=["--concurrency", "2"])
    w.wait_for_log("started")
    ...
    w.terminate(); assert w.wait(timeout=10) == 0

Every process a test started (workers, their slots, anything the jobs spawned) is
SIGKILLed at teardown, found through psutil, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from tests import waiting

REPO_ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = REPO_ROOT / "testproject" / "manage.py"

# Short timings for worker tests (seconds). Recovery after a crash takes about
# LEASE_DURATION + STALE_LOCK_INTERVAL.
FAST_OPTIONS: dict[str, Any] = {
    "LEASE_DURATION": 2.0,
    "HEARTBEAT_INTERVAL": 0.3,
    "STALE_LOCK_INTERVAL": 0.3,
    "POLL_INTERVAL": 0.2,
    "LOCK_LOST_GRACE": 1.0,
    "RETRY_BACKOFF": {"base": 0, "factor": 1, "cap": 0, "jitter": 0},
}


IDLE_MAIN_LOOP = ("WITH picked AS", "SELECT CASE WHEN EXISTS")
"""The statements an idle main loop's connection ends with (``pg_stat_activity.query``):
its claim, and after an empty claim the check whether a job under flow control is due
or (listening) the next-due lookup (``leases.seconds_to_next_due``)."""


def pid_alive(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class WorkerProcess:
    """One ``runworker`` subprocess with its output collected line by line."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_for_log(self, text: str, timeout: float = 20.0, count: int = 1) -> None:
        waiting.wait_until(
            lambda: self.output.count(text) >= count or self.popen.poll() is not None,
            timeout,
            what=f"log line {text!r} x{count}",
        )
        if self.output.count(text) < count:
            raise AssertionError(
                f"worker exited ({self.popen.returncode}) before logging {text!r}:\n{self.output}"
            )

    def slot_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.popen.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code


class Workers:
    """Factory for worker subprocesses bound to the test database."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.started: list[WorkerProcess] = []
        self._pids: set[int] = set()

    def start(
        self,
        options: dict[str, Any] | None = None,
        args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        wait_started: bool = True,
    ) -> WorkerProcess:
        merged = {**FAST_OPTIONS, **(options or {})}
        process_env = {
            **self.env,
            "LEASEJOBS_TEST_OPTIONS": json.dumps(merged),
            **(env or {}),
        }
        popen = subprocess.Popen(
            [sys.executable, str(MANAGE_PY), "runworker", *args],
            cwd=REPO_ROOT,
            env=process_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        worker = WorkerProcess(popen)
        self.started.append(worker)
        if wait_started:
            worker.wait_for_log("started: backend=")
        self._remember_tree(worker)
        return worker

    def _remember_tree(self, worker: WorkerProcess) -> None:
        self._pids.add(worker.pid)
        self._pids.update(worker.slot_pids())

    def track(self, pids: Iterable[int]) -> None:
        """Also kill these (for example grandchildren a job reported) at teardown."""
        self._pids.update(pids)

    def cleanup(self) -> None:
        # Workers run in their own sessions: everything in a worker's session is ours too
        # (slots whose worker died before we listed them, grandchildren of jobs).
        sessions = {worker.pid for worker in self.started}
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) in sessions:
                    self._pids.add(process.pid)
            except (ProcessLookupError, PermissionError, psutil.Error):
                pass
        for worker in self.started:
            if worker.popen.poll() is None:
                self._remember_tree(worker)
                try:
                    for child in psutil.Process(worker.pid).children(recursive=True):
                        self._pids.add(child.pid)
                except psutil.NoSuchProcess:
                    pass
        for pid in self._pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for worker in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.popen.wait(timeout=10)
            worker._reader.join(timeout=5)
            if worker.popen.stdout is not None and not worker._reader.is_alive():
                # (Closing while the reader still blocks on it would hang.)
                worker.popen.stdout.close()
