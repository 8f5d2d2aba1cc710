"""What one database round adds to the rollup table, from its plan and its result.

Counted from what the database said, never from what the worker asked: an outcome counts
only when its write matched its row (``RoundResult.statuses``), a claim only for the rows
it claimed. Times are the database's: a claim's minute is its ``last_attempted_at``, an
outcome's its ``finished_at`` (for a retried attempt, which has none, the claim's time plus
the attempt's run time). The counters' meaning: docs/monitoring.md#trends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from operator import attrgetter

from .. import leases
from ..leases import COUNTER_AT, ClaimedJob, RollupKey, Tally, minute_of, run_at, wait_at
from .rounds import RoundPlan, RoundResult

_ENDED_AT = {status: COUNTER_AT[name] for status, name in leases.ENDING_COUNTERS.items()}
"""Where an ended attempt is counted, by the job's new status."""
_STARTED_AT = COUNTER_AT["started"]
_ENQUEUED_AT = COUNTER_AT["enqueued"]


class _Rows:
    """The rows of one round's tally, by the (queue, task, moment) of a job: the jobs of
    a round share few queues and tasks and, on most databases, few moments (a statement's
    ``now()``), so the minute and the row of each are found once per round, not once per
    job (about 1 us each: ``datetime.replace`` and a key's hash)."""

    __slots__ = ("backend", "known", "tally")

    def __init__(self, tally: Tally, backend: str) -> None:
        self.tally = tally
        self.backend = backend
        self.known: dict[tuple[str, str, datetime], list[int]] = {}

    def __call__(self, job: ClaimedJob, when: datetime) -> list[int]:
        return self.find(job.queue, job.task_path, when)

    def find(self, queue: str, task_path: str, when: datetime) -> list[int]:
        found = self.known.get((queue, task_path, when))
        if found is None:
            key = RollupKey(self.backend, minute_of(when), queue, task_path)
            found = self.known[(queue, task_path, when)] = self.tally.row(key)
        return found


def round_tally(plan: RoundPlan, result: RoundResult, backend: str) -> Tally:
    """The counts of one round: its written outcomes, its claims, and the claims it gave
    back unused (which take their counts back)."""
    tally = Tally()
    row_of = _Rows(tally, backend)
    ended = [(r.job, o.duration, False) for r, o in plan.successes]
    ended += [(r.job, duration, f.snooze) for r, _, f, duration in plan.failures]
    statuses, finished_at = result.statuses, result.finished_at
    for job, duration, snoozed in ended:
        lease = (job.id, job.attempt)
        status = statuses.get(lease)
        at = None if status is None or snoozed else _ENDED_AT.get(status)
        if at is None:
            continue
        finished = finished_at.get(lease)
        if finished is None and job.last_attempted_at is not None:
            finished = job.last_attempted_at + timedelta(seconds=duration)
        if finished is None:
            continue  # (a row without a claim time: written by hand)
        row = row_of(job, finished)
        row[at] += 1
        row[run_at(duration)] += 1
    if result.deferred is not None:
        deferred = {r.job.lease: r.job for r, _ in plan.deferrals}
        for lease, status in result.deferred.dead.written.items():
            when = result.deferred.dead.finished_at.get(lease)
            at = _ENDED_AT.get(status)
            if lease in deferred and when is not None and at is not None:
                row_of(deferred[lease], when)[at] += 1
        _claims(row_of, (deferred[lease] for lease in result.deferred.delays), -1)
    if result.unclaimed:
        given_back = (r.job for r, _ in plan.unclaims if r.job.lease in result.unclaimed)
        _claims(row_of, given_back, -1)
    if result.claimed:
        _claims(row_of, result.claimed, 1)
    return tally


_CLAIM_KEY = attrgetter("queue", "task_path", "last_attempted_at", "enqueued_at", "attempt")
"""What a claim's counts depend on. The jobs of one claim share their claim time (one
statement's), and often their queue, task and enqueue time (a bulk enqueue's): counted
per distinct key (in C), the counts cost a few look-ups per round, not per job."""


def _claims(row_of: _Rows, jobs: Iterable[ClaimedJob], sign: int) -> None:
    """Claims (``sign`` 1), or claims given back unused (-1, the same counts taken back):
    ``started`` in the claim's minute; for a job's first attempt also ``enqueued`` in the
    minute it was enqueued, and its wait from enqueue to this claim."""
    for (queue, task_path, claimed, enqueued, attempt), n in Counter(map(_CLAIM_KEY, jobs)).items():
        if claimed is None:
            continue
        row = row_of.find(queue, task_path, claimed)
        row[_STARTED_AT] += sign * n
        if attempt == 1 and enqueued is not None:
            row_of.find(queue, task_path, enqueued)[_ENQUEUED_AT] += sign * n
            row[wait_at((claimed - enqueued).total_seconds())] += sign * n
