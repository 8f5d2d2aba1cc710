"""The run file: every start and every end of a bench job, one line each.

A job appends ``"s <n> <time.time()>"`` when it starts and ``"e <n> <time.time()>"`` when
it ends, each with one ``os.write`` to the file named by ``$ASYNC_BENCH_RUNS``, opened
``O_APPEND`` (a line is never torn, whatever process or thread writes it). ``n`` is the
job's index, given to it as an argument: the bench enqueues ``0 .. N-1``, and reads the
file back (``read``) to check that each ran exactly once.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RUNS_ENV = "ASYNC_BENCH_RUNS"

_fd: int | None = None


def mark(kind: str, n: int) -> None:
    """Append ``"<kind> <n> <time.time()>"`` to the run file (``kind``: ``s`` or ``e``)."""
    global _fd
    if _fd is None:
        _fd = os.open(os.environ[RUNS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{kind} {n} {time.time():.6f}\n".encode())


@dataclass
class Runs:
    """What a run file says: starts and ends per job index, their times, bad lines."""

    starts: Counter[int] = field(default_factory=Counter)
    ends: Counter[int] = field(default_factory=Counter)
    start_times: list[float] = field(default_factory=list)
    end_times: list[float] = field(default_factory=list)
    bad_lines: int = 0

    def problems(self, jobs: int) -> list[str]:
        """Every way the runs differ from "each of the ``jobs`` indexes started once and
        ended once", with a few examples."""
        expected = set(range(jobs))
        found: list[str] = []
        never = sorted(expected - set(self.starts))
        twice = sorted(n for n, count in self.starts.items() if count > 1)
        unended = sorted(n for n in self.starts if self.ends[n] < self.starts[n])
        strangers = sorted((set(self.starts) | set(self.ends)) - expected)
        for label, ns in (
            ("never started", never),
            ("started more than once", twice),
            ("started but never ended", unended),
            ("not enqueued by the bench", strangers),
        ):
            if ns:
                found.append(f"{len(ns)} jobs {label} (e.g. {ns[:5]})")
        if self.bad_lines:
            found.append(f"{self.bad_lines} unreadable lines in the run file")
        return found


def read(path: Path) -> Runs:
    runs = Runs()
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        parts = line.split()
        try:
            kind, n, at = parts[0], int(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            runs.bad_lines += 1
            continue
        if kind == "s":
            runs.starts[n] += 1
            runs.start_times.append(at)
        elif kind == "e":
            runs.ends[n] += 1
            runs.end_times.append(at)
        else:
            runs.bad_lines += 1
    return runs
