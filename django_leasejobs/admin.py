"""The Django admin for jobs, attempts and workers, plus the live queue dashboard.

Rows are never hand-edited: every change goes through an action that calls the
lease protocol (``leases.retry``, ``leases.cancel``), each action gated by its own
permission, reported with a message and recorded as an admin log entry.

A malformed filter in a list's URL (a NUL character, an invalid regular expression,
a value the database refuses) is answered with 400 Bad Request, never a server error.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.views.main import ALL_VAR, ERROR_FLAG, ORDER_VAR, PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import DatabaseError, router, transaction
from django.db.models import Count, Model, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

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

logger = logging.getLogger("django_leasejobs")


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


# Errors a malformed filter value raises when the list's query is compiled or run:
# the database refusing it (an invalid regular expression, a lookup it does not
# support), or the driver or a lookup failing on the value (SQLite's integers,
# ``__range`` with one value).
FILTER_ERRORS: tuple[type[Exception], ...] = (
    DatabaseError,
    OverflowError,
    IndexError,
    TypeError,
    ValueError,
)
# Parameters of the list that never reach a query's WHERE clause unchecked.
NON_FILTER_PARAMS = frozenset(
    {ALL_VAR, ORDER_VAR, PAGE_VAR, ERROR_FLAG, IS_POPUP_VAR, TO_FIELD_VAR}
)


class BadFilter(Exception):
    """A list's filter parameters cannot be evaluated: the answer is 400 Bad Request."""


def nul_parameter(params: Any) -> str:
    """The name of the first parameter whose name or value holds a NUL character ('' if none).

    PostgreSQL cannot compare text with NUL in it: such a filter fails in the database.
    """
    for name, values in params.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return str(name)
    return ""


class FilterSafeAdmin(admin.ModelAdmin):
    """A model admin whose list answers 400, never 500, to malformed filter parameters.

    Django turns some bad lookups into a redirect to ``?e=1``; errors that only show
    when the query runs (while counting, fetching the page, or rendering facets) are
    caught here. Inside a transaction (``ATOMIC_REQUESTS``, tests) the failed query
    runs in a savepoint, rolled back, so the request's transaction stays usable.
    """

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        for params in (request.GET, request.POST):
            name = nul_parameter(params)
            if name:
                return self.bad_filter_response(
                    request,
                    f"The parameter {name!r} contains a NUL character, which the database "
                    "cannot compare.",
                )
        try:
            response = super().changelist_view(request, extra_context)
            if isinstance(response, TemplateResponse):
                with self.filter_errors(request):
                    response.render()  # facets and the page's rows are queried here
        except BadFilter as exc:
            return self.bad_filter_response(request, str(exc))
        return response

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        with self.filter_errors(request):  # counts the matching rows
            return super().get_changelist_instance(request)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if "\x00" in object_id:
            return None  # no row has it; Django reports "does not exist"
        return super().get_object(request, object_id, from_field)

    @contextlib.contextmanager
    def filter_errors(self, request: HttpRequest) -> Iterator[None]:
        """Turn a query failure caused by the request's filters into :class:`BadFilter`."""
        model = cast(type[Model], self.model)
        using = router.db_for_read(model)
        in_transaction = transaction.get_connection(using).in_atomic_block
        try:
            with transaction.atomic(using=using) if in_transaction else contextlib.nullcontext():
                yield
        except FILTER_ERRORS as exc:
            if not set(request.GET) - NON_FILTER_PARAMS:
                raise  # no filter to blame: a real error
            logger.warning(
                "admin list %s: malformed filter %s",
                request.path,
                request.GET.urlencode(),
                exc_info=True,
            )
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            if isinstance(exc, DatabaseError) and reason:
                raise BadFilter(f"The database rejected this filter: {reason}") from exc
            raise BadFilter(
                f"This filter cannot be applied ({type(exc).__name__}: {reason})."
            ) from exc

    def bad_filter_response(self, request: HttpRequest, reason: str) -> HttpResponse:
        opts = self.model._meta
        url = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")
        return HttpResponseBadRequest(
            format_html(
                '<!doctype html><html lang="en"><head><title>{}</title></head><body>'
                '<h1>{}</h1><p>{}</p><p><a href="{}">{}</a></p></body></html>',
                _("Bad filter (400)"),
                _("Bad filter"),
                reason,
                url,
                _("Show the list without filters"),
            )
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
    fields = (
        "attempt",
        "outcome",
        "worker",
        "started_at",
        "finished_at",
        "error",
        "decision",
        "trace",
    )
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
    """Counts what an admin action changed and skipped (and why), then reports it once.

    Used by the job and the schedule admins; ``noun`` names what the action works on.
    """

    def __init__(
        self, admin_obj: admin.ModelAdmin[Any], request: HttpRequest, verb: str, noun: str = "job"
    ) -> None:
        self.admin = admin_obj
        self.request = request
        self.verb = verb
        self.noun = noun
        self.changed = 0
        self.skipped: dict[str, int] = {}
        self.jobs: list[int] = []
        """Jobs the action enqueued (a schedule's run now)."""

    def done(self, obj: Any, log_message: str, job_id: int | None = None) -> None:
        self.changed += 1
        self.admin.log_change(self.request, obj, log_message)
        if job_id is not None:
            self.jobs.append(job_id)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def send(self) -> None:
        level = messages.SUCCESS if self.changed else messages.WARNING
        text = f"{self.verb} {self.changed} {self.noun}{'s' if self.changed != 1 else ''}."
        if self.jobs:
            noun = ngettext("job", "jobs", len(self.jobs))
            text += f" Enqueued {noun} {', '.join(f'#{i}' for i in self.jobs)}."
        if self.skipped:
            reasons = "; ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            text += f" Skipped {sum(self.skipped.values())}: {reasons}."
        self.admin.message_user(self.request, text, level)


@admin.register(Job)
class JobAdmin(FilterSafeAdmin):
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
                    "snoozes",
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
            try:  # written to the database of the job's backend, whatever the admin reads
                result = leases.retry(job.pk, statuses=statuses, backend=job.backend)
            except ValueError:
                report.skip("because their task backend is not configured any more")
                continue
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
            try:
                result = leases.cancel(job.pk, backend=job.backend)
            except ValueError:
                report.skip("because their task backend is not configured any more")
                continue
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
    from .schedule_admin import dashboard_panel

    database = Job.objects.db
    health = stats.collect(using=database, online_after=online_after())
    context = {
        **site.each_context(request),
        "title": _("Queue dashboard"),
        "health": health,
        "totals": health.totals,
        "chart": chart_bars(health.per_minute),
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


class WorkerProblemFilter(admin.SimpleListFilter):
    title = _("problem")
    parameter_name = "problem"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, Any]]:
        return (("yes", _("reports a problem")), ("no", _("no problem")))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Worker]) -> QuerySet[Worker]:
        if self.value() == "yes":
            return queryset.exclude(problem="")
        if self.value() == "no":
            return queryset.filter(problem="")
        return queryset


@admin.register(Worker)
class WorkerAdmin(FilterSafeAdmin):
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
        "problem_short",
    )
    list_filter = ("state", "pool", "host", WorkerProblemFilter)
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


from . import schedule_admin  # noqa: E402, F401  (registers ScheduleAdmin)
