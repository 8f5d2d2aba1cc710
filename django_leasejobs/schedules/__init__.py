"""Periodic jobs: cron and interval schedules declared in ``OPTIONS["SCHEDULES"]``.

* ``transitions``: the fenced writes of a schedule's state (one function each);
* ``scheduler``: one pass: the due ticks and the catch-up policy (decided once);
* ``operations``: what operators see and do (overview, pause, resume, run now).

The declared schedules, checked, and their ticks live beside this package, in
``django_leasejobs.schedule_spec``: ``conf`` parses ``SCHEDULES`` with it, and this
package imports the backend, which imports ``conf``.

The public API is re-exported here: ``pause``, ``resume``, ``run_now``, ``overview``.
"""

from __future__ import annotations

from .operations import ScheduleView, UnknownSchedule, overview, pause, resume, run_now

__all__ = ["ScheduleView", "UnknownSchedule", "overview", "pause", "resume", "run_now"]
