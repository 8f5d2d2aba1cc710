import os

from django.apps import AppConfig


class TestsConfig(AppConfig):
    """The test suite is an app so that its modules can hold tasks (and models)."""

    name = "tests"
    label = "tests"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tests.worker_events import EVENTS_ENV, connect

        path = os.environ.get(EVENTS_ENV)
        if path:  # a worker started by tests/worker_harness.py: its signals, for waits
            connect(path)
