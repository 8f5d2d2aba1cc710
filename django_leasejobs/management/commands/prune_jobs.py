"""``manage.py prune_jobs``: delete old finished jobs and schedule runs in short batches."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError

from ...pruning import prune, statuses_for
from ..argtypes import parse_age, positive_int
from ..backends import database_failure, get_leasejobs_backend


class Command(BaseCommand):
    # Like reap_stale_locks: no system checks first, so an unreachable database gives the
    # clean one-line error below.
    requires_system_checks: list[str] = []
    help = (
        "Delete finished jobs (succeeded, cancelled; with --include-failed also failed and "
        "dead) whose finished_at is older than their retention (the job's result_ttl, else "
        "its queue's QUEUE_RESULT_TTL, else --older-than), and schedule runs enqueued "
        "before --older-than, in short batches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=parse_age,
            default=None,
            help="Age of finished_at (of a schedule run: enqueued_at), database clock: "
            "e.g. 90s, 30m, 12h, 7d, 2w; for jobs without a result_ttl of their own or of "
            "their queue. Without it only those jobs are pruned, and no schedule run.",
        )
        parser.add_argument(
            "--include-failed",
            action="store_true",
            help="Also delete failed and dead jobs (default: only succeeded and cancelled).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            help="Jobs (or schedule runs) deleted per transaction (default: 1000).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default).")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_leasejobs_backend(options["backend"])
        try:
            result = prune(
                older_than=options["older_than"],
                queue_result_ttl=backend.config.queue_result_ttl,
                include_failed=options["include_failed"],
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
                backend=backend.alias,
                using=backend.database,
                rollup_retention=backend.config.rollup_retention,
            )
        except DatabaseError as exc:
            raise database_failure(backend, exc) from exc
        if result.dry_run:
            statuses = ",".join(statuses_for(options["include_failed"]))
            self.stdout.write(
                f"dry run: would prune finished jobs count={result.count} "
                f"batches={result.batches} statuses={statuses}"
            )
            self.stdout.write(f"dry run: would prune schedule runs count={result.schedule_runs}")
            self.stdout.write(f"dry run: would prune rollup rows count={result.rollups}")
            return
        self.stdout.write(f"pruned finished jobs count={result.count}")
        self.stdout.write(f"pruned schedule runs count={result.schedule_runs}")
        self.stdout.write(f"pruned rollup rows count={result.rollups}")
