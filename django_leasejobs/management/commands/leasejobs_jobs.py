"""``manage.py leasejobs_jobs ACTION``: act on every job matching a filter.

``retry``, ``requeue-dead``, ``cancel``, ``set-queue QUEUE``, ``set-priority N`` and
``delete-finished``, on the jobs of one backend that match ``--task``, ``--queue``,
``--state``, ``--since``, ``--until`` and ``--search`` (the admin's search syntax); at
least one of them, or ``--all``. Prints the count it acted on (``--dry-run``: the count it
would act on). The work is ``django_leasejobs.bulk``, the same as the admin's bulk
actions; this command parses and prints.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ... import bulk
from ...backend import LeaseJobsBackend
from ...bulk import Action, Change, JobFilter
from ...leases import database_now
from ...models import MAX_PRIORITY, MIN_PRIORITY, JobStatus
from ..argtypes import moment, positive_int
from ..backends import database_failure, get_leasejobs_backend
from .leasejobs_queue import queue_name

HELP = {
    Action.RETRY: "Retry the failed and dead jobs among those matching.",
    Action.REQUEUE_DEAD: "Requeue the dead letters among those matching.",
    Action.CANCEL: (
        "Cancel the jobs matching: waiting and pending ones at once, running ones by a "
        "request their workers see."
    ),
    Action.SET_QUEUE: "Move the matching jobs that have not started to QUEUE.",
    Action.SET_PRIORITY: "Give the matching jobs that have not started the priority N.",
    Action.DELETE_FINISHED: "Delete the finished jobs among those matching, with their attempts.",
}


def priority(value: str) -> int:
    """A priority: a whole number from MIN_PRIORITY to MAX_PRIORITY."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not MIN_PRIORITY <= number <= MAX_PRIORITY:
        raise argparse.ArgumentTypeError(
            f"expected a priority from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value!r}"
        )
    return number


class Command(BaseCommand):
    # Like the other commands: no system checks first, so an unreachable database gives
    # the clean one-line error below (the backend's options are validated on lookup).
    requires_system_checks: list[str] = []
    help = (
        "Act on every job matching a filter: retry, requeue-dead, cancel, set-queue, "
        "set-priority, delete-finished. Filters: --task, --queue, --state, --since, --until, "
        "--search (the admin's search syntax); at least one, or --all. Prints the count."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", required=True, metavar="{" + ",".join(Action) + "}"
        )
        for action in Action:
            sub = actions.add_parser(action.value, help=HELP[action], description=HELP[action])
            if action == Action.SET_QUEUE:
                sub.add_argument("to", metavar="QUEUE", type=queue_name, help="The new queue.")
            elif action == Action.SET_PRIORITY:
                sub.add_argument(
                    "to",
                    metavar="N",
                    type=priority,
                    help=f"The new priority ({MIN_PRIORITY} to {MAX_PRIORITY}, higher first).",
                )
            self._add_filters(sub)

    @staticmethod
    def _add_filters(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--task", metavar="PATH", help="The task's dotted path.")
        parser.add_argument("--queue", metavar="NAME", type=queue_name, help="The queue.")
        parser.add_argument("--state", choices=JobStatus.values, help="The job's status.")
        parser.add_argument(
            "--since",
            type=moment,
            metavar="WHEN",
            help="Enqueued at or after WHEN: an ISO date or time (UTC unless it has an "
            "offset) or an age before now (30m, 12h, 7d; database clock).",
        )
        parser.add_argument(
            "--until", type=moment, metavar="WHEN", help="Enqueued before WHEN (as --since)."
        )
        parser.add_argument(
            "--search",
            default="",
            metavar="TEXT",
            help="The admin's search: kwargs.customer_id:4711, args.0:42, a job id, words.",
        )
        parser.add_argument(
            "--all", action="store_true", help="Act on every job of the backend (no filter)."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the jobs it would act on; change none."
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=bulk.DEFAULT_BATCH_SIZE,
            help=f"Jobs written per statement and transaction (default {bulk.DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--backend", metavar="ALIAS", default="default", help="TASKS alias (default: default)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_leasejobs_backend(options["backend"])
        action = Action(options["action"])
        try:
            self._run(backend, action, options)
        except DatabaseError as exc:
            raise database_failure(backend, exc) from exc

    def _run(self, backend: LeaseJobsBackend, action: Action, options: dict[str, Any]) -> None:
        found = self._filter(backend, options)
        if found.is_empty and not options["all"]:
            raise CommandError(
                "Give at least one filter (--task, --queue, --state, --since, --until, "
                "--search), or --all to act on every job of the backend."
            )
        change = Change()
        if action == Action.SET_QUEUE:
            self._require_known(backend, options["to"])
            change = Change(queue=options["to"])
        elif action == Action.SET_PRIORITY:
            change = Change(priority=options["to"])
        jobs = found.jobs(using=backend.database)
        if options["dry_run"]:
            count = bulk.count(action, jobs)
            noun = "job" if count == 1 else "jobs"
            self.stdout.write(
                f"dry run: {count} {noun} would be {action.done} "
                f"(of {jobs.count()} matching {found.describe()})"
            )
            return
        result = bulk.act(action, jobs, change, batch_size=options["batch_size"])
        self.stdout.write(result.summary())

    def _filter(self, backend: LeaseJobsBackend, options: dict[str, Any]) -> JobFilter:
        try:
            return JobFilter(
                task=options["task"] or None,
                queue=options["queue"],
                state=options["state"],
                since=self._time(backend, options["since"]),
                until=self._time(backend, options["until"]),
                search=options["search"],
                backend=backend.alias,
            )
        except ValueError as exc:  # a malformed search, since not before until
            raise CommandError(f"{exc}.") from exc

    @staticmethod
    def _time(backend: LeaseJobsBackend, given: datetime | timedelta | None) -> datetime | None:
        if isinstance(given, timedelta):
            return database_now(backend.database) - given
        return given

    @staticmethod
    def _require_known(backend: LeaseJobsBackend, name: str) -> None:
        """A backend that declares its QUEUES takes jobs from those only: a job moved to
        another queue would wait for a worker that never comes."""
        if backend.queues and name not in backend.queues:
            raise CommandError(
                f"No queue {name!r} in TASKS[{backend.alias!r}]['QUEUES'] "
                f"({', '.join(sorted(backend.queues))}): no worker of this backend would "
                "take the jobs. Add it to QUEUES first, or choose one of those."
            )
