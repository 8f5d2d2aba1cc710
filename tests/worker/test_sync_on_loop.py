"""``runworker --sync-on-loop`` (issue 32, point 4): sync jobs ride a process-pool slot's
event loop, many at once, each in a thread of the slot, with real ``runworker``
subprocesses.

They keep every rule of a job on the loop: a stop (a cancel, a timeout, a shutdown)
reaches the job as ``context.lease_lost`` and is waited out, and a job that outlives
``LOCK_LOST_GRACE`` after it gets its slot killed, its neighbours released as collateral.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests import tasks_sync_loop
from tests.waiting import wait_until
from tests.worker.test_async_jobs import (
    BURST_BOUND,
    JSON_ENV,
    JSON_LOGS,
    LOST_LEASE_OPTIONS,
    PAUSE_OPTIONS,
    assert_failed_alone,
    assert_pauses_kill_nothing,
    assert_ran_again,
    attempts,
    lines,
    statuses,
    wait_for_reaped,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ON_LOOP = ["--sync-on-loop", "--concurrency", "1"]


def test_twenty_sync_jobs_run_at_once_in_one_slot(workers, marker_dir: str) -> None:
    ids = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 2.0).id) for _ in range(20)]
    worker = workers.start(args=[*ON_LOOP, "--async-concurrency", "20", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert statuses(ids) == {JobStatus.SUCCEEDED: 20}
    starts = lines(marker_dir, "doze.starts")
    assert sorted(int(job) for job, *_ in starts) == sorted(ids)  # each once
    assert {attempt for _, attempt, *_ in starts} == {"1"}
    assert len({pid for _, _, pid, _, _ in starts}) == 1  # one slot's child ran them all
    assert len({thread for _, _, _, thread, _ in starts}) == 20  # a thread each
    # All of them slept at once: each started before any ended.
    first_end = min(float(clock) for *_, clock in lines(marker_dir, "doze.ends"))
    assert max(float(clock) for *_, clock in starts) < first_end
    assert not JobAttempt.objects.filter(job_id__in=ids).exists()


def test_the_slot_runs_no_more_at_once_than_async_concurrency(workers, marker_dir: str) -> None:
    ids = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 0.5).id) for _ in range(12)]
    worker = workers.start(args=[*ON_LOOP, "--async-concurrency", "4", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert statuses(ids) == {JobStatus.SUCCEEDED: 12}
    starts = lines(marker_dir, "doze.starts")
    # Three waves of four, in the threads of the first: a thread is made only while every
    # one there is busy (none per job), and no more than --async-concurrency of them.
    assert len({thread for _, _, _, thread, _ in starts}) == 4
    events = [(float(clock), 1) for *_, clock in starts]
    events += [(float(clock), -1) for *_, clock in lines(marker_dir, "doze.ends")]
    running = most = 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):
        running += step
        most = max(most, running)
    assert most == 4


def test_a_cancelled_sync_job_is_told_and_its_neighbours_run_on(workers, marker_dir: str) -> None:
    from django_leasejobs.leases import cancel

    stopped = int(tasks_sync_loop.until_told.enqueue(marker_dir, "stopped").id)
    neighbours = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 3.0).id) for _ in range(5)]
    worker = workers.start(args=[*ON_LOOP, "--burst"])
    wait_until(lambda: len(lines(marker_dir, "stopped.starts")) == 1, 30, what="its start")
    cancel(stopped)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "stopped.told") == [[str(stopped), "1", "True"]]
    assert Job.objects.get(pk=stopped).status == JobStatus.CANCELLED
    [row] = attempts(stopped)
    assert row.outcome == AttemptOutcome.CANCELLED, row.error_message
    # Its neighbours in the same slot ran on, once, untouched.
    assert statuses(neighbours) == {JobStatus.SUCCEEDED: 5}
    assert len(lines(marker_dir, "doze.starts")) == 5


def test_a_timed_out_sync_job_is_told_and_fails_as_timed_out(workers, marker_dir: str) -> None:
    late = int(tasks_sync_loop.past_its_timeout.enqueue(marker_dir, "late").id)
    worker = workers.start(args=[*ON_LOOP, "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "late.told") == [[str(late), "1", "True"]]
    assert Job.objects.get(pk=late).status == JobStatus.FAILED
    [row] = attempts(late)
    assert row.outcome == AttemptOutcome.TIMEOUT, row.error_message


def test_a_sync_job_that_ignores_its_stop_gets_its_slot_killed(workers, marker_dir: str) -> None:
    from django_leasejobs.leases import cancel

    stubborn = int(tasks_sync_loop.ignores_its_stop.enqueue(marker_dir, "stubborn").id)
    neighbours = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 4.0).id) for _ in range(4)]
    worker = workers.start(
        options={"LOCK_LOST_GRACE": 1.0},
        args=[*ON_LOOP, "--burst", *JSON_LOGS],
        env=JSON_ENV,
    )
    wait_until(lambda: len(lines(marker_dir, "doze.starts")) == 4, 30, what="neighbours start")
    wait_until(lambda: lines(marker_dir, "stubborn.starts"), 30, what="its start")
    cancel(stubborn)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert Job.objects.get(pk=stubborn).status == JobStatus.CANCELLED
    [row] = attempts(stubborn)
    assert row.outcome == AttemptOutcome.CANCELLED
    # The neighbours died with the slot, were released without an attempt counted, and
    # ran again: SUCCEEDED at attempt 2 of max_attempts + 1.
    starts = lines(marker_dir, "doze.starts")
    assert_ran_again(worker, stubborn, neighbours, "did not end within 1s", starts)


def test_a_lease_lost_sync_job_is_told_with_sigkill(workers, marker_dir: str) -> None:
    """Under the default behaviour too, a sync job on the loop whose lease is lost is told
    (``context.lease_lost``) and given half a heartbeat to end: one that ends runs once,
    and its neighbours, whose leases are sound, run on once, untouched."""
    lost = int(tasks_sync_loop.loses_its_lease.enqueue(marker_dir, "lost").id)
    neighbours = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 2.0).id) for _ in range(3)]
    workers.start(options=LOST_LEASE_OPTIONS, args=ON_LOOP)
    wait_until(lambda: statuses(neighbours) == {JobStatus.SUCCEEDED: 3}, 40, what="neighbours")
    assert lines(marker_dir, "lost.told") == [[str(lost), "1", "True"]]
    assert all(attempts(job_id) == [] for job_id in neighbours)
    assert len(lines(marker_dir, "doze.starts")) == 3
    wait_for_reaped(lost)


def test_a_lease_lost_sync_job_that_runs_on_gets_its_slot_killed(workers, marker_dir: str) -> None:
    """One that does not end within half a heartbeat is killed with the whole child (a
    thread cannot be stopped alone): its neighbours run again without an attempt
    counted."""
    lost = int(tasks_sync_loop.loses_its_lease_and_ignores_its_stop.enqueue(marker_dir, "lost").id)
    neighbours = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 2.0).id) for _ in range(3)]
    worker = workers.start(args=[*ON_LOOP, *JSON_LOGS], env=JSON_ENV)
    wait_until(lambda: statuses(neighbours) == {JobStatus.SUCCEEDED: 3}, 40, what="neighbours")
    starts = lines(marker_dir, "doze.starts")
    why = "lost its lease and did not end within 0.15s of its CancelledError"
    assert_ran_again(worker, lost, neighbours, why, starts)
    wait_for_reaped(lost)


def test_shutdown_tells_sync_jobs_and_releases_them(workers, marker_dir: str) -> None:
    """A stop signal waits for running jobs up to --shutdown-timeout; then each is told
    (``context.lease_lost``) and, once it ends, released: pending again, its attempt row
    ``released``."""
    ids = [int(tasks_sync_loop.until_told.enqueue(marker_dir, "held").id) for _ in range(3)]
    worker = workers.start(args=[*ON_LOOP, "--shutdown-timeout", "1"])
    wait_until(lambda: len(lines(marker_dir, "held.starts")) == 3, 30, what="three starts")
    worker.terminate()
    assert worker.wait(timeout=60) == 0, worker.output
    assert sorted(int(job) for job, *_ in lines(marker_dir, "held.told")) == sorted(ids)
    assert statuses(ids) == {JobStatus.PENDING: 3}
    assert set(JobAttempt.objects.filter(job_id__in=ids).values_list("outcome", flat=True)) == {
        AttemptOutcome.RELEASED
    }


def test_hostile_sync_outcomes_on_the_loop_stay_with_their_job(workers, marker_dir: str) -> None:
    bad = {
        kind: int(tasks_sync_loop.returns.enqueue(kind).id)
        for kind in ("nul", "unstorable", "keyboard", "exit")
    }
    healthy = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 0.5).id) for _ in range(10)]
    worker = workers.start(args=["--sync-on-loop", "--concurrency", "2", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert_failed_alone(bad)
    assert statuses(healthy) == {JobStatus.SUCCEEDED: 10}
    assert len(lines(marker_dir, "doze.starts")) == 10


def test_sync_on_loop_is_refused_with_the_thread_pool() -> None:
    with pytest.raises(CommandError, match=r"--sync-on-loop .* --pool thread"):
        call_command("runworker", "--pool", "thread", "--sync-on-loop", "--burst")


def test_a_paused_slot_or_worker_kills_no_sync_job_on_the_loop(workers, marker_dir: str) -> None:
    """A busy machine is not a fault: the slot's child, then the worker, stopped (SIGSTOP)
    for longer than ASYNC_BLOCKING_LIMIT while the loop's threads hold sync jobs, and let
    go within the lease, kill nothing: every job succeeds once, with no attempt row."""
    ids = [int(tasks_sync_loop.doze.enqueue(marker_dir, "doze", 4.0).id) for _ in range(20)]
    worker = workers.start(
        options=PAUSE_OPTIONS, args=[*ON_LOOP, "--async-concurrency", "20", "--burst"]
    )
    assert_pauses_kill_nothing(worker, marker_dir, "doze", ids)
