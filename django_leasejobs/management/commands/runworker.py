"""``manage.py runworker``: run a worker (claims jobs, runs them, keeps their leases)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from django.core.checks import Tags
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.utils import autoreload

from ...logs import install_default_handler
from ...schema import DEFAULT_DATABASE_WAIT, DatabaseUnreachable, SchemaNotReady
from ...worker import Supervisor, Worker, WorkerConfig, wait_for_database
from ..argtypes import non_negative_int, non_negative_seconds, positive_int
from ..backends import get_leasejobs_backend


def queue_list(value: str) -> tuple[str, ...]:
    queues = tuple(q.strip() for q in value.split(",") if q.strip())
    if not queues:
        raise argparse.ArgumentTypeError("expected one or more queue names, comma separated")
    return queues


logger = logging.getLogger("django_leasejobs")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(value: str) -> int:
    name = value.strip().upper()
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}")
    return logging.getLevelNamesMapping()[name]


def worker_id(value: str) -> str:
    if not value.strip() or len(value) > 255:
        raise argparse.ArgumentTypeError("expected a non-empty id of at most 255 characters")
    return value


def metrics_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError("expected PORT or HOST:PORT, a port from 1 to 65535")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - scraped from elsewhere


def serve_metrics(address: tuple[str, int] | None) -> None:
    """Count this worker's signals and serve them on ``address`` (the [prometheus] extra)."""
    if address is None:
        return
    try:
        from ...metrics import WorkerMetrics
    except ImproperlyConfigured as exc:
        raise CommandError(f"--metrics-port: {exc}") from exc
    metrics = WorkerMetrics()
    try:
        metrics.serve(*address)
    except OSError as exc:
        where = f"{address[0]}:{address[1]}"
        raise CommandError(f"--metrics-port: cannot listen on {where}: {exc}") from exc
    metrics.connect()
    logger.info("metrics served on http://%s:%d/metrics", *address)


