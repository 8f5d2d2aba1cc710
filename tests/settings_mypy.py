"""Minimal settings for mypy's Django plugin: no database server is started."""

import django

SECRET_KEY = "typecheck-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_leasejobs"]
if django.VERSION < (6, 0):
    INSTALLED_APPS.insert(0, "django_tasks")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TASKS = {"default": {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
