"""``manage.py leasejobs_queue``: pause or resume a queue, or list the queues with their limits.

``pause NAME``: no worker claims the queue's pending jobs until ``resume NAME``; running
jobs finish, enqueueing goes on. Both hold on every worker at its next claim, without a
restart, and both are safe to repeat (the second says the queue was so already).
``list`` shows each queue of the backend: paused or not, its ``QUEUE_LIMITS`` and
``QUEUE_RATE_LIMITS`` and their use, its running, pending and ready jobs. The work is
``django_leasejobs.queues``; this command parses and prints.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...backend import LeaseJobsBackend
from ...conf import MAX_QUEUE_NAME
from ...queues import QueueView, overview, pause, resume
from ..backends import database_failure, get_leasejobs_backend


def queue_name(value: str) -> str:
    """A NAME argument: what could be a queue's name (the backend may still not know it)."""
    if not 0 < len(value) <= MAX_QUEUE_NAME:
        raise argparse.ArgumentTypeError(
            f"expected a queue name of 1 to {MAX_QUEUE_NAME} characters, got {value!r}"
        )
    return value


def _limit(view: QueueView) -> str:
    return "-" if view.limit is None else f"{view.running}/{view.limit}"


def _rate(view: QueueView) -> str:
    return "-" if view.rate is None else f"{view.starts_in_window or 0}/{view.rate}"


class Command(BaseCommand):
    # Like the other commands: no system checks first, so an unreachable database gives
    # the clean one-line error below (the backend's options are validated on lookup).
    requires_system_checks: list[str] = []
    help = (
        "Pause or resume a queue (no worker claims a paused queue's jobs; running jobs "
        "finish, enqueueing goes on), or list the queues with their state, limits "
        "(OPTIONS['QUEUE_LIMITS'], OPTIONS['QUEUE_RATE_LIMITS']) and jobs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{pause,resume,list}")
        for action, what in (
            ("pause", "Pause the queue NAME: workers stop claiming its pending jobs."),
            ("resume", "Resume the queue NAME: workers claim its pending jobs again."),
        ):
            sub = actions.add_parser(action, help=what, description=what)
            sub.add_argument("name", metavar="NAME", type=queue_name, help="The queue.")
            self._add_backend(sub)
        listing = actions.add_parser(
            "list",
            help="List the queues: paused, limits and their use, jobs.",
            description="List the backend's queues: paused, limits and their use, jobs.",
        )
        listing.add_argument("--json", action="store_true", help="Print JSON for scripts.")
        self._add_backend(listing)

    @staticmethod
    def _add_backend(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--backend", metavar="ALIAS", default="default", help="TASKS alias (default: default)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_leasejobs_backend(options["backend"])
        try:
            if options["action"] == "list":
                self._list(backend, options["json"])
            else:
                self._change(backend, options["name"], paused=options["action"] == "pause")
        except DatabaseError as exc:
            raise database_failure(backend, exc) from exc

    def _change(self, backend: LeaseJobsBackend, name: str, *, paused: bool) -> None:
        self._require_known(backend, name)
        try:
            changed = (pause if paused else resume)(name, backend.alias)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if paused:
            text = f"paused queue {name!r}" if changed else f"queue {name!r} was already paused"
        else:
            text = f"resumed queue {name!r}" if changed else f"queue {name!r} was not paused"
        self.stdout.write(text)

    def _require_known(self, backend: LeaseJobsBackend, name: str) -> None:
        """A backend that declares its QUEUES takes jobs in those only: another name is
        most likely a typo. Queues the backend still knows of otherwise (a pause, active
        jobs, a limit) are accepted, so that a queue dropped from QUEUES can be resumed."""
        if not backend.queues or name in backend.queues:
            return
        known = [view.name for view in overview(backend.alias)]
        if name not in known:
            raise CommandError(
                f"No queue {name!r} in TASKS[{backend.alias!r}]['QUEUES']. "
                f"Known queues: {', '.join(known)}."
            )

    def _list(self, backend: LeaseJobsBackend, as_json: bool) -> None:
        views = overview(backend.alias)
        if as_json:
            self.stdout.write(
                json.dumps([view.as_dict() for view in views], indent=2, sort_keys=True)
            )
            return
        if not views:
            self.stdout.write(f"No queues in TASKS[{backend.alias!r}] and no jobs.")
            return
        header = ("queue", "paused", "limit", "rate", "running", "pending", "ready")
        rows = [
            (
                view.name,
                "PAUSED" if view.paused else "no",
                _limit(view),
                _rate(view),
                str(view.running),
                str(view.pending),
                str(view.ready),
            )
            for view in views
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            cells = (
                cell.ljust(width) if i < 4 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
            self.stdout.write("  ".join(cells).rstrip())
        self.stdout.write(
            "\nlimit: running/most at once (QUEUE_LIMITS); rate: starts in the last period/"
            "most starts per period (QUEUE_RATE_LIMITS); -: no limit"
        )
        if any(view.paused for view in views):
            self.stdout.write(
                "PAUSED: no worker claims the queue's jobs until manage.py leasejobs_queue "
                "resume NAME (running jobs finish, enqueueing goes on)."
            )
