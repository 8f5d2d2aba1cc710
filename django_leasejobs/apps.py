from django.apps import AppConfig


class LeaseJobsConfig(AppConfig):
    name = "django_leasejobs"
    verbose_name = "Lease jobs"
    default_auto_field = "django.db.models.BigAutoField"
