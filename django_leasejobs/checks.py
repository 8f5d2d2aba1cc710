"""System checks for django-leasejobs settings (stable ids: leasejobs.E001... / W001...)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from importlib import import_module
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import connections

from . import registry
from .alert_spec import E_ALERT_QUEUE
from .compat import DEFAULT_TASK_QUEUE_NAME
from .conf import (
    BACKEND_PATH,
    E_BAD_VALUE,
    E_DATABASE_FEATURES,
    E_LISTEN_DATABASE_NOT_POSTGRESQL,
    E_UNKNOWN_DATABASE,
    E_UNKNOWN_LIMITED_QUEUE,
    E_UNKNOWN_LISTEN_DATABASE,
    W_FOREIGN_DATABASE_OPTION,
    Options,
    parse_options,
)
from .exceptions import UnknownTask
from .schedule_spec import (
    E_SCHEDULE_QUEUE,
    E_SCHEDULE_TASK,
    E_SCHEDULE_USE_TZ,
    USE_TZ_PROBLEM,
    ScheduleSpec,
)

SQLITE_MIN = (3, 35, 0)  # UPDATE ... RETURNING

# DATABASES[...]["OPTIONS"] keys of SQLite (Django's SQLite backend pops transaction_mode
# and init_command, 5.1+; the others are sqlite3.connect()'s arguments), with the other
# supported vendors that take them too. Django hands the rest of OPTIONS to the driver
# when it first connects, not at `check`: PostgreSQL (libpq, through psycopg) refuses an
# unknown key ('invalid connection option "transaction_mode"'), MySQL and MariaDB
# (mysqlclient, PyMySQL) an unexpected keyword argument. MySQL's init_command is its own.
SQLITE_OPTIONS: dict[str, frozenset[str]] = {
    "transaction_mode": frozenset(),
    "init_command": frozenset({"mysql"}),
    "timeout": frozenset(),
    "detect_types": frozenset(),
    "check_same_thread": frozenset(),
    "cached_statements": frozenset(),
}
VENDOR_NAMES = {"postgresql": "PostgreSQL", "mysql": "MySQL/MariaDB"}
# What the first connection then fails with, by vendor.
VENDOR_REFUSALS = {
    "postgresql": 'invalid connection option "{key}"',
    "mysql": "a TypeError: the driver takes no '{key}' argument",
}


def leasejobs_backends() -> list[tuple[str, dict[str, Any]]]:
    """(alias, params) of every TASKS entry that uses the LeaseJobs backend."""
    found = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if isinstance(params, dict) and params.get("BACKEND") == BACKEND_PATH:
            found.append((alias, params))
    return found


def database_feature_problem(alias: str) -> str:
    """Why the database behind ``alias`` cannot run the claim path ('' when it can)."""
    connection = connections[alias]
    vendor = connection.vendor
    if vendor == "postgresql":
        return ""
    if vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_MIN:
            return (
                f"SQLite {sqlite3.sqlite_version} lacks UPDATE ... RETURNING "
                f"(needs {'.'.join(map(str, SQLITE_MIN))}+)."
            )
        return ""
    if vendor == "mysql":
        if not connection.features.has_select_for_update_skip_locked:
            return (
                "this MySQL/MariaDB server lacks SELECT ... FOR UPDATE SKIP LOCKED "
                "(MySQL 8+, MariaDB 10.6+)."
            )
        return ""
    return (
        f"the {vendor!r} database backend is not supported "
        "(use PostgreSQL, SQLite, MySQL or MariaDB)."
    )


def scheduled_task_problem(
    spec: ScheduleSpec, backend: str, queues: Iterable[str] | None
) -> tuple[str, str]:
    """(check id, message) when a schedule's task cannot run on ``backend`` ('' id if it can).

    ``queues``: the backend's ``QUEUES`` (None or empty: every queue).
    """
    try:
        task = registry.resolve(spec.task_path)
    except UnknownTask as exc:
        return E_SCHEDULE_TASK, f"Schedule {spec.name!r}: {exc}"
    queue = spec.queue or task.queue_name
    served = set(queues or ())
    if served and queue not in served:
        return (
            E_SCHEDULE_QUEUE,
            f"Schedule {spec.name!r}: queue {queue!r} is not served by TASKS[{backend!r}] "
            f"(QUEUES: {', '.join(sorted(served))}).",
        )
    return "", ""


def _schedule_messages(
    alias: str, params: dict[str, Any], specs: Sequence[ScheduleSpec], imports: Sequence[str]
) -> list[checks.CheckMessage]:
    if not specs:
        return []
    if not settings.USE_TZ:
        return [
            _message(
                E_SCHEDULE_USE_TZ, USE_TZ_PROBLEM, "Set USE_TZ = True.", False, f"TASKS[{alias!r}]"
            )
        ]
    for module in imports:
        with contextlib.suppress(ImportError):  # the worker reports a bad IMPORTS entry
            import_module(module)
    queues = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
    found = []
    for spec in specs:
        problem_id, msg = scheduled_task_problem(spec, alias, queues)
        if problem_id:
            hint = (
                "Name a function declared with @task in an installed app's tasks module "
                "(or a module in OPTIONS['IMPORTS'])."
                if problem_id == E_SCHEDULE_TASK
                else "Add the queue to QUEUES, or give the schedule a queue the backend serves."
            )
            found.append(_message(problem_id, msg, hint, False, f"TASKS[{alias!r}]"))
    return found


def _listen_database_messages(options: Options, obj: str) -> list[checks.CheckMessage]:
    """``LISTEN_DATABASE``: an alias in ``DATABASES``, on PostgreSQL (known without a query)."""
    alias = options.listen_database
    if alias is None:
        return []
    if alias not in settings.DATABASES:
        return [
            _message(
                E_UNKNOWN_LISTEN_DATABASE,
                f"LISTEN_DATABASE {alias!r} is not in settings.DATABASES.",
                "Add an alias that connects to the job database directly (not through a "
                f"pooler), or use one of: {', '.join(settings.DATABASES)}.",
                False,
                obj,
            )
        ]
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        return [
            _message(
                E_LISTEN_DATABASE_NOT_POSTGRESQL,
                f"LISTEN_DATABASE {alias!r} is a {vendor!r} database: only PostgreSQL "
                "has LISTEN/NOTIFY.",
                "Point it at the PostgreSQL database of DATABASE, connecting directly "
                "(not through a pooler), or remove it.",
                False,
                obj,
            )
        ]
    return []


def _limited_queue_messages(
    params: dict[str, Any], options: Options, obj: str
) -> list[checks.CheckMessage]:
    """A queue in ``QUEUE_LIMITS``, ``QUEUE_RATE_LIMITS`` or ``QUEUE_RESULT_TTL`` that the
    backend does not serve (its ``QUEUES``; without it, Django's default queue only; an
    empty list serves every queue): the limit or retention would never apply."""
    served = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
    if not served or not isinstance(served, list | tuple | set | frozenset):
        return []
    found = []
    for option, names in (
        ("QUEUE_LIMITS", options.flow.queue_limits),
        ("QUEUE_RATE_LIMITS", options.flow.queue_rates),
        ("QUEUE_RESULT_TTL", options.queue_result_ttl),
    ):
        for name in sorted(set(names) - set(served)):
            found.append(
                _message(
                    E_UNKNOWN_LIMITED_QUEUE,
                    f"{option} names the queue {name!r}, which this backend does not serve "
                    f"(QUEUES: {', '.join(sorted(map(str, served)))}).",
                    "Add the queue to QUEUES, or remove its "
                    f"{'retention' if option == 'QUEUE_RESULT_TTL' else 'limit'}.",
                    False,
                    obj,
                )
            )
    return found


def _alert_queue_messages(
    params: dict[str, Any], options: Options, obj: str
) -> list[checks.CheckMessage]:
    """An alert rule on a queue the backend does not serve (only when ``QUEUES`` lists
    queues): no job of it could exist, so the rule could never say anything true."""
    served = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
    if not served or not isinstance(served, list | tuple | set | frozenset):
        return []
    return [
        _message(
            E_ALERT_QUEUE,
            f"Alert rule {rule.name!r} watches the queue {rule.queue!r}, which this backend "
            f"does not serve (QUEUES: {', '.join(sorted(map(str, served)))}).",
            "Add the queue to QUEUES, or name a queue the backend serves in the rule.",
            False,
            obj,
        )
        for rule in options.alerts
        if rule.queue is not None and rule.queue not in served
    ]


def foreign_database_options(vendor: str, options: Any) -> list[str]:
    """The keys of a database's ``OPTIONS`` that are SQLite's and that ``vendor``'s driver
    refuses when Django connects (only PostgreSQL and MySQL/MariaDB are judged)."""
    if vendor not in VENDOR_NAMES or not isinstance(options, dict):
        return []
    return [key for key in options if key in SQLITE_OPTIONS and vendor not in SQLITE_OPTIONS[key]]


def _database_options_messages(aliases: Iterable[str]) -> list[checks.CheckMessage]:
    """``leasejobs.W006``: SQLite options on the backends' PostgreSQL or MySQL databases,
    which pass ``check`` and fail the first query."""
    found = []
    for alias in aliases:
        vendor = connections[alias].vendor
        engine = VENDOR_NAMES.get(vendor, vendor)
        for key in foreign_database_options(vendor, settings.DATABASES[alias].get("OPTIONS")):
            found.append(
                _message(
                    W_FOREIGN_DATABASE_OPTION,
                    f"DATABASES[{alias!r}]['OPTIONS'] has {key!r}, an SQLite option, on a "
                    f"{engine} database, whose driver refuses it: the first query will fail "
                    f"({VENDOR_REFUSALS[vendor].format(key=key)}).",
                    f"Remove OPTIONS[{key!r}] from DATABASES[{alias!r}]: it is an SQLite "
                    "option (keep it in the settings of an SQLite database only).",
                    True,
                    f"DATABASES[{alias!r}]",
                )
            )
    return found


def _message(problem_id: str, msg: str, hint: str, warning: bool, obj: str) -> checks.CheckMessage:
    kind = checks.Warning if warning else checks.Error
    return kind(msg, hint=hint or None, obj=obj, id=problem_id)


@checks.register(checks.Tags.compatibility)
def check_backends(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterable[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    databases_used: dict[str, None] = {}  # the backends' database aliases, in order, once
    for alias, params in leasejobs_backends():
        obj = f"TASKS[{alias!r}]"
        raw = params.get("OPTIONS", {})
        if not isinstance(raw, dict):
            messages.append(
                _message(
                    E_BAD_VALUE,
                    f"OPTIONS must be a dict, got {type(raw).__name__}.",
                    "",
                    False,
                    obj,
                )
            )
            continue
        options, problems = parse_options(raw)
        messages.extend(_message(p.id, p.msg, p.hint, p.warning, obj) for p in problems)
        messages.extend(_schedule_messages(alias, params, options.schedules, options.imports))
        messages.extend(_listen_database_messages(options, obj))
        messages.extend(_limited_queue_messages(params, options, obj))
        messages.extend(_alert_queue_messages(params, options, obj))
        if options.database not in settings.DATABASES:
            messages.append(
                _message(
                    E_UNKNOWN_DATABASE,
                    f"DATABASE {options.database!r} is not in settings.DATABASES.",
                    f"Use one of: {', '.join(settings.DATABASES)}.",
                    False,
                    obj,
                )
            )
            continue
        databases_used[options.database] = None
        listen = options.listen_database
        if listen is not None and listen in settings.DATABASES:
            databases_used[listen] = None
        # Vendor support is known without a connection. Server versions (MySQL/MariaDB
        # only; PostgreSQL needs nothing and SQLite's version is the library's) are looked
        # at when the check run includes database checks, as Django's own MySQL checks do.
        vendor = connections[options.database].vendor
        if vendor not in ("postgresql", "sqlite", "mysql") or (
            databases is not None and options.database in databases
        ):
            problem = database_feature_problem(options.database)
            if problem:
                messages.append(
                    _message(
                        E_DATABASE_FEATURES,
                        f"Database {options.database!r}: {problem}",
                        "",
                        False,
                        obj,
                    )
                )
    messages.extend(_database_options_messages(databases_used))
    return messages


E_METRICS_TOKEN = "leasejobs.E016"  # noqa: S105 - a check id
METRICS_TOKEN_SETTING = "LEASEJOBS_METRICS_TOKEN"  # noqa: S105 - the setting's name
METRICS_TOKEN_MIN_LENGTH = 32


@checks.register(checks.Tags.security)
def check_metrics_token(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> Iterable[checks.CheckMessage]:
    """``LEASEJOBS_METRICS_TOKEN`` (the metrics view's bearer token), when set."""
    token = getattr(settings, METRICS_TOKEN_SETTING, None)
    if token is None:
        return []
    if (
        isinstance(token, str)
        and len(token) >= METRICS_TOKEN_MIN_LENGTH
        and not any(c.isspace() for c in token)
    ):
        return []
    return [
        checks.Error(
            f"{METRICS_TOKEN_SETTING} must be a string of at least {METRICS_TOKEN_MIN_LENGTH} "
            "characters without whitespace.",
            hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'",
            obj=METRICS_TOKEN_SETTING,
            id=E_METRICS_TOKEN,
        )
    ]
