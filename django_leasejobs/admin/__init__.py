"""The Django admin of django-leasejobs: jobs, attempts, workers, schedules, queues, the
dashboard.

Django's autodiscovery imports this package; importing the modules below registers
their model admins.

| module | holds |
|--------|-------|
| ``jobs`` | the job list and page (attempts inline), the actions, the delete confirmation |
| ``bulk`` | the job list's bulk actions over every matching job, their confirmation page |
| ``workers`` | the worker list and page |
| ``schedules`` | the schedule list and page, the dashboard's "next scheduled runs" |
| ``queues`` | the queue list and page (pause, resume), the dashboard's limits column |
| ``workflows`` | the workflow list and page (graph, steps; cancel, retry failed steps) |
| ``dashboard`` | the queue dashboard view and its chart |
| ``filters`` | the list filters |
| ``filter_safety`` | the lists' 400 answer to a malformed filter |
| ``clock`` | the database's clock for everything shown as online, lease left or age |
| ``big_values`` | big values cut on pages (read cut by the database), their downloads |
| ``display``, ``reports`` | shared display helpers; an action's report |

The model admins (and the job list's filters) are importable from here, as they were
when this was one module: ``from django_leasejobs.admin import JobAdmin`` to subclass,
unregister and register again.
"""

from . import dashboard, jobs, queues, schedules, workers, workflows  # noqa: F401  (register their admins)
from .dashboard import QueueDashboardAdmin
from .filter_safety import FilterSafeAdmin
from .filters import HasErrorsFilter, QueueFilter, TaskFilter, WorkerFilter, WorkerProblemFilter
from .jobs import JobAdmin, JobAttemptInline
from .queues import QueueAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerAdmin
from .workflows import WorkflowAdmin

__all__ = [
    "FilterSafeAdmin",
    "HasErrorsFilter",
    "JobAdmin",
    "JobAttemptInline",
    "QueueAdmin",
    "QueueDashboardAdmin",
    "QueueFilter",
    "ScheduleAdmin",
    "TaskFilter",
    "WorkerAdmin",
    "WorkerFilter",
    "WorkerProblemFilter",
    "WorkflowAdmin",
]
