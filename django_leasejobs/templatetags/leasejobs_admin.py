"""Template filters for the admin dashboard."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def seconds(value: float | None) -> str:
    """A duration in seconds, shortly: 42s, 5m, 3.2h; '-' for None."""
    if value is None or value == "":
        return "-"
    value = abs(float(value))
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


@register.filter
def percent(value: float | None) -> str:
    if value is None or value == "":
        return "-"
    return f"{float(value) * 100:.1f}%"


@register.filter
def task_name(task_path: str) -> str:
    """The function's name of a dotted task path (the whole path goes in a tooltip)."""
    module, _dot, name = task_path.rpartition(".")
    return name or module
