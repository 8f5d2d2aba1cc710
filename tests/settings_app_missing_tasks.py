"""``tests/settings_app_missing.py`` with the ``tests`` app importing its tasks at start-up
(``tests.apps.TasksAtStartConfig``), as a site's app does whose signal handlers enqueue."""

from tests.settings_app_missing import *  # noqa: F403
from tests.settings_app_missing import INSTALLED_APPS

INSTALLED_APPS = [
    "tests.apps.TasksAtStartConfig" if app == "tests" else app for app in INSTALLED_APPS
]
