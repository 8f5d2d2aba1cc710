"""The job admin: the list, the read-only job page with its attempts, and the actions.

Rows are never hand-edited: every change goes through an action that calls the lease
protocol (``leases.retry``, ``leases.cancel``) or pruning's one rule for deleting
finished jobs, each action gated by its own permission, reported with a message and
recorded as an admin log entry. Deleting asks first, on a confirmation page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _

from .. import leases, pruning, queues
from ..alerts.banner import firing
from ..job_search import SearchSyntaxError, apply_search, parse_search
from ..leases import database_now
from ..limits import describe_group
from ..models import Job, JobAttempt, JobStatus
from ..templatetags.leasejobs_admin import seconds
from ..templatetags.leasejobs_admin import task_name as function_name
from . import big_values
from .big_values import ATTEMPT_TEXT, JOB_BIG, JOB_JSON, JOB_TEXT, cut_note, preview, shown_json
from .bulk import bulk_action_view, bulk_links
from .clock import now_of, with_database_now
from .dashboard import dashboard_response
from .display import relative, status_badge
from .filter_safety import FilterSafeAdmin
from .filters import HasErrorsFilter, QueueFilter, TaskFilter, WorkerFilter
from .reports import ActionReport
from .workflows import children_of, parents_of, relatives_html

CONFIRMATION_SHOWS = 100
"""Jobs the delete confirmation lists by name (it counts them all)."""

CONFIRMATION_IDS = 1000
"""At most this many finished jobs' ids the delete confirmation posts back (fewer when
``DATA_UPLOAD_MAX_NUMBER_FIELDS`` would refuse them); a larger *select all* posts back
its bound instead (:class:`ConfirmedBound`)."""

CONFIRMATION_OTHER_FIELDS = 10
"""Room for the confirmation form's other fields (token, action, post, select_across)."""


def confirmation_ids_limit() -> int:
    """How many ids the delete confirmation may post back."""
    limit = CONFIRMATION_IDS
    fields = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    if fields is not None:
        limit = min(limit, fields - CONFIRMATION_OTHER_FIELDS)
    return max(limit, 0)


@dataclass(frozen=True)
class ConfirmedBound:
    """What a delete confirmation of a large *select all* counted: the finished jobs
    matching the list's filters with an id up to ``upto`` (the highest it counted) that
    had finished before ``at`` (the database's time, read before it counted).

    A job that finishes after the page read the time has a ``finished_at`` no earlier
    than ``at``, and one enqueued later a higher id: neither is deleted by the
    confirmation.
    """

    upto: int
    at: datetime

    UPTO = "leasejobs_upto"
    AT = "leasejobs_at"

    def fields(self) -> dict[str, str]:
        """The confirmation form's hidden fields."""
        return {self.UPTO: str(self.upto), self.AT: self.at.isoformat()}

    @classmethod
    def of(cls, request: HttpRequest) -> ConfirmedBound | None:
        """The bound a confirmation posted, or None when it is missing or malformed."""
        try:
            upto = int(request.POST[cls.UPTO])
            at = datetime.fromisoformat(request.POST[cls.AT])
        except (KeyError, ValueError):
            return None
        if at.tzinfo is None:
            return None
        return cls(upto=upto, at=at)

    def limit(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        return jobs.filter(pk__lte=self.upto, finished_at__lt=self.at)


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

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobAttempt]:
        # The message and traceback are read cut to what the page shows (big_values).
        return big_values.with_previews(super().get_queryset(request), ATTEMPT_TEXT)

    def _download_url(self, attempt: JobAttempt, name: str) -> str:
        return reverse(
            f"{self.admin_site.name}:django_leasejobs_job_attempt_download",
            args=[attempt.job_id, attempt.pk, name],
        )

    @admin.display(description=_("error"))
    def error(self, attempt: JobAttempt) -> str:
        message = preview(attempt, "error_message")
        if message is None or not message.cut:
            return format_html(
                "<code>{}</code><br>{}", attempt.error_class, message.text if message else ""
            )
        return format_html(
            "<code>{}</code><br>{}…{}",
            attempt.error_class,
            message.text,
            cut_note(message, self._download_url(attempt, "error_message")),
        )

    @admin.display(description=_("traceback"))
    def trace(self, attempt: JobAttempt) -> str:
        traceback = preview(attempt, "traceback")
        if traceback is None or not traceback.text:
            return "-"
        if not traceback.cut:
            return format_html(
                '<details><summary>{}</summary><pre class="leasejobs-traceback">{}</pre></details>',
                _("show"),
                traceback.text,
            )
        return format_html(
            '<details><summary>{}</summary><pre class="leasejobs-traceback leasejobs-cut">{}…</pre>'
            "</details>{}",
            _("show"),
            traceback.text,
            cut_note(traceback, self._download_url(attempt, "traceback")),
        )


