"""Database-backed django.tasks backend with row leases, fenced writes and self-healing workers.

Public API: ``task`` (the decorator with per-task options), ``LeaseTask``,
``Backoff``. The backend is ``django_leasejobs.backend.LeaseJobsBackend``.
"""

from .lease_task import LeaseTask, task
from .retry import Backoff

__all__ = ["Backoff", "LeaseTask", "task"]
__version__ = "0.1.0"
