"""Hostile tasks for tests/worker/test_worker_poison.py: outcomes a database cannot store as they
are, exceptions that break while being described, and progress no column can hold.

Each one is a bulkhead test: the job must end in a terminal state with an attempt row
saying why, while the healthy jobs beside it run on the same worker.
"""

from __future__ import annotations

import time
from typing import Any

from django_leasejobs import task

# Poison fails on its first attempt when it raises: two attempts show the retry path works
# too, without making the tests slow.
POISON = {"max_attempts": 2, "backoff": {"base": 0, "jitter": 0}}


@task(**POISON)
def return_nul() -> str:
    return "before \x00 after"


@task(**POISON)
def raise_nul() -> None:
    raise ValueError("bad \x00 byte")


def _long_named_exception() -> type[Exception]:
    kind = type("LongNamed", (Exception,), {})
    kind.__qualname__ = "Very" + "Long" * 200 + "Name"  # a class path of over 800 characters
    return kind


LONG_NAMED = _long_named_exception()


@task(**POISON)
def raise_long_class_path() -> None:
    raise LONG_NAMED("its class path does not fit the error_class column")


@task(**POISON)
def raise_lone_surrogate() -> None:
    raise ValueError("half a pair: \ud800")


@task(**POISON)
def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception raises")


@task(**POISON)
def raise_unprintable() -> None:
    raise Unprintable()


@task(takes_context=True)
def progress_nul(context: Any, seconds: float) -> str:
    """Report progress whose message has a NUL and a lone surrogate, then keep running
    until a heartbeat has stored that message (escaped) on the job's row, and succeed:
    "finished" once it was stored, "not stored" when ``seconds`` passed without it."""
    from django_leasejobs.models import Job

    context.set_progress(0.5, "bad \x00 progress \ud800")
    stored = Job.objects.filter(pk=context.job_id, progress_message="bad \\x00 progress \\ud800")
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:  # the job's own work: heartbeats renew meanwhile
        if stored.exists():
            return "finished"
        time.sleep(0.05)
    return "not stored"
