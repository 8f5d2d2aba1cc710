"""argparse ``type=`` validators shared by the management commands."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime, timedelta

from ..pruning import parse_age


def non_negative_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {value!r}")
    return seconds


def positive_seconds(value: str) -> float:
    seconds = non_negative_seconds(value)
    if seconds == 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return seconds


def _whole_number(value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value!r}")
    return number


def positive_int(value: str) -> int:
    return _whole_number(value, 1)


def non_negative_int(value: str) -> int:
    return _whole_number(value, 0)


def moment(value: str) -> datetime | timedelta:
    """A point in time: an ISO 8601 date or date and time (UTC when it names no offset),
    or an age such as ``30m``, ``12h``, ``7d`` (that long before now, on the database's
    clock: the caller turns it into a time)."""
    text = value.strip()
    if text[-1:] in ("s", "m", "h", "d", "w") and text[:-1].isdigit():
        return parse_age(text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO date or time (2024-05-01, 2024-05-01T12:00:00+02:00) or an "
            f"age (30m, 12h, 7d), got {value!r}"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
