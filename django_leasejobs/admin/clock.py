"""The admin's one clock: the database's.

Every "online", "lease left" and age the admin shows is measured against the clock
every lease uses (``functions.DatabaseNow``, ``leases.database_now``), never this
process's: a web server whose clock is off shows the same as the workers and the
dashboard. Lists read the database's time with their rows (:func:`with_database_now`),
so it costs no extra query.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db.models import DateTimeField, ExpressionWrapper, Model, QuerySet, Value

from .. import stats
from ..functions import DatabaseNow
from ..leases import database_now

NOW = "leasejobs_database_now"
"""The annotation that carries the database's time on rows read through the admin."""

M = TypeVar("M", bound=Model)


def with_database_now(queryset: QuerySet[M]) -> QuerySet[M]:
    """``queryset`` whose rows carry the database's time they were read at (see :func:`now_of`)."""
    return queryset.annotate(**{NOW: DatabaseNow()})


def now_of(obj: Any) -> datetime:
    """The database's time when ``obj`` was read, or, for a row read without it, now."""
    value = getattr(obj, NOW, None)
    if value is None:
        value = database_now(obj._state.db or "default")
    return value


def database_time_ago(seconds: float) -> ExpressionWrapper:
    """The database's time ``seconds`` ago, as an expression for a filter."""
    return ExpressionWrapper(
        DatabaseNow() - Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def online_after() -> float:
    """Seconds without a heartbeat after which a worker is gone (as ``leasejobs_status``,
    from the longest heartbeat interval of the configured backends)."""
    from ..backend import LeaseJobsBackend
    from ..compat import task_backends

    heartbeats = [
        backend.config.heartbeat_interval
        for backend in task_backends.all()
        if isinstance(backend, LeaseJobsBackend)
    ]
    return stats.online_window(max(heartbeats, default=10.0))
