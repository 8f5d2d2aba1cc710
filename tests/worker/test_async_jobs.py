"""``async def`` jobs run many at once on a process-pool slot's event loop, with the same
leases and stops as any job (issue 30), with real ``runworker`` subprocesses.

Every stop reaches the right coroutine: a cancel, a timeout and a lost lease each deliver
``CancelledError`` into it and leave an attempt row; a coroutine that ignores its
cancellation, or blocks the loop, gets its slot killed, its own attempt row, and its
neighbours run again without an attempt counted against them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from tests import tasks_async
from tests.tasks_worker import record
from tests.waiting import wait_until
from tests.worker_harness import WorkerProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BURST_BOUND = 120  # seconds: a wedged worker never exits; a healthy one takes a few
JSON_LOGS = ["--log-format", "json"]
JSON_ENV = {"DJANGO_SETTINGS_MODULE": "tests.settings_fresh"}
"""With ``JSON_LOGS``: settings without ``LOGGING``, so the worker's own handler writes the
records as JSON (tests/observability/test_worker_logging.py)."""
LOOP_FAULT_OPTIONS = {"ASYNC_BLOCKING_LIMIT": 1.0, "LEASE_DURATION": 10.0}
"""For the cases of a job that blocks its slot's event loop: they are about the loop, not
leases, so the leases are long enough that a loaded machine cannot make one run out first
(a lost lease kills the slot too: its neighbours, the blocker among them, would then run
again as collateral of that loss, and the blocker's attempt rows be two)."""


LOST_LEASE_OPTIONS = {"LEASE_DURATION": 8.0, "HEARTBEAT_INTERVAL": 2.0}
"""For the cases of a lost lease whose job ends on its stop: a 2 s heartbeat gives it 1 s
(``LOST_LEASE_WAIT_SHARE``), which a loaded machine's slot and worker take to deliver the
stop and read the job's end, where FAST_OPTIONS' 0.3 s heartbeat gives 0.15 s."""


def lines(marker_dir: str, name: str) -> list[list[str]]:
    path = Path(marker_dir) / name
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def statuses(ids: list[int]) -> Counter[str]:
    return Counter(Job.objects.filter(pk__in=ids).values_list("status", flat=True))


def attempts(job_id: int) -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt"))


def wait_for_reaped(job_id: int) -> None:
    """Wait for the reaper to take the job back from the thief its task handed its lease
    to, once that lease ran out: its first attempt row says ``lease_expired`` (the worker
    that lost the lease writes nothing for it)."""
    wait_until(
        lambda: attempts(job_id) and attempts(job_id)[0].outcome == AttemptOutcome.LEASE_EXPIRED,
        30,
        what=lambda: f"its lease-expired attempt row, got {attempts(job_id)}",
    )


def described(rows: list[JobAttempt]) -> list[tuple[int, str, str]]:
    """Attempt rows as a failed assertion shows them."""
    return [(row.attempt, row.outcome, row.error_message) for row in rows]


def json_lines(worker: WorkerProcess) -> list[dict[str, Any]]:
    """The worker's log records (``--log-format json``)."""
    return [json.loads(line) for line in worker.lines if line.startswith("{")]


def assert_collateral(worker: WorkerProcess, culprit: int, neighbours: list[int], why: str) -> None:
    """Each neighbour was released as collateral of ``culprit``: one attempt row saying
    ``why``, its attempt given back (``max_attempts`` 3 + 1), no stall counted, and one
    WARNING record naming the culprit (``reporter.collateral``'s extra keys, as the
    worker's ``--log-format json`` writes them)."""
    for job_id in neighbours:
        first = attempts(job_id)[0]
        assert first.outcome == AttemptOutcome.COLLATERAL, first.error_message
        assert f"job {culprit} (attempt 1) {why}" in first.error_message, first.error_message
    rows = Job.objects.filter(pk__in=neighbours)
    assert {(job.max_attempts, job.stall_count) for job in rows} == {(4, 0)}
    records = [line for line in json_lines(worker) if line.get("culprit_job_id") == culprit]
    assert sorted(entry["job_id"] for entry in records) == sorted(neighbours), worker.output
    for entry in records:
        assert (entry["level"], entry["attempt"]) == ("WARNING", 1), entry
        assert f"job {culprit} (attempt 1) {why}" in entry["reason"], entry
    # Its release, once written, says so too (not "at shutdown").

    def releases() -> list[str]:
        return [
            line["message"]
            for line in json_lines(worker)
            if line["message"].startswith("released job ") and line.get("job_id") in neighbours
        ]

    wait_until(lambda: len(releases()) == len(neighbours), 30, what=lambda: str(releases()))
    assert all(text.endswith("back to pending as collateral") for text in releases())


def assert_ran_again(
    worker: WorkerProcess, culprit: int, neighbours: list[int], why: str, starts: list[list[str]]
) -> None:
    """The neighbours of ``culprit`` died with its slot and ran again: each SUCCEEDED
    after one collateral attempt row (:func:`assert_collateral`), and started once at
    attempt 1 and once at attempt 2 (``starts``: the lines of their run file)."""
    assert statuses(neighbours) == {JobStatus.SUCCEEDED: len(neighbours)}
    assert all(len(attempts(job_id)) == 1 for job_id in neighbours)
    assert_collateral(worker, culprit, neighbours, why)
    count = len(neighbours)
    assert Counter(attempt for _, attempt, *_ in starts) == {"1": count, "2": count}


def assert_failed_alone(bad: dict[str, int]) -> None:
    """Each job of ``bad`` (``tasks_async.hostile_outcome``'s kinds) failed, once, with
    an ``error`` attempt row saying what it raised or returned."""
    for kind, job_id in bad.items():
        job = Job.objects.get(pk=job_id)
        assert job.status == JobStatus.FAILED, (kind, job.status, job.last_error)
        [row] = attempts(job_id)
        assert row.outcome == AttemptOutcome.ERROR, (kind, row.outcome)
    assert "KeyboardInterrupt" in Job.objects.get(pk=bad["keyboard"]).last_error
    assert "SystemExit" in Job.objects.get(pk=bad["exit"]).last_error


def test_a_hundred_async_jobs_run_at_once_in_one_slot(workers, marker_dir: str) -> None:
    ids = [int(tasks_async.nap.enqueue(marker_dir, "nap", 3.0).id) for _ in range(100)]
    worker = workers.start(args=["--concurrency", "1", "--async-concurrency", "100", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert statuses(ids) == {JobStatus.SUCCEEDED: 100}
    starts = lines(marker_dir, "nap.starts")
    assert sorted(int(job) for job, *_ in starts) == sorted(ids)  # each once
    assert {attempt for _, attempt, *_ in starts} == {"1"}
    assert len({pid for _, _, pid, _ in starts}) == 1  # one slot's child ran them all
    # All of them slept at once on the one slot's loop: each started before any ended.
    first_end = min(float(clock) for *_, clock in lines(marker_dir, "nap.ends"))
    assert max(float(clock) for *_, clock in starts) < first_end
    assert not JobAttempt.objects.filter(job_id__in=ids).exists()


def test_a_cancelled_async_job_gets_cancelled_error(workers, marker_dir: str) -> None:
    from django_leasejobs.leases import cancel

    stopped = int(tasks_async.until_cancelled.enqueue(marker_dir, "stopped").id)
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 3.0).id) for _ in range(5)]
    worker = workers.start(args=["--concurrency", "1", "--burst"])
    wait_until(lambda: len(lines(marker_dir, "stopped.starts")) == 1, 30, what="its start")
    cancel(stopped)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "stopped.cancelled") == [[str(stopped), "1"]]
    assert Job.objects.get(pk=stopped).status == JobStatus.CANCELLED
    [row] = attempts(stopped)
    assert row.outcome == AttemptOutcome.CANCELLED
    # Its neighbours on the same loop ran on, once, untouched.
    assert statuses(neighbours) == {JobStatus.SUCCEEDED: 5}
    assert len(lines(marker_dir, "nap.starts")) == 5


