"""Recovering jobs whose lease expired: one set-based statement."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, transaction

from ..models import AttemptOutcome, Job
from .dependants import EndedStep, repair_waiting, settle_and_notify
from .dialect import Dialect, dialect, retry_deadlocks
from .enqueue import database_now
from .fenced import lock_update_read
from .finish import FINAL_STATUSES, insert_attempts
from .rollups import ENDING_COUNTERS, RollupKey, Tally, add_tally, minute_of
from .rules import REAP_ERROR_CLASS, REAP_ERROR_MESSAGE, reaped_is_final, reaped_status
from .values import ErrorInfo, Failure, ReapedJob, ReapPass

REAP_ERROR = ErrorInfo(REAP_ERROR_CLASS, REAP_ERROR_MESSAGE)

_RETURNING = (
    "id",
    "attempt",
    "last_worker",
    "status",
    "queue",
    "task_path",
    "stall_count",
    "backend",
    "workflow_id",
    "last_attempted_at",
)


def find_stale(
    *, stale_lock_age: float = 0.0, backend: str | None = None, using: str = "default"
) -> list[Job]:
    """Running jobs whose lease expired more than ``stale_lock_age`` seconds ago (read only)."""
    d = dialect(using)
    where, params = _stale_where(d, stale_lock_age, backend)
    sql = f"SELECT j.* FROM {d.jobs} AS j WHERE {where} ORDER BY j.id"  # noqa: S608 - identifiers quoted, values bound
    return list(Job.objects.using(using).raw(sql, params))


def _stale_where(d: Dialect, stale_lock_age: float, backend: str | None) -> tuple[str, list[Any]]:
    where = f"j.status = 'running' AND j.locked_until < {d.now_plus}"
    params: list[Any] = [d.offset(-stale_lock_age)]
    if backend is not None:
        where += " AND j.backend = %s"
        params.append(backend)
    return where, params


def reap(
    *,
    stale_lock_age: float = 0.0,
    backend: str | None = None,
    using: str = "default",
    rollups: bool = True,
) -> ReapPass:
    """Recover every running job whose lease expired ``stale_lock_age`` seconds ago or more.

    Set-based and safe to run concurrently (two reapers reap a job once): the
    UPDATE re-checks ``status='running'`` and the expiry on the row it changes,
    so a completion that raced the reaper is never overwritten. Each reaped job
    gets ``stall_count + 1`` and becomes ``dead`` when that reaches
    ``max_stalls``, else ``failed`` when its attempts are used up, else
    ``pending``; a job whose cancel was requested while it ran ends ``cancelled``
    (``rules.reaped_status``). Each reaped attempt gets a JobAttempt row with outcome
    ``lease_expired``.

    A job put back to ``pending`` keeps its ``run_after``, which has passed (it was
    claimed): it is runnable at once and keeps its place in the claim order
    (priority, then ``run_after``, then id), ahead of every job that became ready
    after it, instead of going to the back of a backlog.

    ``rollups``: count the reaped attempts in the rollup table (``failed``, ``dead``, or
    ``retried`` for a job put back), in the same transaction.

    After the reap it repairs waiting workflow steps (:func:`repair_waiting`). Returns the
    reaped jobs and, where a failed repair leaves the reap standing (every database but
    MySQL/MariaDB, where it raises), the repair's error, for the caller to log.
    """
    d = dialect(using)
    where, where_params = _stale_where(d, stale_lock_age, backend)
    # Lock in id order and skip rows another transaction holds (a racing completion,
    # renewal or reaper): no deadlocks, and each row is still reaped exactly once.
    stale = f"SELECT j.id FROM {d.jobs} AS j WHERE {where} ORDER BY j.id{d.skip_locked}"  # noqa: S608 - identifiers quoted, values bound
    # The stall is counted last: MySQL assigns in order, and the rules read stall_count.
    set_list = (
        f"status = {reaped_status()}, "
        f"finished_at = CASE WHEN {reaped_is_final()} THEN {d.now} ELSE NULL END, "
        "locked_by = NULL, locked_until = NULL, last_error = %s, "
        "stall_count = j.stall_count + 1, cancel_requested = FALSE"
    )
    set_params = [REAP_ERROR.last_error]
    columns = ", ".join(d.q(c) for c in _RETURNING)

    def reap_rows() -> list[ReapedJob]:
        with transaction.atomic(using=using):
            if d.batched:
                lock = f"WITH stale AS ({stale}) " if d.row_locks else ""
                only_locked = " AND j.id IN (SELECT id FROM stale)" if d.row_locks else ""
                with connections[using].cursor() as cursor:
                    cursor.execute(
                        f"{lock}UPDATE {d.jobs} AS j SET {set_list} "  # noqa: S608 - identifiers quoted, values bound
                        f"WHERE {where}{only_locked} RETURNING {columns}",
                        [*(where_params if d.row_locks else []), *set_params, *where_params],
                    )
                    rows = cursor.fetchall()
            else:
                update = (set_list, where, [*set_params, *where_params])
                rows = lock_update_read(d, (stale, where_params), update, _RETURNING)
            reaped = [_reaped(row) for row in rows]
            insert_attempts(
                d,
                [
                    (
                        Failure(
                            job.id, job.attempt, REAP_ERROR, None, AttemptOutcome.LEASE_EXPIRED
                        ),
                        job.worker,
                        row[-1],
                    )
                    for job, row in zip(reaped, rows, strict=True)
                ],
            )
            # A workflow step ended for good: its dependants, in this transaction.
            settle_and_notify(
                d,
                [
                    EndedStep(job.id, False, job.task_path, job.status)
                    for job, row in zip(reaped, rows, strict=True)
                    if row[_RETURNING.index("workflow_id")] is not None
                    and job.status in FINAL_STATUSES
                ],
            )
            if rollups and reaped:
                add_tally(_reap_tally(reaped, database_now(using)), using=using)
        return sorted(reaped, key=lambda job: job.id)

    if d.deadlock_victims:
        # InnoDB may pick either as a deadlock victim: each is a whole transaction of its
        # own, run again if so.
        reaped = retry_deadlocks(d.using, reap_rows)
        retry_deadlocks(d.using, lambda: repair_waiting(d, backend=backend))
        return ReapPass(reaped)
    # Elsewhere one transaction (an idle worker's pass is one commit); the repair in a
    # savepoint of it (repair_waiting's atomic), so that a repair that fails leaves the
    # reap standing.
    repair_error: DatabaseError | None = None
    with transaction.atomic(using=using):
        reaped = reap_rows()
        try:
            repair_waiting(d, backend=backend)
        except DatabaseError as exc:
            repair_error = exc
    return ReapPass(reaped, repair_error)


def _reap_tally(reaped: Sequence[ReapedJob], now: datetime) -> Tally:
    """What a reap pass adds to the rollup table, in the minute of the reap."""
    tally = Tally()
    for job in reaped:
        counter = ENDING_COUNTERS.get(job.status)
        if counter is not None:
            tally.count(RollupKey(job.backend, minute_of(now), job.queue, job.task_path), counter)
    return tally


def _reaped(row: Sequence[Any]) -> ReapedJob:
    values = dict(zip(_RETURNING, row, strict=True))
    return ReapedJob(
        id=int(values["id"]),
        attempt=int(values["attempt"]),
        worker=values["last_worker"],
        status=values["status"],
        queue=values["queue"],
        task_path=values["task_path"],
        stall_count=int(values["stall_count"]),
        backend=values["backend"],
    )
