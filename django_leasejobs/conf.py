"""Typed options of a LeaseJobs backend, read once from ``TASKS[alias]["OPTIONS"]``.

``parse_options`` never raises: it returns the options (invalid values replaced
by defaults) plus a list of problems, which the system checks in ``checks.py``
report with stable ids and which the worker refuses to start with.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .alert_spec import AlertRule, parse_alert_rules
from .durations import as_seconds, duration_problem
from .limits import FlowRules, Rate, limit_problem, parse_rate, rate_problem
from .retry import Backoff, backoff_problems
from .schedule_spec import ScheduleSpec, parse_schedules

LockLostBehavior = Literal["sigkill", "sigterm"]
LOCK_LOST_BEHAVIORS: tuple[str, ...] = ("sigkill", "sigterm")
LOCK_LOST_ENV_VAR = "LEASEJOBS_LOCK_LOST_BEHAVIOR"
BACKEND_PATH = "django_leasejobs.backend.LeaseJobsBackend"

# Stable check ids, one per kind of problem.
E_UNKNOWN_OPTION = "leasejobs.E001"
E_BAD_VALUE = "leasejobs.E002"
E_LOCK_LOST_BEHAVIOR = "leasejobs.E003"
E_HEARTBEAT_NOT_BELOW_LEASE = "leasejobs.E004"
E_UNKNOWN_DATABASE = "leasejobs.E005"
E_DATABASE_FEATURES = "leasejobs.E006"
E_DURATION_TOO_LONG = "leasejobs.E007"
E_APP_NOT_INSTALLED = "leasejobs.E008"
E_UNKNOWN_LISTEN_DATABASE = "leasejobs.E018"
E_LISTEN_DATABASE_NOT_POSTGRESQL = "leasejobs.E019"
E_BAD_QUEUE_LIMIT = "leasejobs.E020"
E_UNKNOWN_LIMITED_QUEUE = "leasejobs.E021"
E_BAD_RATE_LIMIT = "leasejobs.E022"
E_BAD_QUEUE_RESULT_TTL = "leasejobs.E023"
E_BAD_ROLLUP_OPTION = "leasejobs.E024"
W_HEARTBEAT_TOO_SLOW = "leasejobs.W001"
W_LEASE_TOO_SHORT = "leasejobs.W002"
W_POLL_TOO_FAST = "leasejobs.W003"
W_HEARTBEAT_TOO_FAST = "leasejobs.W004"
W_IDLE_POLL_BELOW_POLL = "leasejobs.W005"
W_FOREIGN_DATABASE_OPTION = "leasejobs.W006"

MAX_SECONDS = 2_147_483.647
"""Longest duration of any option: 2**31 - 1 milliseconds (about 24.8 days).

The worker hands its timings to C APIs that take a signed 32-bit number of
milliseconds: libpq's ``tcp_user_timeout`` (one lease) and ``poll(2)`` (its waits).
"""
MIN_LEASE_DURATION = 1.0
"""Below this (seconds), a warning: every worker would renew (commit) several times a second."""
MIN_HEARTBEAT_INTERVAL = 0.1
"""Below this (seconds), a warning: more than ten renewals (commits) a second per worker."""
MIN_POLL_INTERVAL = 0.05
"""Below this (seconds), a warning: an idle worker would query for work over 20 times a second."""


DEFAULT_ROLLUP_RETENTION = 8 * 86400.0
"""Eight days: the dashboard's week chart stays full, with a day to spare for a late prune."""


@dataclass(frozen=True, slots=True)
class Problem:
    id: str
    msg: str
    hint: str = ""
    warning: bool = False


