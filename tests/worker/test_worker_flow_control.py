"""Flow control with real ``runworker`` processes: limits hold across workers and pools,
a pause holds on running workers at their next claim and a resume lifts it."""

from __future__ import annotations

import time

import pytest

from django_leasejobs import queues
from django_leasejobs.models import Job, JobStatus
from tests import tasks_flow
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker_harness import Workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DRAIN_TIMEOUT = 60.0


def most_at_once(lines: list[str]) -> dict[str, int]:
    """The most jobs of each key that were between their start and end lines at once."""
    events = []
    for line in lines:
        kind, key, _pid, when = line.split()
        events.append((float(when), 0 if kind == "end" else 1, key))
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    for _, starting, key in sorted(events):
        running[key] = running.get(key, 0) + (1 if starting else -1)
        most[key] = max(most.get(key, 0), running[key])
    return most


def finished(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids)


def test_key_and_queue_limits_hold_across_two_workers_of_both_pools(
    workers: Workers, marker_dir: str
) -> None:
    hold = 0.3
    jobs = []
    for key, limit in (("a", 1), ("b", 2)):
        task = tasks_flow.overlap.using(concurrency_key=key, concurrency_limit=limit)
        jobs += [int(task.enqueue(marker_dir, key, hold).id) for _ in range(6)]
    options = {"QUEUE_LIMITS": {"low": 3}}
    for pool in ("process", "thread"):
        workers.start(
            options=options, args=["--queues", "low", "--concurrency", "4", "--pool", pool]
        )
    wait_until(lambda: finished(jobs), timeout=DRAIN_TIMEOUT, what="every limited job to finish")
    lines = read_lines(marker_dir, "overlap.log")
    assert len(lines) == 2 * len(jobs)
    most = most_at_once(lines)
    assert most["a"] == 1
    assert most["b"] <= 2
    everything = most_at_once([line.replace(" a ", " q ").replace(" b ", " q ") for line in lines])
    assert everything["q"] <= 3


def test_a_pause_holds_on_running_workers_and_a_resume_lifts_it(
    workers: Workers, marker_dir: str
) -> None:
    workers.start(args=["--queues", "low,default", "--concurrency", "2"])
    assert queues.pause("low") is True
    held = int(tasks_flow.started.enqueue(marker_dir, "held").id)
    # A job of another queue, enqueued after it, runs: the worker has claimed since.
    other = int(tasks_flow.started.using(queue_name="default").enqueue(marker_dir, "other").id)
    wait_until(lambda: finished([other]), timeout=DRAIN_TIMEOUT, what="the other queue's job")
    assert Job.objects.get(pk=held).status == JobStatus.PENDING
    assert read_lines(marker_dir, "started.log") == ["other"]
    assert queues.resume("low") is True
    wait_until(lambda: finished([held]), timeout=DRAIN_TIMEOUT, what="the held job after resume")
    assert read_lines(marker_dir, "started.log") == ["other", "held"]


def flow_claims() -> int:
    from django_leasejobs.models import FlowLock

    return sum(FlowLock.objects.values_list("claims", flat=True))


def test_a_used_up_rate_neither_spins_the_worker_nor_holds_back_its_other_work(
    workers: Workers, marker_dir: str
) -> None:
    limited = tasks_flow.started.using(rate_limit="1/h")
    first = int(limited.enqueue(marker_dir, "limited-1").id)
    held = int(limited.enqueue(marker_dir, "limited-2").id)
    poll = 0.2
    workers.start(options={"POLL_INTERVAL": poll}, args=["--queues", "low", "--concurrency", "2"])
    wait_until(lambda: finished([first]), timeout=DRAIN_TIMEOUT, what="the first limited job")
    # Other work enqueued now is taken at once, beside the held job.
    plain = [int(tasks_flow.started.enqueue(marker_dir, f"plain-{n}").id) for n in range(3)]
    wait_until(lambda: finished(plain), timeout=DRAIN_TIMEOUT, what="the other jobs")
    assert Job.objects.get(pk=held).status == JobStatus.PENDING
    # While only the held job waits, the worker looks again about once per POLL_INTERVAL:
    # flow claims are counted on the flow lock's row.
    before, started_at = flow_claims(), time.monotonic()
    wait_until(lambda: time.monotonic() - started_at >= 3.0, timeout=10, what="3 s to pass")
    looks = flow_claims() - before
    assert 1 <= looks <= 3.0 / poll * 2 + 2, looks
    assert Job.objects.get(pk=held).status == JobStatus.PENDING


def test_a_burst_worker_drains_keys_it_held_itself_before_it_exits(
    workers: Workers, marker_dir: str
) -> None:
    # Each job outlasts a claim but not POLL_INTERVAL: the claim made while the worker's
    # own job holds the key finds nothing, and the job ends before the next poll.
    task = tasks_flow.overlap.using(concurrency_key="solo")
    jobs = [int(task.enqueue(marker_dir, "solo", 0.05).id) for _ in range(6)]
    worker = workers.start(
        options={"POLL_INTERVAL": 2.0},
        args=["--queues", "low", "--burst", "--concurrency", "2"],
    )
    assert worker.wait(timeout=DRAIN_TIMEOUT) == 0, worker.output
    assert finished(jobs), Job.objects.filter(pk__in=jobs).exclude(status="succeeded").count()
