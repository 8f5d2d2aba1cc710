"""The Django admin for jobs, attempts and workers, plus the live queue dashboard.

Rows are never hand-edited: every change goes through an action that calls the
lease protocol (``leases.retry``, ``leases.cancel``), each action gated by its own
permission, reported with a message and recorded as an admin log entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, cast

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from . import leases, stats
from .models import (
    FINISHED_STATUSES,
    Job,
    JobAttempt,
    JobStatus,
    QueueDashboard,
    Worker,
    WorkerState,
)
from .templatetags.leasejobs_admin import seconds

DASHBOARD_REFRESH_SECONDS = 5


def online_after() -> float:
    """The "online" window of the admin: as ``leasejobs_status``, from the default backend."""
    from .backend import LeaseJobsBackend
    from .compat import task_backends

    heartbeats = [
        backend.config.heartbeat_interval
        for backend in task_backends.all()
        if isinstance(backend, LeaseJobsBackend)
    ]
    return stats.online_window(max(heartbeats, default=10.0))


def pretty_json(value: Any) -> str:
    """Escaped, indented JSON in a <pre> (never rendered as HTML)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="leasejobs-json">{}</pre>', text)


def _status_badge(status: str) -> str:
    return format_html(
        '<span class="leasejobs-status leasejobs-status-{}">{}</span>',
        status,
        JobStatus(status).label if status in JobStatus.values else status,
    )


class FieldValueFilter(admin.SimpleListFilter):
    """A list filter whose value is matched exactly against one job column."""

    field: str

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value():
            return queryset.filter(**{self.field: self.value()})
        return queryset


class TaskFilter(FieldValueFilter):
    title = _("task")
    parameter_name = "task"
    field = "task_path"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        # Tasks of active jobs plus recently finished ones: cheap on a big table.
        recent = timezone.now() - timedelta(hours=1)
        paths = (
            Job.objects.filter(
                Q(status__in=[JobStatus.PENDING, JobStatus.RUNNING])
                | Q(status__in=FINISHED_STATUSES, finished_at__gte=recent)
            )
            .values_list("task_path", flat=True)
            .distinct()
            .order_by("task_path")[:200]
        )
        # Dead letters of any age, through their own small partial index.
        dead = (
            Job.objects.filter(status=JobStatus.DEAD)
            .values_list("task_path", flat=True)
            .distinct()
            .order_by("task_path")[:200]
        )
        return [(path, path) for path in sorted({*paths, *dead})]


class QueueFilter(FieldValueFilter):
    """Queues the backends declare plus those of active jobs (no DISTINCT over the table)."""

    title = _("queue")
    parameter_name = "queue"
    field = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        from .backend import LeaseJobsBackend
        from .compat import task_backends

        names = {
            queue
            for backend in task_backends.all()
            if isinstance(backend, LeaseJobsBackend)
            for queue in backend.queues
        }
        names.update(
            Job.objects.filter(status__in=[JobStatus.PENDING, JobStatus.RUNNING])
            .values_list("queue", flat=True)
            .distinct()
        )
        chosen = self.value()
        if chosen:
            names.add(chosen)
        return [(name, name) for name in sorted(names)]


