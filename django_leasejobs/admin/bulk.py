"""The job list's bulk actions: act on every job matching the list's filters and search,
not one page (``django_leasejobs.bulk`` does the work).

When a filter or a search is active, the list offers each action the user may take
(:func:`bulk_links`); its link opens a confirmation page (:func:`bulk_action_view`, GET) with
the exact count of the jobs the action takes, the filter in words, and a form that posts
back to the same URL, whose querystring is the list's own filters: what is confirmed is
what the list showed. The page counts up to the highest matching id it saw, posted back
with the form, so a job enqueued after the page was shown is never touched. The POST
acts, records ONE ``LogEntry`` (the job content type, no object: the action, the filter
and the count in its message) and goes back to the list with a message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.options import IS_FACETS_VAR, IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.views.main import (
    ALL_VAR,
    ERROR_FLAG,
    ORDER_VAR,
    PAGE_VAR,
    SEARCH_VAR,
    ChangeList,
)
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from .. import bulk
from ..bulk import Action, BulkResult, Change
from ..models import Job
from .filter_safety import BadFilter, FilterSafeAdmin

if TYPE_CHECKING:
    from django.utils.functional import _StrPromise

JobAdmin = FilterSafeAdmin
"""The job list's admin as this module uses it (``jobs.JobAdmin``, which imports this
module): its permission checks are found by name (``has_<name>_permission``)."""

LIST_ONLY_PARAMS = frozenset(
    {ALL_VAR, ORDER_VAR, PAGE_VAR, ERROR_FLAG, IS_POPUP_VAR, TO_FIELD_VAR, IS_FACETS_VAR}
)
"""The list's parameters that choose no job: left out of a bulk action's querystring."""

OBJECT_REPR_LENGTH = 200
"""``LogEntry.object_repr``'s length."""


@dataclass(frozen=True, slots=True)
class BulkChoice:
    """One bulk action as the list offers it."""

    action: Action
    label: _StrPromise
    question: _StrPromise
    takes: _StrPromise
    """Which of the matching jobs it acts on, in words."""
    permission: Callable[[JobAdmin, HttpRequest], bool]
    flag: int


def _permission(name: str) -> Callable[[JobAdmin, HttpRequest], bool]:
    def allowed(model_admin: JobAdmin, request: HttpRequest) -> bool:
        check: Callable[[HttpRequest], bool] = getattr(model_admin, f"has_{name}_permission")
        return check(request)

    return allowed


CHOICES = {
    choice.action: choice
    for choice in (
        BulkChoice(
            Action.RETRY,
            _("Retry"),
            _("Retry every matching job?"),
            _("the failed and dead ones"),
            _permission("retry"),
            CHANGE,
        ),
        BulkChoice(
            Action.REQUEUE_DEAD,
            _("Requeue dead"),
            _("Requeue every matching dead letter?"),
            _("the dead ones"),
            _permission("requeue"),
            CHANGE,
        ),
        BulkChoice(
            Action.CANCEL,
            _("Cancel"),
            _("Cancel every matching job?"),
            _(
                "the waiting and pending ones (cancelled now) and the running ones (their "
                "workers stop them)"
            ),
            _permission("cancel"),
            CHANGE,
        ),
        BulkChoice(
            Action.SET_QUEUE,
            _("Change queue"),
            _("Move every matching job to another queue?"),
            _("the ones that have not started (waiting, ready or scheduled)"),
            _permission("reroute"),
            CHANGE,
        ),
        BulkChoice(
            Action.SET_PRIORITY,
            _("Change priority"),
            _("Change the priority of every matching job?"),
            _("the ones that have not started (waiting, ready or scheduled)"),
            _permission("reroute"),
            CHANGE,
        ),
        BulkChoice(
            Action.DELETE_FINISHED,
            _("Delete finished"),
            _("Delete every matching finished job?"),
            _("the finished ones (succeeded, failed, dead, cancelled), with their attempts"),
            _permission("purge"),
            DELETION,
        ),
    )
}


def filter_query(request: HttpRequest) -> QueryDict:
    """The list's filters and search from ``request``'s querystring, nothing else."""
    query = request.GET.copy()
    for name in LIST_ONLY_PARAMS:
        query.pop(name, None)
    return query


def _has_filter(query: QueryDict) -> bool:
    return any(
        name != SEARCH_VAR or any(value.strip() for value in values)
        for name, values in query.lists()
    )


def bulk_links(model_admin: JobAdmin, request: HttpRequest) -> list[tuple[str, str]]:
    """(label, url) of each bulk action the user may take on the list's matching jobs;
    none without a filter or a search (acting on every job is never one click away)."""
    query = filter_query(request)
    if not _has_filter(query):
        return []
    return [
        (str(choice.label), f"{bulk_url(model_admin, choice.action)}?{query.urlencode()}")
        for choice in CHOICES.values()
        if choice.permission(model_admin, request)
    ]


def bulk_url(model_admin: JobAdmin, action: Action) -> str:
    opts = model_admin.opts
    return reverse(
        f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_bulk",
        args=[action.value],
    )


