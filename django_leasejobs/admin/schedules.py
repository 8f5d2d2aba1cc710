"""The admin page of schedules, and the "next scheduled runs" of the queue dashboard.

The definition of a schedule lives in settings (``OPTIONS["SCHEDULES"]``), so the page
is read-only: what it shows comes from ``schedules.operations.overview()`` (the same
story as ``leasejobs_schedules`` and the dashboard), and the only changes are the
permission-gated actions *Pause*, *Resume* and *Run now*, each recorded in the admin
log. A row whose schedule is gone from settings is *removed*; only such a row may be
deleted (with Django's ``delete_schedule`` permission), from its own page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.utils import display_for_value
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..backend import LeaseJobsBackend
from ..compat import task_backends
from ..exceptions import UnknownTask
from ..leases import database_now
from ..models import Job, Schedule, ScheduleRun
from ..schedule_spec import ScheduleSpec
from ..schedules import operations, transitions
from ..schedules.operations import ScheduleView, UnknownSchedule
from ..templatetags.leasejobs_admin import seconds
from .display import pretty_json, status_badge, when
from .filter_safety import FilterSafeAdmin
from .reports import ActionReport

RECENT_RUNS = 20
NEXT_RUNS = 5
STATE_LABELS = {
    "active": _("active"),
    "paused": _("paused"),
    "disabled": _("disabled in settings"),
    "removed": _("removed from settings"),
    "new": _("new"),
}
_STATE_ATTR = "_leasejobs_schedule_state"


def lease_backends() -> dict[str, LeaseJobsBackend]:
    return {b.alias: b for b in task_backends.all() if isinstance(b, LeaseJobsBackend)}


def sync_declared() -> None:
    """Bring the state rows in line with settings, as a worker's scheduler pass does
    (``transitions.sync``): a schedule no worker has seen yet gets its row and is listed."""
    for alias, backend in lease_backends().items():
        if backend.config.schedules:
            using = backend.database
            transitions.sync(alias, backend.config.schedules, database_now(using), using)


@dataclass(frozen=True, slots=True)
class RowState:
    """A schedule row as the admin shows it: its overview, its spec, the database's time."""

    view: ScheduleView
    spec: ScheduleSpec | None
    now: datetime


def _removed_view(row: Schedule) -> ScheduleView:
    """The view of a row that no configured backend declares: removed, whatever it says."""
    return ScheduleView(
        backend=row.backend,
        name=row.name,
        task_path=row.task_path,
        expression=row.expression,
        description="",
        timezone=row.timezone,
        state="removed",
        next_tick=None,
        last_tick=row.last_tick,
        last_run_at=row.last_run_at,
        last_job_id=row.last_job_id,
        last_job_status=None,
        overdue=False,
        overdue_seconds=0.0,
        pk=row.pk,
    )


def attach_states(rows: Iterable[Schedule]) -> None:
    """Compute each row's :class:`RowState` (one overview per backend) and keep it on the row."""
    rows = list(rows)
    backends = lease_backends()
    for alias in {row.backend for row in rows}:
        backend = backends.get(alias)
        mine = [row for row in rows if row.backend == alias]
        if backend is None:
            now = database_now(mine[0]._state.db or "default")
            for row in mine:
                setattr(row, _STATE_ATTR, RowState(_removed_view(row), None, now))
            continue
        now = database_now(backend.database)
        views = {view.name: view for view in operations.overview(alias, now=now)}
        specs = {spec.name: spec for spec in backend.config.schedules}
        for row in mine:
            view = views.get(row.name) or _removed_view(row)
            setattr(row, _STATE_ATTR, RowState(view, specs.get(row.name), now))


def state_of(row: Schedule) -> RowState:
    if not hasattr(row, _STATE_ATTR):
        attach_states([row])
    return cast(RowState, getattr(row, _STATE_ATTR))


class ScheduleChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        attach_states(self.result_list)


