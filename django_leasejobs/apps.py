from django.apps import AppConfig


class LeaseJobsConfig(AppConfig):
    name = "django_leasejobs"
    verbose_name = "Lease jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
