"""The child process behind one process-pool slot.

A child is forked once and runs many jobs, one at a time, each sent over a pipe.
It lives in its own process group, so the parent can kill the job together with
anything it spawned (``killpg``). A watchdog thread reads a *lifeline* pipe whose
write end only the parent holds: when the parent dies, even by SIGKILL, the read
returns EOF and the watchdog kills the whole group, so a job never outlives its
worker and never overlaps a re-run of itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from django.db import close_old_connections, connections

from ..tracing import flush_spans
from .execution import JobSpec, execute

# Messages: child -> parent
MSG_READY = "ready"
MSG_PROGRESS = "progress"
MSG_OUTCOME = "outcome"


def _watch_lifeline(lifeline_fd: int) -> None:
    try:
        while os.read(lifeline_fd, 1):
            pass
    except OSError:
        pass
    # The parent is gone: take the job and everything it started down with us.
    os.killpg(os.getpgrp(), signal.SIGKILL)


def child_main(conn: Connection, lifeline_fd: int, close_fds: list[int]) -> None:
    """Entry point of a forked slot process. Never returns normally."""
    with contextlib.suppress(OSError):  # the parent may have set it already
        os.setpgid(0, 0)
    for fd in close_fds:  # the parent's ends of other slots' pipes
        with contextlib.suppress(OSError):
            os.close(fd)
    # The parent's handlers (graceful shutdown) must not run here; a job may install its own.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    # Connections inherited from the parent belong to the parent: forget them unclosed.
    for alias in connections:
        connections[alias].connection = None  # type: ignore[union-attr]
    threading.Thread(
        target=_watch_lifeline, args=(lifeline_fd,), name="leasejobs-lifeline", daemon=True
    ).start()

    def progress(lease: tuple[int, int], fraction: float | None, message: str | None) -> None:
        conn.send((MSG_PROGRESS, lease, fraction, message))

    conn.send((MSG_READY, os.getpid()))
    code = 0
    try:
        while True:
            try:
                spec: Any = conn.recv()
            except EOFError:
                break
            if spec is None:
                break
            assert isinstance(spec, JobSpec)  # noqa: S101 - protocol invariant
            close_old_connections()
            outcome = execute(spec, progress_sink=progress)
            conn.send((MSG_OUTCOME, outcome))
    except BaseException:
        code = 1
    finally:
        try:
            flush_spans()
            connections.close_all()
        finally:
            os._exit(code)
