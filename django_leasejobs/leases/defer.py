"""The lease holder's give-back of jobs whose task it does not know.

New code that declares a task can reach the producers (the web) before a worker: that
worker claims the new task's jobs and cannot run them. It gives each back instead of
failing it: ``pending`` again a little later, the attempt not used and no stall counted,
so that a worker running the new code takes it. ``unknown_task_since`` remembers when a
worker first met it; once it waited longer than the grace (``UNKNOWN_TASK_GRACE``), it
is dead-lettered with its error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.db import connections, transaction

from ..models import AttemptOutcome, Job
from .claim import give_back_unused
from .dialect import dialect, retry_deadlocks
from .enqueue import database_now
from .finish import dead_letter_many
from .rules import unknown_task_delay, unknown_task_stand_aside
from .values import ErrorInfo, Failure, WriteResult

Lease = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Deferred:
    """What :func:`defer_unknown` did. A lease in neither map was lost (or its row locked
    elsewhere and left for the next try: ``dead.skipped``)."""

    delays: dict[Lease, float]
    """Given back: claimable again after this many seconds."""
    stand_aside: dict[Lease, float]
    """Given back: seconds for which this worker should claim no job of the task
    (``rules.unknown_task_stand_aside``)."""
    waited: dict[Lease, float]
    """Seconds each job had waited for a worker that knows its task (both maps' jobs)."""
    dead: WriteResult
    """Dead-lettered: they waited past the grace."""


UNKNOWN_TASK_ERROR_CLASS = "django_leasejobs.exceptions.UnknownTask"


def unknown_task_error(why: str, grace: float) -> ErrorInfo:
    """The error a job is dead-lettered with after no worker knew its task for ``grace``."""
    return ErrorInfo(
        UNKNOWN_TASK_ERROR_CLASS,
        f"{why} No worker that knows the task claimed the job within UNKNOWN_TASK_GRACE "
        f"({grace:g}s): deploy the code that declares it to the workers, then retry the job.",
    )


def defer_unknown(
    worker_id: str,
    unknown: Mapping[Lease, str],
    *,
    grace: float,
    using: str = "default",
) -> Deferred:
    """Give back, or dead-letter past ``grace``, the claimed attempts in ``unknown`` (each
    with why its task could not be loaded). One fenced UPDATE per job given back, in id
    order inside one transaction (rare: a deploy's first minutes), then the dead letters
    in one fenced write."""
    wanted = sorted(unknown)
    if not wanted:
        return Deferred(delays={}, stand_aside={}, waited={}, dead=WriteResult({}))
    d = dialect(using)
    sql = give_back_unused(
        d,
        f"run_after = {d.now_plus}, unknown_task_since = COALESCE(j.unknown_task_since, {d.now}), ",
    )

    def give_back() -> tuple[dict[Lease, float], dict[Lease, float], list[Lease]]:
        given: dict[Lease, float] = {}
        waited: dict[Lease, float] = {}
        late: list[Lease] = []
        with transaction.atomic(using=using):
            now = database_now(using)
            since = dict(
                Job.objects.using(using)
                .filter(id__in=[job_id for job_id, _ in wanted], locked_by=worker_id)
                .values_list("id", "unknown_task_since")
            )
            with connections[using].cursor() as cursor:
                for lease in wanted:
                    if lease[0] not in since:
                        continue  # not ours any more: the fence would refuse it
                    first = since[lease[0]]
                    waited[lease] = 0.0 if first is None else (now - first).total_seconds()
                    if waited[lease] >= grace:
                        late.append(lease)
                        continue
                    delay = unknown_task_delay(waited[lease])
                    cursor.execute(sql, [d.offset(delay), lease[0], lease[1], worker_id])
                    if cursor.rowcount == 1:
                        given[lease] = delay
        return given, waited, late

    given, waited, late = retry_deadlocks(d.using, give_back)
    aside = {
        lease: unknown_task_stand_aside(delay, waited[lease], grace)
        for lease, delay in given.items()
    }
    decision = (
        f"not retried: no worker that knows its task claimed it within {grace:g}s "
        "(UNKNOWN_TASK_GRACE)"
    )
    dead = dead_letter_many(
        worker_id,
        [
            Failure(
                job_id,
                attempt,
                unknown_task_error(unknown[(job_id, attempt)], grace),
                None,
                AttemptOutcome.ERROR,
                decision=decision,
            )
            for job_id, attempt in late
        ],
        using=using,
    )
    return Deferred(delays=given, stand_aside=aside, waited=waited, dead=dead)


__all__ = ["Deferred", "defer_unknown"]
