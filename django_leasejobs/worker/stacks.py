"""``kill -USR1``: every thread's stack of a worker or of a slot, to standard error.

Printed by a Python signal handler, so from the main thread between two bytecodes, with
the interpreter's own view of every thread (``sys._current_frames``). Python's
``faulthandler`` prints from inside the signal, reading the frames of threads that keep
running meanwhile: a worker whose other thread was importing a module at that moment
crashed (SIGSEGV, Python 3.13). The cost of doing it safely: a main thread held inside
a long call into C code prints when that call returns (``py-spy dump --pid`` sees it at
once).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from types import FrameType


def print_stacks(signum: int, frame: FrameType | None) -> None:
    """The signal handler: each thread's stack, most recent call first, in
    ``faulthandler``'s layout (with the thread's name). It never raises: it runs inside
    whatever the main thread was doing (the worker's main loop, a slot's job), which
    may itself be writing to standard error (a reentrant write raises RuntimeError)."""
    with contextlib.suppress(Exception):
        sys.stderr.write(_stacks())
        sys.stderr.flush()


def _stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines: list[str] = []
    for ident, top in sys._current_frames().items():
        lines.append(f"Thread {ident:#018x} [{names.get(ident, '?')}] (most recent call first):\n")
        stack = traceback.StackSummary.extract(traceback.walk_stack(top), lookup_lines=False)
        lines.extend(f'  File "{f.filename}", line {f.lineno} in {f.name}\n' for f in stack)
        lines.append("\n")
    return "".join(lines)
