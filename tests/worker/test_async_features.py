"""Every other feature holds for ``async def`` jobs on a slot's event loop (issue 30,
point 4), with real ``runworker`` subprocesses: progress, checkpoints and retries, retry
control, a workflow step reading its parents, queue concurrency limits and rate limits.
(Tracing: tests/observability/test_tracing.py runs an async job among its traced jobs;
the testing kit: tests/testing_kit/test_testing_kit.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.workflows import chain, group
from tests import tasks_async
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BURST_BOUND = 120


def test_progress_from_an_async_job_reaches_the_row(workers, marker_dir: str) -> None:
    job_id = int(tasks_async.reports_progress.enqueue(marker_dir).id)
    workers.start(args=["--concurrency", "1"])

    def reported() -> bool:
        job = Job.objects.get(pk=job_id)
        return (job.progress, job.progress_message) == (0.5, "half way")

    wait_until(reported, 30, what="its progress on the row (sent with a heartbeat)")
    (Path(marker_dir) / "go").touch()
    wait_until(lambda: Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED, 30, what="success")
    assert Job.objects.get(pk=job_id).progress == 1.0


def test_checkpoint_retry_and_retry_control(workers) -> None:
    resumed = int(tasks_async.resumes_from_checkpoint.enqueue().id)
    refused = int(tasks_async.refuses_to_retry.enqueue().id)
    worker = workers.start(args=["--concurrency", "1", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output

    job = Job.objects.get(pk=resumed)
    assert job.status == JobStatus.SUCCEEDED, job.last_error
    assert job.result == {"attempt": 2, "checkpoint": {"step": 1}}
    [first] = JobAttempt.objects.filter(job_id=resumed)
    assert (first.attempt, first.outcome) == (1, AttemptOutcome.ERROR)
    assert "attempt 1 fails after its checkpoint" in first.error_message

    job = Job.objects.get(pk=refused)
    assert (job.status, job.attempt) == (JobStatus.FAILED, 1)
    [row] = JobAttempt.objects.filter(job_id=refused)
    assert row.decision.startswith("not retried"), row.decision


def test_an_async_step_reads_its_parents_results(workers) -> None:
    flow = chain(
        group(tasks_async.number.step(2), tasks_async.number.step(5)),
        tasks_async.sums_its_parents.step(),
    ).enqueue()
    worker = workers.start(args=["--concurrency", "2", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    flow.refresh()
    assert flow.status == "SUCCESSFUL", flow.status
    last = Job.objects.filter(workflow_id=flow.id, task_path__endswith="sums_its_parents").get()
    assert last.result == 7


def intervals(marker_dir: str) -> list[tuple[float, float]]:
    """(start, end) of each ``nap`` job, by the clock of the slot that ran it."""
    starts = {
        job: float(clock)
        for job, _, _, clock in (
            line.split() for line in (Path(marker_dir) / "nap.starts").read_text().splitlines()
        )
    }
    ends = {
        job: float(clock)
        for job, _, clock in (
            line.split() for line in (Path(marker_dir) / "nap.ends").read_text().splitlines()
        )
    }
    return [(starts[job], ends[job]) for job in starts]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def test_async_concurrency_caps_a_slots_loop(workers, marker_dir: str) -> None:
    """Twenty async jobs on one slot whose loop may run 5 at once: never more than 5 run
    at once, and 5 do."""
    ids = [int(tasks_async.nap.enqueue(marker_dir, "nap", 0.3).id) for _ in range(20)]
    worker = workers.start(args=["--concurrency", "1", "--async-concurrency", "5", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    spans = intervals(marker_dir)
    assert len(spans) == 20
    assert most_at_once(spans) == 5


def test_a_queue_limit_holds_for_async_jobs(workers, marker_dir: str) -> None:
    """Eight async jobs of a queue limited to 2 at once, on a loop with room for 100:
    never more than 2 run at once, and 2 do."""
    capped = tasks_async.nap.using(queue_name="low")
    ids = [int(capped.enqueue(marker_dir, "nap", 0.5).id) for _ in range(8)]
    worker = workers.start(
        options={"QUEUE_LIMITS": {"low": 2}}, args=["--concurrency", "1", "--burst"]
    )
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    assert most_at_once(intervals(marker_dir)) == 2


def test_a_rate_limit_holds_for_async_jobs(workers, marker_dir: str) -> None:
    """Nine async jobs of a queue limited to 3 starts a second: any 4 starts (the
    database's clock, as the claim stamps them) span more than a second."""
    rated = tasks_async.nap.using(queue_name="high")
    ids = [int(rated.enqueue(marker_dir, "nap", 0.05).id) for _ in range(9)]
    workers.start(options={"QUEUE_RATE_LIMITS": {"high": "3/s"}}, args=["--concurrency", "1"])
    # (not --burst: a claim the rate holds back finds no job ready, and a burst worker
    # would leave)
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 9,
        60,
        what="every job succeeded",
    )
    starts = sorted(Job.objects.filter(pk__in=ids).values_list("started_at", flat=True))
    assert len(starts) == 9
    for first, fourth in zip(starts, starts[3:], strict=False):
        assert (fourth - first).total_seconds() >= 1.0, starts
