"""A receiver of ``alert_fired`` that raises, for workers started with
``LEASEJOBS_TEST_ALERT_RECEIVER_RAISES=1`` (tests/alerts/test_workers.py): the worker must
log the failure and go on evaluating. ``TestsConfig.ready`` connects it."""

from __future__ import annotations

from typing import Any

from django_leasejobs.alerts import Alert
from django_leasejobs.signals import alert_fired

RAISES_ENV = "LEASEJOBS_TEST_ALERT_RECEIVER_RAISES"


def broken_webhook(sender: type, alert: Alert, **kwargs: Any) -> None:
    raise RuntimeError(f"webhook down for {alert.rule}")


def connect() -> None:
    alert_fired.connect(broken_webhook, dispatch_uid="tests.alert_receivers.broken_webhook")
