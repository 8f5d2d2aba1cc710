"""Periodic jobs: cron and interval schedules declared in ``OPTIONS["SCHEDULES"]``.

* ``spec``: the declared schedules, checked, and their ticks (cronsim for cron);
* ``transitions``: the fenced writes of a schedule's state (one function each);
* ``scheduler``: one pass: the due ticks and the catch-up policy (decided once);
* ``operations``: what operators see and do (overview, pause, resume, run now).

The public API is re-exported here: ``pause``, ``resume``, ``run_now``, ``overview``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .operations import ScheduleView, UnknownSchedule, overview, pause, resume, run_now

__all__ = ["ScheduleView", "UnknownSchedule", "overview", "pause", "resume", "run_now"]


def __getattr__(name: str) -> Any:
    # Imported on first use: ``conf`` reads ``spec`` while the backend is being built.
    if name in __all__:
        from . import operations

        return getattr(operations, name)
    raise AttributeError(name)
