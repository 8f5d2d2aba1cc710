"""Flow-control values: rates (``"50/m"``), concurrency limits, and the rules a claim obeys.

Nothing here touches the database. ``conf.py`` reads the backend's ``QUEUE_LIMITS``
and ``QUEUE_RATE_LIMITS`` into :class:`FlowRules`, ``lease_task.py`` checks a task's
``concurrency_limit``, ``concurrency_key`` and ``rate_limit``, and the claim
(``leases/flow.py``) enforces them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
"""The periods a rate may name, in seconds."""
MAX_RATE_COUNT = 1_000_000
"""More starts than this per period is no limit: refused as a mistake."""
_RATE = re.compile(r"([0-9]+)/([smh])")

KEY_GROUP = "key:"
TASK_GROUP = "task:"
"""Prefixes of ``Job.flow_group``: a job limited by its concurrency key is in the group
``"key:" + key``; one limited by its task (a task-wide concurrency limit, or a rate limit)
in ``"task:" + task path``. The prefixes keep a key from ever naming a task's group."""
MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` job starts in any window of ``period`` seconds."""

    count: int
    period: float
    text: str

    def __str__(self) -> str:
        return self.text


def rate_problem(value: Any) -> str:
    """Why ``value`` is not a rate (``"N/s"``, ``"N/m"`` or ``"N/h"``, N >= 1); '' if it is."""
    if not isinstance(value, str):
        return f'must be a string such as "50/m" ("N/s", "N/m" or "N/h"), got {value!r}'
    match = _RATE.fullmatch(value.strip())
    if match is None:
        return f'must look like "50/m" ("N/s", "N/m" or "N/h" with N a whole number), got {value!r}'
    count = int(match.group(1))
    if not 1 <= count <= MAX_RATE_COUNT:
        return f"must allow between 1 and {MAX_RATE_COUNT:,} starts per period, got {value!r}"
    return ""


def parse_rate(value: Any) -> Rate:
    """``value`` as a :class:`Rate`; ValueError (saying why) when it is not one."""
    problem = rate_problem(value)
    if problem:
        raise ValueError(f"rate_limit {problem}")
    match = _RATE.fullmatch(value.strip())
    assert match is not None  # noqa: S101 - rate_problem matched it
    count, unit = int(match.group(1)), match.group(2)
    return Rate(count=count, period=PERIODS[unit], text=f"{count}/{unit}")


def limit_problem(value: Any) -> str:
    """Why ``value`` is not a concurrency limit (a whole number >= 1); '' if it is."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a whole number >= 1, got {value!r}"
    return ""


@dataclass(frozen=True, slots=True)
class FlowRules:
    """A backend's queue-wide limits, which every claim of its queues obeys."""

    queue_limits: Mapping[str, int] = field(default_factory=dict)
    """Queue name -> most running jobs of that queue (``QUEUE_LIMITS``)."""
    queue_rates: Mapping[str, Rate] = field(default_factory=dict)
    """Queue name -> most job starts per period (``QUEUE_RATE_LIMITS``)."""
    limited_queues: frozenset[str] = field(init=False)
    """The queues with either (made once: every database round reads it)."""

    def __post_init__(self) -> None:
        limited = frozenset(self.queue_limits) | frozenset(self.queue_rates)
        object.__setattr__(self, "limited_queues", limited)


def task_group(task_path: str) -> str:
    return TASK_GROUP + task_path


def key_group(key: str) -> str:
    return KEY_GROUP + key


def describe_group(group: str) -> str:
    """``Job.flow_group`` in words: ``key "customer-1"`` or ``task app.tasks.send``."""
    if group.startswith(KEY_GROUP):
        return f"key {group[len(KEY_GROUP) :]!r}"
    if group.startswith(TASK_GROUP):
        return f"task {group[len(TASK_GROUP) :]}"
    return group


def queue_scope(queue: str) -> str:
    """The rate scope of a queue-wide rate limit (``RateStart.scope``)."""
    return "queue:" + queue
