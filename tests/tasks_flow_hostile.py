"""Tasks for tests/worker/test_worker_flow_hostile.py: jobs of one concurrency key that check
the key's limit from the inside while they run, healthy ones and hostile ones.

While a job runs, it holds one of its key's ``limit`` *slot files* locked with
``flock``. A job that finds none of them free when it starts runs while ``limit``
other jobs of its key run: it writes an ``overlap`` line. This check does not depend
on how long the jobs take: of two jobs that overlap, the later one starts while the
earlier one holds its file. ``flock`` locks belong to an open file, not to a process,
so two threads of one process (the thread pool) exclude each other too; and the
kernel drops the lock of a process that dies (a slot child that ended itself, or was
killed with its worker), so a job that never reached its end frees its file anyway.

Each job also appends to ``<key>.log``, with one ``write()`` on a file opened with
``O_APPEND`` (lines of concurrent jobs never mix):

* ``start <job id> <attempt> <pid>`` once it holds a slot file (or found none);
* ``overlap <job id> <attempt> <pid>`` before that, when it found none;
* ``end <job id> <attempt> <pid>`` when its work returned;
* ``raised <job id> <attempt> <pid> <exception class>`` when it raised.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django_leasejobs import task
from tests.tasks_worker_flow import _append, read_lines
from tests.tasks_worker_poison import POISON


def _line(kind: str, context: Any, *more: str) -> str:
    return " ".join([kind, str(context.job_id), str(context.attempt), str(os.getpid()), *more])


@contextlib.contextmanager
def _running(context: Any, marker_dir: str, key: str, limit: int) -> Iterator[None]:
    """Hold one of ``key``'s slot files while the body runs (see the module docstring)."""
    log = f"{key}.log"
    held = None
    try:
        for index in range(int(limit)):
            fd = os.open(Path(marker_dir) / f"{key}.slot{index}", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held = fd
            break
        if held is None:
            _append(marker_dir, log, _line("overlap", context))
        _append(marker_dir, log, _line("start", context))
        try:
            yield
        except BaseException as exc:
            _append(marker_dir, log, _line("raised", context, type(exc).__name__))
            raise
        _append(marker_dir, log, _line("end", context))
    finally:
        if held is not None:
            os.close(held)  # releases the lock


@task(takes_context=True)
def keyed(
    context: Any, marker_dir: str, key: str, limit: int, hold: float = 0.0, meet: int = 0
) -> int:
    """A healthy job of ``key``: runs ``hold`` seconds and returns its attempt.

    With ``meet``, it also waits (at most 20 s) until ``meet`` jobs of the key have
    started: jobs without a limit then run at the same time for certain (the test that
    shows the overlap check sees overlaps)."""
    with _running(context, marker_dir, key, limit):
        time.sleep(float(hold))  # the job's work
        deadline = time.monotonic() + 20
        while meet and time.monotonic() < deadline:
            started = [ln for ln in read_lines(marker_dir, f"{key}.log") if ln.startswith("start ")]
            if len(started) >= meet:
                break
            time.sleep(0.01)
    return int(context.attempt)


@task(takes_context=True)
def keyed_until_gate(context: Any, marker_dir: str, key: str, limit: int) -> int:
    """A long job of ``key``: runs until ``<key>.gate`` exists (at most 60 s)."""
    gate = Path(marker_dir) / f"{key}.gate"
    with _running(context, marker_dir, key, limit):
        deadline = time.monotonic() + 60
        while not gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} never appeared")
            time.sleep(0.02)
    return int(context.attempt)


@task(takes_context=True, **POISON)
def keyed_harm(context: Any, marker_dir: str, key: str, limit: int, how: str) -> None:
    """A hostile job of ``key``, two attempts (``POISON``), each doing the same harm:
    ``os_exit`` ends its own process at once (status 3: no exception, no cleanup, no
    outcome), ``keyboard_interrupt`` and ``system_exit`` (``sys.exit(2)``) raise."""
    with _running(context, marker_dir, key, limit):
        if how == "os_exit":
            os._exit(3)
        if how == "keyboard_interrupt":
            raise KeyboardInterrupt
        if how == "system_exit":
            raise SystemExit(2)
        raise ValueError(f"no such harm: {how!r}")
