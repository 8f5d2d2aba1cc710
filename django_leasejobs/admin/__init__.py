"""The Django admin of django-leasejobs: jobs, attempts, workers, schedules, the dashboard.

Django's autodiscovery imports this package; importing the modules below registers
their model admins.

| module | holds |
|--------|-------|
| ``jobs`` | the job list and page (attempts inline), the actions, the delete confirmation |
| ``workers`` | the worker list and page |
| ``schedules`` | the schedule list and page, the dashboard's "next scheduled runs" |
| ``dashboard`` | the queue dashboard view and its chart |
| ``filters`` | the list filters |
| ``filter_safety`` | the lists' 400 answer to a malformed filter |
| ``clock`` | the database's clock for everything shown as online, lease left or age |
| ``display``, ``reports`` | shared display helpers; an action's report |
"""

from . import dashboard, jobs, schedules, workers  # noqa: F401  (register their admins)
