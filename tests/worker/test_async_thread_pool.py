"""``async def`` jobs in the thread pool (``--pool thread``), with real ``runworker``
subprocesses: one per slot, and every stop (a cancel, a timeout, a lost lease, a
shutdown) delivers ``CancelledError`` into its coroutine, as in the process pool.
"""

from __future__ import annotations

import pytest

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests import tasks_async
from tests.waiting import wait_until
from tests.worker.test_async_jobs import BURST_BOUND, attempts, lines, statuses

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

THREADS = ["--pool", "thread", "--concurrency", "1"]


def test_a_cancelled_async_job_gets_cancelled_error(workers, marker_dir: str) -> None:
    from django_leasejobs.leases import cancel

    stopped = int(tasks_async.until_cancelled.enqueue(marker_dir, "stopped").id)
    after = int(tasks_async.nap.enqueue(marker_dir, "nap", 0.1).id)
    worker = workers.start(args=[*THREADS, "--burst"])
    wait_until(lambda: len(lines(marker_dir, "stopped.starts")) == 1, 30, what="its start")
    cancel(stopped)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "stopped.cancelled") == [[str(stopped), "1"]]
    assert Job.objects.get(pk=stopped).status == JobStatus.CANCELLED
    [row] = attempts(stopped)
    assert row.outcome == AttemptOutcome.CANCELLED
    # Its coroutine ended: the one slot ran the next job.
    assert Job.objects.get(pk=after).status == JobStatus.SUCCEEDED


def test_a_timed_out_async_job_gets_cancelled_error(workers, marker_dir: str) -> None:
    late = int(tasks_async.past_its_timeout.enqueue(marker_dir, "late").id)
    worker = workers.start(args=[*THREADS, "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "late.cancelled")[0] == [str(late), "1"]
    rows = attempts(late)
    assert rows[0].outcome == AttemptOutcome.TIMEOUT, [(r.outcome, r.error_message) for r in rows]
    assert "CancelledError" in rows[0].error_message


def test_a_lease_lost_async_job_gets_cancelled_error(workers, marker_dir: str) -> None:
    """Under the default LOCK_LOST_BEHAVIOR ("sigkill", which the thread pool cannot
    do) as under "sigterm": the coroutine is cancelled, its thread runs on, fenced."""
    lost = int(tasks_async.loses_its_lease.enqueue(marker_dir, "lost").id)
    workers.start(args=THREADS)
    wait_until(lambda: len(lines(marker_dir, "lost.cancelled")) == 1, 30, what="its cancel")
    assert lines(marker_dir, "lost.cancelled") == [[str(lost), "1"]]
    # The reaper takes the job back from the thief once its lease runs out.
    wait_until(
        lambda: attempts(lost) and attempts(lost)[0].outcome == AttemptOutcome.LEASE_EXPIRED,
        30,
        what=lambda: f"its lease-expired attempt row, got {attempts(lost)}",
    )


def test_shutdown_cancels_async_jobs_and_releases_them(workers, marker_dir: str) -> None:
    ids = [int(tasks_async.until_cancelled.enqueue(marker_dir, "held").id) for _ in range(2)]
    worker = workers.start(
        args=["--pool", "thread", "--concurrency", "2", "--shutdown-timeout", "1"]
    )
    wait_until(lambda: len(lines(marker_dir, "held.starts")) == 2, 30, what="two starts")
    worker.terminate()
    assert worker.wait(timeout=60) == 0, worker.output
    assert sorted(int(job) for job, _ in lines(marker_dir, "held.cancelled")) == sorted(ids)
    assert statuses(ids) == {JobStatus.PENDING: 2}
    assert set(JobAttempt.objects.filter(job_id__in=ids).values_list("outcome", flat=True)) == {
        AttemptOutcome.RELEASED
    }


def test_a_coroutine_that_ignores_its_cancel_keeps_its_slot(workers, marker_dir: str) -> None:
    """A thread cannot be killed: a coroutine that swallows its CancelledError runs on,
    fenced, and its slot takes no other job; at shutdown the worker waits
    LOCK_LOST_GRACE for it, then leaves without it."""
    from django_leasejobs.leases import cancel

    stubborn = int(tasks_async.ignores_cancel.enqueue(marker_dir, "stubborn").id)
    after = int(tasks_async.nap.enqueue(marker_dir, "nap", 0.1).id)
    worker = workers.start(args=THREADS)
    wait_until(lambda: lines(marker_dir, "stubborn.starts"), 30, what="its start")
    cancel(stubborn)
    wait_until(lambda: lines(marker_dir, "stubborn.cancelled"), 30, what="its CancelledError")
    wait_until(
        lambda: Job.objects.get(pk=stubborn).status == JobStatus.CANCELLED, 30, what="cancelled"
    )
    [row] = attempts(stubborn)
    assert row.outcome == AttemptOutcome.CANCELLED
    worker.terminate()
    assert worker.wait(timeout=60) == 0, worker.output
    assert lines(marker_dir, "stubborn.cancelled") == [[str(stubborn), "1"]]  # sent once
    assert lines(marker_dir, "nap.starts") == []  # its slot stayed busy
    assert Job.objects.get(pk=after).status == JobStatus.PENDING
