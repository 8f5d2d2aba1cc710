"""An alert delivered: a log record on the ``django_leasejobs`` logger and a signal.

A firing alert is logged at ERROR, a resolve at INFO, both with the stable ``extra``
keys ``alert`` (the rule's name), ``alert_kind``, ``alert_state``, ``backend``,
``queue``, ``task``, ``value``, ``threshold``, ``fired_at`` and ``worker`` (the worker
that delivers it). The signal goes to every receiver through ``send_robust``: a receiver
that raises is logged at ERROR (its traceback attached, ``receiver`` naming it) and
neither stops the others nor the evaluation.
"""

from __future__ import annotations

import logging
from typing import Any

from ..signals import alert_fired, alert_resolved
from .values import Alert

logger = logging.getLogger("django_leasejobs")


def _extra(alert: Alert, worker_id: str) -> dict[str, Any]:
    return {
        "alert": alert.rule,
        "alert_kind": alert.kind,
        "alert_state": alert.state,
        "backend": alert.backend,
        "queue": alert.queue,
        "task": alert.task,
        "value": alert.value,
        "threshold": alert.threshold,
        "fired_at": alert.fired_at.isoformat(),
        "worker": worker_id,
    }


def deliver(alert: Alert, *, sender: type, worker_id: str) -> None:
    """Log ``alert`` and send its signal (``sender``: the backend's class, as every
    signal of the package)."""
    extra = _extra(alert, worker_id)
    if alert.state == "firing":
        logger.error("alert %s: %s", alert.rule, alert.message, extra=extra)
        signal = alert_fired
    else:
        logger.info("alert %s resolved: %s", alert.rule, alert.message, extra=extra)
        signal = alert_resolved
    answers = signal.send_robust(sender, backend=alert.backend, worker_id=worker_id, alert=alert)
    for receiver, answer in answers:
        if isinstance(answer, Exception):
            name = getattr(receiver, "__qualname__", repr(receiver))
            logger.error(
                "alert %s: receiver %s raised %s",
                alert.rule,
                name,
                type(answer).__name__,
                exc_info=(type(answer), answer, answer.__traceback__),
                extra={**extra, "receiver": name},
            )
