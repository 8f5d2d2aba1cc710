"""The queue dashboard: a view (at two addresses) with its cards, tables and trend charts.

It reads the queues' state through ``stats.collect`` on the database's clock (the paused
queues and the queue-wide limits through ``queues.dashboard_flow`` of this package), the
trend charts through ``trends.series`` (the rollup table only; ``?range=hour|day|week``,
drawn by ``trend_charts.py``), and refreshes in place
(``static/django_leasejobs/dashboard.js`` fetches the same range with ``fragment=1``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from .. import stats, trends
from ..alerts.banner import firing
from ..models import Job, Queue, QueueDashboard
from .clock import online_after
from .queues import QueueFlow, dashboard_flow
from .trend_charts import trend_chart

DASHBOARD_REFRESH_SECONDS = 5


def queue_rows(
    health: stats.Health, flows: dict[str, QueueFlow]
) -> list[tuple[stats.QueueHealth, QueueFlow | None]]:
    """The rows of the per-queue table: each queue with jobs, and each paused or limited
    queue without any, with its flow control (None: not paused, no limit)."""
    found = {q.queue: q for q in health.queues}
    for name in flows:
        if name not in found:
            found[name] = stats.QueueHealth(queue=name)
    return [(found[name], flows.get(name)) for name in sorted(found)]


def dashboard_response(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    from .schedules import dashboard_panel

    database = Job.objects.db
    health = stats.collect(using=database, online_after=online_after())
    range_name = request.GET.get("range", trends.DEFAULT_RANGE)
    if range_name not in trends.RANGES:
        range_name = trends.DEFAULT_RANGE
    trend = trends.series(range_name, now=health.now, using=database)
    may_see_queues = site.is_registered(Queue) and request.user.has_perm(
        "django_leasejobs.view_queue"
    )
    context = {
        **site.each_context(request),
        "title": _("Queue dashboard"),
        "health": health,
        "alerts": firing(database),
        "totals": health.totals,
        "chart": trend_chart(trend),
        "ranges": [(r.name, r.label) for r in trends.RANGES.values()],
        "queue_rows": queue_rows(health, dashboard_flow(database, health.now)),
        "queue_changelist": reverse(f"{site.name}:django_leasejobs_queue_changelist")
        if may_see_queues
        else "",
        "schedules": dashboard_panel(),
        "refresh_seconds": DASHBOARD_REFRESH_SECONDS,
        "job_changelist": reverse(f"{site.name}:django_leasejobs_job_changelist"),
        "opts": Job._meta,
    }
    template = (
        "django_leasejobs/admin/dashboard_body.html"
        if request.GET.get("fragment")
        else "django_leasejobs/admin/dashboard.html"
    )
    return TemplateResponse(request, template, context)


@admin.register(QueueDashboard)
class QueueDashboardAdmin(admin.ModelAdmin):
    """Puts "Queue dashboard" in the app's list on the admin index; staff with view access."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff) and (
            request.user.has_perm("django_leasejobs.view_job")
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return dashboard_response(self.admin_site, request)