@dataclass(frozen=True, slots=True)
class Options:
    lease_duration: float = 30.0
    heartbeat_interval: float = 10.0
    stale_lock_interval: float = 10.0
    stale_lock_age: float = 0.0
    max_attempts: int = 3
    max_stalls: int = 3
    retry_backoff: Backoff = field(default_factory=Backoff)
    lock_lost_behavior: LockLostBehavior = "sigkill"
    lock_lost_grace: float = 10.0
    """Seconds a stopped job gets to end before its process group is SIGKILLed: after
    SIGTERM (``LOCK_LOST_BEHAVIOR = "sigterm"``), or after the ``CancelledError`` an
    ``async def`` job on a slot's event loop is sent."""
    async_concurrency: int = 100
    """``async def`` jobs one process-pool slot runs at once on its event loop
    (``runworker --async-concurrency``)."""
    async_blocking_limit: float = 10.0
    """Seconds one step of an ``async def`` job may hold its slot's event loop (a
    ``time.sleep``, a CPU loop) before the worker kills the slot: that job's attempt
    counts, the other jobs of its loop run again without one counted."""
    poll_interval: float = 1.0
    idle_poll_interval: float = 30.0
    """How often an idle worker whose listener is listening looks for work anyway (the
    safety poll): NOTIFY wakes it for new jobs, and it also wakes when the earliest
    pending ``run_after`` of its queues comes due. Never below ``poll_interval``."""
    unknown_task_grace: float = 3600.0
    """How long a job of a task no worker knows waits for one that does (a deploy that
    reached the web before the workers) before it is dead-lettered; 0: at once."""
    database: str = "default"
    listen_database: str | None = None
    """Alias the worker LISTENs on (None: ``database``, unless that is pooled)."""
    imports: tuple[str, ...] = ()
    schedules: tuple[ScheduleSpec, ...] = ()
    flow: FlowRules = field(default_factory=FlowRules)
    """``QUEUE_LIMITS`` and ``QUEUE_RATE_LIMITS``: what every claim of a queue obeys."""
    queue_result_ttl: dict[str, float] = field(default_factory=dict)
    """``QUEUE_RESULT_TTL``: seconds a finished job of each queue is kept (``prune_jobs``),
    unless the job has a ``result_ttl`` of its own."""
    rollups: bool = True
    """``ROLLUPS``: workers and reapers count outcomes per minute in the rollup table (the
    dashboard's trends, the metrics view's rollup gauges); False writes nothing there."""
    rollup_retention: float = DEFAULT_ROLLUP_RETENTION
    """``ROLLUP_RETENTION``: seconds a rollup row is kept (``prune_jobs`` deletes older ones)."""
    alerts: tuple[AlertRule, ...] = ()
    """``ALERTS``: the rules every worker of the backend evaluates (``alerts/``)."""
    alert_check_interval: float = 30.0
    """How often each worker evaluates the ``ALERTS`` rules (seconds)."""


# option name -> (attribute, kind, minimum, minimum is exclusive)
_NUMBERS: dict[str, tuple[str, type, float, bool]] = {
    "LEASE_DURATION": ("lease_duration", float, 0, True),
    "HEARTBEAT_INTERVAL": ("heartbeat_interval", float, 0, True),
    "STALE_LOCK_INTERVAL": ("stale_lock_interval", float, 0, False),
    "STALE_LOCK_AGE": ("stale_lock_age", float, 0, False),
    "MAX_ATTEMPTS": ("max_attempts", int, 1, False),
    "MAX_STALLS": ("max_stalls", int, 1, False),
    "LOCK_LOST_GRACE": ("lock_lost_grace", float, 0, False),
    "ASYNC_CONCURRENCY": ("async_concurrency", int, 1, False),
    "ASYNC_BLOCKING_LIMIT": ("async_blocking_limit", float, 0, True),
    "POLL_INTERVAL": ("poll_interval", float, 0, True),
    "IDLE_POLL_INTERVAL": ("idle_poll_interval", float, 0, True),
    "UNKNOWN_TASK_GRACE": ("unknown_task_grace", float, 0, False),
    "ALERT_CHECK_INTERVAL": ("alert_check_interval", float, 0, True),
}
KNOWN_OPTIONS = frozenset(
    {
        *_NUMBERS,
        "RETRY_BACKOFF",
        "LOCK_LOST_BEHAVIOR",
        "DATABASE",
        "LISTEN_DATABASE",
        "IMPORTS",
        "SCHEDULES",
        "QUEUE_LIMITS",
        "QUEUE_RATE_LIMITS",
        "QUEUE_RESULT_TTL",
        "ROLLUPS",
        "ROLLUP_RETENTION",
        "ALERTS",
    }
)
MAX_QUEUE_NAME = 128
"""``Job.queue``'s length: a longer name can hold no job."""

