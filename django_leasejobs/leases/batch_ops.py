"""An operator's writes to the jobs of a selection within one id range: the batches of
``django_leasejobs.bulk`` (retry, cancel, change queue or priority of every job matching
a filter).

Each function is one transition, written in its own short transaction as ONE set-based
``UPDATE`` of the range (``id > after AND id <= upto``) whose ``WHERE`` also holds the
selection's filter and the statuses the transition takes, so a row that changed since it
was counted is skipped, never overwritten. What each writes, and to which statuses, is
the single job's rule (``operator.py``): a running job is never retried, moved or
re-prioritised, and its cancel is the request its worker sees. The rows of a range are
never read into Python, but for the few the rules need: the workflow steps a cancel
ends (their dependants are settled in the same transaction), the workflow steps a retry
runs again (their waiting dependants get back the count their end took, as for a single
retry) and the jobs with a dedup key a retry would make active.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet

from ..models import ACTIVE_STATUSES, Job
from .dependants import give_back, settle_and_notify, steps_of
from .dialect import ID_CHUNK, dialect, retry_deadlocks
from .enqueue import NOTIFY_CHANNEL, notify
from .operator import (
    NOT_STARTED,
    RETRIABLE,
    cancel_requested_columns,
    cancelled_columns,
    retried_columns,
    running_to_flag,
)

KEY_RACE_RETRIES = 3
"""Times a retry's batch is written again when a job that took one of its keys committed
between the batch's key check and its ``UPDATE`` (the unique index refused the batch)."""


@dataclass(frozen=True, slots=True)
class IdRange:
    """The jobs with ``after < id <= upto``: one batch."""

    after: int
    upto: int

    def of(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        return jobs.filter(pk__gt=self.after, pk__lte=self.upto)


@dataclass(frozen=True, slots=True)
class RetriedRange:
    retried: int
    key_held: int
    """Jobs left as they were: another active job holds their dedup key (or an earlier
    job of the same batch took it)."""


@dataclass(frozen=True, slots=True)
class CancelledRange:
    cancelled: int
    """Waiting and pending jobs: now ``cancelled``."""
    requested: int
    """Running jobs: their cancel is requested; their workers stop them."""


def retry_range(
    jobs: QuerySet[Job], ids: IdRange, statuses: Sequence[str] = RETRIABLE
) -> RetriedRange:
    """Retry the failed or dead jobs (or those of ``statuses``) of ``jobs`` in ``ids``, as
    ``operator.retry`` retries one; on PostgreSQL a ``NOTIFY`` of their queues on commit.

    A job whose dedup key another active job holds stays as it is, as a single retry
    refuses it (``KEY_TAKEN``), and so does every job of the batch after the first with
    the same key: the batch is never refused by the unique index of active keys.
    """
    allowed = [str(status) for status in statuses]
    if not set(allowed) <= set(RETRIABLE):
        raise ValueError(f"only failed or dead jobs can be retried, not {allowed}")
    d = dialect(jobs.db)

    def write() -> RetriedRange:
        with transaction.atomic(using=d.using):
            batch = ids.of(jobs).filter(status__in=allowed)
            blocked = _keys_taken(batch)
            if blocked:
                batch = batch.exclude(pk__in=blocked)
            steps = batch.filter(workflow_id__isnull=False).order_by("pk")
            if d.row_locks:  # in id order, before their counters and children
                steps = steps.select_for_update()
            step_ids = list(steps.values_list("pk", flat=True))
            retried = batch.update(**retried_columns())
            if step_ids:
                with connections[d.using].cursor() as cursor:
                    give_back(d, cursor, step_ids)
            if retried:
                notify(NOTIFY_CHANNEL, _pending_queues(jobs.db, ids), using=d.using)
            return RetriedRange(retried, len(blocked))

    for attempt in range(KEY_RACE_RETRIES):
        try:
            return retry_deadlocks(d.using, write)
        except IntegrityError:
            if attempt == KEY_RACE_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _keys_taken(batch: QuerySet[Job]) -> list[int]:
    """The jobs of ``batch`` with a dedup key that an active job holds, or that an earlier
    job of the batch (lower id) would take: their retry would break the key's uniqueness."""
    keyed = [
        (job_id, key)
        for job_id, key in batch.filter(key__isnull=False).order_by("pk").values_list("pk", "key")
        if key is not None
    ]
    if not keyed:
        return []
    keys = sorted({key for _, key in keyed})
    active = Job.objects.using(batch.db).filter(status__in=ACTIVE_STATUSES)
    taken: set[str] = set()
    for start in range(0, len(keys), ID_CHUNK):
        chunk = keys[start : start + ID_CHUNK]
        taken.update(
            key
            for key in active.filter(key__in=chunk).values_list("key", flat=True)
            if key is not None
        )
    blocked: list[int] = []
    for job_id, key in keyed:
        if key in taken:
            blocked.append(job_id)
        else:
            taken.add(key)
    return blocked


def _pending_queues(using: str, ids: IdRange) -> list[str]:
    pending = ids.of(Job.objects.using(using)).filter(status="pending")
    return sorted(set(pending.values_list("queue", flat=True).distinct()))


def cancel_range(jobs: QuerySet[Job], ids: IdRange) -> CancelledRange:
    """Cancel the jobs of ``jobs`` in ``ids`` as ``operator.cancel`` cancels one: waiting
    and pending ones at once (a workflow step's dependants settled in the same
    transaction), running ones by the request their workers see."""
    d = dialect(jobs.db)

    def write() -> CancelledRange:
        with transaction.atomic(using=d.using):
            batch = ids.of(jobs)
            not_started = batch.filter(status__in=NOT_STARTED)
            steps = not_started.filter(workflow_id__isnull=False).order_by("pk")
            if d.row_locks:  # in id order, as every settle locks them: no deadlock
                steps = steps.select_for_update()
            step_ids = list(steps.values_list("pk", flat=True))
            cancelled = not_started.update(**cancelled_columns())
            if step_ids:
                settle_and_notify(d, steps_of(d, step_ids, succeeded=False))
            requested = batch.filter(running_to_flag()).update(**cancel_requested_columns())
            return CancelledRange(cancelled, requested)

    return retry_deadlocks(d.using, write)


def set_queue_range(jobs: QuerySet[Job], ids: IdRange, queue: str) -> int:
    """Move the jobs of ``jobs`` in ``ids`` that have not started to ``queue`` (a running
    job stays where it runs); on PostgreSQL a ``NOTIFY`` of ``queue`` on commit."""
    d = dialect(jobs.db)

    def write() -> int:
        with transaction.atomic(using=d.using):
            moved = ids.of(jobs).filter(status__in=NOT_STARTED).update(queue=queue)
            if moved:
                notify(NOTIFY_CHANNEL, [queue], using=d.using)
            return moved

    return retry_deadlocks(d.using, write)


def set_priority_range(jobs: QuerySet[Job], ids: IdRange, priority: int) -> int:
    """Give the jobs of ``jobs`` in ``ids`` that have not started the priority
    ``priority`` (a running job keeps its own)."""
    d = dialect(jobs.db)

    def write() -> int:
        with transaction.atomic(using=d.using):
            return ids.of(jobs).filter(status__in=NOT_STARTED).update(priority=priority)

    return retry_deadlocks(d.using, write)
