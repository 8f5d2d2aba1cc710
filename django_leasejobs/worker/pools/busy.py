"""Whether a job holds a slot's event loop, seen from the worker's side.

The child's monitor thread (``child.py``) measures how long the loop has not ticked, but
it needs the GIL to look: a native call that holds the GIL (a long ``sum()``, a regular
expression, a C extension's loop) starves it, and the loop may be held for good without
the monitor counting it. The worker, another process, looks too: the loop's last tick
(``values[LOOP_NS]``) against the CPU time of the loop's thread (``/proc``, Linux). A
loop that has not ticked while its thread kept running is held by a busy job; one whose
thread did not run (the machine paused the slot, or the job waits in a blocking call,
which the monitor counts) is not, by this measure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..child import LOOP_NS, LOOP_THREAD

SAMPLE_EVERY = 0.2
"""The worker reads the loop thread's CPU time at most this often: CPU time grows in
clock ticks (10 ms), so closer looks could see a busy thread stand still."""

BUSY_SHARE = 0.25
"""Between two samples, the loop's thread ran at least this share of the time: busy (a
busy machine gives a thread less than all of it; an idle loop's thread uses next to
nothing)."""

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu(pid: int, thread: int) -> float | None:
    """CPU seconds (user and system) thread ``thread`` of process ``pid`` has used; None
    when it cannot be read (not Linux, the process gone)."""
    try:
        with open(f"/proc/{pid}/task/{thread}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # after the name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


@dataclass(slots=True)
class LoopWatch:
    """The worker's view of one slot's event loop: the tick it saw at its last sample,
    when, the CPU time of the loop's thread then, and how long it has seen the loop held
    by a busy thread."""

    mark: int = 0
    sampled_at: float = 0.0
    cpu: float | None = None
    busy: float = 0.0

    def held_busy(self, pid: int, values: Any, now: float) -> float:
        """Seconds the loop has gone without a tick while its thread ran (``now``:
        ``time.monotonic()``). Each sample where the loop did not tick counts the time
        since the last one (at most two samples' worth, as the child's monitor counts)
        if the thread ran ``BUSY_SHARE`` of it, and nothing if it did not: a paused slot,
        or a loop waiting in a blocking call (which the monitor counts), is not busy. A
        tick starts again from 0."""
        if now - self.sampled_at < SAMPLE_EVERY:
            return self.busy
        mark, thread = int(values[LOOP_NS]), int(values[LOOP_THREAD])
        cpu = thread_cpu(pid, thread) if mark and thread else None
        if mark != self.mark or cpu is None or self.cpu is None:
            self.busy = 0.0
        elif cpu - self.cpu >= BUSY_SHARE * (now - self.sampled_at):
            self.busy += min(now - self.sampled_at, 2 * SAMPLE_EVERY)
        self.mark, self.sampled_at, self.cpu = mark, now, cpu
        return self.busy
