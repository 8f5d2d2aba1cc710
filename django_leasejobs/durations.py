"""Durations given by users: a number of seconds or a ``timedelta``, checked once.

The keys' time windows (``unique_for``, ``debounce``) and result retention
(``result_ttl``, ``QUEUE_RESULT_TTL``) all take one; no database here.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

MAX_DURATION = 10 * 366 * 86400.0
"""The longest window or retention (about ten years): every database's interval
arithmetic stays far inside its range."""


def duration_problem(value: Any) -> str:
    """Why ``value`` is not a duration ('' when it is): seconds (int or float) or a
    ``timedelta``, > 0 and at most :data:`MAX_DURATION`."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return (
            f"must be a number of seconds or a datetime.timedelta, got {_shown(value)} "
            f"({type(value).__name__})"
        )
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        return f"must be more than 0 seconds, got {_shown(value)}"
    if seconds > MAX_DURATION:
        return f"must be at most {MAX_DURATION:,.0f} seconds (about ten years), got {_shown(value)}"
    return ""


def as_seconds(value: float | timedelta) -> float:
    """A duration that passed :func:`duration_problem`, in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _shown(value: Any) -> str:
    try:
        return repr(value)[:200]
    except Exception:
        return f"a {type(value).__name__} that cannot be shown"
