"""The test settings with the LeaseJobs backend in ``TASKS`` but ``django_leasejobs`` left
out of ``INSTALLED_APPS`` (check ``leasejobs.E008``), for subprocesses that never load
the app. Nothing imports ``django.tasks`` at start-up here: on Django 6 no tasks check
runs then (``tests/settings_app_missing_tasks.py`` has the app that imports its tasks).

Only the ``default`` database: Django 6's model checks connect to every MySQL/MariaDB
alias, and the suite's second database exists only when a test asked for it."""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_leasejobs"]
DATABASES = {"default": DATABASES["default"]}
