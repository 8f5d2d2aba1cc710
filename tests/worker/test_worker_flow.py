"""The worker runtime end to end, with real ``runworker`` subprocesses.

Throughput without faults (every job exactly once), progress and checkpoints across
a killed worker, the job context, lease loss in the thread pool, the command-line
switches (queues, max jobs, burst, priority order), LISTEN/NOTIFY wake-ups, the
worker registry row and the start log line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from django_leasejobs import leases
from django_leasejobs.compat import task_backends
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus, WorkerState
from django_leasejobs.models import Worker as WorkerRow
from tests import tasks_worker, tasks_worker_flow
from tests.freezing import freeze
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker_harness import IDLE_MAIN_LOOP, WorkerProcess, Workers, pid_alive

pytestmark = pytest.mark.django_db(transaction=True)

# Generous deadlines: the machine is small and shared; a passing run is far quicker.
DRAIN_TIMEOUT = 90.0
EXIT_TIMEOUT = 30.0


# --------------------------------------------------------------------------- helpers


def id_counts(marker_dir: str, name: str) -> Counter[int]:
    """How many times each job id was recorded by ``record_id`` under ``name``."""
    return Counter(int(line.split()[0]) for line in read_lines(marker_dir, f"{name}.ids"))


def recorded_pids(marker_dir: str, name: str) -> set[int]:
    return {int(line.split()[2]) for line in read_lines(marker_dir, f"{name}.ids")}


def job(pk: int | str) -> Job:
    return Job.objects.get(pk=int(pk))


def stop_all(fleet: list[WorkerProcess]) -> None:
    for worker in fleet:
        worker.terminate()
    for worker in fleet:
        assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


def drain_with_two_workers(workers: Workers, marker_dir: str, count: int, pool: str) -> None:
    # No prefetch: each claim takes at most the free slots (4), so neither worker can
    # take the whole batch in a few claims while the other waits for its next poll (on
    # a loaded machine that happened, and then the test showed no contention at all).
    fleet = [
        workers.start(args=["--concurrency", "4", "--pool", pool, "--prefetch", "0"])
        for _ in range(2)
    ]
    calls = [(tasks_worker_flow.record_id, (marker_dir, "fleet"), {})] * count
    results = task_backends["default"].bulk_enqueue(calls)
    ids = {int(r.id) for r in results}
    assert len(ids) == count

    jobs = Job.objects.filter(task_path=tasks_worker_flow.record_id.module_path)
    wait_until(
        lambda: jobs.filter(status=JobStatus.SUCCEEDED).count() == count,
        timeout=DRAIN_TIMEOUT,
        interval=0.2,
        what=f"{count} jobs to succeed",
    )
    stop_all(fleet)

    counts = id_counts(marker_dir, "fleet")
    assert set(counts) == ids
    assert sorted(counts.values()) == [1] * count, "some job ran more than once"
    rows = list(jobs.values_list("pk", "status", "attempt", "result", "last_worker"))
    assert len(rows) == count
    assert {status for _, status, _, _, _ in rows} == {JobStatus.SUCCEEDED}
    assert {attempt for _, _, attempt, _, _ in rows} == {1}
    assert all(result == pk for pk, _, _, result, _ in rows)  # context.job_id is the row's id
    fleet_ids = set(
        WorkerRow.objects.filter(pid__in=[w.pid for w in fleet]).values_list("pk", flat=True)
    )
    assert len(fleet_ids) == 2
    assert {last for *_, last in rows} == fleet_ids, "both workers must have taken jobs"
    assert not JobAttempt.objects.filter(job_id__in=ids).exists()
    assert not jobs.exclude(locked_by=None).exists()

    pids = recorded_pids(marker_dir, "fleet")
    worker_pids = {w.pid for w in fleet}
    if pool == "thread":
        assert pids == worker_pids  # threads run inside the worker process
    else:
        assert pids.isdisjoint(worker_pids)  # slots are child processes


# --------------------------------------------------------------------------- throughput


def test_two_process_pool_workers_run_a_thousand_jobs_exactly_once(
    workers: Workers, marker_dir: str
) -> None:
    drain_with_two_workers(workers, marker_dir, 1000, "process")


def test_two_thread_pool_workers_run_every_job_exactly_once(
    workers: Workers, marker_dir: str
) -> None:
    # Enough jobs that one worker cannot drain them all before the other's first poll.
    drain_with_two_workers(workers, marker_dir, 1000, "thread")


# --------------------------------------------------------------------------- progress, checkpoint


def test_progress_is_visible_while_running_and_a_killed_job_resumes_from_its_checkpoint(
    workers: Workers, marker_dir: str
) -> None:
    first = workers.start(args=["--concurrency", "1"])
    result = tasks_worker.progress_and_checkpoint.enqueue(marker_dir, "pc", 4)
    job_id = int(result.id)
    markers = Path(marker_dir)

    def shows(progress: float, message: str, step: int) -> bool:
        row = job(job_id)
        return (
            row.status == JobStatus.RUNNING
            and row.progress == pytest.approx(progress)
            and row.progress_message == message
            and row.checkpoint == {"step": step}
        )

    # Step 1, then step 2: progress arrives with the heartbeat, the checkpoint at once.
    wait_until(lambda: shows(0.25, "step 1", 1), what="progress and checkpoint of step 1")
    assert read_lines(marker_dir, "pc.steps") == ["1 1"]
    (markers / "pc.go1").touch()
    wait_until(lambda: shows(0.5, "step 2", 2), what="progress and checkpoint of step 2")
    assert read_lines(marker_dir, "pc.steps") == ["1 1", "1 2"]
    [run] = read_lines(marker_dir, "pc.runs")
    attempt, slot_pid, _, start = run.split()
    assert (attempt, start) == ("1", "0")

    # Kill the worker mid-job, with its slot (as an OOM kill of the whole container would):
    # no cleanup runs, only the lease's expiry recovers the job. The slot dying on its own
    # with its worker is test_slots_die_with_a_sigkilled_worker's business.
    first.kill()
    with contextlib.suppress(ProcessLookupError):  # already gone if the lifeline took it
        os.killpg(int(slot_pid), signal.SIGKILL)
    assert first.wait(timeout=EXIT_TIMEOUT) == -signal.SIGKILL
    wait_until(lambda: not pid_alive(int(slot_pid)), timeout=10, what="the slot to die")
    assert job(job_id).status == JobStatus.RUNNING  # nothing released it

    # Another worker reaps the expired lease and runs attempt 2 from the checkpoint.
    second = workers.start(args=["--concurrency", "1"])
    wait_until(
        lambda: shows(0.75, "step 3", 3) and job(job_id).attempt == 2,
        timeout=30,
        what="the reaped job to resume at step 3 in attempt 2",
    )
    (markers / "pc.go3").touch()
    wait_until(lambda: shows(1.0, "step 4", 4), what="progress and checkpoint of step 4")
    (markers / "pc.go4").touch()
    wait_until(lambda: job(job_id).status == JobStatus.SUCCEEDED, what="the job to succeed")
    second.terminate()
    assert second.wait(timeout=EXIT_TIMEOUT) == 0, second.output

    runs = read_lines(marker_dir, "pc.runs")
    assert [(r.split()[0], r.split()[-1]) for r in runs] == [("1", "0"), ("2", "2")]
    assert read_lines(marker_dir, "pc.steps") == ["1 1", "1 2", "2 3", "2 4"]
    row = job(job_id)
    assert row.attempt == 2
    assert row.stall_count == 1
    assert row.result == {"resumed_from": 2, "attempt": 2}
    assert row.checkpoint == {"step": 4}
    assert row.progress == 1.0
    assert tasks_worker.progress_and_checkpoint.get_result(result.id).return_value == {
        "resumed_from": 2,
        "attempt": 2,
    }
    [lost] = JobAttempt.objects.filter(job_id=job_id)
    assert (lost.attempt, lost.outcome) == (1, AttemptOutcome.LEASE_EXPIRED)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_slots_die_with_a_sigkilled_worker(
    workers: Workers, marker_dir: str, concurrency: int
) -> None:
    worker = workers.start(args=["--concurrency", str(concurrency)])
    for _ in range(concurrency):
        tasks_worker.spawn_and_wait.enqueue(marker_dir, "orphan", 60)
    wait_until(
        lambda: len(read_lines(marker_dir, "orphan.pids")) == concurrency,
        what="every slot to run a job and start its grandchild",
    )
    pids = {int(pid) for line in read_lines(marker_dir, "orphan.pids") for pid in line.split()[1:]}
    workers.track(pids)
    assert len(pids) == 2 * concurrency

    worker.kill()
    # popen.wait, not worker.wait: surviving slots would keep the output pipe open.
    assert worker.popen.wait(timeout=EXIT_TIMEOUT) == -signal.SIGKILL
    wait_until(
        lambda: not any(pid_alive(pid) for pid in pids),
        timeout=4,
        what="the slots and their jobs' processes to die with their worker",
    )


# --------------------------------------------------------------------------- context


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_job_context_describes_the_attempt(workers: Workers, marker_dir: str, pool: str) -> None:
    result = tasks_worker_flow.context_snapshot.enqueue(marker_dir, "ctx")
    worker = workers.start(args=["--burst", "--concurrency", "1", "--pool", pool])
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output

    [line] = read_lines(marker_dir, "ctx.context")
    seen: dict[str, Any] = json.loads(line)
    row = job(result.id)
    assert seen["job_id"] == row.pk == int(result.id)
    assert seen["task_result_id"] == result.id
    assert seen["attempt"] == 1 == row.attempt
    assert seen["lease_lost"] is False
    assert seen["task_result_status"] == "RUNNING"
    assert seen["worker_id"] == row.last_worker
    assert seen["worker_ids"] == [row.last_worker]
    assert seen["checkpoint"] is None
    if pool == "thread":
        assert seen["pid"] == worker.pid
    else:
        assert seen["pid"] != worker.pid
    assert row.status == JobStatus.SUCCEEDED
    assert row.result == seen


# --------------------------------------------------------------------------- thread pool lease loss


def test_thread_pool_job_sees_lease_lost_and_its_late_writes_are_rejected(
    workers: Workers, marker_dir: str
) -> None:
    zombie = workers.start(
        options={"STALE_LOCK_INTERVAL": 0},  # only this test reaps
        args=["--pool", "thread", "--concurrency", "1", "--worker-id", "flow-zombie"],
    )
    result = tasks_worker_flow.watch_lease_lost.enqueue(marker_dir, "zl", 60)
    job_id = int(result.id)
    wait_until(lambda: read_lines(marker_dir, "zl.watch") == ["started 1"], what="the job to start")

    freeze(zombie, job_id)
    expired = Job.objects.filter(pk=job_id, status=JobStatus.RUNNING, locked_until__lt=Now())
    wait_until(expired.exists, timeout=15, what="the frozen worker's lease to expire")
    reaped = leases.reap(backend="default").jobs
    assert [(r.id, r.attempt, r.status) for r in reaped] == [(job_id, 1, JobStatus.PENDING)]
    [claimed] = leases.claim("flow-newer", limit=1, lease_duration=60, backend="default")
    assert claimed.lease == (job_id, 2)
    leases.save_checkpoint(job_id, 2, "flow-newer", {"by": "attempt 2"})
    assert read_lines(marker_dir, "zl.watch") == ["started 1"]  # frozen: saw nothing yet

    zombie.signal(signal.SIGCONT)
    wait_until(
        lambda: read_lines(marker_dir, "zl.watch")[-1:] == ["returning 1"],
        timeout=15,
        what="the old attempt to notice the lost lease and return",
    )
    watch = read_lines(marker_dir, "zl.watch")
    assert watch[0] == "started 1"
    assert watch[1].startswith("lost 1 ")
    assert watch[2:] == ["rejected checkpoint", "returning 1"]
    zombie.wait_for_event("lease_lost", job_id=job_id, attempt=1)

    # The slot frees up once the old thread returned: a job run after it proves the
    # main loop has collected (and voided) the old attempt's outcome.
    after = tasks_worker_flow.record_id.enqueue(marker_dir, "after")
    wait_until(
        lambda: job(after.id).status == JobStatus.SUCCEEDED,
        what="the zombie's next job to succeed",
    )
    assert job(after.id).last_worker == "flow-zombie"

    row = job(job_id)
    assert row.status == JobStatus.RUNNING  # the late completion did not land
    assert (row.attempt, row.locked_by) == (2, "flow-newer")
    assert row.checkpoint == {"by": "attempt 2"}
    assert row.result is None

    leases.complete(job_id, 2, "flow-newer", result="attempt 2 won")
    row = job(job_id)
    assert (row.status, row.result, row.attempt) == (JobStatus.SUCCEEDED, "attempt 2 won", 2)
    assert list(JobAttempt.objects.filter(job_id=job_id).values_list("attempt", "outcome")) == [
        (1, AttemptOutcome.LEASE_EXPIRED)
    ]
    zombie.terminate()
    assert zombie.wait(timeout=EXIT_TIMEOUT) == 0, zombie.output


# --------------------------------------------------------------------------- command-line switches


def test_queues_option_takes_only_the_named_queues(workers: Workers, marker_dir: str) -> None:
    high = [
        tasks_worker_flow.record_label.using(queue_name="high").enqueue(marker_dir, "q", f"h{i}")
        for i in range(3)
    ]
    default = [tasks_worker_flow.record_label.enqueue(marker_dir, "q", f"d{i}") for i in range(3)]
    worker = workers.start(args=["--queues", "high", "--burst", "--concurrency", "2"])
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output

    assert sorted(read_lines(marker_dir, "q.order")) == ["h0", "h1", "h2"]
    assert {job(r.id).status for r in high} == {JobStatus.SUCCEEDED}
    assert {(job(r.id).status, job(r.id).attempt) for r in default} == {(JobStatus.PENDING, 0)}
    assert WorkerRow.objects.get(pid=worker.pid).queues == ["high"]


def test_max_jobs_exits_after_that_many_jobs(workers: Workers, marker_dir: str) -> None:
    results = [tasks_worker_flow.record_label.enqueue(marker_dir, "mj", str(i)) for i in range(8)]
    worker = workers.start(args=["--max-jobs", "5", "--concurrency", "2"])
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output

    statuses = Counter(job(r.id).status for r in results)
    assert statuses == {JobStatus.SUCCEEDED: 5, JobStatus.PENDING: 3}
    assert len(read_lines(marker_dir, "mj.order")) == 5
    assert "stopped after 5 attempts" in worker.output
    assert WorkerRow.objects.get(pid=worker.pid).state == WorkerState.STOPPED


def test_burst_exits_once_nothing_is_ready(workers: Workers, marker_dir: str) -> None:
    ready = [tasks_worker_flow.record_label.enqueue(marker_dir, "b", str(i)) for i in range(3)]
    later = tasks_worker_flow.record_label.using(
        run_after=timezone.now() + timedelta(hours=1)
    ).enqueue(marker_dir, "b", "later")
    worker = workers.start(args=["--burst", "--concurrency", "2"])
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output

    assert {job(r.id).status for r in ready} == {JobStatus.SUCCEEDED}
    assert (job(later.id).status, job(later.id).attempt) == (JobStatus.PENDING, 0)
    assert sorted(read_lines(marker_dir, "b.order")) == ["0", "1", "2"]


def test_priority_order_is_respected_with_one_slot(workers: Workers, marker_dir: str) -> None:
    enqueued = [
        ("a0", 0),
        ("b5", 5),
        ("c-3", -3),
        ("d5", 5),
        ("e100", 100),
        ("f0", 0),
        ("g-100", -100),
        ("h5", 5),
    ]
    for label, priority in enqueued:
        tasks_worker_flow.record_label.using(priority=priority).enqueue(marker_dir, "prio", label)
    worker = workers.start(args=["--burst", "--concurrency", "1"])
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output

    expected = [label for label, _ in sorted(enqueued, key=lambda item: -item[1])]  # stable
    assert expected == ["e100", "b5", "d5", "h5", "a0", "f0", "c-3", "g-100"]
    assert read_lines(marker_dir, "prio.order") == expected


# --------------------------------------------------------------------------- LISTEN/NOTIFY


def idle_queries() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'idle'"
        )
        return [query for (query,) in cursor.fetchall()]


def test_notify_wakes_an_idle_worker_long_before_its_poll_interval(
    workers: Workers, marker_dir: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    worker = workers.start(options={"POLL_INTERVAL": 30}, args=["--concurrency", "1"])

    # Idle: the listener has run LISTEN and the main loop has run its first (empty) claim,
    # so the main loop now sleeps up to POLL_INTERVAL (30 s) unless woken.
    wait_until(
        lambda: (
            "LISTEN leasejobs" in (queries := idle_queries())
            and any(q.startswith(IDLE_MAIN_LOOP) for q in queries)
        ),
        timeout=15,
        what="the worker to listen and go idle",
    )
    result = tasks_worker_flow.record_id.enqueue(marker_dir, "notify")
    wait_until(
        lambda: job(result.id).status == JobStatus.SUCCEEDED,
        timeout=10,
        what="the job to run (woken by NOTIFY, not by the 30 s poll)",
    )
    row = job(result.id)
    assert row.started_at is not None
    assert row.started_at - row.enqueued_at < timedelta(seconds=2)  # database clock
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output


# --------------------------------------------------------------------------- registry, start line


def test_worker_registry_row_follows_the_worker(workers: Workers) -> None:
    worker = workers.start(args=["--concurrency", "2", "--worker-id", "flow-registry"])
    row = WorkerRow.objects.get(pk="flow-registry")
    assert row.host == socket.gethostname()
    assert row.pid == worker.pid
    assert row.queues == ["default", "high", "low"]  # every queue of the backend
    assert (row.pool, row.concurrency, row.backend) == ("process", 2, "default")
    assert row.state == WorkerState.RUNNING
    assert row.stopped_at is None
    first_seen = row.last_seen_at
    wait_until(
        lambda: WorkerRow.objects.get(pk="flow-registry").last_seen_at > first_seen,
        timeout=10,
        what="the heartbeat to advance last_seen_at",
    )

    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output
    row = WorkerRow.objects.get(pk="flow-registry")
    assert row.state == WorkerState.STOPPED
    assert row.stopped_at is not None
    assert row.last_seen_at > first_seen


def test_start_line_logs_the_worker_settings(workers: Workers) -> None:
    worker = workers.start(
        options={"LEASE_DURATION": 3, "HEARTBEAT_INTERVAL": 0.5, "STALE_LOCK_INTERVAL": 0.7},
        args=[
            "--queues",
            "high,low",
            "--pool",
            "thread",
            "--concurrency",
            "3",
            "--worker-id",
            "flow-start",
        ],
        env={"LEASEJOBS_LOCK_LOST_BEHAVIOR": "sigterm"},  # the environment wins
    )
    [line] = [line for line in worker.lines if "started: backend=" in line]
    assert " INFO django_leasejobs " in line
    assert line.endswith(
        "worker flow-start started: backend=default queues=high,low pool=thread "
        "concurrency=3 lease=3s heartbeat=0.5s reaper=0.7s lock_lost=sigterm schedules=0"
    )
    worker.terminate()
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.output
