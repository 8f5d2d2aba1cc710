"""Look up a configured LeaseJobs backend for a management command."""

from __future__ import annotations

from django.core.management.base import CommandError

from ..backend import LeaseJobsBackend
from ..compat import task_backends


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
