"""Freezing a worker (SIGSTOP) for the tests of what a frozen worker must not do.

A worker stopped in the middle of a write transaction keeps its locks for as long as it
is stopped: on SQLite the database's write lock (the test could not write), on
MySQL/MariaDB, whose portable path renews and reaps in transactions of several
statements, the job's row (the test's reap would skip it; seen once in CI). PostgreSQL's
worker statements run in autocommit and lock no job row outside of a statement, but the
same probe costs nothing there. :func:`freeze` thaws such a worker and tries again.
"""

from __future__ import annotations

import signal
import sqlite3
from typing import Any

import psutil
from django.db import DatabaseError, connection, transaction

from django_leasejobs.models import Job
from tests.waiting import wait_until
from tests.worker_harness import WorkerProcess


def job_row_lock_is_free(job_id: Any) -> bool:
    """True when no other connection holds the job's row lock (SQLite: the write lock)."""
    if connection.vendor == "sqlite":
        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.3, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()
    try:
        with transaction.atomic():
            list(Job.objects.select_for_update(nowait=True).filter(pk=job_id).values_list("pk"))
        return True
    except DatabaseError:
        return False


def _status(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def _lease_end(job_id: Any) -> Any:
    return Job.objects.filter(pk=job_id).values_list("locked_until", flat=True).first()


def freeze(worker: WorkerProcess, job_id: Any) -> None:
    """SIGSTOP the worker process itself (not its slots, which keep running), at a moment
    when it holds no lock on job ``job_id``'s row.

    After each thaw, wait until the worker renewed the job's lease: stopped again and
    again before it could renew, its lease would expire and its own reaper would take
    the job back (seen once in CI under load).
    """
    for _ in range(50):
        worker.signal(signal.SIGSTOP)
        wait_until(
            lambda: _status(worker.pid) == psutil.STATUS_STOPPED,
            5,
            interval=0.01,
            what="the worker to stop",
        )
        if job_row_lock_is_free(job_id):
            return
        worker.signal(signal.SIGCONT)  # frozen inside a write: let it finish, try again
        wait_until(
            lambda: _status(worker.pid) != psutil.STATUS_STOPPED,
            5,
            interval=0.01,
            what="the worker to resume",
        )
        before = _lease_end(job_id)
        wait_until(
            lambda before=before: (
                (after := _lease_end(job_id)) is not None and before is not None and after > before
            ),
            10,
            what=f"the worker to renew the lease of job {job_id} after the thaw",
        )
    raise AssertionError("could not stop the worker outside of a write on its job's row")
