"""``leasejobs_metrics``: the queue's gauges for Prometheus, never open to anyone.

A request is answered when it carries ``Authorization: Bearer <LEASEJOBS_METRICS_TOKEN>``
or comes from a logged-in user with ``django_leasejobs.view_job`` (the permission
that shows the admin's queue dashboard). Anyone else gets 401 (no credentials) or
403 (wrong token, or a user without the permission).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..checks import METRICS_TOKEN_SETTING
from .database import QueueCollector

VIEW_PERMISSION = "django_leasejobs.view_job"


def _token_matches(header: str) -> bool:
    token = getattr(settings, METRICS_TOKEN_SETTING, None)
    scheme, _, given = header.partition(" ")
    if not isinstance(token, str) or not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """The 401/403 answer for a request that may not read the metrics, else None."""
    header = request.headers.get("Authorization", "")
    if header:
        if _token_matches(header):
            return None
        return HttpResponse("invalid credentials\n", status=403, content_type="text/plain")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="leasejobs metrics"'
        return response
    if not user.has_perm(VIEW_PERMISSION):
        return HttpResponse("permission denied\n", status=403, content_type="text/plain")
    return None


@never_cache
@require_GET
def leasejobs_metrics(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
