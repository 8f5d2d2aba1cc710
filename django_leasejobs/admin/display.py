"""How the admin pages show values: escaped JSON, status badges, times relative to now."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib.admin.utils import display_for_value
from django.utils.html import format_html
from django.utils.translation import gettext

from ..models import JobStatus
from ..templatetags.leasejobs_admin import seconds


def pretty_json(value: Any) -> str:
    """Escaped, indented JSON in a <pre> (never rendered as HTML)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="leasejobs-json">{}</pre>', text)


def status_badge(status: str) -> str:
    return format_html(
        '<span class="leasejobs-status leasejobs-status-{}">{}</span>',
        status,
        JobStatus(status).label if status in JobStatus.values else status,
    )


def relative(moment: datetime, now: datetime) -> str:
    """How far ``moment`` is from ``now``, shortly: "in 5m", "12s ago"."""
    delta = (moment - now).total_seconds()
    return (gettext("in %s") if delta >= 0 else gettext("%s ago")) % seconds(delta)


def when(moment: datetime | None, now: datetime) -> str:
    """An instant for people: the admin's date format, and how far from now ("in 5m")."""
    if moment is None:
        return "-"
    return format_html(
        '<time datetime="{}">{}</time> <small>({})</small>',
        moment.isoformat(),
        display_for_value(moment, "-"),
        relative(moment, now),
    )
