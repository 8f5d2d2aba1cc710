"""Retry control: the backoff policy (exponential with a cap and symmetric jitter), and
what the slot that ran a failed attempt decides about its exception (:func:`verdict`).

The exception object exists only in the slot (a child process or a pool thread), so the
task's ``retry_on`` / ``dont_retry_on`` are matched there, by ``isinstance`` (subclasses
count), a callable ``retry_backoff`` is called there, and a :class:`Verdict` goes back
to the worker, which turns it into the attempt's ending (``leases.rules.decide``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .exceptions import Retry

BACKOFF_KEYS = frozenset({"base", "factor", "cap", "jitter"})

MAX_DELAY = 30 * 86400.0
"""The longest wait, in seconds, a ``Retry(after=...)`` or a callable backoff may ask for."""

DEFAULT_MAX_SNOOZES = 10
"""Snoozes (``Retry`` raised) a job may take without using an attempt, unless its task
says otherwise (``max_snoozes``)."""

BackoffCallable = Callable[[int, BaseException], float]
"""A task's ``retry_backoff`` (deprecated) as a function: (failed attempt number, its
exception) -> seconds to wait."""

BackoffFunction = Callable[[BaseException, Any], "float | None"]
"""A task's ``backoff`` as a function (Django's coming spelling): (the exception, the
failed attempt's ``TaskResult``) -> seconds to wait, or None: not retried."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``n`` (1-based) is ``min(cap, base * factor ** (n - 1))`` ± jitter."""

    base: float = 2.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        problems = backoff_problems(
            {"base": self.base, "factor": self.factor, "cap": self.cap, "jitter": self.jitter}
        )
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_value(cls, value: Backoff | Mapping[str, Any] | None) -> Backoff:
        if value is None:
            return cls()
        if isinstance(value, Backoff):
            return value
        return cls(**{str(k): float(v) for k, v in value.items()})

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * self.factor**exponent
        except OverflowError:
            raw = self.cap
        raw = min(raw, self.cap)
        if self.jitter:
            spread = raw * self.jitter
            raw += (rng or random).uniform(-spread, spread)
        return max(raw, 0.0)


def backoff_problems(value: Any) -> list[str]:
    """Human-readable problems with a RETRY_BACKOFF value (empty when valid)."""
    if isinstance(value, Backoff):
        return []
    if not isinstance(value, Mapping):
        return [f"must be a dict with keys {sorted(BACKOFF_KEYS)}, got {type(value).__name__}"]
    problems = []
    unknown = set(value) - BACKOFF_KEYS
    if unknown:
        problems.append(f"unknown keys {sorted(map(str, unknown))}")
    for key in sorted(BACKOFF_KEYS & set(value)):
        v = value[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            problems.append(f"{key} must be a finite number, got {v!r}")
        elif key == "jitter" and not 0 <= v < 1:
            problems.append(f"jitter must be in [0, 1), got {v!r}")
        elif key == "factor" and v < 1:
            problems.append(f"factor must be >= 1, got {v!r}")
        elif key in ("base", "cap") and v < 0:
            problems.append(f"{key} must be >= 0, got {v!r}")
    return problems


class Decision(StrEnum):
    RETRY = "retry"
    """Retried after the backoff, when the job has attempts left."""
    FAIL = "fail"
    """Failed at once, whatever attempts are left."""
    SNOOZE = "snooze"
    """The task raised :class:`Retry`: run again later, without using an attempt while
    the job is within its ``max_snoozes``."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the slot that ran a failed attempt decided about its exception."""

    decision: Decision = Decision.RETRY
    reason: str = ""
    """Why, for the attempt row (empty: the default rule, retried while attempts last)."""
    seconds: float | None = None
    """SNOOZE: the wait asked for; RETRY: the callable backoff's delay (None: the
    dict policy's, computed by the worker)."""


RETRIED = Verdict()
"""The default verdict: retried after the policy's backoff while attempts last (also of
timeouts and kills, which have no exception to judge)."""


def verdict(
    task: Any,
    exc: BaseException,
    attempt: int,
    result_of: Callable[[], Any] | None = None,
) -> Verdict:
    """The verdict on ``exc``, raised by attempt ``attempt`` of ``task``; ``result_of``
    gives the failed attempt's ``TaskResult`` for a ``backoff`` function.

    Precedence: a valid :class:`Retry` snoozes; a class in ``dont_retry_on`` fails at
    once; with ``retry_on`` set, a class not in it fails at once; else retried. Never
    raises, whatever the exception or the task's callable do.
    """
    name = _class_name(exc)
    if isinstance(exc, Retry):
        try:
            return Verdict(Decision.SNOOZE, seconds=_seconds(getattr, exc, "after"))
        except _Refused as refused:
            reason = f"Retry(after=...) {refused}: counted as a failed attempt"
            return _retried(task, exc, attempt, reason, result_of)
    dont_retry_on = getattr(task, "dont_retry_on", ())
    if dont_retry_on and isinstance(exc, dont_retry_on):
        return Verdict(Decision.FAIL, f"not retried: {name} is in dont_retry_on")
    retry_on = getattr(task, "retry_on", None)
    if retry_on is not None and not isinstance(exc, retry_on):
        return Verdict(Decision.FAIL, f"not retried: {name} is not in retry_on")
    return _retried(task, exc, attempt, f"{name} is in retry_on" if retry_on else "", result_of)


def _retried(
    task: Any,
    exc: BaseException,
    attempt: int,
    reason: str,
    result_of: Callable[[], Any] | None,
) -> Verdict:
    function = getattr(task, "backoff", None)
    if callable(function):
        return _by_backoff(function, exc, reason, result_of)
    backoff = getattr(task, "retry_backoff", None)
    if not callable(backoff):
        return Verdict(Decision.RETRY, reason)
    try:
        return Verdict(Decision.RETRY, reason, _seconds(backoff, attempt, exc))
    except _Refused as refused:
        note = f"retry_backoff {refused}: used the backend's RETRY_BACKOFF"
        return Verdict(Decision.RETRY, f"{reason}; {note}" if reason else note)


def _by_backoff(
    function: Callable[..., Any],
    exc: BaseException,
    reason: str,
    result_of: Callable[[], Any] | None,
) -> Verdict:
    """The verdict of a ``backoff(exception, task_result)`` function: None fails the job."""
    try:
        value = function(exc, result_of() if result_of is not None else None)
    except Exception as raised:
        note = f"backoff raised {_class_name(raised)}: used the backend's RETRY_BACKOFF"
        return Verdict(Decision.RETRY, f"{reason}; {note}" if reason else note)
    if value is None:
        return Verdict(Decision.FAIL, "not retried: backoff returned None")
    try:
        return Verdict(Decision.RETRY, reason, _seconds(lambda: value))
    except _Refused as refused:
        note = f"backoff {refused}: used the backend's RETRY_BACKOFF"
        return Verdict(Decision.RETRY, f"{reason}; {note}" if reason else note)


class _Refused(Exception):
    """A wait that is not a number of seconds from 0 to MAX_DELAY (the message says why)."""


def _seconds(source: Callable[..., Any], *args: Any) -> float:
    """``source(*args)`` as a number of seconds from 0 to MAX_DELAY, else :class:`_Refused`."""
    try:
        value = source(*args)
    except Exception as exc:
        raise _Refused(f"raised {_class_name(exc)}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Refused(f"gave a {_class_name(value)}, not a number of seconds")
    try:
        seconds = float(value)  # a plain float: an int or float subclass may do anything
    except Exception:
        raise _Refused("gave a number out of range") from None
    if math.isnan(seconds):
        raise _Refused("gave NaN seconds")
    if seconds < 0:
        raise _Refused("gave a negative number of seconds")
    if seconds > MAX_DELAY:
        raise _Refused(f"gave more than the {MAX_DELAY:.0f} seconds allowed")
    return seconds


def _class_name(value: object) -> str:
    try:
        return str(type(value).__qualname__)[:200]
    except Exception:
        return "object"
