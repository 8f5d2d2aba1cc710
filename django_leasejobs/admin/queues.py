"""The admin page of queues, and the queue dashboard's flow-control column.

A queue is not declared as a row: it exists by being named in a backend's ``QUEUES``,
``QUEUE_LIMITS`` or ``QUEUE_RATE_LIMITS``, or by its jobs, and a queue without a row
in ``leasejobs_queue`` is simply not paused. So that every queue can be listed and
selected, the list first creates the missing rows of the queues
``queues.overview()`` knows (one ``INSERT`` that ignores rows created meanwhile), as
the schedule list does for declared schedules. What the page shows comes from that
overview: the same story as ``manage.py leasejobs_queue list`` and the dashboard.

The page is read-only; the only changes are the actions *Pause* and *Resume*, gated
by the ``django_leasejobs.pause_queue`` permission, made through
``django_leasejobs.queues`` and recorded in the admin log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import queues
from ..leases import database_now
from ..limits import parse_rate, queue_scope
from ..models import Job, JobStatus, Queue, RateStart
from ..queues import QueueView
from .display import when
from .filter_safety import FilterSafeAdmin
from .reports import ActionReport
from .schedules import lease_backends

_ROW_ATTR = "_leasejobs_queue_state"
_REQUEST_ATTR = "_leasejobs_queue_overviews"

PERIOD_WORDS = {1.0: _("per second"), 60.0: _("per minute"), 3600.0: _("per hour")}


# -- limits in words ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimitUse:
    """One limit of a queue and how much of it is used, in words: ``3 / 4 running``."""

    text: str
    full: bool
    backend: str = ""
    """The backend whose limit it is, when the dashboard shows several; '' otherwise."""


def limit_use(running: int, limit: int | None, backend: str = "") -> LimitUse | None:
    """``QUEUE_LIMITS`` and the running jobs it counts (None without a limit)."""
    if limit is None:
        return None
    text = gettext("%(running)d / %(limit)d running") % {"running": running, "limit": limit}
    return LimitUse(text=text, full=running >= limit, backend=backend)


def rate_use(starts: int | None, rate: str | None, backend: str = "") -> LimitUse | None:
    """``QUEUE_RATE_LIMITS`` and the starts within its last period (None without a rate)."""
    if rate is None:
        return None
    parsed = parse_rate(rate)
    per = PERIOD_WORDS.get(parsed.period, parsed.text)
    used = starts or 0
    text = gettext("%(used)d / %(count)d %(per)s") % {
        "used": used,
        "count": parsed.count,
        "per": per,
    }
    return LimitUse(text=text, full=used >= parsed.count, backend=backend)


def render_use(use: LimitUse | None) -> str:
    if use is None:
        return "-"
    if use.full:
        return format_html(
            '<span class="leasejobs-limit leasejobs-limit-full" title="{}">{}</span>',
            gettext("full: the queue's next jobs wait"),
            use.text,
        )
    return format_html('<span class="leasejobs-limit">{}</span>', use.text)


def paused_badge(paused: bool) -> str:
    if paused:
        return format_html(
            '<span class="leasejobs-status leasejobs-queue-paused">{}</span>', gettext("paused")
        )
    return format_html(
        '<span class="leasejobs-status leasejobs-queue-active">{}</span>', gettext("active")
    )


# -- the rows and the overview -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Overview:
    """``queues.overview()`` of one backend, by queue name, and the database's time."""

    views: dict[str, QueueView]
    now: datetime


@dataclass(frozen=True, slots=True)
class RowState:
    """A queue row as the page shows it: its overview (None when its backend is not
    configured any more), and the database's time."""

    view: QueueView | None
    now: datetime


def overviews(aliases: Iterable[str] | None = None) -> dict[str, Overview]:
    """The overview of every django-leasejobs backend (or of the ``aliases`` among them)."""
    backends = lease_backends()
    wanted = backends if aliases is None else [a for a in aliases if a in backends]
    found = {}
    for alias in wanted:
        views = {view.name: view for view in queues.overview(alias)}
        found[alias] = Overview(views, database_now(backends[alias].database))
    return found


def create_known_rows(known: dict[str, Overview]) -> None:
    """Give every queue the overview knows its row (not paused), in its backend's database."""
    backends = lease_backends()
    for alias, overview in known.items():
        rows = Queue.objects.using(backends[alias].database)
        existing = set(rows.filter(backend=alias).values_list("name", flat=True))
        missing = [Queue(backend=alias, name=n) for n in overview.views if n not in existing]
        if missing:
            rows.bulk_create(missing, ignore_conflicts=True)


def attach_states(rows: Iterable[Queue], known: dict[str, Overview] | None = None) -> None:
    """Keep each row's :class:`RowState` on it (one overview per backend, or ``known``)."""
    rows = list(rows)
    if known is None:
        known = overviews({row.backend for row in rows})
    for row in rows:
        overview = known.get(row.backend)
        if overview is None:
            now = database_now(row._state.db or "default")
            setattr(row, _ROW_ATTR, RowState(None, now))
        else:
            setattr(row, _ROW_ATTR, RowState(overview.views.get(row.name), overview.now))


def state_of(row: Queue) -> RowState:
    if not hasattr(row, _ROW_ATTR):
        attach_states([row])
    return cast(RowState, getattr(row, _ROW_ATTR))


class QueueChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        attach_states(self.result_list, getattr(request, _REQUEST_ATTR, None))


