"""``manage.py leasejobs_schedules``: list the schedules, run one now, or enqueue the due ticks.

``--enqueue-due`` runs one scheduler pass, for hosts that run the schedules from cron
instead of from workers; like the workers' passes it is safe to run anywhere, any
number of times: each tick is enqueued once.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...backend import LeaseJobsBackend
from ...compat import InvalidTask
from ...leases import database_now
from ...schedules import UnknownSchedule, overview, run_now
from ...schedules.scheduler import run_pass
from ...schedules.transitions import EnqueuedRun
from ...templatetags.leasejobs_admin import seconds
from ..backends import database_failure, get_leasejobs_backend


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC, or None."""
    return None if value is None else value.astimezone(UTC).isoformat()


def _run_as_dict(run: EnqueuedRun) -> dict[str, Any]:
    return {"schedule": run.schedule, "tick": iso(run.tick), "job_id": run.job_id}


def _time(value: datetime | None) -> str:
    return "-" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


class Command(BaseCommand):
    # Like the other commands: no system checks first, so an unreachable database gives
    # the clean one-line error below.
    requires_system_checks: list[str] = []
    help = (
        "List the backend's schedules (OPTIONS['SCHEDULES']) with their state, next and last "
        "run; --run NAME enqueues one job of a schedule now; --enqueue-due runs one "
        "scheduler pass (for cron, on hosts where no worker runs the schedules)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default).")
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts.")
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--run",
            metavar="NAME",
            default=None,
            help="Enqueue one job of this schedule now, outside its ticks (paused or not).",
        )
        action.add_argument(
            "--enqueue-due",
            action="store_true",
            help="Enqueue the due ticks of every schedule (one scheduler pass) and exit.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_leasejobs_backend(options["backend"])
        try:
            if options["run"] is not None:
                self._run(backend, options["run"], options["json"])
            elif options["enqueue_due"]:
                self._enqueue_due(backend, options["json"])
            else:
                self._list(backend, options["json"])
        except DatabaseError as exc:
            raise database_failure(backend, exc) from exc

    def _run(self, backend: LeaseJobsBackend, name: str, as_json: bool) -> None:
        try:
            run = run_now(name, backend.alias)
        except UnknownSchedule as exc:
            names = ", ".join(spec.name for spec in backend.config.schedules)
            known = f"Known schedules: {names}." if names else "It declares no schedules."
            raise CommandError(f"{exc} {known}") from exc
        except InvalidTask as exc:  # the task is not registered, or refuses the schedule
            raise CommandError(f"Schedule {name!r}: {exc}") from exc
        if as_json:
            self.stdout.write(json.dumps(_run_as_dict(run), indent=2, sort_keys=True))
        else:
            self.stdout.write(f"schedule {run.schedule}: enqueued job {run.job_id} (run now)")

    def _enqueue_due(self, backend: LeaseJobsBackend, as_json: bool) -> None:
        scheduler = f"{socket.gethostname()}:{os.getpid()}:leasejobs_schedules"
        report = run_pass(backend, scheduler=scheduler)
        if as_json:
            payload = {
                "now": iso(report.now),
                "enqueued": [_run_as_dict(run) for run in report.enqueued],
                "next_due": iso(report.next_due),
                "failed": list(report.failed),
            }
            self.stdout.write(json.dumps(payload, indent=2, sort_keys=True))
        else:
            for run in report.enqueued:
                self.stdout.write(
                    f"schedule {run.schedule}: enqueued job {run.job_id} for tick {iso(run.tick)}"
                )
            self.stdout.write(f"enqueued due schedule ticks count={len(report.enqueued)}")
        if report.failed:
            raise CommandError(
                f"pass failed for schedule(s) {', '.join(report.failed)} "
                "(the others went on; the errors are logged on the django_leasejobs logger)"
            )

    def _list(self, backend: LeaseJobsBackend, as_json: bool) -> None:
        now = database_now(backend.database)
        views = overview(backend.alias, now=now)
        if as_json:
            payload = {
                "backend": backend.alias,
                "now": iso(now),
                "schedules": [view.as_dict() for view in views],
            }
            self.stdout.write(json.dumps(payload, indent=2, sort_keys=True))
            return
        if not views:
            self.stdout.write(f"No schedules in TASKS[{backend.alias!r}]['OPTIONS']['SCHEDULES'].")
            return
        header = ("name", "schedule", "time zone", "state", "next run", "last run", "last job")
        rows = [
            (
                view.name,
                f"{view.expression}: {view.description}" if view.description else view.expression,
                view.timezone,
                f"{view.state} OVERDUE {seconds(view.overdue_seconds)}"
                if view.overdue
                else view.state,
                _time(view.next_tick),
                _time(view.last_run_at),
                f"{view.last_job_id} {view.last_job_status or '(deleted)'}"
                if view.last_job_id is not None
                else "-",
            )
            for view in views
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())
        self.stdout.write(f"\ntimes in UTC; database time: {_time(now)}")
        if any(view.overdue for view in views):
            self.stdout.write(
                "OVERDUE: a tick is more than one period late, so no worker is running the "
                "schedules (runworker runs them unless --no-scheduler or --burst; without "
                "workers, run this command with --enqueue-due from cron)."
            )
