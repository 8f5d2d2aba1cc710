"""A worker's life outside its jobs: its connections, its registry row, its signals.

The registry row (``leasejobs_worker``) is for people (the admin, ``leasejobs_status``):
liveness for recovery comes from job leases only, never from it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from django.db import DatabaseError, connections

from ..conf import Options
from ..functions import DatabaseNow
from ..models import Worker as WorkerRow
from ..models import WorkerState
from ..schema import wait_until_ready
from . import stacks

logger = logging.getLogger("django_leasejobs")

Handler = Callable[[int, FrameType | None], None]


def harden_connections(options: Options, database: str) -> None:
    """Make a dead network path fail fast instead of hanging a thread for minutes.

    On PostgreSQL over TCP, the worker's connections get TCP keepalives, a
    ``tcp_user_timeout`` of one lease and a connect timeout, unless the site's
    ``DATABASES[...]["OPTIONS"]`` sets them. (libpq ignores them on Unix sockets.)
    That is ``DATABASE`` and, when set, ``LISTEN_DATABASE`` (the listener's
    connection parameters are read from the alias's settings).
    """
    defaults = {
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": int(options.lease_duration * 1000),
    }
    aliases = [database]
    if options.listen_database is not None:
        aliases.append(options.listen_database)
    for alias in aliases:
        settings_dict = connections.settings[alias]
        if settings_dict.get("ENGINE", "").rsplit(".", 1)[-1] != "postgresql":
            continue
        options_dict = settings_dict.setdefault("OPTIONS", {})
        for key, value in defaults.items():
            options_dict.setdefault(key, value)


def wait_for_database(options: Options, database: str, wait: float) -> None:
    """Before any worker starts (once, before ``--processes`` forks): the database is
    reached within ``wait`` seconds and has this app's migrations and tables.

    Raises ``schema.DatabaseUnreachable`` (tried for ``wait`` seconds) or
    ``schema.SchemaNotReady`` (at once); each failed try is logged. The connection it used
    is closed: nothing crosses a fork. Once started, a worker rides out an outage instead.
    """
    harden_connections(options, database)

    def retrying(attempt: int, pause: float, error: DatabaseError) -> None:
        detail = " ".join(str(error).split()) or type(error).__name__
        logger.warning(
            "database %r cannot be reached at start (attempt %d), trying again in %.1f s "
            "(for up to %.0f s): %s",
            database,
            attempt,
            pause,
            wait,
            detail,
            extra={"database": database, "attempt": attempt, "error": detail},
        )

    wait_until_ready(database, wait, on_retry=retrying)


@dataclass(frozen=True, slots=True)
class Registration:
    """What a worker's registry row says about it."""

    worker_id: str
    backend: str
    database: str
    queues: tuple[str, ...] | None
    pool: str
    concurrency: int

    def register(self) -> None:
        """Create or refresh the row (state running); also after an operator deleted it."""
        _with_reconnect(
            self,
            "register",
            lambda: WorkerRow.objects.using(self.database).update_or_create(
                pk=self.worker_id,
                defaults={
                    "backend": self.backend,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "queues": list(self.queues or []),
                    "pool": self.pool,
                    "concurrency": self.concurrency,
                    "state": WorkerState.RUNNING,
                    "stopped_at": None,
                },
            ),
        )

    def deregister(self) -> None:
        _with_reconnect(
            self,
            "deregister",
            lambda: (
                WorkerRow.objects.using(self.database)
                .filter(pk=self.worker_id)
                .update(
                    state=WorkerState.STOPPED, stopped_at=DatabaseNow(), last_seen_at=DatabaseNow()
                )
            ),
        )

    def touch(self, state: str, problem: str) -> None:
        """The heartbeat's update of the row; puts it back if an operator deleted it."""
        seen = (
            WorkerRow.objects.using(self.database)
            .filter(pk=self.worker_id)
            .update(last_seen_at=DatabaseNow(), state=state, problem=problem)
        )
        if not seen:
            self.register()


def _with_reconnect(who: Registration, what: str, write: Callable[[], object]) -> None:
    """Run a registry write; after a dropped connection, reconnect and try once more."""
    for attempt in (1, 2):
        try:
            write()
            return
        except DatabaseError as exc:
            connections[who.database].close()
            if attempt == 2:
                logger.warning(
                    "could not %s the worker: %s",
                    what,
                    exc,
                    extra={"worker": who.worker_id, "error": str(exc)},
                )


def install_signal_handlers(stop: Handler) -> dict[int, object]:
    """Route SIGTERM, SIGINT and SIGHUP to ``stop`` and SIGUSR1 to the stack print
    (``kill -USR1 <worker pid>``: every thread's stack to standard error, a worker that
    hangs); what was there before, to put back. Only the main thread can: under
    ``--reload`` the worker runs in a thread of Django's autoreloader, which handles the
    signals itself (nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    # SIGHUP (the terminal closed) stops gracefully too, unless it was ignored when the
    # worker started (nohup): then it stays ignored.
    stops = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        stops.append(signal.SIGHUP)
    previous: dict[int, object] = {s: signal.signal(s, stop) for s in stops}
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, stacks.print_stacks)
    return previous


def restore_signals(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
