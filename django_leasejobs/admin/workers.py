"""The worker list and page: the registry rows, online or gone by the database's clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ..models import Job, JobStatus, Worker, WorkerState
from .clock import now_of, online_after, with_database_now
from .display import relative
from .filter_safety import FilterSafeAdmin
from .filters import WorkerProblemFilter


@admin.register(Worker)
class WorkerAdmin(FilterSafeAdmin):
    # Narrow enough for 1280 px with the navigation sidebar open: the id names the host
    # and pid, the pool shows its size; host, pid and start time are on the worker's page.
    list_display = (
        "id",
        "queue_list",
        "pool_size",
        "last_seen",
        "online",
        "jobs_held",
        "problem_short",
    )
    list_filter = ("state", "pool", "host", WorkerProblemFilter)

    class Media:
        css = {"all": ["django_leasejobs/admin.css"]}

    search_fields = ("id", "host")
    ordering = ("-last_seen_at",)
    readonly_fields = (
        "id",
        "backend",
        "host",
        "pid",
        "queue_list",
        "pool",
        "concurrency",
        "state",
        "started_at",
        "last_seen_at",
        "stopped_at",
        "online",
        "problem",
        "held_jobs",
    )
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        held = (
            Job.objects.filter(status=JobStatus.RUNNING, locked_by=OuterRef("pk"))
            .values("locked_by")
            .annotate(n=Count("id"))
            .values("n")
        )
        workers = super().get_queryset(request).annotate(held=Coalesce(Subquery(held), 0))
        return with_database_now(workers)

    @admin.display(description=_("queues"))
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues) or "*"

    @admin.display(description=_("pool"), ordering="pool")
    def pool_size(self, worker: Worker) -> str:
        return f"{worker.pool} \u00d7{worker.concurrency}"

    @admin.display(description=_("last seen"), ordering="last_seen_at")
    def last_seen(self, worker: Worker) -> str:
        return format_html(
            '<span title="{} (UTC)">{}</span>',
            f"{worker.last_seen_at:%Y-%m-%d %H:%M:%S}",
            relative(worker.last_seen_at, now_of(worker)),
        )

    @admin.display(description=_("online"), boolean=True)
    def online(self, worker: Worker) -> bool:
        recent = now_of(worker) - timedelta(seconds=online_after())
        return worker.state != WorkerState.STOPPED and worker.last_seen_at >= recent

    @admin.display(description=_("jobs held"), ordering="held")
    def jobs_held(self, worker: Worker) -> str:
        count = getattr(worker, "held", 0)
        if not count:
            return "0"
        url = reverse("admin:django_leasejobs_job_changelist")
        return format_html(
            '<a href="{}?{}">{}</a>',
            url,
            urlencode({"worker": worker.id, "status__exact": "running"}),
            count,
        )

    @admin.display(description=_("problem"))
    def problem_short(self, worker: Worker) -> str:
        """The worker's own report of trouble (see ``Worker.problem``), cut short; the full
        text is the cell's tooltip and on the worker's page."""
        if not worker.problem:
            return "-"
        short = worker.problem if len(worker.problem) <= 60 else worker.problem[:59] + "…"
        return format_html(
            '<span class="leasejobs-problem" title="{}">⚠ {}</span>', worker.problem, short
        )

    @admin.display(description=_("jobs it holds now"))
    def held_jobs(self, worker: Worker) -> str:
        jobs = (
            Job.objects.filter(status=JobStatus.RUNNING, locked_by=worker.id)
            .only("id", "task_path", "attempt")  # never a job's big values
            .order_by("id")[:100]
        )
        if not jobs:
            return "-"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                '<li><a href="{}">#{} {}</a> attempt {}</li>',
                (
                    (
                        reverse("admin:django_leasejobs_job_change", args=[job.pk]),
                        job.pk,
                        job.task_path,
                        job.attempt,
                    )
                    for job in jobs
                ),
            ),
        )