def test_a_timed_out_async_job_gets_cancelled_error(workers, marker_dir: str) -> None:
    late = int(tasks_async.past_its_timeout.enqueue(marker_dir, "late").id)
    worker = workers.start(args=["--concurrency", "1", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "late.cancelled")[0] == [str(late), "1"]
    rows = attempts(late)
    assert rows[0].outcome == AttemptOutcome.TIMEOUT, [(r.outcome, r.error_message) for r in rows]
    assert "CancelledError" in rows[0].error_message


def test_a_lease_lost_async_job_gets_cancelled_error_with_sigterm(workers, marker_dir: str) -> None:
    lost = int(tasks_async.loses_its_lease.enqueue(marker_dir, "lost").id)
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 2.0).id) for _ in range(3)]
    workers.start(
        options={"LOCK_LOST_BEHAVIOR": "sigterm", "LOCK_LOST_GRACE": 5.0},
        args=["--concurrency", "1"],
    )
    wait_until(lambda: len(lines(marker_dir, "lost.cancelled")) == 1, 30, what="its cancel")
    assert lines(marker_dir, "lost.cancelled") == [[str(lost), "1"]]
    wait_until(lambda: statuses(neighbours) == {JobStatus.SUCCEEDED: 3}, 30, what="neighbours")
    # The reaper takes the job back from the thief once its lease runs out.
    wait_for_reaped(lost)
    assert len(lines(marker_dir, "nap.starts")) == 3