class MoreThan(int):
    """A count past the paginator's cap: ``CAP + 1`` for the paging arithmetic, shown as
    "10,000+" (the list's "10,000+ jobs")."""

    def __str__(self) -> str:
        return f"{self - 1:,}+"


class CappedCountPaginator(Paginator):
    """Counts at most CAP rows: COUNT(*) over a million jobs costs more than the page.
    Past the cap the count reads "10,000+" (:class:`MoreThan`)."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        rows: Any = self.object_list
        if not isinstance(rows, QuerySet):
            return len(rows)
        counted = rows.values("pk").order_by()[: self.CAP + 1].count()
        return MoreThan(counted) if counted > self.CAP else counted


@admin.register(Job)
class JobAdmin(FilterSafeAdmin):
    # Narrow enough for 1280 px with the navigation sidebar open: the lease holder and
    # its time left fold into the status, stalls into the attempts, the times into one
    # "when"; the rest is on the job's page.
    list_display = (
        "id",
        "task_name",
        "status_badge",
        "queue",
        "priority",
        "attempts_display",
        "progress_display",
        "when",
    )
    list_display_links = ("id", "task_name")
    list_filter = ("status", QueueFilter, TaskFilter, HasErrorsFilter, WorkerFilter)
    paginator = CappedCountPaginator
    search_fields = ("task_path", "=key")  # (the search itself: job_search.py)
    search_help_text = _(
        "Words that must all match: kwargs.customer_id:4711 or args.0:42 (a value inside "
        "the arguments, paths with dots), a job id, the dedup key, or part of the task "
        "path, the error or the worker."
    )

    class Media:
        css = {"all": ["django_leasejobs/admin.css", "django_leasejobs/flow.css"]}

    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) over the whole table
    inlines = (JobAttemptInline,)
    actions = ("retry_now", "cancel_jobs", "requeue_dead", "delete_finished")
    fieldsets = (
        (None, {"fields": ("task_path", "status_badge", "queue", "priority", "backend", "key")}),
        (
            _("Flow control"),
            {"fields": ("concurrency_group", "concurrency_limit", "rate_limit")},
        ),
        (
            _("Arguments and results"),
            {
                "fields": (
                    "args_json",
                    "kwargs_json",
                    "result_json",
                    "checkpoint_json",
                    "metadata_json",
                )
            },
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
                    "last_worker",
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
    # Every field shown is read only: the job page is a view, never a form. A pending
    # job's page also says why it is not running (get_fieldsets).
    # A workflow step's page also shows its workflow, parents and children (get_fieldsets).
    workflow_fieldset: Any = (
        _("Workflow"),
        {"fields": ("workflow_link", "parents_display", "children_display")},
    )
    readonly_fields = (
        *(cast(str, name) for _, options in fieldsets for name in options["fields"]),
        "why_waiting",
        *workflow_fieldset[1]["fields"],
    )

    # -- read only ----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # finished jobs are deleted by the permission-gated action only

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None and obj.workflow_id is not None:
            fieldsets = [fieldsets[0], self.workflow_fieldset, *fieldsets[1:]]
        if obj is None or obj.status != JobStatus.PENDING:
            return fieldsets
        (name, options), *rest = fieldsets
        fields = list(options["fields"])
        fields.insert(fields.index("status_badge") + 1, "why_waiting")
        return [(name, {**options, "fields": fields}), *rest]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # Big values are never read whole: the list reads the progress message cut to
        # what it shows, and nothing of the arguments, result, checkpoint or error
        # (the job's page reads those cut too: get_object).
        jobs = with_database_now(super().get_queryset(request)).defer(*JOB_BIG)
        return big_values.with_previews(jobs, ("progress_message",))

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Job | None:
        """The job of its page, with its arguments, result, checkpoint and error read
        cut to what the page shows (``big_values.with_previews``)."""
        jobs = big_values.with_previews(
            self.get_queryset(request),
            tuple(name for name in (*JOB_JSON, *JOB_TEXT) if name != "progress_message"),
            JOB_JSON,
        )
        field = Job._meta.pk if from_field is None else Job._meta.get_field(from_field)
        try:
            value = field.to_python(object_id)  # type: ignore[union-attr]
            return jobs.get(**{field.name: value})
        except (Job.DoesNotExist, ValidationError, ValueError):
            return None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        try:
            search = parse_search(search_term)
        except SearchSyntaxError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return queryset.none(), False
        return apply_search(queryset, search), False

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        """An exact count of the jobs a search by argument found (an index answers it on
        PostgreSQL); else at most ``CappedCountPaginator.CAP`` counted."""
        try:
            exact = parse_search(request.GET.get("q", "")).by_arguments
        except SearchSyntaxError:
            exact = False
        kind = Paginator if exact else CappedCountPaginator
        return kind(queryset, per_page, orphans, allow_empty_first_page)

    # -- columns ------------------------------------------------------------------

    @admin.display(description=_("task"), ordering="task_path")
    def task_name(self, job: Job) -> str:
        """The function's name (it may wrap after an underscore); the path in the tooltip."""
        parts = function_name(job.task_path).split("_")
        return format_html(
            '<span title="{}">{}</span>',
            job.task_path,
            format_html_join(mark_safe("_<wbr>"), "{}", ((part,) for part in parts)),
        )

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, job: Job) -> str:
        badge = status_badge(job.status)
        if job.status != JobStatus.RUNNING:
            return badge
        holder = format_html(
            '<small class="leasejobs-holder">{} · {}</small>',
            job.locked_by or "-",
            self.lease_left(job),
        )
        if job.cancel_requested:
            return format_html("{} <small>{}</small> {}", badge, _("cancel requested"), holder)
        return format_html("{} {}", badge, holder)

    @admin.display(description=_("attempt"))
    def attempts_display(self, job: Job) -> str:
        attempts = f"{job.attempt}/{job.max_attempts}"
        if not job.stall_count:
            return attempts
        return format_html(
            '{} <small class="leasejobs-quiet leasejobs-stalls">{} {}</small>',
            attempts,
            job.stall_count,
            _("stalled"),
        )

    @admin.display(description=_("lease left"))
    def lease_left(self, job: Job) -> str:
        if job.status != JobStatus.RUNNING or job.locked_until is None:
            return "-"
        left = (job.locked_until - now_of(job)).total_seconds()
        if left < 0:
            return format_html('<span class="leasejobs-expired">{}</span>', _("expired"))
        return format_html("{} {}", seconds(left), _("left"))

    @admin.display(description=_("progress"))
    def progress_display(self, job: Job) -> str:
        if job.progress is None:
            return "-"
        bar = format_html(
            '<progress value="{}" max="1"></progress> {}%',
            f"{job.progress:.3f}",
            f"{job.progress * 100:.0f}",
        )
        shown = preview(job, "progress_message")
        if shown is None or not shown.text:
            return bar
        message = shown.text
        if shown.cut:
            message = format_html(
                "{}…{}", shown.text, cut_note(shown, self._download_url(job, "progress_message"))
            )
        if job.status == JobStatus.RUNNING:
            return format_html("{} {}", bar, message)
        # Not running: what its last attempt said, not what is happening now.
        return format_html(
            '{} <small class="leasejobs-quiet">{} {}</small>',
            bar,
            _("last reported:"),
            message,
        )

    @admin.display(description=_("when"))
    def when(self, job: Job) -> str:
        """The moment that matters for the job's status, relative to the database's time;
        every time in the tooltip."""
        now = now_of(job)
        moment: datetime | None
        if job.status == JobStatus.PENDING and job.run_after > now:
            label, moment = _("runs"), job.run_after
        elif job.status == JobStatus.PENDING:
            label, moment = _("enqueued"), job.enqueued_at
        elif job.status == JobStatus.RUNNING:
            label, moment = _("started"), job.last_attempted_at or job.started_at
        else:
            label, moment = _("finished"), job.finished_at
        if moment is None:
            return "-"
        times = [
            (_("enqueued"), job.enqueued_at),
            (_("runs"), job.run_after if job.status == JobStatus.PENDING else None),
            (_("started"), job.started_at),
            (_("finished"), job.finished_at),
        ]
        title = ", ".join(f"{name} {value:%Y-%m-%d %H:%M:%S}" for name, value in times if value)
        return format_html(
            '<span title="{} (UTC)">{} {}</span>', title, label, relative(moment, now)
        )

    @admin.display(description=_("waiting"))
    def why_waiting(self, job: Job) -> str:
        """Why a pending job is not running (``queues.waiting_reasons``), escaped."""
        question = _("Why is it not running?")
        try:
            reasons = queues.waiting_reasons(job)
        except ValueError:
            return format_html(
                '<div class="leasejobs-waiting"><strong>{}</strong>{}</div>',
                question,
                _('Its task backend "%(backend)s" is not configured: no worker here takes it.')
                % {"backend": job.backend},
            )
        if not reasons:
            return format_html(
                '<div class="leasejobs-waiting leasejobs-waiting-none"><strong>{}</strong>{}</div>',
                question,
                _("Nothing holds it back: a worker takes it at its next claim."),
            )
        return format_html(
            '<div class="leasejobs-waiting"><strong>{}</strong><ul>{}</ul></div>',
            question,
            format_html_join("", "<li>{}</li>", ((reason,) for reason in reasons)),
        )

    @admin.display(description=_("concurrency key / group"))
    def concurrency_group(self, job: Job) -> str:
        """The job's concurrency key, or the task whose limits it obeys ('-': none)."""
        if not job.flow_group:
            return "-"
        key = job.concurrency_key
        if key is not None:
            return format_html("{} <code>{}</code>", _("key"), key)
        return format_html("<code>{}</code>", describe_group(job.flow_group))

    def _download_url(self, job: Job, name: str) -> str:
        return reverse(f"{self.admin_site.name}:django_leasejobs_job_download", args=[job.pk, name])

    def _job_url(self, job_id: int) -> str:
        return reverse(f"{self.admin_site.name}:django_leasejobs_job_change", args=[job_id])

    @admin.display(description=_("workflow"))
    def workflow_link(self, job: Job) -> str:
        if job.workflow_id is None:
            return "-"
        url = reverse(
            f"{self.admin_site.name}:django_leasejobs_workflow_change", args=[job.workflow_id]
        )
        return format_html('<a href="{}">{} #{}</a>', url, _("workflow"), job.workflow_id)

    @admin.display(description=_("parents"))
    def parents_display(self, job: Job) -> str:
        """The steps it waits for, in their order, with their status (one query)."""
        return relatives_html(parents_of(job), self._job_url)

    @admin.display(description=_("children"))
    def children_display(self, job: Job) -> str:
        """The steps that wait for it, with their status (one query)."""
        return relatives_html(children_of(job), self._job_url)

    def _json(self, job: Job, name: str) -> str:
        return shown_json(preview(job, name), self._download_url(job, name))

    @admin.display(description=_("arguments"))
    def args_json(self, job: Job) -> str:
        return self._json(job, "args")

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, job: Job) -> str:
        return self._json(job, "kwargs")

    @admin.display(description=_("result"))
    def result_json(self, job: Job) -> str:
        return self._json(job, "result") if job.status == JobStatus.SUCCEEDED else "-"

    @admin.display(description=_("checkpoint"))
    def checkpoint_json(self, job: Job) -> str:
        return self._json(job, "checkpoint")

    @admin.display(description=_("metadata"))
    def metadata_json(self, job: Job) -> str:
        return self._json(job, "metadata")

    @admin.display(description=_("last error"))
    def last_error_display(self, job: Job) -> str:
        shown = preview(job, "last_error")
        if shown is None or not shown.text:
            return "-"
        if not shown.cut:
            return format_html('<pre class="leasejobs-error">{}</pre>', shown.text)
        return format_html(
            '<pre class="leasejobs-error leasejobs-cut">{}…</pre>{}',
            shown.text,
            cut_note(shown, self._download_url(job, "last_error")),
        )

    # -- actions ------------------------------------------------------------------

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.cancel_job")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.requeue_job")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.purge_job")

    def has_reroute_permission(self, request: HttpRequest) -> bool:
        """Change the queue or the priority of jobs that have not started (the bulk
        actions): the model's ``change_job`` permission (the job page stays read only)."""
        return request.user.has_perm("django_leasejobs.change_job")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The list, with links to the bulk actions over every job its filters and
        search match (``admin/bulk.py``)."""
        context = {
            **(extra_context or {}),
            "bulk_links": bulk_links(self, request),
            "alerts": firing(Job.objects.db),
        }
        return super().changelist_view(request, context)

    def bulk_view(self, request: HttpRequest, action: str) -> HttpResponse:
        return bulk_action_view(self, request, action)

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
    def delete_finished(
        self, request: HttpRequest, queryset: QuerySet[Job]
    ) -> TemplateResponse | None:
        """Ask first (a confirmation page, as Django's own *delete selected*), then delete
        the selected jobs that are finished by pruning's rule, logging each one.

        The confirmation deletes at most what its page showed: the page posts back the
        ids of the finished jobs it counted, or, for a *select all* too large for that,
        the bound of what it counted (see :class:`ConfirmedBound`). Pruning's rule is
        checked again on each locked row: a job retried meanwhile stays.
        """
        if request.POST.get("post") != "yes":
            shown_at = database_now(queryset.db)  # first: what finishes later is not counted
            unfinished = queryset.exclude(pruning.finished()).count()
            finished = queryset.filter(pruning.finished())
            count = finished.count()
            if count:
                return self.delete_finished_confirmation(
                    request, finished, count, unfinished, shown_at
                )
            report = ActionReport(self, request, "Deleted")
            if unfinished:
                report.skipped["not finished (pending or running)"] = unfinished
            report.send()
            return None
        if request.POST.get("select_across", "0") not in ("", "0"):
            bound = ConfirmedBound.of(request)
            if bound is None:
                self.message_user(
                    request,
                    _(
                        "Nothing was deleted: the confirmation did not say which jobs it "
                        "showed. Choose the action again."
                    ),
                    messages.ERROR,
                )
                return None
            queryset = bound.limit(queryset)
        report = ActionReport(self, request, "Deleted")
        unfinished = queryset.exclude(pruning.finished()).count()
        report.changed, _batches = pruning.delete_finished(
            queryset, before_delete=lambda jobs: self.log_deletions(request, jobs)
        )
        if unfinished:
            report.skipped["not finished (pending or running)"] = unfinished
        report.send()
        return None

    def delete_finished_confirmation(
        self,
        request: HttpRequest,
        finished: QuerySet[Job],
        count: int,
        unfinished: int,
        shown_at: datetime,
    ) -> TemplateResponse:
        """The page that asks; its form posts back, with ``post=yes``, what it counted:
        the finished jobs' ids, or the bound of a *select all* too large for them."""
        shown = list(finished.order_by("-id")[:CONFIRMATION_SHOWS])
        across = request.POST.get("select_across", "0") not in ("", "0")
        selected: list[str] = []
        bound: ConfirmedBound | None = None
        if across and count > confirmation_ids_limit():
            bound = ConfirmedBound(upto=shown[0].pk, at=shown_at)
            # Django runs a confirmed action only with some id selected; with
            # select_across it takes the list's filters instead, here within the bound.
            selected = [str(bound.upto)]
        else:
            selected = [str(pk) for pk in finished.order_by("id").values_list("pk", flat=True)]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Delete finished jobs?"),
            "opts": self.opts,
            "jobs": shown,
            "count": count,
            "more": count - len(shown),
            "unfinished": unfinished,
            "selected": selected,
            "select_across": "1" if bound is not None else "0",
            "bound": bound.fields() if bound is not None else {},
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_leasejobs/job/delete_finished_confirmation.html", context
        )

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
            path(
                "bulk/<str:action>/",
                self.admin_site.admin_view(self.bulk_view),
                name="{}_{}_bulk".format(*info),
            ),
            path(
                "<int:job_id>/download/<str:name>/",
                self.admin_site.admin_view(self.download_view),
                name="{}_{}_download".format(*info),
            ),
            path(
                "<int:job_id>/attempts/<int:attempt_id>/download/<str:name>/",
                self.admin_site.admin_view(self.attempt_download_view),
                name="{}_{}_attempt_download".format(*info),
            ),
            *urls,
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return dashboard_response(self.admin_site, request)

    # -- downloads of big values ----------------------------------------------------

    def download_view(self, request: HttpRequest, job_id: int, name: str) -> HttpResponse:
        """A job's whole argument list, keyword arguments, result, checkpoint (JSON), last
        error or progress message (text), as a file: for whoever may view the job."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        value = big_values.job_value(self.get_queryset(request), job_id, name)
        extension = "json" if name in JOB_JSON else "txt"
        return big_values.download(
            value, f"job-{job_id}-{name}.{extension}", as_json=name in JOB_JSON
        )

    def attempt_download_view(
        self, request: HttpRequest, job_id: int, attempt_id: int, name: str
    ) -> HttpResponse:
        """An attempt's whole error message or traceback, as a text file."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        attempts = JobAttempt.objects.using(self.get_queryset(request).db)
        number, value = big_values.attempt_value(attempts, job_id, attempt_id, name)
        return big_values.download(
            value, f"job-{job_id}-attempt-{number}-{name}.txt", as_json=False
        )
