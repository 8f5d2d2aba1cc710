"""The workflow admin: the list (status from the steps, counts per status), the page with
the graph drawn as inline SVG and the table of steps, and the actions *Cancel workflow*
and *Retry failed steps*.

A workflow's steps live in the database of the workflow's row. The page reads them with
two queries, whatever the size of the graph: the steps (``leasejobs_job_workflow_idx``)
and the edges. Above :data:`DRAW_LIMIT` steps the page shows a table per layer instead
of the drawing, and the table of steps lists the first :data:`TABLE_LIMIT`.

Rows are never hand-edited: the actions go through ``leases.cancel_workflow`` and
``leases.retry_failed_steps``, gated by the ``django_leasejobs.cancel_workflow``
permission, reported with a message of the counts and recorded in the admin log.
"""

from __future__ import annotations

from collections import Counter
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
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import leases
from ..models import Dependency, Job, JobStatus, Workflow
from ..templatetags.leasejobs_admin import task_name as function_name
from ..workflow_results import workflow_status
from .clock import now_of, with_database_now
from .display import status_badge, when
from .filter_safety import FilterSafeAdmin

DRAW_LIMIT = 500
"""Above this many steps the page shows a table per layer instead of the drawing."""

TABLE_LIMIT = 500
"""The table of steps lists at most this many (the first by id)."""

_COUNTS_ATTR = "_leasejobs_workflow_counts"
_GRAPH_ATTR = "_leasejobs_workflow_graph"

# The colours of admin.css's status badges, written on the nodes: the drawing reads
# the same without the stylesheet.
STATUS_COLOURS: dict[str, str] = {
    JobStatus.WAITING: "#a16207",
    JobStatus.PENDING: "#6b7280",
    JobStatus.RUNNING: "#2563eb",
    JobStatus.SUCCEEDED: "#15803d",
    JobStatus.FAILED: "#c2410c",
    JobStatus.DEAD: "#991b1b",
    JobStatus.CANCELLED: "#4b5563",
}

# Geometry of the drawing (pixels): layers are columns, left to right.
NODE_W, NODE_H = 168, 34
GAP_X, GAP_Y = 48, 14
MARGIN = 8
LABEL_CHARS = 22


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
    order = {value: n for n, value in enumerate(JobStatus.values)}
    parts = sorted(counts.by_status.items(), key=lambda item: order.get(item[0], len(order)))
    if not parts:
        return "-"
    return format_html_join(" ", "{} {}", ((status_badge(s), n) for s, n in parts))


class WorkflowChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        attach_counts(self.result_list)


# -- the graph (the page) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepRow:
    id: int
    task_path: str
    status: str
    attempt: int
    max_attempts: int


@dataclass(slots=True)
class Graph:
    """A workflow's steps, edges and layers, read with two queries."""

    steps: list[StepRow]
    edges: list[tuple[int, int]]
    """(parent, child), in the order of each child's parents."""
    layers: dict[int, int] = field(default_factory=dict)
    """A step's layer: 0 without parents in the workflow, else 1 + its parents' highest."""
    parents: Counter[int] = field(default_factory=Counter)
    """How many parents each step has (edges to pruned parents included)."""

    @property
    def layer_count(self) -> int:
        return max(self.layers.values(), default=-1) + 1

    def columns(self) -> list[list[StepRow]]:
        columns: list[list[StepRow]] = [[] for _ in range(self.layer_count)]
        for step in self.steps:
            columns[self.layers[step.id]].append(step)
        return columns


def read_graph(workflow: Workflow) -> Graph:
    """The steps (one query) and the edges (one query) of ``workflow``, and its layers."""
    using = workflow._state.db or "default"
    steps = [
        StepRow(*row)
        for row in Job.objects.using(using)
        .filter(workflow_id=workflow.pk)
        .order_by("id")
        .values_list("id", "task_path", "status", "attempt", "max_attempts")
    ]
    edges = list(
        Dependency.objects.using(using)
        .filter(child__workflow_id=workflow.pk)
        .order_by("child_id", "position")
        .values_list("parent_id", "child_id")
    )
    graph = Graph(steps=steps, edges=edges)
    graph.parents = Counter(child for _parent, child in edges)
    graph.layers = layers([s.id for s in steps], edges)
    return graph


