"""System checks for django-leasejobs settings (stable ids: leasejobs.E001... / W001...)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import connections

from .conf import BACKEND_PATH, E_BAD_VALUE, E_DATABASE_FEATURES, E_UNKNOWN_DATABASE, parse_options

SQLITE_MIN = (3, 35, 0)  # UPDATE ... RETURNING


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
    return messages
