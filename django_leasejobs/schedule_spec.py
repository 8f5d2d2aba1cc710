"""Schedules as declared in ``OPTIONS["SCHEDULES"]``: typed, checked, and their ticks.

``parse_schedules`` never raises: it returns the valid schedules plus a problem for each
invalid one (the system checks report them with stable ids, and the worker refuses to
start with them). Whether a schedule's task exists, and whether the backend serves its
queue, needs the apps loaded: ``task_problem`` answers that at check time.

Ticks are instants (aware UTC datetimes). A cron schedule's ticks come from
`cronsim <https://github.com/cuu508/cronsim>`_, evaluated in the schedule's time zone
with Debian cron's documented DST rules; an ``every`` schedule ticks at the whole
multiples of its period since the Unix epoch, so every worker computes the same ticks.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .exceptions import InvalidTaskArguments
from .serialization import json_arguments

CatchUp = Literal["latest", "none", "all"]
CATCH_UP_POLICIES: tuple[str, ...] = ("latest", "none", "all")
DEFAULT_CATCH_UP_LIMIT = 100

# Stable check ids for schedules (the backend's options use E001-E008).
E_SCHEDULE_INVALID = "leasejobs.E009"
E_SCHEDULE_TRIGGER = "leasejobs.E010"
E_SCHEDULE_CRON = "leasejobs.E011"
E_SCHEDULE_TIMEZONE = "leasejobs.E012"
E_SCHEDULE_TASK = "leasejobs.E013"
E_SCHEDULE_ARGUMENTS = "leasejobs.E014"
E_SCHEDULE_QUEUE = "leasejobs.E015"
E_SCHEDULE_USE_TZ = "leasejobs.E017"

KNOWN_KEYS = frozenset(
    {
        "task",
        "cron",
        "every",
        "args",
        "kwargs",
        "queue",
        "priority",
        "timezone",
        "enabled",
        "catch_up",
        "catch_up_limit",
    }
)
MAX_NAME_LENGTH = 200
MAX_TASK_PATH_LENGTH = 512
MAX_EXPRESSION_LENGTH = 255
"""The state table's column sizes (``models.Schedule``)."""
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")

NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The named schedules of Vixie/Debian cron, as the five-field expressions crontab(5)
documents for them (``@reboot`` has no meaning for a job queue)."""

MAX_EVERY = 366 * 86400
"""Longest ``every`` period (one leap year); longer periods belong in a cron expression."""

MAX_SCAN = 10_000
"""Most ticks counted between two instants; an outage longer than that many periods is
treated as exactly that many (only the policy's most recent ticks are ever enqueued)."""

MAX_BEHIND = 4000
"""Ticks in a row that cronsim may give at or before the last one (the repeated hour of a
fall-back night has at most 60 with minute resolution) before the expression is
treated as one that cannot advance: an error for that schedule, never a hung thread."""

ON_TIME_LIMITS = (1.0, 60.0)
"""A tick is on time when a scheduler sees it within half a period of it, but at least
1 s and at most 60 s; later than that it was missed, and ``catch_up`` decides."""


@dataclass(frozen=True, slots=True)
class ScheduleProblem:
    id: str
    msg: str
    hint: str = ""
    schedule: str = ""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """One valid schedule of a backend's ``SCHEDULES``."""

    name: str
    task_path: str
    cron: str | None = None
    """The five-field expression (nicknames already expanded), or None."""
    every: int | None = None
    """The period in whole seconds, or None."""
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    """None: the task's own queue."""
    priority: int | None = None
    """None: the task's own priority."""
    timezone: str = "UTC"
    enabled: bool = True
    catch_up: CatchUp = "latest"
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    declared: str = ""
    """The trigger as written in settings (``@daily`` stays ``@daily``)."""

    @property
    def zone(self) -> tzinfo:
        return UTC if self.timezone == "UTC" else ZoneInfo(self.timezone)

    @property
    def expression(self) -> str:
        """The trigger for people: the cron line as declared, or ``every 30s``."""
        return self.declared or (f"every {self.every}s" if self.every else str(self.cron))

    def describe(self) -> str:
        """A readable sentence for the trigger (cronsim's ``explain()`` for cron)."""
        if self.every is not None:
            return f"Every {_seconds_text(self.every)}"
        text = CronSim(self.cron or "", datetime(2000, 1, 1)).explain()
        return f"{text} ({self.timezone})"

    def next_after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant`` (aware), as an aware UTC datetime."""
        if self.every is not None:
            seconds = math.floor(instant.timestamp() / self.every) * self.every + self.every
            return datetime.fromtimestamp(seconds, UTC)
        return next(self._cron_ticks(instant))

    def _cron_ticks(self, after: datetime) -> Iterator[datetime]:
        """Cron ticks strictly after ``after``, in increasing order, as UTC datetimes."""
        last = _plain(after)
        behind = 0
        for local in CronSim(self.cron or "", last.astimezone(self.zone)):
            tick = local.astimezone(UTC)
            if tick > last:
                last, behind = tick, 0
                yield tick
                continue
            # On the repeated hour of a fall-back day cronsim walks wall-clock time, so a
            # time can come out earlier (in real time) than one already seen: skip it.
            behind += 1
            if behind > MAX_BEHIND:
                raise RuntimeError(
                    f"cron {self.cron!r} in {self.timezone}: no tick after {last.isoformat()}"
                )

    def ticks_between(self, after: datetime, until: datetime) -> tuple[list[datetime], int]:
        """Ticks in ``(after, until]``: the most recent ``catch_up_limit`` (oldest first)
        and how many there were in all (counted up to ``MAX_SCAN``)."""
        keep = self.catch_up_limit
        if self.every is not None:
            first = self.next_after(after)
            if first > until:
                return [], 0
            last = datetime.fromtimestamp(
                math.floor(until.timestamp() / self.every) * self.every, UTC
            )
            count = min(int((last - first).total_seconds()) // self.every + 1, MAX_SCAN)
            kept = [last - timedelta(seconds=self.every * n) for n in range(min(count, keep))]
            return kept[::-1], count
        found: deque[datetime] = deque(maxlen=keep)
        count = 0
        for tick in self._cron_ticks(after):
            if tick > until:
                return list(found), count
            if count == MAX_SCAN:
                break
            count += 1
            found.append(tick)
        # A very long outage: take the most recent ticks walking back from ``until``.
        start = _plain(until).replace(microsecond=0) + timedelta(seconds=1)
        recent = CronSim(self.cron or "", start.astimezone(self.zone), reverse=True)
        latest = [t.astimezone(UTC) for t, _ in zip(recent, range(keep), strict=False)]
        return sorted(t for t in latest if after < t <= until), count

    def on_time_grace(self, tick: datetime) -> float:
        """Seconds after ``tick`` within which it still counts as on time."""
        period = (self.next_after(tick) - tick).total_seconds()
        low, high = ON_TIME_LIMITS
        return min(max(period / 2, low), high)


def _plain(instant: datetime) -> datetime:
    """``instant`` as a plain aware UTC datetime (a subclass, such as a test clock's, may
    lose ``fold`` in ``astimezone``: the very bit that tells the two 02:30s of a
    fall-back night apart)."""
    return datetime.fromtimestamp(instant.timestamp(), UTC)


def _seconds_text(seconds: int) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}" if count != 1 else unit
    return f"{seconds} seconds" if seconds != 1 else "second"


def require_aware_times() -> None:
    """Schedules keep instants (aware datetimes): refuse to run them with ``USE_TZ = False``."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if not settings.USE_TZ:
        raise ImproperlyConfigured(USE_TZ_PROBLEM)


USE_TZ_PROBLEM = (
    "OPTIONS['SCHEDULES'] needs USE_TZ = True: ticks are instants, stored as aware "
    "datetimes (a cron schedule's local times come from its 'timezone')."
)


def cron_problem(expression: str) -> str:
    """Why ``expression`` is not a five-field cron line or nickname ('' when it is)."""
    text = expression.strip()
    if len(text) > MAX_EXPRESSION_LENGTH:
        return f"longer than {MAX_EXPRESSION_LENGTH} characters"
    if text.startswith("@"):
        if text.lower() in NICKNAMES:
            return ""
        return f"unknown cron nickname {text!r} (known: {', '.join(NICKNAMES)})"
    if len(text.split()) != 5:
        return (
            f"a cron expression has five fields (minute hour day month weekday), "
            f"got {len(text.split())} in {text!r}"
        )
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as exc:
        return f"{text!r}: {exc}"
    except (ValueError, IndexError, KeyError) as exc:  # cronsim's own parse slips
        return f"{text!r}: {exc or type(exc).__name__}"
    return ""


def zone_problem(name: Any) -> str:
    if not isinstance(name, str) or not name:
        return f"timezone must be an IANA time zone name such as 'Europe/Berlin', got {name!r}"
    if name == "UTC":
        return ""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "US" is a directory
        return f"unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin')"
    return ""


def _every_seconds(value: Any) -> int | str:
    """The period in seconds, or why ``value`` is not one."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"every must be a number of seconds or a timedelta, got {value!r}"
    if isinstance(value, int) and value > MAX_EVERY:  # before float(): 10**400 overflows it
        return f"every must be at most {MAX_EVERY} seconds (a year), got {value!r}; use cron"
    if not math.isfinite(value):
        return f"every must be a number of seconds or a timedelta, got {value!r}"
    if value != int(value) or value < 1:
        return f"every must be a whole number of seconds >= 1, got {value!r}"
    if value > MAX_EVERY:
        return f"every must be at most {MAX_EVERY} seconds (a year), got {value!r}; use cron"
    return int(value)


def _parse_one(
    name: str, raw: Mapping[str, Any], default_timezone: str
) -> tuple[ScheduleSpec | None, list[ScheduleProblem]]:
    from .models import MAX_PRIORITY, MIN_PRIORITY

    found: list[ScheduleProblem] = []

    def problem(check_id: str, msg: str, hint: str = "") -> None:
        found.append(ScheduleProblem(check_id, f"Schedule {name!r}: {msg}.", hint, name))

    for key in sorted(set(raw) - KNOWN_KEYS, key=str):
        problem(
            E_SCHEDULE_INVALID,
            f"unknown key {key!r}",
            f"Known keys: {', '.join(sorted(KNOWN_KEYS))}.",
        )
    task = raw.get("task")
    if not isinstance(task, str) or "." not in task or len(task) > MAX_TASK_PATH_LENGTH:
        problem(
            E_SCHEDULE_TASK,
            "task must be the dotted path of a task, such as 'mail.tasks.send' (at most "
            f"{MAX_TASK_PATH_LENGTH} characters), got {task!r}",
        )
    values: dict[str, Any] = {"name": name, "task_path": task}

    has_cron, has_every = raw.get("cron") is not None, raw.get("every") is not None
    if has_cron == has_every:
        problem(
            E_SCHEDULE_TRIGGER,
            "give exactly one of 'cron' and 'every'"
            + (", not both" if has_cron else f", got neither (keys: {sorted(raw)})"),
            "'cron': '0 7 * * mon-fri' (five fields or @hourly/@daily/...), or "
            "'every': 30 (seconds).",
        )
    elif has_cron:
        cron = raw["cron"]
        why = (
            cron_problem(cron) if isinstance(cron, str) else f"cron must be a string, got {cron!r}"
        )
        if why:
            problem(E_SCHEDULE_CRON, f"bad cron expression: {why}")
        else:
            values["declared"] = cron.strip()
            values["cron"] = NICKNAMES.get(cron.strip().lower(), cron.strip())
    else:
        every = _every_seconds(raw["every"])
        if isinstance(every, str):
            problem(E_SCHEDULE_INVALID, every)
        else:
            values["every"] = every

    zone = raw.get("timezone", default_timezone)
    why = zone_problem(zone)
    if why:
        problem(E_SCHEDULE_TIMEZONE, why)
    else:
        values["timezone"] = zone

    args, kwargs = raw.get("args", ()), raw.get("kwargs", {})
    try:
        json_args, json_kwargs = json_arguments(args, kwargs)
    except InvalidTaskArguments as exc:
        problem(E_SCHEDULE_ARGUMENTS, f"arguments must be JSON: {exc}")
    else:
        values["args"], values["kwargs"] = tuple(json_args), json_kwargs

    if "queue" in raw:
        queue = raw["queue"]
        if isinstance(queue, str) and queue:
            values["queue"] = queue
        else:
            problem(E_SCHEDULE_INVALID, f"queue must be a queue name, got {queue!r}")
    if "priority" in raw:
        priority = raw["priority"]
        if (
            isinstance(priority, int)
            and not isinstance(priority, bool)
            and MIN_PRIORITY <= priority <= MAX_PRIORITY
        ):
            values["priority"] = priority
        else:
            problem(
                E_SCHEDULE_INVALID,
                f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                f"got {priority!r}",
            )
    if "enabled" in raw:
        if isinstance(raw["enabled"], bool):
            values["enabled"] = raw["enabled"]
        else:
            problem(E_SCHEDULE_INVALID, f"enabled must be True or False, got {raw['enabled']!r}")
    catch_up = raw.get("catch_up", "latest")
    if catch_up in CATCH_UP_POLICIES:
        values["catch_up"] = catch_up
    else:
        problem(
            E_SCHEDULE_INVALID,
            f"catch_up must be one of {', '.join(map(repr, CATCH_UP_POLICIES))}, got {catch_up!r}",
        )
    if "catch_up_limit" in raw:
        limit = raw["catch_up_limit"]
        if catch_up != "all":
            problem(
                E_SCHEDULE_INVALID,
                "catch_up_limit applies to catch_up='all' only",
                "Remove catch_up_limit, or set catch_up to 'all'.",
            )
        elif isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit <= MAX_SCAN:
            values["catch_up_limit"] = limit
        else:
            problem(
                E_SCHEDULE_INVALID,
                f"catch_up_limit must be a whole number from 1 to {MAX_SCAN}, got {limit!r}",
            )
    if found:
        return None, found
    if values.get("catch_up") != "all":
        values["catch_up_limit"] = 1
    return ScheduleSpec(**values), []


def parse_schedules(
    raw: Any, default_timezone: str
) -> tuple[tuple[ScheduleSpec, ...], list[ScheduleProblem]]:
    """Read ``OPTIONS["SCHEDULES"]``: the valid schedules, and a problem per invalid one."""
    if raw is None:
        return (), []
    if not isinstance(raw, Mapping):
        return (), [
            ScheduleProblem(
                E_SCHEDULE_INVALID,
                f"SCHEDULES must be a dict of name -> schedule, got {type(raw).__name__}.",
            )
        ]
    specs: list[ScheduleSpec] = []
    problems: list[ScheduleProblem] = []
    seen: dict[str, str] = {}
    for name, entry in raw.items():
        if isinstance(name, str) and name.casefold() in seen:
            # MySQL/MariaDB compare the state table's names without case.
            problems.append(
                ScheduleProblem(
                    E_SCHEDULE_INVALID,
                    f"Schedule names {seen[name.casefold()]!r} and {name!r} differ only in "
                    "case; names must be unique without regard to case.",
                    schedule=name,
                )
            )
            continue
        if isinstance(name, str):
            seen[name.casefold()] = name
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
            problems.append(
                ScheduleProblem(
                    E_SCHEDULE_INVALID,
                    f"Schedule name {name!r} is not valid: letters, digits, '_', '.', ':' "
                    f"and '-', at most {MAX_NAME_LENGTH} characters, starting with a letter "
                    "or digit.",
                )
            )
            continue
        if not isinstance(entry, Mapping):
            problems.append(
                ScheduleProblem(
                    E_SCHEDULE_INVALID,
                    f"Schedule {name!r} must be a dict, got {type(entry).__name__}.",
                    schedule=name,
                )
            )
            continue
        spec, found = _parse_one(name, entry, default_timezone)
        problems.extend(found)
        if spec is not None:
            specs.append(spec)
    return tuple(specs), problems
