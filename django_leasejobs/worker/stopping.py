"""How a worker stops: the state of its shutdown and the rules of stop signals.

Owned by the main loop (``loop.py``), which acts on the answers: it stops claiming once
the shutdown began, and stops the running jobs (releasing them) once it is forced or
past its deadline. A signal handler never touches this: it posts ``StopAsked``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from .config import SAME_STOP_WINDOW
from .inbox import StopAsked

StopAnswer = Literal["ignored", "graceful", "forced"]


@dataclass(slots=True)
class Shutdown:
    timeout: float
    """Seconds the running jobs may take to finish (``--shutdown-timeout``)."""
    supervised: bool
    """Forked by ``runworker --processes``: a repeat within ``SAME_STOP_WINDOW`` is the
    same request heard twice."""
    stopping: bool = False
    forced: bool = False
    deadline: float | None = None
    heard_at: float = -SAME_STOP_WINDOW
    """When the signal that began the stop arrived (monotonic)."""

    def begin(self) -> None:
        """Stop claiming and let the running jobs finish, until the deadline (a stop
        signal, or ``--burst`` / ``--max-jobs`` done)."""
        self.stopping = True
        self.deadline = time.monotonic() + self.timeout

    def asked(self, message: StopAsked) -> StopAnswer:
        """What a stop signal means now: the first begins a graceful stop, a second one
        forces it. A repeated SIGHUP never forces (a closing terminal sends two), nor a
        repeat a supervised worker hears within the window."""
        if message.signal_name == "SIGHUP" and self.stopping:
            return "ignored"
        if self.supervised and message.at - self.heard_at < SAME_STOP_WINDOW:
            return "ignored"
        if self.stopping:
            self.forced = True
            return "forced"
        self.heard_at = message.at
        self.begin()
        return "graceful"

    def jobs_must_stop(self) -> bool:
        """Stop the running jobs now: forced, or past the deadline."""
        return self.stopping and (self.forced or time.monotonic() >= (self.deadline or 0.0))
