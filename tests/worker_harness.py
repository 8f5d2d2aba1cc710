"""Start real ``manage.py runworker`` subprocesses for tests, watch them, clean them up.

Use the ``workers`` fixture (tests/conftest.py)::

    w = workers.start(options={"LEASE_DURATION": 2}, args=["--concurrency", "2"])
    # (start() returned once the worker sent ``worker_started``)
    [lost] = w.wait_for_event("lease_lost", job_id=job_id)
    ...
    w.terminate(); assert w.wait(timeout=10) == 0

Tests wait on the events the worker sends (its signals, written to a file of its own by
``tests/worker_events.py``), never on its log lines; ``output`` is there to assert what
an operator reads, after the fact. Every process a test started (workers, their slots,
anything the jobs spawned) is SIGKILLed at teardown, found through psutil, so a failing
test leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from tests import waiting, worker_events

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


PREFETCHING_OPTIONS: dict[str, Any] = {"LEASE_DURATION": 10.0}
"""For a test that needs the worker to prefetch: a worker claims for its free slots only
while a database round takes over a tenth of ``LEASE_DURATION``
(``dispatch.SLOW_ROUND_SHARE``), and on a loaded CI machine SQLite rounds took 0.22 to
0.25 s, over the 0.2 s of ``FAST_OPTIONS``' 2 s leases (2026-11-29)."""


STARTUP_WAIT = 60.0
"""How long ``Workers.start`` waits for ``worker_started``: about 1 s on a quiet machine,
over 20 s seen on a loaded one two to three times slower (CI, 2026-11-29)."""


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
    """One ``runworker`` subprocess with its output collected line by line.

    ``output`` and ``lines`` hold every whole line the worker wrote before they were
    read (they take what waits in the pipe first): a log line written before an event
    was sent is there once the event is seen, so a test may assert on it after the fact.
    """

    def __init__(self, popen: subprocess.Popen[str], events_path: Path) -> None:
        self.popen = popen
        self.events_path = events_path
        """The file this worker writes its events to (``tests/worker_events.py``)."""
        assert popen.stdout is not None
        self._fd = popen.stdout.fileno()  # read raw: no buffer between the pipe and us
        os.set_blocking(self._fd, False)
        self._lines: list[str] = []
        self._partial = b""
        self._eof = False
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Keep the pipe drained while nobody asks (a full pipe would block the worker)."""
        poller = select.poll()  # (not select.select: a long session's fds pass 1024)
        poller.register(self._fd, select.POLLIN)
        while True:
            poller.poll(500)
            with self._lock:
                self._drain()
                if self._eof:
                    return

    def _drain(self) -> None:
        """Take what waits in the pipe (with ``_lock`` held)."""
        while not self._eof:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
                chunk = b"\n" if self._partial else b""
            *whole, self._partial = (self._partial + chunk).split(b"\n")
            self._lines.extend(line.decode(errors="replace") for line in whole)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def lines(self) -> list[str]:
        with self._lock:
            self._drain()
            return list(self._lines)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def events(self, name: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """The events the worker sent so far, in order: those named ``name`` (all when
        None) whose fields equal ``match`` (``job_id=3``, ``reason="SIGTERM"``...)."""
        return worker_events.matching(self.events_path, name, **match)

    def wait_for_event(
        self, name: str, timeout: float = 20.0, count: int = 1, **match: Any
    ) -> list[dict[str, Any]]:
        """Wait until the worker sent ``count`` events ``name`` matching ``match``, and
        return all it sent so far. Fails at once, with the worker's output, when the
        worker exits first."""
        wanted = f"event {name} {match or ''} x{count}"

        def sent() -> list[dict[str, Any]] | None:
            exited = self.popen.poll() is not None  # (before reading: the file is complete)
            found = self.events(name, **match)
            if len(found) >= count:
                return found
            if exited:
                raise AssertionError(
                    f"worker exited ({self.popen.returncode}) before sending {wanted}; "
                    f"its events: {self._event_names()}\n{self.output}"
                )
            return None

        return waiting.wait_until(
            sent,
            timeout,
            what=lambda: f"{wanted}; its events: {self._event_names()}\n{self.output}",
        )

    def _event_names(self) -> str:
        names = [e["event"] for e in self.events() if e["event"] != "heartbeat_sent"]
        return " ".join(names[-40:])

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
        self._events_dir = Path(tempfile.mkdtemp(prefix="leasejobs-events-"))

    def start(
        self,
        options: dict[str, Any] | None = None,
        args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        wait_started: bool = True,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> WorkerProcess:
        """Start ``runworker`` with ``FAST_OPTIONS`` updated by ``options``; unless
        ``wait_started`` is false, return once it sent ``worker_started``."""
        merged = {**FAST_OPTIONS, **(options or {})}
        events_path = self._events_dir / f"worker-{len(self.started)}.jsonl"
        process_env = {
            **self.env,
            "LEASEJOBS_TEST_OPTIONS": json.dumps(merged),
            worker_events.EVENTS_ENV: str(events_path),
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
            preexec_fn=preexec_fn,  # (nohup: SIGHUP ignored across the exec)
        )
        worker = WorkerProcess(popen, events_path)
        self.started.append(worker)
        if wait_started:
            worker.wait_for_event("worker_started", timeout=STARTUP_WAIT)
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
        shutil.rmtree(self._events_dir, ignore_errors=True)
