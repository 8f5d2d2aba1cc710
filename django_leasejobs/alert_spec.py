"""Alert rules as declared in ``OPTIONS["ALERTS"]``: typed and checked, no database.

``parse_alert_rules`` never raises: it returns the valid rules plus a problem for each
invalid one (the system checks report them with stable ids, and the worker refuses to
start with them). Whether the backend serves a rule's queue needs the backend's
``QUEUES``: ``checks.py`` compares them. Durations are the project's durations
(``durations.py``): seconds or a ``timedelta``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .durations import as_seconds, duration_problem

AlertKind = Literal["failure_rate", "dead_letters", "backlog", "oldest_ready", "no_worker"]
ALERT_KINDS: tuple[str, ...] = (
    "failure_rate",
    "dead_letters",
    "backlog",
    "oldest_ready",
    "no_worker",
)

# Stable check ids for alert rules.
E_ALERT_INVALID = "leasejobs.E025"
E_ALERT_DURATION = "leasejobs.E026"
E_ALERT_QUEUE = "leasejobs.E027"

KNOWN_KEYS = frozenset(
    {"name", "kind", "queue", "task", "threshold", "window", "min_jobs", "interval"}
)
WINDOWED_KINDS = frozenset({"failure_rate", "dead_letters"})
"""Kinds that count jobs finished within ``window``."""
TASK_KINDS = frozenset({"failure_rate", "dead_letters", "backlog", "oldest_ready"})
"""Kinds a ``task`` narrows (a worker serves queues, not tasks: not ``no_worker``)."""

MAX_NAME_LENGTH = 200
MAX_QUEUE_LENGTH = 128
MAX_TASK_PATH_LENGTH = 512
"""The state table's and the job table's column sizes (``models.AlertState``, ``Job``)."""
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")

DEFAULT_WINDOW = 600.0
DEFAULT_INTERVAL = 3600.0
DEFAULT_MIN_JOBS = 10
MAX_WINDOW = 86400.0
"""The longest ``window`` (one day): a window's measure reads every job that finished
within it, through the ``(status, finished_at)`` index, so it must stay bounded."""

EXAMPLE = (
    '{"name": "mail-failures", "kind": "failure_rate", "queue": "mail", '
    '"threshold": 0.2, "window": 600, "min_jobs": 20, "interval": 900}'
)


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One checked rule. ``threshold`` is a share (``failure_rate``, 0 to 1), a count of
    jobs (``dead_letters``, ``backlog``), seconds (``oldest_ready``), or unused (0,
    ``no_worker``)."""

    name: str
    kind: AlertKind
    threshold: float
    queue: str | None = None
    task: str | None = None
    window: float = DEFAULT_WINDOW
    """Seconds of finished jobs ``failure_rate`` and ``dead_letters`` count."""
    min_jobs: int = DEFAULT_MIN_JOBS
    """``failure_rate``: fewer finished jobs in the window give no verdict."""
    interval: float = DEFAULT_INTERVAL
    """At most one alert of the rule per this many seconds, across every worker."""

    def reached(self, value: float) -> bool:
        """Whether a measured ``value`` makes the rule fire."""
        if self.kind == "no_worker":
            return value < 1
        return value >= self.threshold


@dataclass(frozen=True, slots=True)
class AlertProblem:
    id: str
    msg: str
    hint: str = ""


def _hint() -> str:
    return f"A rule is a dict such as {EXAMPLE}; durations are seconds or a datetime.timedelta."


def _invalid(name: str, message: str, hint: str = "") -> AlertProblem:
    return AlertProblem(E_ALERT_INVALID, f"Alert rule {name!r}: {message}", hint or _hint())


