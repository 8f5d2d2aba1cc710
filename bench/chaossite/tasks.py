"""The chaos soak's tasks: one healthy task and one task per kind of poison.

Every task takes the job context and appends records to an append-only ledger: one
file per process (``ledger-<pid>.jsonl`` in ``CHAOS_LEDGER``), opened with
``O_APPEND``, each record one JSON line written with a single ``os.write`` and fsynced
before the task goes on. A record carries the job id and the attempt number from the
context, the worker id, the pid, ``time.monotonic()`` (one clock for every process of
the machine, the soak's fault log uses it too) and ``time.time()``.

* ``healthy(seconds)``: "start", sleep, "end", return which attempt succeeded;
* ``poison_*``: one task per way of breaking a worker (see ``POISON`` in bench/chaos.py);
  they write a "start" record and an "end" record just before they return or raise, so
  that the report can say what each attempt did. Those expected to fail allow 3 attempts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from django_leasejobs import task

LEDGER_DIR = os.environ.get("CHAOS_LEDGER", "")
POISON_ATTEMPTS = 3

_lock = threading.Lock()
_ledger: tuple[int, int] | None = None  # (pid, fd): a forked slot opens its own file


def _ledger_fd() -> int:
    global _ledger
    pid = os.getpid()
    with _lock:
        if _ledger is None or _ledger[0] != pid:
            path = os.path.join(LEDGER_DIR, f"ledger-{pid}.jsonl")
            _ledger = (pid, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        return _ledger[1]


def record(event: str, context: Any, **extra: Any) -> None:
    """Append one record (one line, one write, fsynced) to this process's ledger."""
    line = json.dumps(
        {
            "e": event,
            "job": context.job_id,
            "attempt": context.attempt,
            "worker": context.worker_id,
            "pid": os.getpid(),
            "mono": time.monotonic(),
            "wall": time.time(),
            **extra,
        },
        separators=(",", ":"),
    )
    fd = _ledger_fd()
    os.write(fd, (line + "\n").encode())
    os.fsync(fd)


def _done(context: Any) -> dict[str, Any]:
    record("end", context)
    return {"job": context.job_id, "attempt": context.attempt, "pid": os.getpid()}


@task(takes_context=True)
def healthy(context: Any, seconds: float) -> dict[str, Any]:
    record("start", context, planned=seconds)
    time.sleep(seconds)
    return _done(context)


# -- poison ------------------------------------------------------------------------------


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be turned into a string")


def _long_named_exception() -> type[Exception]:
    """An exception class whose path (module + qualname) is far longer than 512 characters."""
    kind = type("LongNamed", (Exception,), {"__module__": __name__})
    kind.__qualname__ = ".".join(["AVeryLongExceptionClassNameSegment"] * 20)  # 699 characters
    return kind


LongNamed = _long_named_exception()


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_nul_result(context: Any) -> str:
    """(a) returns a string holding a NUL character (jsonb cannot store \\u0000)."""
    record("start", context)
    record("end", context)
    return "bad \x00 result"


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_nul_error(context: Any) -> None:
    """(b) raises with a NUL character in the message (text columns cannot hold it)."""
    record("start", context)
    record("end", context, raising=True)
    raise ValueError("bad \x00 byte")


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_long_class(context: Any) -> None:
    """(c) raises an exception whose class path is longer than 512 characters."""
    record("start", context)
    record("end", context, raising=True)
    raise LongNamed("an exception class with a very long path")


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_surrogate(context: Any) -> None:
    """(d) raises with a lone surrogate in the message (not encodable as UTF-8)."""
    record("start", context)
    record("end", context, raising=True)
    raise ValueError("\ud800")


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_keyboard_interrupt(context: Any) -> None:
    """(e) raises KeyboardInterrupt (a BaseException, not an Exception)."""
    record("start", context)
    record("end", context, raising=True)
    raise KeyboardInterrupt


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_bad_str(context: Any) -> None:
    """(f) raises an exception whose ``__str__`` raises."""
    record("start", context)
    record("end", context, raising=True)
    raise _BadStr()


@task(takes_context=True)  # expected to succeed: as many attempts as a healthy job
def poison_nul_progress(context: Any, seconds: float) -> dict[str, Any]:
    """(g) reports progress with a NUL character, then runs ``seconds`` (about 2 leases)."""
    record("start", context, planned=seconds)
    context.set_progress(0.5, "bad \x00 progress")
    time.sleep(seconds)
    return _done(context)


@task(takes_context=True, max_attempts=POISON_ATTEMPTS)
def poison_kwargs_array(context: Any, **kwargs: Any) -> dict[str, Any]:
    """(h) a normal task; the soak rewrites its row's ``kwargs`` into a JSON array."""
    record("start", context)
    return _done(context)