# What a duration above MAX_SECONDS breaks, per option.
_TOO_LONG_BREAKS = {
    "LEASE_DURATION": (
        "the worker sets libpq's tcp_user_timeout to one lease in milliseconds, which libpq "
        "refuses above 2,147,483,647, so the worker could never connect"
    ),
    "POLL_INTERVAL": (
        "an idle worker waits in poll(2), which takes at most 2,147,483,647 milliseconds"
    ),
    "IDLE_POLL_INTERVAL": (
        "an idle worker waits in poll(2), which takes at most 2,147,483,647 milliseconds"
    ),
}
_TOO_LONG_DEFAULT = (
    "every duration shares the limit of the worker's millisecond timeouts "
    "(libpq's tcp_user_timeout, poll(2))"
)


def _number_problem(name: str, value: Any, kind: type, minimum: float, exclusive: bool) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return (
            f"{name} must be a finite {'whole number' if kind is int else 'number'}, got {value!r}"
        )
    if kind is int and int(value) != value:
        return f"{name} must be a whole number, got {value!r}"
    if (exclusive and value <= minimum) or (not exclusive and value < minimum):
        return f"{name} must be {'>' if exclusive else '>='} {minimum:g}, got {value!r}"
    return ""


def _timing_warnings(options: Options) -> list[Problem]:
    """Valid but wasteful timings: each makes every worker hit the database many times a second."""
    found = []
    if options.lease_duration < MIN_LEASE_DURATION:
        found.append(
            Problem(
                W_LEASE_TOO_SHORT,
                f"LEASE_DURATION ({options.lease_duration:g}s) is below {MIN_LEASE_DURATION:g} s: "
                "heartbeats must come several times per lease, so every worker would renew "
                "(one UPDATE and commit) several times a second, and a pause of a fraction of "
                "a second (garbage collection, a slow query) would lose its leases.",
                hint="Use a LEASE_DURATION of a few seconds or more (default 30).",
                warning=True,
            )
        )
    if options.heartbeat_interval < MIN_HEARTBEAT_INTERVAL:
        found.append(
            Problem(
                W_HEARTBEAT_TOO_FAST,
                f"HEARTBEAT_INTERVAL ({options.heartbeat_interval:g}s) is below "
                f"{MIN_HEARTBEAT_INTERVAL:g} s: every worker would renew its leases (one "
                "UPDATE and commit) more than ten times a second.",
                hint="Use about a third of LEASE_DURATION (default 10 s for 30 s leases).",
                warning=True,
            )
        )
    if options.poll_interval < MIN_POLL_INTERVAL:
        found.append(
            Problem(
                W_POLL_TOO_FAST,
                f"POLL_INTERVAL ({options.poll_interval:g}s) is below {MIN_POLL_INTERVAL:g} s: "
                "every idle worker would query for work more than twenty times a second. "
                "Enqueues on PostgreSQL wake idle workers at once anyway (LISTEN/NOTIFY).",
                hint="Use a POLL_INTERVAL of 0.1 s or more (default 1 s).",
                warning=True,
            )
        )
    return found


