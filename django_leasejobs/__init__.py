"""Database-backed django.tasks backend with row leases, fenced writes and self-healing workers.

Public API: ``task`` (the decorator with per-task options), ``LeaseTask``,
``Backoff``, ``Retry`` (raised by a task to run again later without using an attempt).
The backend is ``django_leasejobs.backend.LeaseJobsBackend``.

The names are imported on first use: importing the package alone (as pytest does for the
testing kit's plugin, before Django is configured) loads neither Django's task framework
nor the backport, so a setup problem surfaces where the API is used, not in every import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .exceptions import Retry
    from .lease_task import LeaseTask, task
    from .retry import Backoff

__all__ = ["Backoff", "LeaseTask", "Retry", "task"]
__version__ = "0.1.0"

_HOMES = {
    "Backoff": ".retry",
    "LeaseTask": ".lease_task",
    "Retry": ".exceptions",
    "task": ".lease_task",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
