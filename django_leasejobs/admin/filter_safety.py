"""The lists' guard: a malformed filter in a list's URL is answered with 400, never 500.

A NUL character, an invalid regular expression, a value the database refuses: each is
answered with 400 Bad Request and a link back to the unfiltered list.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.views.main import ALL_VAR, ERROR_FLAG, ORDER_VAR, PAGE_VAR
from django.db import DatabaseError, router, transaction
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

logger = logging.getLogger("django_leasejobs")

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