def _queue_name_problem(option: str, name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_QUEUE_NAME:
        return (
            f"{option} keys must be queue names (non-empty strings of at most "
            f"{MAX_QUEUE_NAME} characters), got {name!r}"
        )
    return ""


def _flow_rules(raw: Mapping[str, Any]) -> tuple[list[Problem], FlowRules]:
    """``QUEUE_LIMITS`` and ``QUEUE_RATE_LIMITS`` read; a bad entry is left out and reported."""
    problems: list[Problem] = []
    limits: dict[str, int] = {}
    rates: dict[str, Rate] = {}
    for option, kind in (
        ("QUEUE_LIMITS", E_BAD_QUEUE_LIMIT),
        ("QUEUE_RATE_LIMITS", E_BAD_RATE_LIMIT),
    ):
        given = raw.get(option, {})
        if not isinstance(given, Mapping):
            problems.append(
                Problem(
                    kind,
                    f"{option} must be a dict of queue name -> "
                    f"{'most running jobs' if option == 'QUEUE_LIMITS' else 'rate'}, "
                    f"got {given!r}.",
                )
            )
            continue
        for name, value in given.items():
            message = _queue_name_problem(option, name)
            if not message:
                found = limit_problem(value) if option == "QUEUE_LIMITS" else rate_problem(value)
                message = f"{option}[{name!r}] {found}" if found else ""
            if message:
                hint = (
                    "A limit is the most jobs of the queue that run at once, across every worker."
                    if option == "QUEUE_LIMITS"
                    else 'A rate is "N/s", "N/m" or "N/h": at most N job starts in any such period.'
                )
                problems.append(Problem(kind, message + ".", hint=hint))
            elif option == "QUEUE_LIMITS":
                limits[name] = value
            else:
                rates[name] = parse_rate(value)
    return problems, FlowRules(queue_limits=limits, queue_rates=rates)


def _queue_result_ttl(raw: Mapping[str, Any]) -> tuple[list[Problem], dict[str, float]]:
    """``QUEUE_RESULT_TTL`` read; a bad entry is left out and reported (``E023``)."""
    given = raw.get("QUEUE_RESULT_TTL", {})
    hint = (
        'Give each queue a number of seconds > 0 or a timedelta: {"reports": 86400} keeps '
        "the finished jobs of the queue reports for a day."
    )
    if not isinstance(given, Mapping):
        message = f"QUEUE_RESULT_TTL must be a dict of queue name -> duration, got {given!r}."
        return [Problem(E_BAD_QUEUE_RESULT_TTL, message, hint=hint)], {}
    problems: list[Problem] = []
    found: dict[str, float] = {}
    for name, value in given.items():
        message = _queue_name_problem("QUEUE_RESULT_TTL", name)
        if not message:
            problem = duration_problem(value)
            message = f"QUEUE_RESULT_TTL[{name!r}] {problem}" if problem else ""
        if message:
            problems.append(Problem(E_BAD_QUEUE_RESULT_TTL, message + ".", hint=hint))
        else:
            found[name] = as_seconds(value)
    return problems, found


def _rollup_options(raw: Mapping[str, Any]) -> tuple[list[Problem], dict[str, Any]]:
    """``ROLLUPS`` and ``ROLLUP_RETENTION`` read; a bad value keeps the default and is
    reported (``E024``)."""
    problems: list[Problem] = []
    found: dict[str, Any] = {}
    if "ROLLUPS" in raw:
        if isinstance(raw["ROLLUPS"], bool):
            found["rollups"] = raw["ROLLUPS"]
        else:
            problems.append(
                Problem(
                    E_BAD_ROLLUP_OPTION,
                    f"ROLLUPS must be True or False, got {raw['ROLLUPS']!r}.",
                    hint="True (default) counts outcomes per minute for the dashboard's trends.",
                )
            )
    if "ROLLUP_RETENTION" in raw:
        problem = duration_problem(raw["ROLLUP_RETENTION"])
        if problem:
            problems.append(
                Problem(
                    E_BAD_ROLLUP_OPTION,
                    f"ROLLUP_RETENTION {problem}.",
                    hint="Give seconds or a timedelta; the default, 8 days, keeps the week chart "
                    "full.",
                )
            )
        else:
            found["rollup_retention"] = as_seconds(raw["ROLLUP_RETENTION"])
    return problems, found


def parse_options(
    raw: Mapping[str, Any] | None,
    environ: Mapping[str, str] | None = None,
    default_timezone: str | None = None,
) -> tuple[Options, list[Problem]]:
    """Read backend OPTIONS into :class:`Options`; return it with every problem found.

    ``default_timezone``: the time zone of schedules that name none (default:
    ``settings.TIME_ZONE``, or UTC when it is unset).
    """
    environ = os.environ if environ is None else environ
    problems: list[Problem] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(Problem(E_BAD_VALUE, f"OPTIONS must be a dict, got {type(raw).__name__}."))
        raw = {}
    raw = dict(raw)
    values: dict[str, Any] = {}

    for name in sorted(set(raw) - KNOWN_OPTIONS, key=str):
        problems.append(
            Problem(
                E_UNKNOWN_OPTION,
                f"Unknown django-leasejobs option {name!r}.",
                hint=f"Known options: {', '.join(sorted(KNOWN_OPTIONS))}.",
            )
        )

    rejected: set[str] = set()
    for name, (attr, kind, minimum, exclusive) in _NUMBERS.items():
        if name not in raw:
            continue
        message = _number_problem(name, raw[name], kind, minimum, exclusive)
        if message:
            problems.append(Problem(E_BAD_VALUE, message))
            rejected.add(name)
        elif kind is float and raw[name] > MAX_SECONDS:
            breaks = _TOO_LONG_BREAKS.get(name, _TOO_LONG_DEFAULT)
            problems.append(
                Problem(
                    E_DURATION_TOO_LONG,
                    f"{name} ({raw[name]:g}s) is longer than {MAX_SECONDS:,} s (2**31 - 1 "
                    f"milliseconds, about 24.8 days): {breaks}.",
                    hint=f"Keep {name} at most {MAX_SECONDS:,} seconds.",
                )
            )
            rejected.add(name)
        else:
            values[attr] = kind(raw[name])

    if "RETRY_BACKOFF" in raw:
        found = backoff_problems(raw["RETRY_BACKOFF"])
        if found:
            problems.append(Problem(E_BAD_VALUE, "RETRY_BACKOFF " + "; ".join(found)))
        else:
            values["retry_backoff"] = Backoff.from_value(raw["RETRY_BACKOFF"])

    if "DATABASE" in raw:
        if isinstance(raw["DATABASE"], str) and raw["DATABASE"]:
            values["database"] = raw["DATABASE"]
        else:
            problems.append(
                Problem(E_BAD_VALUE, f"DATABASE must be a database alias, got {raw['DATABASE']!r}")
            )

    if "LISTEN_DATABASE" in raw:
        if isinstance(raw["LISTEN_DATABASE"], str) and raw["LISTEN_DATABASE"]:
            values["listen_database"] = raw["LISTEN_DATABASE"]
        else:
            problems.append(
                Problem(
                    E_BAD_VALUE,
                    f"LISTEN_DATABASE must be a database alias, got {raw['LISTEN_DATABASE']!r}",
                )
            )

    if "IMPORTS" in raw:
        imports = raw["IMPORTS"]
        if isinstance(imports, list | tuple) and all(isinstance(m, str) for m in imports):
            values["imports"] = tuple(imports)
        else:
            problems.append(
                Problem(E_BAD_VALUE, f"IMPORTS must be a list of module paths, got {imports!r}")
            )

    if "SCHEDULES" in raw:
        if default_timezone is None:
            from django.conf import settings

            default_timezone = getattr(settings, "TIME_ZONE", None) or "UTC"
        values["schedules"], schedule_problems = parse_schedules(raw["SCHEDULES"], default_timezone)
        problems.extend(Problem(p.id, p.msg, p.hint) for p in schedule_problems)

    flow_problems, flow = _flow_rules(raw)
    problems.extend(flow_problems)
    if flow != FlowRules():
        values["flow"] = flow

    ttl_problems, queue_result_ttl = _queue_result_ttl(raw)
    problems.extend(ttl_problems)
    if queue_result_ttl:
        values["queue_result_ttl"] = queue_result_ttl

    rollup_problems, rollup_values = _rollup_options(raw)
    problems.extend(rollup_problems)
    values.update(rollup_values)
    if "ALERTS" in raw:
        values["alerts"], alert_problems = parse_alert_rules(raw["ALERTS"])
        problems.extend(Problem(p.id, p.msg, p.hint) for p in alert_problems)

    behavior_sources = []
    if "LOCK_LOST_BEHAVIOR" in raw:
        behavior_sources.append(("LOCK_LOST_BEHAVIOR option", raw["LOCK_LOST_BEHAVIOR"]))
    if environ.get(LOCK_LOST_ENV_VAR):
        behavior_sources.append(
            (f"{LOCK_LOST_ENV_VAR} environment variable", environ[LOCK_LOST_ENV_VAR])
        )
    for source, behavior in behavior_sources:  # later sources (the environment) win
        normalized = behavior.strip().lower() if isinstance(behavior, str) else behavior
        if normalized in LOCK_LOST_BEHAVIORS:
            values["lock_lost_behavior"] = normalized
        else:
            problems.append(
                Problem(
                    E_LOCK_LOST_BEHAVIOR,
                    f"Unknown lock-lost behaviour {behavior!r} in the {source}.",
                    hint='Use "sigkill" (default) or "sigterm".',
                )
            )

    options = Options(**values)
    problems.extend(_timing_warnings(options))
    if options.idle_poll_interval < options.poll_interval:
        if "idle_poll_interval" in values:  # set below POLL_INTERVAL: say so
            problems.append(
                Problem(
                    W_IDLE_POLL_BELOW_POLL,
                    f"IDLE_POLL_INTERVAL ({options.idle_poll_interval:g}s) is below "
                    f"POLL_INTERVAL ({options.poll_interval:g}s): a worker that listens for "
                    "NOTIFY would look for work more often than one that cannot; "
                    "POLL_INTERVAL is used instead.",
                    hint="Keep IDLE_POLL_INTERVAL at least POLL_INTERVAL (default 30 s).",
                    warning=True,
                )
            )
        values["idle_poll_interval"] = options.poll_interval  # (a long POLL_INTERVAL alone)
        options = Options(**values)
    # Comparing with a rejected value's default would only confuse: skip it then.
    compare = not rejected & {"LEASE_DURATION", "HEARTBEAT_INTERVAL"}
    if options.heartbeat_interval >= options.lease_duration:
        if compare:
            problems.append(
                Problem(
                    E_HEARTBEAT_NOT_BELOW_LEASE,
                    f"HEARTBEAT_INTERVAL ({options.heartbeat_interval:g}s) must be shorter than "
                    f"LEASE_DURATION ({options.lease_duration:g}s): every lease would expire "
                    "before it is renewed.",
                    hint="Keep HEARTBEAT_INTERVAL at most a third of LEASE_DURATION.",
                )
            )
        options = Options(**{**values, "heartbeat_interval": options.lease_duration / 3})
    elif compare and options.heartbeat_interval > options.lease_duration / 3:
        problems.append(
            Problem(
                W_HEARTBEAT_TOO_SLOW,
                f"HEARTBEAT_INTERVAL ({options.heartbeat_interval:g}s) is above a third of "
                f"LEASE_DURATION ({options.lease_duration:g}s): one slow or missed heartbeat "
                "can lose a lease.",
                hint="Keep HEARTBEAT_INTERVAL at most a third of LEASE_DURATION.",
                warning=True,
            )
        )
    return options, problems