def test_a_lease_lost_async_job_gets_cancelled_error_with_sigkill(workers, marker_dir: str) -> None:
    """Under the default behaviour too, a lost lease on an event loop stops its coroutine
    with CancelledError (``LOST_LEASE_WAIT_SHARE``): its neighbours, whose leases are
    sound, run on once, untouched, instead of dying with the slot and running again."""
    lost = int(tasks_async.loses_its_lease.enqueue(marker_dir, "lost").id)
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 2.0).id) for _ in range(3)]
    workers.start(options=LOST_LEASE_OPTIONS, args=["--concurrency", "1"])
    wait_until(lambda: statuses(neighbours) == {JobStatus.SUCCEEDED: 3}, 40, what="neighbours")
    assert lines(marker_dir, "lost.cancelled") == [[str(lost), "1"]]
    assert all(attempts(job_id) == [] for job_id in neighbours)
    assert len(lines(marker_dir, "nap.starts")) == 3
    # The reaper takes it back from the thief once its lease runs out (this worker writes
    # nothing for a lease it lost).
    wait_for_reaped(lost)


def test_a_lease_lost_async_job_that_ignores_its_cancel_gets_its_slot_killed(
    workers, marker_dir: str
) -> None:
    """One that swallows its CancelledError is killed with its slot once half a heartbeat
    passed: its neighbours run again without an attempt counted."""
    lost = int(tasks_async.loses_its_lease_and_ignores_cancel.enqueue(marker_dir, "lost").id)
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 2.0).id) for _ in range(3)]
    worker = workers.start(args=["--concurrency", "1", *JSON_LOGS], env=JSON_ENV)
    wait_until(lambda: statuses(neighbours) == {JobStatus.SUCCEEDED: 3}, 40, what="neighbours")
    # FAST_OPTIONS' 0.3 s heartbeat: 0.15 s to end.
    why = "lost its lease and did not end within 0.15s of its CancelledError"
    assert_ran_again(worker, lost, neighbours, why, lines(marker_dir, "nap.starts"))
    assert lines(marker_dir, "lost.cancelled") == [[str(lost), "1"]]
    wait_for_reaped(lost)


def test_a_coroutine_that_ignores_its_cancel_gets_its_slot_killed(workers, marker_dir: str) -> None:
    from django_leasejobs.leases import cancel

    stubborn = int(tasks_async.ignores_cancel.enqueue(marker_dir, "stubborn").id)
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 4.0).id) for _ in range(4)]
    worker = workers.start(
        options={"LOCK_LOST_GRACE": 1.0},
        args=["--concurrency", "1", "--burst", *JSON_LOGS],
        env=JSON_ENV,
    )
    wait_until(lambda: len(lines(marker_dir, "nap.starts")) == 4, 30, what="neighbours start")
    wait_until(lambda: lines(marker_dir, "stubborn.starts"), 30, what="its start")
    cancel(stubborn)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert lines(marker_dir, "stubborn.cancelled") == [[str(stubborn), "1"]]
    job = Job.objects.get(pk=stubborn)
    assert job.status == JobStatus.CANCELLED
    [row] = attempts(stubborn)
    assert row.outcome == AttemptOutcome.CANCELLED
    # The neighbours died with the slot, were released without an attempt counted, and
    # ran again: SUCCEEDED at attempt 2 of max_attempts + 1.
    starts = lines(marker_dir, "nap.starts")
    assert_ran_again(worker, stubborn, neighbours, "did not end within 1s", starts)


