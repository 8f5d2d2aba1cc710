"""A workflow's graph for its admin page: its steps, edges and layers (two queries), drawn
as inline SVG (no script, nothing loaded from elsewhere), or as a table per layer above
:data:`DRAW_LIMIT` steps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from ..models import Dependency, Job, JobStatus, Workflow
from ..templatetags.leasejobs_admin import task_name as function_name
from .display import status_badge

DRAW_LIMIT = 500
"""Above this many steps the page shows a table per layer instead of the drawing."""

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


def status_counts_html(by_status: Mapping[str, int]) -> str:
    """Steps per status as badges, in the order of the statuses; ``-`` for none."""
    order = {value: n for n, value in enumerate(JobStatus.values)}
    parts = sorted(by_status.items(), key=lambda item: order.get(item[0], len(order)))
    if not parts:
        return "-"
    return format_html_join(" ", "{} {}", ((status_badge(s), n) for s, n in parts))


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
                status_counts_html(counts),
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
