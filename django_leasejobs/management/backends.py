"""Look up a configured LeaseJobs backend for a management command."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DatabaseError

from ..backend import LeaseJobsBackend
from ..compat import task_backends
from ..schema import schema_problem


def get_leasejobs_backend(alias: str) -> LeaseJobsBackend:
    try:
        backend = task_backends[alias]
    except Exception as exc:  # InvalidTaskBackend on Django 6, ...Error on the backport
        raise CommandError(f"No task backend {alias!r} in settings.TASKS: {exc}") from exc
    if not isinstance(backend, LeaseJobsBackend):
        raise CommandError(
            f"TASKS[{alias!r}] uses {type(backend).__module__}.{type(backend).__qualname__}, "
            "not django_leasejobs.backend.LeaseJobsBackend."
        )
    try:
        backend.require_valid_config()
    except Exception as exc:
        raise CommandError(str(exc)) from exc
    return backend


def database_failure(backend: LeaseJobsBackend, exc: DatabaseError) -> CommandError:
    """The one-line error (exit code 2) of a command whose query failed: the fix when the
    database lacks this app's migrations or tables (a query on a missing table fails
    like any other), else the database's own error."""
    problem = schema_problem(backend.database)
    if problem:
        return CommandError(problem, returncode=2)
    detail = " ".join(str(exc).split())
    return CommandError(
        f"database {backend.database!r} unreachable or failing: {detail}".strip(), returncode=2
    )