class Command(BaseCommand):
    help = "Run a worker: claim ready jobs, run them in isolated slots, keep their leases alive."
    # The checks a worker needs at start: models, and this app's own (tagged compatibility
    # and security). Not the URL, admin or template checks: those import the site's URLconf
    # and every view behind it, which a worker never serves (`manage.py check` runs them
    # all). Every worker pays its start-up, and a fleet starts many.
    requires_system_checks = [Tags.models, Tags.compatibility, Tags.security, Tags.signals]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default).")
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="Comma-separated queues to take jobs from (default: the backend's QUEUES).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=os.cpu_count() or 1,
            help="Jobs run at once (default: the CPU count).",
        )
        parser.add_argument(
            "--processes",
            type=positive_int,
            default=1,
            help="Run this many workers, forked from this process once Django has started "
            "(each a whole worker with its own id and slots; they share the start-up cost). "
            "A worker that ends is started again, unless --burst. Default: 1.",
        )
        parser.add_argument(
            "--pool",
            choices=("process", "thread"),
            default="process",
            help="process (default): each job in a killable child process; thread: for "
            "I/O-bound jobs, weaker isolation (a lost lease only flags the job).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=positive_int,
            default=None,
            help="async def jobs each process-pool slot runs at once on its event loop "
            "(default: the backend's ASYNC_CONCURRENCY, 100). The thread pool runs them "
            "one per slot.",
        )
        parser.add_argument(
            "--sync-on-loop",
            action="store_true",
            help="Process pool: run sync jobs on the slots' event loops too, each in a "
            "thread of its slot, up to --async-concurrency at once per slot: for many "
            "short I/O-bound jobs. Jobs then share their slot's process: a lost lease or a "
            "crash of one ends the others on it too (given back, no attempt counted).",
        )
        parser.add_argument(
            "--prefetch",
            type=non_negative_int,
            default=None,
            help="At most this many jobs claimed ahead of free slots while jobs are short "
            "(about 20 ms of work per slot; jobs of 20 ms or more are never prefetched), "
            "twice that during a drain (a round queued behind another claims ahead). "
            "Default: 64 per slot, at most 512; 0 turns prefetching off.",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit once no job is ready and none runs."
        )
        parser.add_argument(
            "--max-jobs", type=positive_int, default=None, help="Exit after this many jobs."
        )
        parser.add_argument(
            "--worker-id",
            type=worker_id,
            default=None,
            help="Unique id of this worker (default: host:pid:random).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=non_negative_seconds,
            default=30.0,
            help="On SIGTERM/SIGINT/SIGHUP, seconds to let running jobs finish before they are "
            "stopped and released (default: 30).",
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Do not enqueue the backend's SCHEDULES from this worker (by default every "
            "worker but a --burst one runs them; any number may, each tick runs once).",
        )
        parser.add_argument(
            "--log-level",
            type=log_level,
            default=logging.INFO,
            help="Level of the log lines on stderr: DEBUG, INFO (default), WARNING or ERROR. "
            "Only when the project's LOGGING gives the django_leasejobs logger (or an "
            "ancestor, root included) no handler: otherwise LOGGING decides.",
        )
        parser.add_argument(
            "--log-format",
            choices=("text", "json"),
            default="text",
            help="text (default), or json: one object per line with the stable extra keys. "
            "Same condition as --log-level.",
        )
        parser.add_argument(
            "--metrics-port",
            type=metrics_address,
            default=None,
            metavar="[HOST:]PORT",
            help="Serve this worker's Prometheus counters on this port (all interfaces unless "
            "HOST is given); needs the django-leasejobs[prometheus] extra. Off by default.",
        )
        parser.add_argument(
            "--wait-for-database",
            type=non_negative_seconds,
            default=DEFAULT_DATABASE_WAIT,
            metavar="SECONDS",
            help="At start, try this long to reach the database before exiting with status 2 "
            f"(default: {DEFAULT_DATABASE_WAIT:.0f}; 0: one try). A database without this "
            "app's migrations ends the command at once, whatever this says.",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Development: restart the worker when Python code changes (running jobs "
            "are stopped abruptly and re-run after their lease expires).",
        )

    def execute(self, *args: Any, **options: Any) -> str | None:
        self._options = options
        return super().execute(*args, **options)

    def check(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().check(*args, **kwargs)
        except DatabaseError:
            # Django 6's model checks ask a MySQL/MariaDB server for its version: the
            # database is down. Wait for it as the worker would, then check again.
            self._wait_for_database(self._options)
            super().check(*args, **kwargs)

    def _wait_for_database(self, options: dict[str, Any]) -> None:
        """A database nobody migrated ends the command at once (with --burst too), one
        that cannot be reached after --wait-for-database seconds of trying; exit code 2."""
        install_default_handler(options["log_level"], options["log_format"])
        backend = get_leasejobs_backend(options["backend"])
        try:
            wait_for_database(backend.config, backend.database, options["wait_for_database"])
        except (SchemaNotReady, DatabaseUnreachable) as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def handle(self, *args: Any, **options: Any) -> None:
        install_default_handler(options["log_level"], options["log_format"])
        backend = get_leasejobs_backend(options["backend"])
        if options["queues"] and backend.queues:
            unknown = sorted(set(options["queues"]) - set(backend.queues))
            if unknown:
                raise CommandError(
                    f"--queues names queues not in TASKS[{backend.alias!r}]['QUEUES']: "
                    f"{', '.join(unknown)}"
                )
        if options["sync_on_loop"] and options["pool"] != "process":
            raise CommandError(
                "--sync-on-loop runs sync jobs on the process pool's event loops: leave it "
                "out with --pool thread (whose threads run sync jobs at once already)"
            )
        config = WorkerConfig(
            backend=options["backend"],
            queues=options["queues"],
            concurrency=options["concurrency"],
            pool=options["pool"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            worker_id=options["worker_id"],
            shutdown_timeout=options["shutdown_timeout"],
            prefetch=options["prefetch"],
            async_concurrency=options["async_concurrency"],
            sync_on_loop=options["sync_on_loop"],
            scheduler=False if options["no_scheduler"] else None,
        )
        processes = options["processes"]
        if processes > 1:
            for option in ("reload", "metrics_port"):
                if options[option]:
                    flag = "--" + option.replace("_", "-")
                    raise CommandError(
                        f"{flag} works with one worker per runworker: leave out --processes "
                        f"or {flag} (for metrics of several workers, start one runworker "
                        "per --metrics-port)"
                    )
        if processes == 1 and not options["reload"]:
            # A port that cannot be served is a mistake in the command line: say so before
            # the database is touched (waited for, checked).
            serve_metrics(options["metrics_port"])
        # Once, here, before any slot is forked, thread started or worker forked.
        self._wait_for_database(options)
        if processes > 1:
            code = Supervisor(config, processes).run()
            if code:
                raise CommandError(f"a worker exited with status {code}", returncode=code)
            return
        if options["reload"]:

            def run_reloaded() -> None:
                # The autoreloader runs this in a thread and watches files in the main
                # thread; when the worker ends (--burst, --max-jobs), end the process too.
                serve_metrics(options["metrics_port"])
                code = Worker(config).run()
                logging.shutdown()
                os._exit(code)

            autoreload.run_with_reloader(run_reloaded)
            return
        code = Worker(config).run()
        if code:
            raise CommandError(f"worker exited with status {code}", returncode=code)
