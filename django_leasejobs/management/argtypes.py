"""argparse ``type=`` validators shared by the management commands.

Django-free: this module imports nothing of Django's nor of the package's models, so a
script parses its options with these before Django is set up (bench/enqueue_split.py);
``tests/commands/test_argtypes.py`` keeps it so.
"""

from __future__ import annotations

import argparse
import math
import re
from datetime import UTC, datetime, timedelta


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


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_RE = re.compile(r"([0-9]+)([smhdw])")


def parse_age(value: str) -> timedelta:
    """argparse ``type=``: ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` -> a positive timedelta."""
    match = _AGE_RE.fullmatch(value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a whole number with a unit s, m, h, d or w (e.g. 7d), got {value!r}"
        )
    number = int(match.group(1))
    if number == 0:
        raise argparse.ArgumentTypeError(f"expected an age > 0, got {value!r}")
    try:
        return timedelta(seconds=number * _AGE_UNITS[match.group(2)])
    except OverflowError:
        raise argparse.ArgumentTypeError(f"age too large, got {value!r}") from None


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