@admin.register(Queue)
class QueueAdmin(FilterSafeAdmin):
    list_display = (
        "name",
        "backend",
        "state",
        "paused_since",
        "queue_limit",
        "rate_limit",
        "pending",
        "ready",
    )
    list_display_links = ("name",)
    search_fields = ("name",)
    actions = ("pause_queues", "resume_queues")
    fields = (*list_display, "changed_at")
    readonly_fields = fields

    class Media:
        css = {"all": ["django_leasejobs/admin.css", "django_leasejobs/flow.css"]}

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied  # before any row is written
        known = overviews()
        create_known_rows(known)  # every queue the backends know is listed, paused or not
        setattr(request, _REQUEST_ATTR, known)
        return super().changelist_view(request, extra_context)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return QueueChangeList

    # -- read only ------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # -- columns --------------------------------------------------------------------

    @admin.display(description=_("state"), ordering="paused")
    def state(self, row: Queue) -> str:
        view = state_of(row).view
        badge = paused_badge(row.paused if view is None else view.paused)
        if view is None and row.backend not in lease_backends():
            return format_html(
                '{} <small class="leasejobs-quiet">{}</small>',
                badge,
                gettext("its backend is not configured"),
            )
        return badge

    @admin.display(description=_("paused since"), ordering="paused_at")
    def paused_since(self, row: Queue) -> str:
        state = state_of(row)
        paused_at = row.paused_at if state.view is None else state.view.paused_at
        return when(paused_at, state.now)

    @admin.display(description=_("queue limit"))
    def queue_limit(self, row: Queue) -> str:
        view = state_of(row).view
        return "-" if view is None else render_use(limit_use(view.running, view.limit))

    @admin.display(description=_("rate limit"))
    def rate_limit(self, row: Queue) -> str:
        view = state_of(row).view
        return "-" if view is None else render_use(rate_use(view.starts_in_window, view.rate))

    @admin.display(description=_("pending"))
    def pending(self, row: Queue) -> str:
        view = state_of(row).view
        if view is None:
            return "-"
        return self._jobs_link(row, view.pending, {"status__exact": JobStatus.PENDING})

    @admin.display(description=_("ready"))
    def ready(self, row: Queue) -> str:
        view = state_of(row).view
        return "-" if view is None else str(view.ready)

    def _jobs_link(self, row: Queue, count: int, filters: dict[str, str]) -> str:
        url = reverse(f"{self.admin_site.name}:django_leasejobs_job_changelist")
        query = urlencode({"queue": row.name, **filters})
        return format_html('<a href="{}?{}">{}</a>', url, query, count)

    # -- actions --------------------------------------------------------------------

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_leasejobs.pause_queue")

    def _each(self, request: HttpRequest, queryset: QuerySet[Queue], pause: bool) -> None:
        verb = "Paused" if pause else "Resumed"
        report = ActionReport(self, request, verb, noun="queue")
        for row in queryset:
            try:
                changed = (queues.pause if pause else queues.resume)(row.name, row.backend)
            except ValueError:
                report.skip("because their task backend is not configured any more")
                continue
            if changed:
                report.done(row, verb)
            else:
                report.skip("already paused" if pause else "not paused")
        report.send()

    @admin.action(description=_("Pause selected queues"), permissions=["pause"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        self._each(request, queryset, pause=True)

    @admin.action(description=_("Resume selected queues"), permissions=["pause"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        self._each(request, queryset, pause=False)


# -- the dashboard's column -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueFlow:
    """What the queue dashboard shows of one queue's flow control."""

    paused: bool = False
    paused_at: datetime | None = None
    paused_backends: list[str] = field(default_factory=list)
    uses: list[LimitUse] = field(default_factory=list)


def dashboard_flow(using: str, now: datetime) -> dict[str, QueueFlow]:
    """Paused queues and the queue-wide limits of the backends whose jobs are in the
    database ``using``, with their use, by queue name.

    Cheap: the paused rows of ``leasejobs_queue`` (a handful); the running jobs of
    limited queues (running rows only, and only when a queue has a limit); one count
    per rate-limited queue over its last period (``leasejobs_rate_start_idx``).
    """
    backends = {a: b for a, b in lease_backends().items() if b.database == using}
    if not backends:
        return {}
    several = len(backends) > 1
    paused: dict[str, list[tuple[str, datetime | None]]] = {}
    for alias, name, paused_at in (
        Queue.objects.using(using)
        .filter(backend__in=list(backends), paused=True)
        .values_list("backend", "name", "paused_at")
        .order_by("backend", "name")
    ):
        paused.setdefault(name, []).append((alias, paused_at))

    uses: dict[str, list[LimitUse]] = {}
    limited = {a: b.config.flow.queue_limits for a, b in backends.items()}
    if any(limited.values()):
        running = {
            (row["backend"], row["queue"]): row["n"]
            for row in Job.objects.using(using)
            .filter(
                status=JobStatus.RUNNING,
                locked_until__gt=now,
                backend__in=[a for a, limits in limited.items() if limits],
            )
            .values("backend", "queue")
            .annotate(n=Count("id"))
        }
        for alias, limits in limited.items():
            for name, limit in limits.items():
                use = limit_use(running.get((alias, name), 0), limit, alias if several else "")
                uses.setdefault(name, []).append(cast(LimitUse, use))
    for alias, backend in backends.items():
        for name, rate in backend.config.flow.queue_rates.items():
            starts = (
                RateStart.objects.using(using)
                .filter(
                    backend=alias,
                    scope=queue_scope(name),
                    started_at__gt=now - timedelta(seconds=rate.period),
                )
                .count()
            )
            use = rate_use(starts, rate.text, alias if several else "")
            uses.setdefault(name, []).append(cast(LimitUse, use))

    flows = {}
    for name in set(paused) | set(uses):
        held = paused.get(name, [])
        times = [at for _alias, at in held if at is not None]
        flows[name] = QueueFlow(
            paused=bool(held),
            paused_at=min(times) if times else None,
            paused_backends=[alias for alias, _at in held] if several else [],
            uses=uses.get(name, []),
        )
    return flows
