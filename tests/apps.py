import os

from django.apps import AppConfig


class TestsConfig(AppConfig):
    """The test suite is an app so that its modules can hold tasks (and models)."""

    name = "tests"
    label = "tests"
    default = True
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tests.worker_events import EVENTS_ENV, connect

        path = os.environ.get(EVENTS_ENV)
        if path:  # a worker started by tests/worker_harness.py: its signals, for waits
            connect(path)
        from tests import alert_receivers

        if os.environ.get(alert_receivers.RAISES_ENV):
            alert_receivers.connect()


class TasksAtStartConfig(TestsConfig):
    """The same app, importing its tasks when the apps are ready, as a site's app does
    whose signal handlers enqueue (``tests/settings_app_missing_tasks.py``). On Django 6
    that import is what registers Django's tasks system check (``django.tasks``
    registers it when imported), which runs each backend's ``check()``."""

    default = False

    def ready(self) -> None:
        TestsConfig.ready(self)
        from . import tasks  # noqa: F401
