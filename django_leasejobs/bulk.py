"""Act on every job matching a filter: retry, cancel, requeue dead letters, change the
queue or the priority, delete finished jobs.

The admin's bulk actions (``admin/bulk.py``), ``manage.py leasejobs_jobs`` and this
Python API share it::

    from django_leasejobs import bulk

    jobs = bulk.JobFilter(queue="mail", state="dead", search="kwargs.customer_id:4711").jobs()
    bulk.count(bulk.Action.RETRY, jobs)        # how many a retry would take now
    bulk.retry(jobs).count                     # how many it took

Each action walks the matching jobs by primary key in batches (``batch_size`` rows,
keyset: the batch's last id is read, never a list of all of them) and writes each batch
with the single job's transition in ONE set-based statement, in its own short
transaction (``leases/batch_ops.py``), so the rows a batch skips (changed since they
matched) are never overwritten. Which statuses an action takes is :func:`takes`, built
from the single action's rule. Deleting finished jobs is pruning's one rule and its
batches (``pruning.delete_finished``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from django.db.models import Max, Q, QuerySet

from . import pruning
from .conf import MAX_QUEUE_NAME
from .job_search import apply_search, parse_search
from .leases.batch_ops import (
    IdRange,
    cancel_range,
    retry_range,
    set_priority_range,
    set_queue_range,
)
from .leases.operator import NOT_STARTED, RETRIABLE, running_to_flag
from .models import MAX_PRIORITY, MIN_PRIORITY, Job, JobStatus

logger = logging.getLogger("django_leasejobs")

DEFAULT_BATCH_SIZE = 2000
"""Rows per batch (one statement, one transaction each)."""


class Action(StrEnum):
    """A bulk action, by the name ``leasejobs_jobs`` takes."""

    RETRY = "retry"
    REQUEUE_DEAD = "requeue-dead"
    CANCEL = "cancel"
    SET_QUEUE = "set-queue"
    SET_PRIORITY = "set-priority"
    DELETE_FINISHED = "delete-finished"

    @property
    def done(self) -> str:
        """What the action did, after a count: ``12 jobs retried``."""
        return _DONE[self]


_DONE = {
    Action.RETRY: "retried",
    Action.REQUEUE_DEAD: "requeued",
    Action.CANCEL: "cancelled",
    Action.SET_QUEUE: "moved",
    Action.SET_PRIORITY: "re-prioritised",
    Action.DELETE_FINISHED: "deleted",
}


def takes(action: Action) -> Q:
    """The jobs ``action`` acts on, by status: the single action's rule.

    Retry: failed or dead. Requeue: dead. Cancel: waiting and pending ones (cancelled at
    once) and running ones whose cancel is not requested yet (the request their workers
    see). Change queue or priority: jobs that have not started (waiting, or pending:
    ready or scheduled); a running job keeps the queue and priority it was claimed with.
    Delete: finished jobs (pruning's rule).
    """
    if action == Action.RETRY:
        return Q(status__in=RETRIABLE)
    if action == Action.REQUEUE_DEAD:
        return Q(status=JobStatus.DEAD)
    if action == Action.CANCEL:
        return Q(status__in=NOT_STARTED) | running_to_flag()
    if action in (Action.SET_QUEUE, Action.SET_PRIORITY):
        return Q(status__in=NOT_STARTED)
    return pruning.finished()


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs: every field given must match (None or ``""``: any).

    ``since`` and ``until`` bound ``enqueued_at`` (``since <= enqueued_at < until``; aware
    datetimes). ``search`` is the admin's search syntax (``job_search.py``:
    ``kwargs.customer_id:4711``, ``args.0:42``, a job id, free words); a malformed search
    raises ``SearchSyntaxError`` (a ``ValueError``) here, before any job is touched.
    """

    task: str | None = None
    queue: str | None = None
    state: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    search: str = ""
    backend: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in JobStatus.values:
            raise ValueError(
                f"no job state {self.state!r}: expected one of {', '.join(JobStatus.values)}"
            )
        for name, moment in (("since", self.since), ("until", self.until)):
            if moment is not None and moment.tzinfo is None:
                raise ValueError(f"{name} must be an aware datetime, got {moment!r}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"since ({self.since}) must be before until ({self.until})")
        parse_search(self.search)

    @property
    def is_empty(self) -> bool:
        """True when it matches every job (of its backend, if it names one)."""
        return not (
            self.task or self.queue or self.state or self.since or self.until or self.search
        )

    def jobs(self, using: str = "default") -> QuerySet[Job]:
        """The matching jobs of the database ``using``."""
        jobs = Job.objects.using(using).all()
        exact = {
            "backend": self.backend,
            "task_path": self.task,
            "queue": self.queue,
            "status": self.state,
            "enqueued_at__gte": self.since,
            "enqueued_at__lt": self.until,
        }
        jobs = jobs.filter(**{name: value for name, value in exact.items() if value is not None})
        return apply_search(jobs, parse_search(self.search)) if self.search else jobs

    def describe(self) -> str:
        """The filter in words, for people and audit entries."""
        parts = [
            f"{name} {value}"
            for name, value in (
                ("backend", self.backend),
                ("task", self.task),
                ("queue", self.queue),
                ("state", self.state),
                ("enqueued since", self.since.isoformat() if self.since else None),
                ("enqueued before", self.until.isoformat() if self.until else None),
            )
            if value
        ]
        if self.search:
            parts.append(f"search {self.search!r}")
        return ", ".join(parts) or "every job"


@dataclass(frozen=True, slots=True)
class BulkResult:
    action: Action
    count: int
    """Jobs acted on."""
    batches: int
    cancel_requested: int = 0
    """Of ``count``, for a cancel: running jobs whose cancel was requested (their workers
    stop them); the others were cancelled at once."""
    key_held: int = 0
    """For a retry or requeue: matching jobs left as they were because another active job
    holds their dedup key (as a single retry refuses them)."""

    def summary(self) -> str:
        """``12 jobs retried`` and what else there is to say."""
        text = f"{self.count} job{'' if self.count == 1 else 's'} {self.action.done}"
        if self.cancel_requested:
            text += (
                f" ({self.cancel_requested} of them running: cancel requested, their "
                "workers stop them)"
            )
        if self.key_held:
            text += f"; {self.key_held} left as they were: another active job holds their dedup key"
        return text


def count(action: Action, jobs: QuerySet[Job]) -> int:
    """How many of ``jobs`` ``action`` would act on now (one exact ``COUNT``)."""
    return jobs.filter(takes(action)).count()


def last_id(jobs: QuerySet[Job]) -> int | None:
    """The highest id among ``jobs`` (a confirmation's bound: ``jobs.filter(pk__lte=...)``
    leaves out the jobs enqueued after it counted)."""
    highest: int | None = jobs.aggregate(highest=Max("pk"))["highest"]
    return highest


def id_ranges(jobs: QuerySet[Job], batch_size: int) -> Iterator[IdRange]:
    """``jobs`` cut into id ranges of at most ``batch_size`` of them, lowest first (keyset:
    each range's last id is read when it is reached; the jobs of a range are counted when
    it is written, so rows that stop or start matching meanwhile are handled there)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = jobs.order_by("pk").values_list("pk", flat=True)
    first = list(ids[:1])
    if not first:
        return
    after = first[0] - 1
    while True:
        rest = ids.filter(pk__gt=after)
        nth = list(rest[batch_size - 1 : batch_size])
        if nth:
            yield IdRange(after, nth[0])
            after = nth[0]
            continue
        highest: int | None = rest.aggregate(highest=Max("pk"))["highest"]
        if highest is not None:
            yield IdRange(after, highest)
        return


def retry(jobs: QuerySet[Job], *, batch_size: int = DEFAULT_BATCH_SIZE) -> BulkResult:
    """Retry the failed and dead jobs among ``jobs`` (``operator.retry``'s rule)."""
    return _retry(Action.RETRY, jobs, batch_size)


def requeue_dead(jobs: QuerySet[Job], *, batch_size: int = DEFAULT_BATCH_SIZE) -> BulkResult:
    """Requeue the dead letters among ``jobs`` (a retry of ``dead`` jobs only)."""
    return _retry(Action.REQUEUE_DEAD, jobs, batch_size)


def _retry(action: Action, jobs: QuerySet[Job], batch_size: int) -> BulkResult:
    statuses = RETRIABLE if action == Action.RETRY else (JobStatus.DEAD,)
    retried = held = batches = 0
    for ids in id_ranges(jobs.filter(takes(action)), batch_size):
        written = retry_range(jobs, ids, statuses)
        retried += written.retried
        held += written.key_held
        batches += 1
    return _done(BulkResult(action, retried, batches, key_held=held), jobs)


def cancel(jobs: QuerySet[Job], *, batch_size: int = DEFAULT_BATCH_SIZE) -> BulkResult:
    """Cancel ``jobs`` as a single cancel does: waiting and pending ones at once, running
    ones by a request their workers see (``operator.cancel``'s rule)."""
    cancelled = requested = batches = 0
    for ids in id_ranges(jobs.filter(takes(Action.CANCEL)), batch_size):
        written = cancel_range(jobs, ids)
        cancelled += written.cancelled
        requested += written.requested
        batches += 1
    result = BulkResult(Action.CANCEL, cancelled + requested, batches, cancel_requested=requested)
    return _done(result, jobs)


def set_queue(
    jobs: QuerySet[Job], queue: str, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> BulkResult:
    """Move the jobs among ``jobs`` that have not started to ``queue``."""
    if not isinstance(queue, str) or not 0 < len(queue) <= MAX_QUEUE_NAME:
        raise ValueError(f"a queue name has 1 to {MAX_QUEUE_NAME} characters, got {queue!r}")
    moved = batches = 0
    for ids in id_ranges(jobs.filter(takes(Action.SET_QUEUE)), batch_size):
        moved += set_queue_range(jobs, ids, queue)
        batches += 1
    return _done(BulkResult(Action.SET_QUEUE, moved, batches), jobs)


def set_priority(
    jobs: QuerySet[Job], priority: int, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> BulkResult:
    """Give the jobs among ``jobs`` that have not started the priority ``priority``."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"a priority is a whole number, got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"a priority is from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority}")
    changed = batches = 0
    for ids in id_ranges(jobs.filter(takes(Action.SET_PRIORITY)), batch_size):
        changed += set_priority_range(jobs, ids, priority)
        batches += 1
    return _done(BulkResult(Action.SET_PRIORITY, changed, batches), jobs)


def delete_finished(jobs: QuerySet[Job], *, batch_size: int = DEFAULT_BATCH_SIZE) -> BulkResult:
    """Delete the finished jobs among ``jobs`` with their attempts (pruning's rule and
    batches: the rule is checked again on each batch's locked rows)."""
    deleted, batches = pruning.delete_finished(jobs, batch_size=batch_size)
    return _done(BulkResult(Action.DELETE_FINISHED, deleted, batches), jobs)


@dataclass(frozen=True, slots=True)
class Change:
    """What a queue or priority change sets (the other actions take nothing)."""

    queue: str | None = None
    priority: int | None = None


def act(
    action: Action,
    jobs: QuerySet[Job],
    change: Change | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> BulkResult:
    """Run ``action`` on ``jobs`` (``change``: the new queue or priority of a change)."""
    given = change or Change()
    if action == Action.SET_QUEUE:
        if given.queue is None:
            raise ValueError("set-queue needs the new queue")
        return set_queue(jobs, given.queue, batch_size=batch_size)
    if action == Action.SET_PRIORITY:
        if given.priority is None:
            raise ValueError("set-priority needs the new priority")
        return set_priority(jobs, given.priority, batch_size=batch_size)
    if action == Action.RETRY:
        return retry(jobs, batch_size=batch_size)
    if action == Action.REQUEUE_DEAD:
        return requeue_dead(jobs, batch_size=batch_size)
    if action == Action.CANCEL:
        return cancel(jobs, batch_size=batch_size)
    return delete_finished(jobs, batch_size=batch_size)


def _done(result: BulkResult, jobs: QuerySet[Job]) -> BulkResult:
    logger.info(
        "bulk %s: %s",
        result.action.value,
        result.summary(),
        extra={
            "bulk_action": result.action.value,
            "count": result.count,
            "batches": result.batches,
            "cancel_requested": result.cancel_requested,
            "key_held": result.key_held,
            "database": jobs.db,
        },
    )
    return result
