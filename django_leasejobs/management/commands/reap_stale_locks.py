"""``manage.py reap_stale_locks``: recover running jobs whose lease expired (for cron)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections

from ... import leases
from ...reaper import reap_once
from ..argtypes import non_negative_seconds, positive_seconds
from ..backends import database_failure, get_leasejobs_backend


class Command(BaseCommand):
    # The backend's options are validated when the command starts; running every system
    # check first would open database connections before the clean "unreachable" error.
    requires_system_checks: list[str] = []
    help = (
        "Put running jobs whose lease expired back to pending (or failed/dead by their "
        "attempts and stalls). Safe to run from cron on many hosts at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default).")
        parser.add_argument(
            "--stale-lock-age",
            type=non_negative_seconds,
            default=None,
            help="Extra seconds after lease expiry before a job is reaped "
            "(default: the backend's STALE_LOCK_AGE).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="List what would be reaped; change nothing."
        )
        parser.add_argument(
            "--loop", action="store_true", help="Keep running, one pass every --interval seconds."
        )
        parser.add_argument(
            "--interval",
            type=positive_seconds,
            default=None,
            help="Seconds between passes with --loop (default: the backend's "
            "STALE_LOCK_INTERVAL, or 10 when that is 0).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_leasejobs_backend(options["backend"])
        config = backend.config
        age = (
            config.stale_lock_age
            if options["stale_lock_age"] is None
            else options["stale_lock_age"]
        )
        interval = options["interval"] or config.stale_lock_interval or 10.0
        if options["interval"] is not None and not options["loop"]:
            raise CommandError("--interval only makes sense with --loop.")

        stop = threading.Event()
        if options["loop"]:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
        while True:
            try:
                self._one_pass(
                    backend.alias,
                    backend.database,
                    age,
                    options["dry_run"],
                    rollups=backend.config.rollups,
                )
            except DatabaseError as exc:
                failure = database_failure(backend, exc)
                if not options["loop"]:
                    raise failure from exc
                self.stderr.write(str(failure))
                close_old_connections()
            if not options["loop"] or stop.wait(interval):
                return

    def _one_pass(
        self, alias: str, database: str, age: float, dry_run: bool, *, rollups: bool
    ) -> None:
        if dry_run:
            stale = leases.find_stale(stale_lock_age=age, backend=alias, using=database)
            for job in stale:
                self.stdout.write(
                    f"would reap job {job.pk} attempt {job.attempt} task {job.task_path} "
                    f"queue {job.queue} worker {job.locked_by} locked until "
                    f"{job.locked_until.isoformat() if job.locked_until else '-'}"
                )
            self.stdout.write(f"dry run: would release stale running jobs count={len(stale)}")
            return
        reaped = reap_once(stale_lock_age=age, backend=alias, using=database, rollups=rollups)
        for reaped_job in reaped:
            self.stdout.write(
                f"reaped job {reaped_job.id} attempt {reaped_job.attempt} -> {reaped_job.status}"
            )
        self.stdout.write(f"released stale running jobs count={len(reaped)}")