def test_a_coroutine_that_blocks_the_loop_gets_its_slot_killed(workers, marker_dir: str) -> None:
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 2.0).id) for _ in range(4)]
    blocker = int(tasks_async.blocks_the_loop.enqueue(marker_dir, "blocker", 60.0).id)
    worker = workers.start(
        options=LOOP_FAULT_OPTIONS,
        args=["--concurrency", "1", "--burst", *JSON_LOGS],
        env=JSON_ENV,
    )
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    job = Job.objects.get(pk=blocker)
    assert job.status == JobStatus.FAILED, job.last_error
    rows = attempts(blocker)
    assert len(rows) == 1, (described(rows), worker.output)
    [row] = rows
    assert row.outcome == AttemptOutcome.KILLED
    assert "blocked the slot's event loop" in row.error_message, row.error_message
    assert statuses(neighbours) == {JobStatus.SUCCEEDED: 4}
    assert all(len(attempts(job_id)) == 1 for job_id in neighbours)
    assert_collateral(worker, blocker, neighbours, "blocked the slot's event loop")


def test_a_coroutine_that_spins_on_the_loop_gets_its_slot_killed(workers, marker_dir: str) -> None:
    """A pure-Python CPU loop, not a sleep: the monitor names it, its neighbours run again."""
    neighbours = [int(tasks_async.nap.enqueue(marker_dir, "nap", 2.0).id) for _ in range(3)]
    spinner = int(tasks_async.spins_the_loop.enqueue(marker_dir, "spinner", 60.0).id)
    worker = workers.start(
        options=LOOP_FAULT_OPTIONS,
        args=["--concurrency", "1", "--burst", *JSON_LOGS],
        env=JSON_ENV,
    )
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    rows = attempts(spinner)
    assert len(rows) == 1, (described(rows), worker.output)
    [row] = rows
    assert row.outcome == AttemptOutcome.KILLED
    assert "blocked the slot's event loop" in row.error_message, row.error_message
    assert statuses(neighbours) == {JobStatus.SUCCEEDED: 3}
    assert_collateral(worker, spinner, neighbours, "blocked the slot's event loop")


