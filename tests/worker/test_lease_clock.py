"""The worker's local lease clock counts from when a statement was sent, never later.

The database counts a lease from the statement that claimed or renewed it. The worker
cannot know when that statement ran, only that it ran after it was sent: so the local
clock that decides whether a job may still start (``JobSpec.start_by``) or must be
stopped (the watchdog) counts from the send. Counted from the return, a renewal or claim
that sat in a frozen or starved worker would credit time the database never gave, and a
job handed over after the freeze could start after another worker re-claimed it
(bench/chaos.py saw that once: a "stale start" after a SIGSTOP).

Each test records, in an execute wrapper, when the statement was handed to the driver,
and checks that the lease table's time is no later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_leasejobs import leases
from django_leasejobs.models import Job
from django_leasejobs.worker import Worker
from django_leasejobs.worker.heartbeat import Heartbeat
from django_leasejobs.worker.rounds import RoundContext, RoundPlan, run_round
from tests import tasks
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class FirstJobStatement:
    """When (monotonic) the first statement on the job table was handed to the driver."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if self.at is None and "leasejobs_job" in sql:
            self.at = time.monotonic()
        return execute(sql, params, many, context)


def test_a_renewal_counts_from_when_it_was_sent(worker: Worker) -> None:
    tasks.add.enqueue(1, 2)
    (claimed,) = leases.claim(worker.worker_id, limit=1, lease_duration=60)
    table = worker.book.table
    before = time.monotonic()
    table.add([claimed.lease], before, 60.0)
    statement = FirstJobStatement()
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    with connection.execute_wrapper(statement):
        heartbeat.tick()
    returned = time.monotonic()
    assert statement.at is not None
    renewed_at = table.renewed_at(claimed.lease)
    # Renewed (the clock moved), and credited no later than the statement was sent.
    assert before < renewed_at <= statement.at < returned


def test_claimed_leases_count_from_when_the_claim_was_sent(worker: Worker) -> None:
    tasks.add.enqueue(1, 2)
    ctx = RoundContext(
        worker_id=worker.worker_id,
        database="default",
        backend="default",
        queues=None,
        lease_duration=60.0,
    )
    statement = FirstJobStatement()
    with connection.execute_wrapper(statement):
        result = run_round(RoundPlan(claim_limit=1), ctx)
    assert result.error is None
    assert result.claimed is not None
    (claimed,) = result.claimed
    assert statement.at is not None
    assert 0 < result.claim_sent <= statement.at
    worker.pool.free_slots = lambda: 0  # type: ignore[method-assign]  # it waits for a slot
    assert result.claim_lease == 60.0
    worker.handover.take_claimed(result.claimed, result.claim_sent, result.claim_lease)
    table = worker.book.table
    assert table.renewed_at(claimed.lease) == result.claim_sent
    # Lost by the local clock one margin before the lease the claim asked for ends.
    lost_at = result.claim_sent + 60.0 - table.margin
    assert table.silence(claimed.lease, lost_at - 0.01) is None
    assert table.silence(claimed.lease, lost_at + 0.01) is not None


def test_a_claim_asks_for_a_heartbeat_more_than_a_renewal(worker: Worker) -> None:
    """A freshly claimed job is first renewed at the heartbeat's next beat after the loop
    took it, up to a beat later than a renewed job's next renewal: its claim asks for that
    beat more (``LeaseLength.claim_seconds``), so its first renewal has as long to come
    back as any other job's next one. Renewals ask for the lease alone."""
    job_id = int(tasks.add.enqueue(1, 2).id)
    options = worker.options
    rounds = worker.rounds
    rounds.open()
    try:
        rounds.start(RoundPlan(claim_limit=1), listening=False, burst=True)
        wait_until(rounds.done, what="the round")
        _, result, _ = rounds.take()
    finally:
        rounds.close()
    assert result.error is None
    assert result.claimed is not None
    assert [job.id for job in result.claimed] == [job_id]
    claimed = result.claim_lease
    assert claimed == options.lease_duration + options.heartbeat_interval
    assert round(_held_for(job_id), 1) == round(claimed, 1)  # what the row holds
    worker.pool.free_slots = lambda: 0  # type: ignore[method-assign]  # it waits for a slot
    worker.handover.take_claimed(result.claimed, result.claim_sent, claimed)
    heartbeat = Heartbeat(worker.thread_context(), threading.Event())
    heartbeat.tick()
    assert round(_held_for(job_id), 1) == round(options.lease_duration, 1)


def _held_for(job_id: int) -> float:
    """The lease the job's row holds: ``locked_until`` less its last claim or renewal."""
    row = Job.objects.values("locked_until", "heartbeat_at").get(pk=job_id)
    return (row["locked_until"] - row["heartbeat_at"]).total_seconds()
