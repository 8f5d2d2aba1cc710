"""The workflow admin: the list (status from the steps, counts per status), the page with
the graph drawn as inline SVG and the table of steps, and the actions *Cancel workflow*
and *Retry failed steps*.

A workflow's steps live in the database of the workflow's row. The page reads them with
two queries, whatever the size of the graph: the steps (``leasejobs_job_workflow_idx``)
and the edges. Above ``workflow_graph.DRAW_LIMIT`` steps the page shows a table per layer instead
of the drawing, and the table of steps lists the first :data:`TABLE_LIMIT`.

Rows are never hand-edited: the actions go through ``leases.cancel_workflow`` and
``leases.retry_failed_steps``, gated by the ``django_leasejobs.cancel_workflow``
permission, reported with a message of the counts and recorded in the admin log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import leases
from ..models import Dependency, Job, Workflow
from ..templatetags.leasejobs_admin import task_name as function_name
from ..workflow_results import workflow_status
from . import workflow_graph
from .clock import now_of, with_database_now
from .display import status_badge, when
from .filter_safety import FilterSafeAdmin
from .workflow_graph import (
    graph_of,
    render_layer_summary,
    render_svg,
    status_counts_html,
)

TABLE_LIMIT = 500
"""The table of steps lists at most this many (the first by id)."""

_COUNTS_ATTR = "_leasejobs_workflow_counts"

# -- counts per status (the list) ------------------------------------------------------


@dataclass(slots=True)
class StepCounts:
    """How many steps of a workflow are in each status, and whether one started."""

    by_status: dict[str, int] = field(default_factory=dict)
    started: bool = False

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def step_counts(workflows: Iterable[Workflow]) -> dict[int, StepCounts]:
    """The :class:`StepCounts` of ``workflows``: one query per database they are in."""
    by_db: dict[str, list[int]] = {}
    for workflow in workflows:
        by_db.setdefault(workflow._state.db or "default", []).append(workflow.pk)
    found: dict[int, StepCounts] = {}
    for using, ids in by_db.items():
        rows = (
            Job.objects.using(using)
            .filter(workflow_id__in=ids)
            .values("workflow_id", "status")
            .annotate(n=Count("id"), started=Count("id", filter=Q(started_at__isnull=False)))
            .order_by()
        )
        for row in rows:
            counts = found.setdefault(row["workflow_id"], StepCounts())
            counts.by_status[row["status"]] = row["n"]
            counts.started = counts.started or row["started"] > 0
    return found


def attach_counts(workflows: Iterable[Workflow]) -> None:
    workflows = list(workflows)
    counts = step_counts(workflows)
    for workflow in workflows:
        setattr(workflow, _COUNTS_ATTR, counts.get(workflow.pk, StepCounts()))


def counts_of(workflow: Workflow) -> StepCounts:
    if not hasattr(workflow, _COUNTS_ATTR):
        attach_counts([workflow])
    return cast(StepCounts, getattr(workflow, _COUNTS_ATTR))


def status_word(counts: StepCounts) -> str:
    """The workflow's status from its steps (``workflow_results.workflow_status``), as a
    badge; '-' when no step is left (every one pruned)."""
    if not counts.by_status:
        return format_html(
            '<span class="leasejobs-quiet">{}</span>', gettext("no steps left (pruned)")
        )
    status = workflow_status(counts.by_status, started=counts.started)
    return format_html(
        '<span class="leasejobs-status leasejobs-workflow-{}">{}</span>',
        status.name.lower(),
        status.name.lower(),
    )


def counts_text(counts: StepCounts) -> str:
    return status_counts_html(counts.by_status)


class WorkflowChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        attach_counts(self.result_list)


@admin.register(Workflow)
class WorkflowAdmin(FilterSafeAdmin):
    list_display = ("id", "backend", "created", "step_count", "status", "counts")
    list_display_links = ("id",)
    list_filter = ("backend",)
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ("cancel_workflows", "retry_failed")
    fields = ("backend", "created", "step_count", "status", "counts", "graph", "steps_table")
    readonly_fields = fields
    change_form_template = "admin/django_leasejobs/workflow/change_form.html"

    class Media:
        css = {"all": ["django_leasejobs/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        return with_database_now(super().get_queryset(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkflowChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Workflow], search_term: str
    ) -> tuple[QuerySet[Workflow], bool]:
        term = search_term.strip().lstrip("#")
        if term.isascii() and term.isdecimal() and len(term) < 19:
            return queryset.filter(pk=int(term)), False
        return queryset.none() if term else queryset, False

    search_fields = ("=id",)
    search_help_text = _("Workflow id.")

    # -- read only ------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # -- columns --------------------------------------------------------------------

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, workflow: Workflow) -> str:
        return when(workflow.created_at, now_of(workflow))

    @admin.display(description=_("status"))
    def status(self, workflow: Workflow) -> str:
        return status_word(counts_of(workflow))

    @admin.display(description=_("steps by status"))
    def counts(self, workflow: Workflow) -> str:
        return counts_text(counts_of(workflow))

    def _job_url(self, job_id: int) -> str:
        return reverse(f"{self.admin_site.name}:django_leasejobs_job_change", args=[job_id])

    @admin.display(description=_("graph"))
    def graph(self, workflow: Workflow) -> str:
        graph = graph_of(workflow)
        if not graph.steps:
            return "-"
        if len(graph.steps) > workflow_graph.DRAW_LIMIT:
            return render_layer_summary(graph)
        return render_svg(graph, self._job_url)

    @admin.display(description=_("steps"))
    def steps_table(self, workflow: Workflow) -> str:
        graph = graph_of(workflow)
        if not graph.steps:
            return "-"
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">#{}</a></td><td><span title="{}">{}</span></td><td>{}</td>'
            "<td>{}/{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    self._job_url(step.id),
                    step.id,
                    step.task_path,
                    function_name(step.task_path),
                    status_badge(step.status),
                    step.attempt,
                    step.max_attempts,
                    graph.parents.get(step.id, 0),
                    graph.layers[step.id],
                )
                for step in graph.steps[:TABLE_LIMIT]
            ),
        )
        more = len(graph.steps) - TABLE_LIMIT
        note = (
            format_html(
                '<p class="leasejobs-quiet">{}</p>',
                gettext("…and %(more)d more steps (the first %(shown)d by id are listed).")
                % {"more": more, "shown": TABLE_LIMIT},
            )
            if more > 0
            else ""
        )
        return format_html(
            '<table class="leasejobs-table leasejobs-steps"><thead><tr><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>{}",
            gettext("id"),
            gettext("task"),
            gettext("status"),
            gettext("attempt"),
            gettext("parents"),
            gettext("layer"),
            rows,
            note,
        )

    # -- actions --------------------------------------------------------------------

    def has_cancel_workflow_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.cancel_workflow")

    def _cancel(self, request: HttpRequest, workflows: Iterable[Workflow]) -> None:
        done, cancelled, requested, skipped = 0, 0, 0, 0
        for workflow in workflows:
            try:
                result = leases.cancel_workflow(
                    workflow.pk, using=leases.backend_database(workflow.backend)
                )
            except ValueError:
                skipped += 1
                continue
            done += 1
            cancelled += result.cancelled
            requested += result.requested
            self.log_change(
                request,
                workflow,
                f"Cancelled workflow: {result.cancelled} steps cancelled, "
                f"{result.requested} running steps asked to stop",
            )
        text = (
            f"Cancelled {done} workflow{'s' if done != 1 else ''}: {cancelled} "
            f"step{'s' if cancelled != 1 else ''} cancelled, {requested} running "
            f"step{'s' if requested != 1 else ''} asked to stop."
        )
        if skipped:
            text += f" Skipped {skipped}: their task backend is not configured any more."
        level = messages.SUCCESS if cancelled or requested else messages.WARNING
        self.message_user(request, text, level)

    def _retry(self, request: HttpRequest, workflows: Iterable[Workflow]) -> None:
        done, retried, skipped = 0, 0, 0
        for workflow in workflows:
            try:
                count = leases.retry_failed_steps(
                    workflow.pk, using=leases.backend_database(workflow.backend)
                )
            except ValueError:
                skipped += 1
                continue
            done += 1
            retried += count
            if count:
                self.log_change(request, workflow, f"Retried {count} failed steps")
        text = (
            f"Retried {retried} failed step{'s' if retried != 1 else ''} in {done} "
            f"workflow{'s' if done != 1 else ''}."
        )
        if skipped:
            text += f" Skipped {skipped}: their task backend is not configured any more."
        self.message_user(request, text, messages.SUCCESS if retried else messages.WARNING)

    @admin.action(
        description=_("Cancel workflow (steps not started: now; running: their workers stop them)"),
        permissions=["cancel_workflow"],
    )
    def cancel_workflows(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        self._cancel(request, queryset.only("id", "backend"))

    @admin.action(description=_("Retry failed steps"), permissions=["cancel_workflow"])
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        self._retry(request, queryset.only("id", "backend"))

    # -- the page's buttons ------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        info = (self.opts.app_label, self.opts.model_name)
        return [
            path(
                "<int:workflow_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="{}_{}_cancel".format(*info),
            ),
            path(
                "<int:workflow_id>/retry/",
                self.admin_site.admin_view(self.retry_view),
                name="{}_{}_retry".format(*info),
            ),
            *super().get_urls(),
        ]

    def _button_target(self, request: HttpRequest, workflow_id: int) -> Workflow:
        if request.method != "POST":
            raise _NotPost
        if not self.has_cancel_workflow_permission(request):
            raise PermissionDenied
        workflow = self.get_queryset(request).filter(pk=workflow_id).first()
        if workflow is None:
            raise Http404
        return workflow

    def _back(self, workflow_id: int) -> HttpResponse:
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:django_leasejobs_workflow_change", args=[workflow_id])
        )

    def cancel_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        try:
            workflow = self._button_target(request, workflow_id)
        except _NotPost:
            return HttpResponseNotAllowed(["POST"])
        self._cancel(request, [workflow])
        return self._back(workflow_id)

    def retry_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        try:
            workflow = self._button_target(request, workflow_id)
        except _NotPost:
            return HttpResponseNotAllowed(["POST"])
        self._retry(request, [workflow])
        return self._back(workflow_id)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        context["leasejobs_can_cancel_workflow"] = self.has_cancel_workflow_permission(request)
        return super().render_change_form(request, context, add, change, form_url, obj)


class _NotPost(Exception):
    pass


# -- the job page's workflow section -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Relative:
    """A step's parent or child as the job page shows it (status None: pruned)."""

    id: int
    status: str | None
    task_path: str | None