def test_the_blame_follows_the_step_that_holds_the_loop(workers, marker_dir: str) -> None:
    """The monitor blames the job whose step holds the loop at its latest look, not at its
    first: one job blocks the loop briefly (as a missed tick looks on a busy machine),
    and in the same turn of the loop, with no tick between, another job's step holds it
    for good. The spinner is the culprit and runs once (a CI run saw it released as
    collateral of the neighbour first blamed, and run twice)."""
    hold = tasks_async.holds_the_loop_in_turn
    brief = int(hold.enqueue(marker_dir, "turn", "g", "brief", 0.3).id)
    spinner = int(hold.enqueue(marker_dir, "turn", "g", "spin", 60.0).id)
    worker = workers.start(options=LOOP_FAULT_OPTIONS, args=["--concurrency", "1", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    rows = attempts(spinner)
    assert [row.outcome for row in rows] == [AttemptOutcome.KILLED], described(rows)
    assert f"job {spinner} (attempt 1) blocked the slot's event loop" in rows[0].error_message
    assert Job.objects.get(pk=brief).status == JobStatus.SUCCEEDED, described(attempts(brief))


def test_a_native_call_holding_the_gil_gets_its_slot_killed(workers, marker_dir: str) -> None:
    """One C call that never lets go of the GIL starves the slot's monitor thread; the
    worker sees the loop's thread busy without a tick, and kills the slot within about
    ASYNC_BLOCKING_LIMIT (the call would take far longer)."""
    holder = int(tasks_async.holds_the_gil.enqueue(marker_dir, "holder", 2 * 10**9).id)
    worker = workers.start(options=LOOP_FAULT_OPTIONS, args=["--concurrency", "1", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    job = Job.objects.get(pk=holder)
    assert job.status == JobStatus.FAILED, job.last_error
    [row] = attempts(holder)
    assert row.outcome == AttemptOutcome.KILLED, row.error_message
    assert f"job {holder} (attempt 1) blocked the slot's event loop" in row.error_message
    assert (row.finished_at - row.started_at).total_seconds() < 5.0, row.error_message


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_hostile_async_outcomes_stay_with_their_job(workers, marker_dir: str, pool: str) -> None:
    bad = {
        kind: int(tasks_async.returns.enqueue(kind).id)
        for kind in ("nul", "unstorable", "keyboard", "exit")
    }
    healthy = [int(tasks_async.nap.enqueue(marker_dir, "nap", 0.5).id) for _ in range(10)]
    worker = workers.start(args=["--pool", pool, "--concurrency", "2", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert_failed_alone(bad)
    assert statuses(healthy) == {JobStatus.SUCCEEDED: 10}
    assert len(lines(marker_dir, "nap.starts")) == 10


def test_shutdown_cancels_async_jobs_and_releases_them(workers, marker_dir: str) -> None:
    """A stop signal waits for running jobs up to --shutdown-timeout; then each async job
    gets CancelledError and is released (pending again, its attempt row ``released``)."""
    ids = [int(tasks_async.until_cancelled.enqueue(marker_dir, "held").id) for _ in range(3)]
    worker = workers.start(args=["--concurrency", "1", "--shutdown-timeout", "1"])
    wait_until(lambda: len(lines(marker_dir, "held.starts")) == 3, 30, what="three starts")
    worker.terminate()
    assert worker.wait(timeout=60) == 0, worker.output
    assert sorted(int(job) for job, _ in lines(marker_dir, "held.cancelled")) == sorted(ids)
    assert statuses(ids) == {JobStatus.PENDING: 3}
    assert set(JobAttempt.objects.filter(job_id__in=ids).values_list("outcome", flat=True)) == {
        AttemptOutcome.RELEASED
    }


def test_async_and_ordinary_jobs_mixed_each_run_once(workers, marker_dir: str) -> None:
    """Interleaved kinds: async ones share the slots' loops, ordinary ones take a slot
    each (a slot never holds both); every job succeeds once, at attempt 1."""
    ids: list[int] = []
    for index in range(60):
        if index % 3:
            ids.append(int(tasks_async.nap.enqueue(marker_dir, "nap", 0.2).id))
        else:
            ids.append(int(record.enqueue(marker_dir, "plain").id))
    worker = workers.start(args=["--concurrency", "2", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert statuses(ids) == {JobStatus.SUCCEEDED: 60}
    assert set(Job.objects.filter(pk__in=ids).values_list("attempt", flat=True)) == {1}
    assert len(lines(marker_dir, "nap.starts")) == 40
    assert len(lines(marker_dir, "plain.runs")) == 20


PAUSE_OPTIONS = {"ASYNC_BLOCKING_LIMIT": 0.3, "LEASE_DURATION": 6.0, "HEARTBEAT_INTERVAL": 0.3}
"""For the pause cases: a loop counts as blocked after 0.3 s, and a 1 s pause stays well
within the lease."""


def assert_pauses_kill_nothing(
    worker: WorkerProcess, marker_dir: str, name: str, ids: list[int]
) -> None:
    """Once every job of ``ids`` started (``<name>.starts``), stop the slot's child, then
    the worker (SIGSTOP) for 1 s each, longer than ``ASYNC_BLOCKING_LIMIT`` and within
    the lease: the burst worker ends with every job succeeded once, and no attempt row."""
    wait_until(lambda: len(lines(marker_dir, f"{name}.starts")) == len(ids), 30, what="every start")
    [slot] = worker.slot_pids()
    for pid in (slot, worker.pid):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)  # the pause under test (no state to wait for: both are stopped)
        os.kill(pid, signal.SIGCONT)
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert statuses(ids) == {JobStatus.SUCCEEDED: len(ids)}
    assert not JobAttempt.objects.filter(job_id__in=ids).exists()
    assert len(lines(marker_dir, f"{name}.starts")) == len(ids)


def test_a_paused_slot_or_worker_is_not_a_blocked_loop(workers, marker_dir: str) -> None:
    """A busy machine is not a fault: the slot's child, then the worker itself, stopped
    (SIGSTOP) for longer than ASYNC_BLOCKING_LIMIT while its loop holds jobs, and let go
    within the lease, kill nothing: every job succeeds once, no attempt row."""
    ids = [int(tasks_async.nap.enqueue(marker_dir, "nap", 4.0).id) for _ in range(20)]
    worker = workers.start(options=PAUSE_OPTIONS, args=["--concurrency", "1", "--burst"])
    assert_pauses_kill_nothing(worker, marker_dir, "nap", ids)
