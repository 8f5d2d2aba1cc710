"""Big values stay out of pages: the admin shows at most :data:`SHOWN` characters of a
job's arguments, result, checkpoint, error, traceback or progress message, with the
value's whole size and a link that downloads it.

The pages never read a big value whole. Their querysets defer the columns
(:func:`deferred`) and read instead, per column, its first ``SHOWN + 1`` characters and
its size in bytes, computed by the database (:func:`with_previews`): a JSON column cast
to text, a text column as it is. A value whose text is at most ``SHOWN`` characters is
shown whole (a JSON value parsed and indented, as before); a longer one is cut, and the
page says how big it is and links to the download (:func:`download`), an admin view
that answers with the whole text as an attachment: the database's JSON text for JSON
columns (``application/json``), the text itself for text columns (``text/plain``).
Everything shown is escaped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Model, QuerySet, TextField
from django.db.models.functions import Cast, Substr
from django.http import Http404, HttpResponse
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html
from django.utils.translation import gettext as _

from ..functions import OctetLength
from ..models import Job, JobAttempt
from .display import pretty_json

SHOWN = 4096
"""At most this many characters of a value are shown on an admin page (4 KiB of ASCII);
a longer value is cut there, with its size and a download link."""

JOB_JSON = ("args", "kwargs", "result", "checkpoint", "metadata")
"""The job's JSON columns the pages show (downloaded as JSON)."""
JOB_TEXT = ("last_error", "progress_message")
"""The job's text columns the pages show (downloaded as text)."""
ATTEMPT_TEXT = ("error_message", "traceback")
"""The attempt's text columns the job page shows (downloaded as text)."""

JOB_BIG = (*JOB_JSON, *JOB_TEXT, "trace_context")
"""Columns no job list reads (``trace_context`` is shown nowhere)."""

_TEXT = "leasejobs_shown_"
_SIZE = "leasejobs_size_"


def with_previews(
    queryset: QuerySet[Any], fields: tuple[str, ...], json_fields: tuple[str, ...] = ()
) -> QuerySet[Any]:
    """``queryset`` without ``fields``, each replaced by its first ``SHOWN + 1``
    characters and its size in bytes (see :func:`preview`). A JSON column is read as
    the database's text of it, the text the download answers with."""
    annotations: dict[str, Any] = {}
    for name in fields:
        text = Cast(F(name), TextField()) if name in json_fields else F(name)
        annotations[_TEXT + name] = Substr(text, 1, SHOWN + 1)
        annotations[_SIZE + name] = OctetLength(text)
    return queryset.defer(*fields).annotate(**annotations)


@dataclass(frozen=True)
class Preview:
    """What a page shows of one value."""

    text: str
    """The whole text, or its first ``SHOWN`` characters when ``cut``."""
    size: int
    """The whole text's size in bytes (UTF-8)."""
    cut: bool


def preview(obj: Model, name: str) -> Preview | None:
    """The preview :func:`with_previews` read for ``name``; None for NULL. A row read
    without it (a subclass's own queryset) is read here, column by column."""
    if not hasattr(obj, _TEXT + name):
        value = getattr(obj, name)  # the whole value: only for rows read without previews
        if value is None:
            return None
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return _preview(text, len(text.encode()))
    text = getattr(obj, _TEXT + name)
    if text is None:
        return None
    return _preview(text, int(getattr(obj, _SIZE + name)))


def _preview(text: str, size: int) -> Preview:
    if len(text) > SHOWN:
        return Preview(text[:SHOWN], size, cut=True)
    return Preview(text, size, cut=False)


def json_value(shown: Preview) -> Any:
    """The value of a whole (not cut) JSON preview."""
    return json.loads(shown.text)


def shown_json(shown: Preview | None, url: str) -> str:
    """A JSON value: whole, indented, when it fits; else its first characters as the
    database writes it, with its size and the download link."""
    if shown is None:
        return "-"
    if not shown.cut:
        return pretty_json(json_value(shown))
    return format_html(
        '<pre class="leasejobs-json leasejobs-cut">{}…</pre>{}',
        shown.text,
        cut_note(shown, url),
    )


def cut_note(shown: Preview, url: str) -> str:
    """Under a cut value: "50.0 MB, showing the first 4.0 KB. Download the whole value"."""
    return format_html(
        '<p class="leasejobs-cut-note">{} <a href="{}" download>{}</a></p>',
        _("%(size)s, showing the first %(shown)s.")
        % {
            "size": filesizeformat(shown.size),
            "shown": filesizeformat(len(shown.text.encode())),
        },
        url,
        _("Download the whole value"),
    )


def download(value: str | None, filename: str, *, as_json: bool) -> HttpResponse:
    """The whole value as an attachment (never shown as a page); 404 for NULL."""
    if value is None:
        raise Http404("no such value")
    content_type = "application/json" if as_json else "text/plain"
    response = HttpResponse(value.encode(), content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def job_value(jobs: QuerySet[Job], job_id: int, name: str) -> str | None:
    """The whole text of a job's column ``name`` (a JSON column as the database's JSON
    text); 404 for an unknown job."""
    if name not in JOB_JSON and name not in JOB_TEXT:
        raise Http404("no such field")
    text = Cast(F(name), TextField()) if name in JOB_JSON else F(name)
    rows = list(jobs.filter(pk=job_id).values_list(text))
    if not rows:
        raise Http404("no such job")
    return rows[0][0]


def attempt_value(
    attempts: QuerySet[JobAttempt], job_id: int, attempt_id: int, name: str
) -> tuple[int, str]:
    """The attempt's number and the whole text of its column ``name``; 404 for an unknown
    attempt or one of another job."""
    if name not in ATTEMPT_TEXT:
        raise Http404("no such field")
    rows = list(attempts.filter(pk=attempt_id, job_id=job_id).values_list("attempt", name))
    if not rows:
        raise Http404("no such attempt")
    return rows[0]