class CappedCountPaginator(Paginator):
    """Counts at most CAP rows: COUNT(*) over a million jobs costs more than the page."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        rows: Any = self.object_list
        if isinstance(rows, QuerySet):
            return rows.values("pk").order_by()[: self.CAP + 1].count()
        return len(rows)


class WorkerFilter(FieldValueFilter):
    """``?worker=<id>``: jobs a worker holds (linked from the worker list; not shown)."""

    title = _("worker")
    parameter_name = "worker"
    field = "locked_by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []


class HasErrorsFilter(admin.SimpleListFilter):
    title = _("has errors")
    parameter_name = "has_errors"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value() == "yes":
            return queryset.exclude(last_error="")
        if self.value() == "no":
            return queryset.filter(last_error="")
        return queryset


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    ordering = ("attempt",)
    fields = ("attempt", "outcome", "worker", "started_at", "finished_at", "error", "trace")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Attempts are part of a job's history: whoever may view jobs sees them.
        return request.user.has_perm("django_leasejobs.view_job")

    @admin.display(description=_("error"))
    def error(self, attempt: JobAttempt) -> str:
        return format_html("<code>{}</code><br>{}", attempt.error_class, attempt.error_message)

    @admin.display(description=_("traceback"))
    def trace(self, attempt: JobAttempt) -> str:
        if not attempt.traceback:
            return "-"
        return format_html(
            '<details><summary>{}</summary><pre class="leasejobs-traceback">{}</pre></details>',
            _("show"),
            attempt.traceback,
        )


class ActionReport:
    """Counts what an action changed and skipped (and why), then reports it once."""

    def __init__(self, admin_obj: JobAdmin, request: HttpRequest, verb: str) -> None:
        self.admin = admin_obj
        self.request = request
        self.verb = verb
        self.changed = 0
        self.skipped: dict[str, int] = {}

    def done(self, job: Job, log_message: str) -> None:
        self.changed += 1
        self.admin.log_change(self.request, job, log_message)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def send(self) -> None:
        level = messages.SUCCESS if self.changed else messages.WARNING
        text = f"{self.verb} {self.changed} job{'s' if self.changed != 1 else ''}."
        if self.skipped:
            reasons = "; ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            text += f" Skipped {sum(self.skipped.values())}: {reasons}."
        self.admin.message_user(self.request, text, level)


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "task_name",
        "queue",
        "status_badge",
        "attempts_display",
        "stall_count",
        "worker",
        "lease_left",
        "progress_display",
        "enqueued_at",
        "started_at",
        "finished_at",
    )
    list_display_links = ("id", "task_name")
    list_filter = ("status", QueueFilter, TaskFilter, HasErrorsFilter, WorkerFilter)
    paginator = CappedCountPaginator
    search_fields = ("task_path", "=key")
    search_help_text = _("Job id, dedup key, or part of the task path.")

    class Media:
        css = {"all": ["django_leasejobs/admin.css"]}

    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) over the whole table
    inlines = (JobAttemptInline,)
    actions = ("retry_now", "cancel_jobs", "requeue_dead", "delete_finished")
    fieldsets = (
        (None, {"fields": ("task_path", "status_badge", "queue", "priority", "backend", "key")}),
        (
            _("Arguments and results"),
            {"fields": ("args_json", "kwargs_json", "result_json", "checkpoint_json")},
        ),
        (
            _("Attempts and lease"),
            {
                "fields": (
                    "attempts_display",
                    "stall_count",
                    "max_stalls",
                    "timeout",
                    "locked_by",
                    "lease_left",
                    "heartbeat_at",
                    "cancel_requested",
                    "progress_display",
                    "last_error_display",
                )
            },
        ),
        (
            _("Times"),
            {
                "fields": (
                    "enqueued_at",
                    "run_after",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                )
            },
        ),
    )
    # Every field shown is read only: the job page is a view, never a form.
    readonly_fields = tuple(
        cast(str, name) for _, options in fieldsets for name in options["fields"]
    )

    # -- read only ----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # finished jobs are deleted by the permission-gated action only

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip().lstrip("#")
        if term.isascii() and term.isdecimal() and len(term) < 19:
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    # -- columns ------------------------------------------------------------------

    @admin.display(description=_("task"), ordering="task_path")
    def task_name(self, job: Job) -> str:
        module, _dot, name = job.task_path.rpartition(".")
        return format_html('<span title="{}">{}</span>', job.task_path, name or module)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, job: Job) -> str:
        badge = _status_badge(job.status)
        if job.cancel_requested and job.status == JobStatus.RUNNING:
            return format_html("{} <small>{}</small>", badge, _("cancel requested"))
        return badge

    @admin.display(description=_("attempt"))
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempt}/{job.max_attempts}"

    @admin.display(description=_("worker"))
    def worker(self, job: Job) -> str:
        return job.locked_by or job.last_worker or "-"

    @admin.display(description=_("lease left"))
    def lease_left(self, job: Job) -> str:
        if job.status != JobStatus.RUNNING or job.locked_until is None:
            return "-"
        left = (job.locked_until - timezone.now()).total_seconds()
        if left < 0:
            return format_html('<span class="leasejobs-expired">{}</span>', _("expired"))
        return seconds(left)

    @admin.display(description=_("progress"))
    def progress_display(self, job: Job) -> str:
        if job.progress is None:
            return "-"
        return format_html(
            '<progress value="{}" max="1"></progress> {}% {}',
            f"{job.progress:.3f}",
            f"{job.progress * 100:.0f}",
            job.progress_message,
        )

    @admin.display(description=_("arguments"))
    def args_json(self, job: Job) -> str:
        return pretty_json(job.args)

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, job: Job) -> str:
        return pretty_json(job.kwargs)

    @admin.display(description=_("result"))
    def result_json(self, job: Job) -> str:
        return pretty_json(job.result) if job.status == JobStatus.SUCCEEDED else "-"

    @admin.display(description=_("checkpoint"))
    def checkpoint_json(self, job: Job) -> str:
        return pretty_json(job.checkpoint) if job.checkpoint is not None else "-"

    @admin.display(description=_("last error"))
    def last_error_display(self, job: Job) -> str:
        if not job.last_error:
            return "-"
        return format_html('<pre class="leasejobs-error">{}</pre>', job.last_error)

    # -- actions ------------------------------------------------------------------

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.cancel_job")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.requeue_job")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.purge_job")

    def _retry(
        self, request: HttpRequest, queryset: QuerySet[Job], statuses: list[str], verb: str
    ) -> None:
        report = ActionReport(self, request, verb)
        for job in queryset.only("id", "status", "backend", "task_path"):
            result = leases.retry(job.pk, statuses=statuses, using=queryset.db)
            if result == leases.RetryResult.RETRIED:
                report.done(job, f"{verb} (was {job.status})")
            elif result == leases.RetryResult.KEY_TAKEN:
                report.skip("because another active job holds their dedup key")
            else:
                report.skip(f"not {' or '.join(statuses)}")
        report.send()

    @admin.action(description=_("Retry now (failed or dead jobs)"), permissions=["retry"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._retry(request, queryset, [JobStatus.FAILED, JobStatus.DEAD], "Retried")

    @admin.action(description=_("Requeue dead letters"), permissions=["requeue"])
    def requeue_dead(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._retry(request, queryset, [JobStatus.DEAD], "Requeued")

    @admin.action(
        description=_("Cancel (pending: now; running: the worker stops it)"), permissions=["cancel"]
    )
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        report = ActionReport(self, request, "Cancelled")
        for job in queryset.only("id", "status", "backend", "task_path"):
            result = leases.cancel(job.pk, using=queryset.db)
            if result == leases.CancelResult.CANCELLED:
                report.done(job, "Cancelled (was pending)")
            elif result == leases.CancelResult.REQUESTED:
                report.done(job, "Cancel requested (running; its worker stops it)")
            else:
                report.skip("already finished or already being cancelled")
        report.send()

    @admin.action(description=_("Delete finished jobs"), permissions=["purge"])
    def delete_finished(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        report = ActionReport(self, request, "Deleted")
        finished = queryset.filter(status__in=FINISHED_STATUSES)
        unfinished = queryset.exclude(status__in=FINISHED_STATUSES).count()
        ids = list(finished.values_list("pk", flat=True))
        if ids:
            doomed = Job.objects.using(queryset.db).filter(pk__in=ids, status__in=FINISHED_STATUSES)
            self.log_deletions(request, doomed)
            report.changed = len(ids)
            doomed.delete()
        if unfinished:
            report.skipped["not finished (pending or running)"] = unfinished
        report.send()

    # -- dashboard ------------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        from django.urls import path

        urls = super().get_urls()
        info = (self.opts.app_label, self.opts.model_name)
        return [
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="{}_{}_dashboard".format(*info),
            ),
            *urls,
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return dashboard_response(self.admin_site, request)


def chart_bars(
    per_minute: list[stats.MinuteCount], width: int = 600, height: int = 120
) -> dict[str, Any]:
    """Geometry of the per-minute succeeded/failed bar chart (rendered as SVG)."""
    peak = max([m.succeeded + m.failed for m in per_minute] + [1])
    slot = width / max(len(per_minute), 1)
    bars = []
    for i, minute in enumerate(per_minute):
        ok_h = minute.succeeded / peak * height
        fail_h = minute.failed / peak * height
        bars.append(
            {
                "x": round(i * slot + 1, 1),
                "w": round(max(slot - 2, 1), 1),
                "ok_y": round(height - ok_h, 1),
                "ok_h": round(ok_h, 1),
                "fail_y": round(height - ok_h - fail_h, 1),
                "fail_h": round(fail_h, 1),
                "label": (
                    f"{minute.minute:%H:%M} succeeded {minute.succeeded}, failed {minute.failed}"
                ),
            }
        )
    return {"bars": bars, "width": width, "height": height, "peak": peak}


def dashboard_response(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    database = Job.objects.db
    health = stats.collect(using=database, online_after=online_after())
    context = {
        **site.each_context(request),
        "title": _("Queue dashboard"),
        "health": health,
        "totals": health.totals,
        "chart": chart_bars(health.per_minute),
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


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "host",
        "pid",
        "queue_list",
        "pool",
        "concurrency",
        "started_at",
        "last_seen_at",
        "online",
        "jobs_held",
    )
    list_filter = ("state", "pool", "host")
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
        return super().get_queryset(request).annotate(held=Coalesce(Subquery(held), 0))

    @admin.display(description=_("queues"))
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues) or "*"

    @admin.display(description=_("online"), boolean=True)
    def online(self, worker: Worker) -> bool:
        recent = timezone.now() - timedelta(seconds=online_after())
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

    @admin.display(description=_("jobs it holds now"))
    def held_jobs(self, worker: Worker) -> str:
        jobs = Job.objects.filter(status=JobStatus.RUNNING, locked_by=worker.id).order_by("id")[
            :100
        ]
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
