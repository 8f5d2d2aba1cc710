from django.apps import AppConfig


class TestsConfig(AppConfig):
    """The test suite is an app so that its modules can hold tasks (and models)."""

    name = "tests"
    label = "tests"
    default_auto_field = "django.db.models.BigAutoField"
