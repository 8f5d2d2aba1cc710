"""Prometheus metrics (the ``django-leasejobs[prometheus]`` extra).

* ``leasejobs_metrics``: a Django view serving the queue's gauges, read from the
  database at each scrape (``database.QueueCollector``); mount it yourself, it
  answers only a user with ``django_leasejobs.view_job`` or the bearer token of
  ``LEASEJOBS_METRICS_TOKEN``.
* ``WorkerMetrics``: a worker's own counters and histograms, fed by the worker's
  signals in its main process and served by ``runworker --metrics-port``.

Importing this package without ``prometheus_client`` raises ``ImproperlyConfigured``
naming the extra; nothing else in django-leasejobs imports it.
"""

from django.core.exceptions import ImproperlyConfigured

try:
    import prometheus_client  # noqa: F401 - fail here, with the extra's name
except ImportError as exc:
    raise ImproperlyConfigured(
        "django_leasejobs.metrics needs prometheus_client: "
        "pip install 'django-leasejobs[prometheus]'"
    ) from exc

from .database import QueueCollector
from .views import leasejobs_metrics
from .worker import WorkerMetrics

__all__ = ["QueueCollector", "WorkerMetrics", "leasejobs_metrics"]
