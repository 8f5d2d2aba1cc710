"""Database-backed django.tasks backend with row leases, fenced writes and self-healing workers.

Public API: ``task`` (the decorator with per-task options), ``LeaseTask``,
``Backoff``, ``Retry`` (raised by a task to run again later without using an attempt).
The backend is ``django_leasejobs.backend.LeaseJobsBackend``.
"""

from .exceptions import Retry
from .lease_task import LeaseTask, task
from .retry import Backoff

__all__ = ["Backoff", "LeaseTask", "Retry", "task"]
__version__ = "0.1.0"
