"""URLconf of tests/observability/test_metrics.py: the metrics view mounted as the docs show."""

from django.urls import path

from django_leasejobs.metrics import leasejobs_metrics

urlpatterns = [path("metrics/", leasejobs_metrics)]