def layers(ids: list[int], edges: list[tuple[int, int]]) -> dict[int, int]:
    """Each step's layer (Kahn's order; edges to steps not in ``ids`` are left out).

    A step on a cycle (never written by the canvas, but the rows are only rows) is put
    one layer after the last."""
    known = set(ids)
    children: dict[int, list[int]] = {}
    indegree = dict.fromkeys(ids, 0)
    for parent, child in edges:
        if parent in known and child in known:
            children.setdefault(parent, []).append(child)
            indegree[child] += 1
    layer = dict.fromkeys(ids, 0)
    ready = [i for i in ids if indegree[i] == 0]
    placed: set[int] = set()
    while ready:
        node = ready.pop()
        placed.add(node)
        for child in children.get(node, []):
            layer[child] = max(layer[child], layer[node] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(placed) < len(ids):
        last = max((layer[i] for i in placed), default=-1) + 1
        for i in ids:
            if i not in placed:
                layer[i] = last
    return layer


def graph_of(workflow: Workflow) -> Graph:
    if not hasattr(workflow, _GRAPH_ATTR):
        setattr(workflow, _GRAPH_ATTR, read_graph(workflow))
    return cast(Graph, getattr(workflow, _GRAPH_ATTR))


def label(task_path: str) -> str:
    name = function_name(task_path)
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def render_svg(graph: Graph, job_url: Any) -> SafeString:
    """The graph as inline SVG: a rect per step coloured by its status, its task's name
    (escaped) linking to ``job_url(id)``, a path per edge. No script, no external asset."""
    columns = graph.columns()
    rows = max((len(c) for c in columns), default=0)
    width = MARGIN * 2 + len(columns) * NODE_W + max(len(columns) - 1, 0) * GAP_X
    height = MARGIN * 2 + rows * NODE_H + max(rows - 1, 0) * GAP_Y
    where: dict[int, tuple[int, int]] = {}
    for x_index, column in enumerate(columns):
        for y_index, step in enumerate(column):
            where[step.id] = (
                MARGIN + x_index * (NODE_W + GAP_X),
                MARGIN + y_index * (NODE_H + GAP_Y),
            )
    edges = []
    for parent, child in graph.edges:
        if parent not in where or child not in where:
            continue
        (px, py), (cx, cy) = where[parent], where[child]
        x1, y1 = px + NODE_W, py + NODE_H // 2
        x2, y2 = cx, cy + NODE_H // 2
        middle = (x1 + x2) // 2
        edges.append(
            format_html(
                '<path class="lj-edge" d="M{} {} C{} {} {} {} {} {}" fill="none" '
                'stroke="#9ca3af" stroke-width="1.5" marker-end="url(#lj-arrow)"/>',
                x1,
                y1,
                middle,
                y1,
                middle,
                y2,
                x2,
                y2,
            )
        )
    nodes = []
    for step in graph.steps:
        x, y = where[step.id]
        nodes.append(
            format_html(
                '<a href="{}" class="lj-node lj-node-{}" data-job="{}">'
                "<title>#{} {} ({})</title>"
                '<rect x="{}" y="{}" width="{}" height="{}" rx="5" fill="{}"/>'
                '<text x="{}" y="{}" fill="#fff" font-size="12">{}</text>'
                "</a>",
                job_url(step.id),
                step.status,
                step.id,
                step.id,
                step.task_path,
                step.status,
                x,
                y,
                NODE_W,
                NODE_H,
                STATUS_COLOURS.get(step.status, "#777"),
                x + 8,
                y + NODE_H // 2 + 4,
                f"#{step.id} {label(step.task_path)}",
            )
        )
    return format_html(
        '<div class="leasejobs-scroll leasejobs-graph">'
        '<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" '
        'role="img" aria-label="{}">'
        '<defs><marker id="lj-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto-start-reverse"><path d="M0 0 L10 5 L0 10 z" '
        'fill="#9ca3af"/></marker></defs>{}{}</svg></div>',
        width,
        height,
        width,
        height,
        gettext("workflow graph"),
        mark_safe("".join(edges)),  # noqa: S308 - each part built by format_html
        mark_safe("".join(nodes)),  # noqa: S308 - each part built by format_html
    )


def render_layer_summary(graph: Graph) -> SafeString:
    """Above DRAW_LIMIT steps: each layer's step count and counts per status."""
    rows = []
    for number, column in enumerate(graph.columns()):
        counts = Counter(step.status for step in column)
        rows.append(
            format_html(
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                number,
                len(column),
                counts_text(StepCounts(by_status=dict(counts))),
            )
        )
    return format_html(
        '<p class="leasejobs-quiet">{}</p><table class="leasejobs-table leasejobs-layers">'
        "<thead><tr><th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        gettext(
            "%(count)d steps: more than %(limit)d, too many to draw. Each layer's steps "
            "are counted instead."
        )
        % {"count": len(graph.steps), "limit": DRAW_LIMIT},
        gettext("layer"),
        gettext("steps"),
        gettext("by status"),
        mark_safe("".join(rows)),  # noqa: S308 - each row built by format_html
    )


# -- the admin ---------------------------------------------------------------------------


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
        if len(graph.steps) > DRAW_LIMIT:
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
    using = job._state.db or "default"
    parent = Job.objects.using(using).filter(pk=OuterRef("parent_id"))
    rows = (
        Dependency.objects.using(using)
        .filter(child_id=job.pk)
        .order_by("position")
        .annotate(
            parent_status=Subquery(parent.values("status")[:1]),
            parent_task=Subquery(parent.values("task_path")[:1]),
        )
        .values_list("parent_id", "parent_status", "parent_task")
    )
    return [Relative(*row) for row in rows]


def children_of(job: Job) -> list[Relative]:
    """The steps that wait for ``job``, by id, with their status (one query)."""
    using = job._state.db or "default"
    child = Job.objects.using(using).filter(pk=OuterRef("child_id"))
    rows = (
        Dependency.objects.using(using)
        .filter(parent_id=job.pk)
        .order_by("child_id")
        .annotate(
            child_status=Subquery(child.values("status")[:1]),
            child_task=Subquery(child.values("task_path")[:1]),
        )
        .values_list("child_id", "child_status", "child_task")
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
