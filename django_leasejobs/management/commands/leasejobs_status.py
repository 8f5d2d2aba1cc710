"""``manage.py leasejobs_status``: the dashboard's health summary in a terminal (or as JSON).

With ``--max-age`` / ``--max-dead`` / ``--max-expired`` (and the others) it doubles as a
health probe: exit code 1 when a threshold is passed, 0 otherwise. Like workers that
report problems, overdue schedules (no worker is running the schedules) are always
shown and change the exit code only with a threshold (``--max-overdue-schedules``).
Paused queues (``manage.py leasejobs_queue pause``) are shown too, and never change it:
a pause is an operator's decision, not a fault.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...queues import QueueView
from ...queues import overview as queue_overview
from ...schedules import ScheduleView, overview
from ...stats import Health, collect, online_window
from ...templatetags.leasejobs_admin import percent, seconds
from ..argtypes import non_negative_int, non_negative_seconds
from ..backends import database_failure, get_leasejobs_backend


class Command(BaseCommand):
    help = (
        "Print queue health (counts per queue, oldest ready job, dead letters, waiting "
        "workflow steps, workers)."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default).")
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts.")
        parser.add_argument(
            "--max-age",
            type=non_negative_seconds,
            default=None,
            help="Exit 1 when the oldest ready job has waited longer than this (seconds).",
        )
        parser.add_argument(
            "--max-dead",
            type=non_negative_int,
            default=None,
            help="Exit 1 when there are more dead letters than this.",
        )
        parser.add_argument(
            "--max-expired",
            type=non_negative_int,
            default=None,
            help="Exit 1 when more running jobs than this are past their lease.",
        )
        parser.add_argument(
            "--max-worker-problems",
            type=non_negative_int,
            default=None,
            help="Exit 1 when more online workers than this report a problem (outcomes "
            "they cannot record, failing database rounds).",
        )
        parser.add_argument(
            "--max-overdue-schedules",
            type=non_negative_int,
            default=None,
            help="Exit 1 when more schedules than this are overdue (a tick more than one "
            "period late: no worker is running the schedules).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_leasejobs_backend(options["backend"])
        try:
            health = collect(
                using=backend.database,
                online_after=online_window(backend.config.heartbeat_interval),
            )
            # Only a schedule declared in settings can be overdue: none, no query.
            overdue = (
                [view for view in overview(backend.alias, now=health.now) if view.overdue]
                if backend.config.schedules
                else []
            )
            paused = [view for view in queue_overview(backend.alias) if view.paused]
        except DatabaseError as exc:
            raise database_failure(backend, exc) from exc
        problems = self._problems(health, overdue, options)
        if options["json"]:
            payload = health.as_dict()
            payload["overdue_schedules"] = [view.as_dict() for view in overdue]
            paused_names = {view.name for view in paused}
            for queue in payload["queues"]:
                queue["paused"] = queue["queue"] in paused_names
            payload["paused_queues"] = [view.as_dict() for view in paused]
            payload["problems"] = problems
            self.stdout.write(json.dumps(payload, indent=2, sort_keys=True))
        else:
            self._print_table(health, overdue, paused, problems)
        if problems:
            raise CommandError("; ".join(problems), returncode=1)

    def _problems(
        self, health: Health, overdue: list[ScheduleView], options: dict[str, Any]
    ) -> list[str]:
        totals = health.totals
        problems = []
        wait = totals.oldest_ready_wait
        if options["max_age"] is not None and wait is not None and wait > options["max_age"]:
            problems.append(f"oldest ready job has waited {wait:.0f}s (> {options['max_age']:g}s)")
        if options["max_dead"] is not None and totals.dead > options["max_dead"]:
            problems.append(f"{totals.dead} dead letters (> {options['max_dead']})")
        if options["max_expired"] is not None and totals.expired > options["max_expired"]:
            problems.append(
                f"{totals.expired} running jobs past their lease (> {options['max_expired']})"
            )
        troubled = health.troubled_workers
        if (
            options["max_worker_problems"] is not None
            and len(troubled) > options["max_worker_problems"]
        ):
            problems.append(
                f"{len(troubled)} online workers report problems "
                f"(> {options['max_worker_problems']})"
            )
        limit = options["max_overdue_schedules"]
        if limit is not None and len(overdue) > limit:
            problems.append(f"{len(overdue)} schedules overdue (> {limit})")
        return problems

    def _print_table(
        self,
        health: Health,
        overdue: list[ScheduleView],
        paused: list[QueueView],
        problems: list[str],
    ) -> None:
        header = (
            "queue",
            "ready",
            "sched",
            "running",
            "expired",
            "dead",
            "ok/1h",
            "fail/1h",
            "fail%",
            "oldest",
            # Last: scripts that read the columns by position keep theirs.
            "waiting",
        )
        rows = [
            (
                q.queue,
                q.ready,
                q.scheduled,
                q.running,
                q.expired,
                q.dead,
                q.succeeded_last_hour,
                q.failed_last_hour,
                percent(q.failure_rate),
                seconds(q.oldest_ready_wait),
                q.waiting,
            )
            for q in [*health.queues, health.totals]
        ]
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

        def fmt(values: tuple[Any, ...]) -> str:
            cells = [
                str(v).ljust(widths[i]) if i == 0 else str(v).rjust(widths[i])
                for i, v in enumerate(values)
            ]
            return "  ".join(cells)

        self.stdout.write(fmt(header))
        for row in rows:
            self.stdout.write(fmt(row))
        self.stdout.write(
            f"\nworkers online: {health.workers_online}   running jobs listed: "
            f"{len(health.running)}   database time: {health.now:%Y-%m-%d %H:%M:%S}"
        )
        for worker in health.troubled_workers:
            self.stdout.write(f"worker {worker.id} reports: {worker.problem}")
        for view in overdue:
            self.stdout.write(
                f"schedule {view.name} overdue: its tick of "
                f"{view.next_tick:%Y-%m-%d %H:%M:%S} is {seconds(view.overdue_seconds)} late; "
                "no worker is running the schedules (see manage.py leasejobs_schedules)"
            )
        for queue in paused:
            since = "" if queue.paused_at is None else f" since {queue.paused_at:%Y-%m-%d %H:%M:%S}"
            resume = f"manage.py leasejobs_queue resume {shlex.quote(queue.name)}"
            self.stdout.write(
                f"queue {queue.name} PAUSED{since}: {queue.pending} pending job(s) wait, "
                f"no worker claims them ({resume})"
            )
        for problem in problems:
            self.stderr.write(f"PROBLEM: {problem}")