def parents_of(job: Job) -> list[Relative]:
    """The parents of the step ``job`` in their order, with their status (one query)."""
    return _relatives(job, "child_id", "parent_id", "position")


def children_of(job: Job) -> list[Relative]:
    """The steps that wait for ``job``, by id, with their status (one query)."""
    return _relatives(job, "parent_id", "child_id", "child_id")


def _relatives(job: Job, this: str, other: str, order: str) -> list[Relative]:
    """The jobs at the ``other`` end of ``job``'s edges (``this`` end), with their status
    and task, in ``order``."""
    using = job._state.db or "default"
    related = Job.objects.using(using).filter(pk=OuterRef(other))
    rows = (
        Dependency.objects.using(using)
        .filter(**{this: job.pk})
        .order_by(order)
        .annotate(
            related_status=Subquery(related.values("status")[:1]),
            related_task=Subquery(related.values("task_path")[:1]),
        )
        .values_list(other, "related_status", "related_task")
    )
    return [Relative(*row) for row in rows]


def relatives_html(relatives: list[Relative], job_url: Any) -> str:
    if not relatives:
        return "-"
    items = []
    for relative in relatives:
        if relative.status is None:
            items.append(
                format_html(
                    '<li>#{} <span class="leasejobs-quiet">{}</span></li>',
                    relative.id,
                    gettext("deleted (pruned)"),
                )
            )
        else:
            items.append(
                format_html(
                    '<li><a href="{}" title="{}">#{} {}</a> {}</li>',
                    job_url(relative.id),
                    relative.task_path,
                    relative.id,
                    function_name(relative.task_path or ""),
                    status_badge(relative.status),
                )
            )
    return format_html(
        '<ul class="leasejobs-relatives">{}</ul>',
        mark_safe("".join(items)),  # noqa: S308 - each item built by format_html
    )