@admin.register(Schedule)
class ScheduleAdmin(FilterSafeAdmin):
    list_display = (
        "name",
        "backend",
        "task",
        "trigger",
        "time_zone",
        "next_run",
        "last_run",
        "state",
        "overdue",
    )
    list_display_links = ("name",)
    search_fields = ("name", "task_path")
    actions = ("pause_schedules", "resume_schedules", "run_schedules_now")
    fieldsets = (
        (None, {"fields": ("name", "backend", "state", "task", "trigger", "time_zone")}),
        (
            _("Definition (from settings)"),
            {"fields": ("args_json", "kwargs_json", "queue", "priority", "catch_up")},
        ),
        (
            _("Runs"),
            {
                "fields": (
                    "next_run",
                    "overdue",
                    "last_run",
                    "paused_at",
                    "removed_at",
                    "created_at",
                    "recent_runs",
                )
            },
        ),
    )
    readonly_fields = tuple(
        cast(str, name) for _, options in fieldsets for name in options["fields"]
    )

    class Media:
        css = {"all": ["django_leasejobs/admin.css", "django_leasejobs/schedules.css"]}

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        sync_declared()  # a schedule declared in settings is listed before any worker saw it
        return super().changelist_view(request, extra_context)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    # -- read only; a removed schedule's row may be deleted -------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and state_of(obj).view.state != "removed":
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions show (and warns about overrides that do not
        # take it); Django 5.2 knows no such parameter.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg, unused-ignore]
        actions.pop("delete_selected", None)  # rows are deleted one by one, removed ones only
        return actions

    # -- columns ------------------------------------------------------------------

    @admin.display(description=_("task"), ordering="task_path")
    def task(self, row: Schedule) -> str:
        return state_of(row).view.task_path

    @admin.display(description=_("when"))
    def trigger(self, row: Schedule) -> str:
        view = state_of(row).view
        if not view.description:
            return format_html("<code>{}</code>", view.expression)
        return format_html(
            '<code>{}</code><br><small class="leasejobs-quiet">{}</small>',
            view.expression,
            view.description,
        )

    @admin.display(description=_("time zone"))
    def time_zone(self, row: Schedule) -> str:
        return state_of(row).view.timezone

    @admin.display(description=_("next run"))
    def next_run(self, row: Schedule) -> str:
        state = state_of(row)
        return when(state.view.next_tick, state.now)

    @admin.display(description=_("last run"))
    def last_run(self, row: Schedule) -> str:
        state = state_of(row)
        view = state.view
        if view.last_job_id is None:
            return "-"
        return format_html(
            "{} {}",
            when(view.last_run_at, state.now),
            self._job(view.last_job_id, view.last_job_status),
        )

    @admin.display(description=_("state"))
    def state(self, row: Schedule) -> str:
        name = state_of(row).view.state
        return format_html(
            '<span class="leasejobs-status leasejobs-schedule-{}">{}</span>',
            name,
            STATE_LABELS[name],
        )

    @admin.display(description=_("overdue"))
    def overdue(self, row: Schedule) -> str:
        view = state_of(row).view
        if not view.overdue:
            return "-"
        return format_html(
            '<span class="leasejobs-expired" title="{}">⚠ {}</span>',
            _("No scheduler has enqueued its ticks: is a worker running the schedules?"),
            _("overdue by %s") % seconds(view.overdue_seconds),
        )

    @admin.display(description=_("arguments"))
    def args_json(self, row: Schedule) -> str:
        spec = state_of(row).spec
        return pretty_json(list(spec.args)) if spec else "-"

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, row: Schedule) -> str:
        spec = state_of(row).spec
        return pretty_json(dict(spec.kwargs)) if spec else "-"

    @admin.display(description=_("queue"))
    def queue(self, row: Schedule) -> str:
        spec = state_of(row).spec
        if spec is None:
            return "-"
        return spec.queue if spec.queue is not None else str(_("the task's own"))

    @admin.display(description=_("priority"))
    def priority(self, row: Schedule) -> str:
        spec = state_of(row).spec
        if spec is None:
            return "-"
        return str(spec.priority) if spec.priority is not None else str(_("the task's own"))

    @admin.display(description=_("missed ticks"))
    def catch_up(self, row: Schedule) -> str:
        spec = state_of(row).spec
        if spec is None:
            return "-"
        limit = f" (at most {spec.catch_up_limit})" if spec.catch_up == "all" else ""
        return f"catch_up={spec.catch_up}{limit}"

    @admin.display(description=_("recent runs"))
    def recent_runs(self, row: Schedule) -> str:
        runs = list(
            ScheduleRun.objects.filter(schedule=row).order_by("-enqueued_at", "-id")[:RECENT_RUNS]
        )
        if not runs:
            return "-"
        ids = [run.job_id for run in runs if run.job_id is not None]
        statuses = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
        return format_html(
            '<table class="leasejobs-table leasejobs-runs"><thead><tr><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("enqueued at"),
            _("kind"),
            _("tick"),
            _("job"),
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (
                        display_for_value(run.enqueued_at, "-"),
                        run.get_kind_display(),
                        display_for_value(run.tick, "-"),
                        self._job(run.job_id, statuses.get(run.job_id)) if run.job_id else "-",
                    )
                    for run in runs
                ),
            ),
        )

    def _job(self, job_id: int, status: str | None) -> str:
        """A link to a job's page with its status badge ("deleted" when it is gone)."""
        if status is None:
            return format_html("#{} <small>({})</small>", job_id, _("deleted"))
        url = reverse(f"{self.admin_site.name}:django_leasejobs_job_change", args=[job_id])
        return format_html('<a href="{}">#{}</a> {}', url, job_id, status_badge(status))

    # -- actions ------------------------------------------------------------------

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.pause_schedule")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.run_schedule")

    def _each_declared(
        self,
        request: HttpRequest,
        queryset: QuerySet[Schedule],
        verb: str,
        apply: Callable[[Schedule, ActionReport], None],
    ) -> None:
        """Run ``apply`` on each selected schedule still in settings; skip the removed ones."""
        report = ActionReport(self, request, verb, noun="schedule")
        rows = list(queryset)
        attach_states(rows)
        for row in rows:
            if state_of(row).view.state == "removed":
                report.skip("removed from settings")
                continue
            try:
                apply(row, report)
            except UnknownSchedule:
                report.skip("removed from settings")
        report.send()

    @admin.action(description=_("Pause"), permissions=["pause"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        def pause(row: Schedule, report: ActionReport) -> None:
            if operations.pause(row.name, row.backend):
                report.done(row, "Paused")
            else:
                report.skip("already paused")

        self._each_declared(request, queryset, "Paused", pause)

    @admin.action(description=_("Resume"), permissions=["pause"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        def resume(row: Schedule, report: ActionReport) -> None:
            if operations.resume(row.name, row.backend):
                report.done(row, "Resumed")
            else:
                report.skip("not paused")

        self._each_declared(request, queryset, "Resumed", resume)

    @admin.action(description=_("Run now (one job each)"), permissions=["run"])
    def run_schedules_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        def run(row: Schedule, report: ActionReport) -> None:
            if state_of(row).view.state == "disabled":
                report.skip("disabled in settings")
                return
            try:
                enqueued = operations.run_now(row.name, row.backend)
            except UnknownTask:
                report.skip("because their task is not registered")
                return
            report.done(row, f"Run now: enqueued job #{enqueued.job_id}", enqueued.job_id)

        self._each_declared(request, queryset, "Ran", run)


# -- the dashboard's panel ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NextRun:
    view: ScheduleView
    in_seconds: float


@dataclass(frozen=True, slots=True)
class SchedulePanel:
    """What the queue dashboard shows of schedules (nothing when none is declared)."""

    declared: bool
    next_runs: list[NextRun]
    overdue: list[ScheduleView]


def dashboard_panel(limit: int = NEXT_RUNS) -> SchedulePanel:
    """The next ticks across backends (paused, disabled and removed ones have none)."""
    upcoming: list[NextRun] = []
    overdue: list[ScheduleView] = []
    declared = False
    for alias, backend in lease_backends().items():
        if not backend.config.schedules:
            continue
        declared = True
        now = database_now(backend.database)
        for view in operations.overview(alias, now=now):
            if view.next_tick is not None:
                upcoming.append(NextRun(view, (view.next_tick - now).total_seconds()))
            if view.overdue:
                overdue.append(view)
    upcoming.sort(key=lambda run: cast(datetime, run.view.next_tick))
    return SchedulePanel(declared=declared, next_runs=upcoming[:limit], overdue=overdue)