def _changelist_url(model_admin: JobAdmin, request: HttpRequest) -> str:
    opts = model_admin.opts
    url = reverse(f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")
    query = filter_query(request).urlencode()
    return f"{url}?{query}" if query else url


def matching(model_admin: JobAdmin, request: HttpRequest) -> tuple[QuerySet[Job], str]:
    """The jobs the list shows for ``request``'s filters and search (the list's own
    filter classes and search, on plain rows), and those filters in words.

    ``BadFilter`` when the list would answer 400.
    """
    from django.contrib.admin.options import IncorrectLookupParameters

    try:
        with model_admin.filter_errors(request):
            changelist: ChangeList = model_admin.get_changelist_instance(request)
            changelist.root_queryset = Job.objects.using(changelist.root_queryset.db).all()
            jobs = changelist.get_queryset(request).order_by()
    except IncorrectLookupParameters as exc:
        raise BadFilter(f"This filter cannot be applied: {exc}") from exc
    return jobs, describe(changelist)


def describe(changelist: ChangeList) -> str:
    """The list's filters and search in words: ``status: Dead; search: "kwargs.a:1"``."""
    parts: list[str] = []
    for spec in changelist.filter_specs:
        if not spec.used_parameters:
            continue
        chosen = [
            str(choice["display"]) for choice in spec.choices(changelist) if choice.get("selected")
        ]
        if not chosen:  # a value the filter does not list (an old task, a worker id)
            for value in spec.used_parameters.values():
                chosen.extend(value if isinstance(value, list) else [str(value)])
        parts.append(f"{spec.title}: {', '.join(chosen)}")
    if changelist.query:
        parts.append(f'search: "{changelist.query}"')
    return "; ".join(parts)


def bulk_action_view(model_admin: JobAdmin, request: HttpRequest, name: str) -> HttpResponse:
    """GET: the confirmation page; POST: the action, its log entry, back to the list."""
    try:
        action = Action(name)
    except ValueError:
        raise PermissionDenied from None  # no such action: nothing to offer
    choice = CHOICES[action]
    if not model_admin.has_view_permission(request) or not choice.permission(model_admin, request):
        raise PermissionDenied
    if not _has_filter(filter_query(request)):
        return model_admin.bad_filter_response(
            request,
            "A bulk action needs a filter or a search: choose one on the job list first.",
        )
    try:
        jobs, described = matching(model_admin, request)
    except BadFilter as exc:
        return model_admin.bad_filter_response(request, str(exc))
    if request.method == "POST":
        return _act(model_admin, request, choice, jobs, described)
    return _confirmation(model_admin, request, choice, jobs, described)


def _confirmation(
    model_admin: JobAdmin,
    request: HttpRequest,
    choice: BulkChoice,
    jobs: QuerySet[Job],
    described: str,
    change_error: str = "",
) -> TemplateResponse:
    upto = bulk.last_id(jobs)
    bounded = jobs if upto is None else jobs.filter(pk__lte=upto)
    matching_count = bounded.count()
    count = bulk.count(choice.action, bounded)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": choice.question,
        "opts": model_admin.opts,
        "choice": choice,
        "action": choice.action.value,
        "described": described,
        "count": count,
        "matching": matching_count,
        "stay": matching_count - count,
        "upto": upto,
        "changelist_url": _changelist_url(model_admin, request),
        "change_error": change_error,
        "queue": request.POST.get("queue", ""),
        "priority": request.POST.get("priority", ""),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_leasejobs/job/bulk_confirmation.html", context)


def _change_of(choice: BulkChoice, request: HttpRequest) -> Change | str:
    """The new queue or priority the form posted, or what is wrong with it."""
    if choice.action == Action.SET_QUEUE:
        queue = request.POST.get("queue", "").strip()
        return Change(queue=queue) if queue else str(_("Give the queue to move them to."))
    if choice.action == Action.SET_PRIORITY:
        try:
            return Change(priority=int(request.POST.get("priority", "")))
        except ValueError:
            return str(_("Give the new priority, a whole number from -100 to 100."))
    return Change()


def _act(
    model_admin: JobAdmin,
    request: HttpRequest,
    choice: BulkChoice,
    jobs: QuerySet[Job],
    described: str,
) -> HttpResponse:
    back = _changelist_url(model_admin, request)
    try:
        upto = int(request.POST["upto"])
    except (KeyError, ValueError):
        model_admin.message_user(
            request,
            _("Nothing was changed: the confirmation did not say which jobs it counted."),
            messages.ERROR,
        )
        return HttpResponseRedirect(back)
    change = _change_of(choice, request)
    if isinstance(change, str):
        return _confirmation(model_admin, request, choice, jobs, described, change)
    try:
        result = bulk.act(choice.action, jobs.filter(pk__lte=upto), change)
    except ValueError as exc:  # a queue name or a priority out of bounds
        return _confirmation(model_admin, request, choice, jobs, described, str(exc))
    message = audit_message(choice, result, described, change)
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type_id=ContentType.objects.get_for_model(Job, for_concrete_model=False).pk,
        object_id=None,
        object_repr=f"{result.count} jobs matching {described}"[:OBJECT_REPR_LENGTH],
        action_flag=choice.flag,
        change_message=message,
    )
    model_admin.message_user(
        request,
        f"{choice.label}: {result.summary()} (every job matching {described}).",
        messages.SUCCESS if result.count else messages.WARNING,
    )
    return HttpResponseRedirect(back)


def audit_message(choice: BulkChoice, result: BulkResult, described: str, change: Change) -> str:
    """The log entry's message: the action, what it set, the filter, the count."""
    target = ""
    if change.queue is not None:
        target = f" to queue {change.queue!r}"
    elif change.priority is not None:
        target = f" to priority {change.priority}"
    return (
        f"Bulk {choice.action.value}{target} of every job matching {described}: {result.summary()}."
    )
