"""What one database round adds to the rollup table, from its plan and its result.

Counted from what the database said, never from what the worker asked: an outcome counts
only when its write matched its row (``RoundResult.statuses``), a claim only for the rows
it claimed. Times are the database's: a claim's minute is its ``last_attempted_at``, an
outcome's its ``finished_at`` (for a retried attempt, which has none, the claim's time plus
the attempt's run time). The counters' meaning: docs/monitoring.md#trends.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from .. import leases
from ..leases import ClaimedJob, RollupKey, Tally, minute_of
from .rounds import RoundPlan, RoundResult


class _Keys:
    """The rows of one round's tally: the jobs of a round share few (queue, task, minute)
    triples, so each key is made once (an outcome's time is its own: the key is looked
    up by its minute)."""

    __slots__ = ("backend", "known")

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.known: dict[tuple[str, str, datetime], RollupKey] = {}

    def __call__(self, job: ClaimedJob, when: datetime) -> RollupKey:
        minute = minute_of(when)
        found = self.known.get((job.queue, job.task_path, minute))
        if found is None:
            found = RollupKey(self.backend, minute, job.queue, job.task_path)
            self.known[(job.queue, job.task_path, minute)] = found
        return found


def round_tally(plan: RoundPlan, result: RoundResult, backend: str) -> Tally:
    """The counts of one round: its written outcomes, its claims, and the claims it gave
    back unused (which take their counts back)."""
    tally = Tally()
    key_of = _Keys(backend)
    ended = [(r.job, o.duration, False) for r, o in plan.successes]
    ended += [(r.job, duration, f.snooze) for r, _, f, duration in plan.failures]
    for job, duration, snoozed in ended:
        status = result.statuses.get(job.lease)
        counter = None if status is None or snoozed else leases.ENDING_COUNTERS.get(status)
        if counter is None:
            continue
        finished = result.finished_at.get(job.lease)
        if finished is None and job.last_attempted_at is not None:
            finished = job.last_attempted_at + timedelta(seconds=duration)
        if finished is None:
            continue  # (a row without a claim time: written by hand)
        key = key_of(job, finished)
        tally.count(key, counter)
        tally.run(key, duration)
    if result.deferred is not None:
        deferred = {r.job.lease: r.job for r, _ in plan.deferrals}
        for lease, status in result.deferred.dead.written.items():
            when = result.deferred.dead.finished_at.get(lease)
            counter = leases.ENDING_COUNTERS.get(status)
            if lease in deferred and when is not None and counter is not None:
                tally.count(key_of(deferred[lease], when), counter)
        _claims(tally, key_of, (deferred[lease] for lease in result.deferred.delays), -1)
    if result.unclaimed:
        given_back = (r.job for r, _ in plan.unclaims if r.job.lease in result.unclaimed)
        _claims(tally, key_of, given_back, -1)
    if result.claimed:
        _claims(tally, key_of, result.claimed, 1)
    return tally


def _claims(tally: Tally, key_of: _Keys, jobs: Iterable[ClaimedJob], sign: int) -> None:
    """Claims (``sign`` 1), or claims given back unused (-1, the same counts taken back):
    ``started`` in the claim's minute; for a job's first attempt also ``enqueued`` in the
    minute it was enqueued, and its wait from enqueue to this claim."""
    for job in jobs:
        claimed = job.last_attempted_at
        if claimed is None:
            continue
        key = key_of(job, claimed)
        tally.count(key, "started", sign)
        if job.attempt == 1 and job.enqueued_at is not None:
            tally.count(key_of(job, job.enqueued_at), "enqueued", sign)
            tally.wait(key, (claimed - job.enqueued_at).total_seconds(), sign)