def _threshold(name: str, kind: str, entry: Mapping[str, Any]) -> tuple[float, AlertProblem | None]:
    if kind == "no_worker":
        if "threshold" in entry:
            return 0.0, _invalid(
                name,
                "a no_worker rule takes no threshold (it fires when no online worker serves "
                "its queue).",
                "Remove 'threshold' from the rule.",
            )
        return 0.0, None
    if "threshold" not in entry:
        return 0.0, _invalid(name, f"a {kind} rule needs a threshold.")
    value = entry["threshold"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0, _invalid(name, f"threshold must be a finite number, got {value!r}.")
    if kind == "failure_rate" and not 0 < value <= 1:
        return 0.0, _invalid(
            name,
            f"a failure_rate threshold is a share of finished jobs, above 0 and at most 1 "
            f"(0.2 = 20 %), got {value!r}.",
        )
    if kind in ("dead_letters", "backlog") and (int(value) != value or value < 1):
        return 0.0, _invalid(
            name, f"a {kind} threshold is a whole number of jobs >= 1, got {value!r}."
        )
    if kind == "oldest_ready" and value <= 0:
        return 0.0, _invalid(name, f"an oldest_ready threshold is seconds > 0, got {value!r}.")
    return float(value), None


def _duration(
    name: str, key: str, entry: Mapping[str, Any], default: float, longest: float | None
) -> tuple[float, AlertProblem | None]:
    if key not in entry:
        return default, None
    value = entry[key]
    found = duration_problem(value)
    if found:
        hint = "Give seconds (600) or a datetime.timedelta (timedelta(minutes=10))."
        if isinstance(value, str):
            hint += " Strings such as '10m' are not durations here."
        return default, AlertProblem(E_ALERT_DURATION, f"Alert rule {name!r}: {key} {found}.", hint)
    seconds = as_seconds(value)
    if longest is not None and seconds > longest:
        return default, AlertProblem(
            E_ALERT_DURATION,
            f"Alert rule {name!r}: {key} must be at most {longest:,.0f} seconds (one day), "
            f"got {value!r}: its measure reads every job finished within it.",
            "Use a shorter window; watch longer trends with the Prometheus metrics "
            "(docs/monitoring.md).",
        )
    return seconds, None


def _text(
    name: str, key: str, entry: Mapping[str, Any], longest: int
) -> tuple[str | None, AlertProblem | None]:
    value = entry.get(key)
    if value is None:
        return None, None
    if not isinstance(value, str) or not 0 < len(value) <= longest:
        return None, _invalid(
            name,
            f"{key} must be a non-empty string of at most {longest} characters, got {value!r}.",
        )
    return value, None


def _parse_one(name: str, entry: Mapping[str, Any]) -> tuple[AlertRule | None, list[AlertProblem]]:
    unknown = sorted(set(map(str, entry)) - KNOWN_KEYS)
    if unknown:
        return None, [
            _invalid(
                name,
                f"unknown key(s) {', '.join(map(repr, unknown))}.",
                f"Known keys: {', '.join(sorted(KNOWN_KEYS))}.",
            )
        ]
    kind = entry.get("kind")
    if kind not in ALERT_KINDS:
        return None, [
            _invalid(
                name,
                f"kind must be one of {', '.join(ALERT_KINDS)}, got {kind!r}.",
            )
        ]
    problems: list[AlertProblem] = []
    threshold, problem = _threshold(name, kind, entry)
    problems += [problem] if problem else []
    queue, problem = _text(name, "queue", entry, MAX_QUEUE_LENGTH)
    problems += [problem] if problem else []
    task, problem = _text(name, "task", entry, MAX_TASK_PATH_LENGTH)
    problems += [problem] if problem else []
    if kind == "no_worker" and queue is None and not problem:
        problems.append(
            _invalid(
                name,
                "a no_worker rule needs a queue: workers evaluate the rules, so the one "
                "evaluating is always online for the backend as a whole.",
                "Add 'queue' to the rule.",
            )
        )
    if task is not None and kind not in TASK_KINDS:
        problems.append(_invalid(name, f"a {kind} rule takes no task.", "Remove 'task'."))
    for key, kinds in (("window", WINDOWED_KINDS), ("min_jobs", {"failure_rate"})):
        if key in entry and kind not in kinds:
            problems.append(
                _invalid(name, f"a {kind} rule takes no {key}.", f"Remove {key!r} from the rule.")
            )
    window, problem = _duration(name, "window", entry, DEFAULT_WINDOW, MAX_WINDOW)
    problems += [problem] if problem else []
    interval, problem = _duration(name, "interval", entry, DEFAULT_INTERVAL, None)
    problems += [problem] if problem else []
    min_jobs = entry.get("min_jobs", DEFAULT_MIN_JOBS)
    if isinstance(min_jobs, bool) or not isinstance(min_jobs, int) or min_jobs < 1:
        problems.append(_invalid(name, f"min_jobs must be a whole number >= 1, got {min_jobs!r}."))
    if problems:
        return None, problems
    rule = AlertRule(
        name=name,
        kind=kind,
        threshold=threshold,
        queue=queue,
        task=task,
        window=window,
        min_jobs=min_jobs,
        interval=interval,
    )
    return rule, []


def parse_alert_rules(raw: Any) -> tuple[tuple[AlertRule, ...], list[AlertProblem]]:
    """Read ``OPTIONS["ALERTS"]``: the valid rules, and a problem per invalid one."""
    if raw is None:
        return (), []
    if not isinstance(raw, list | tuple):
        return (), [
            AlertProblem(
                E_ALERT_INVALID,
                f"ALERTS must be a list of rules, got {type(raw).__name__}.",
                _hint(),
            )
        ]
    rules: list[AlertRule] = []
    problems: list[AlertProblem] = []
    seen: dict[str, str] = {}
    for position, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            problems.append(
                AlertProblem(
                    E_ALERT_INVALID,
                    f"ALERTS[{position}] must be a dict, got {type(entry).__name__}.",
                    _hint(),
                )
            )
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
            problems.append(
                AlertProblem(
                    E_ALERT_INVALID,
                    f"ALERTS[{position}]: name {name!r} is not valid: letters, digits, '_', "
                    f"'.', ':' and '-', at most {MAX_NAME_LENGTH} characters, starting with a "
                    "letter or digit.",
                    _hint(),
                )
            )
            continue
        if name.casefold() in seen:  # MySQL/MariaDB compare the state table's names without case
            problems.append(
                _invalid(
                    name,
                    f"the name is used twice (as {seen[name.casefold()]!r} and {name!r}); "
                    "names must be unique without regard to case.",
                    "Rename one of the rules.",
                )
            )
            continue
        seen[name.casefold()] = name
        rule, found = _parse_one(name, entry)
        problems.extend(found)
        if rule is not None:
            rules.append(rule)
    return tuple(rules), problems


def window_text(seconds: float) -> str:
    """A window or an interval for messages: ``10 min``, ``90 s``, ``2 h``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
