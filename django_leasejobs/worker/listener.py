"""PostgreSQL ``LISTEN leasejobs``: wake an idle worker the moment a job is enqueued.

The backend sends ``pg_notify('leasejobs', <queue>)`` in the enqueueing transaction,
so the notification arrives on commit. Polling (``POLL_INTERVAL``) stays the
fallback; a lost listener connection is re-opened with backoff.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..backend import NOTIFY_CHANNEL
from .heartbeat import _WorkerThread

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("django_leasejobs")


def listen_connection_params(alias: str) -> dict[str, Any]:
    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    return params


class Listener(_WorkerThread):
    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        super().__init__(worker, stop, "listener")

    def loop(self) -> None:
        import psycopg

        failures = 0
        while not self.stop_event.is_set():
            try:
                with psycopg.connect(
                    **listen_connection_params(self.worker.database), autocommit=True
                ) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    failures = 0
                    self.worker.notify_jobs()  # jobs may have come while we were not listening
                    while not self.stop_event.is_set():
                        for notify in conn.notifies(timeout=0.5):
                            queues = self.worker.queues
                            if queues is None or notify.payload in queues:
                                self.worker.notify_jobs()
            except psycopg.Error as exc:
                failures += 1
                logger.warning(
                    "LISTEN connection failed (%s); polling meanwhile",
                    exc,
                    extra={"worker": self.worker.worker_id, "error": str(exc)},
                )
                self.stop_event.wait(min(10.0, 0.5 * 2**failures))
