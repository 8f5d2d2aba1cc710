"""Slots that hold several jobs (pipelining), with real child processes and threads.

With a backlog of short jobs a slot gets several at once and runs them in a row. The
guarantees of one job per slot stay: a stop hits exactly the job it names (the child
records which job it starts under a lock the parent holds to stop one); jobs queued
behind it are taken back and never start there; jobs queued behind a job that runs long
are taken back for other slots; a dead child's queued jobs come back unstarted; every
outcome a child sent before it died counts. The worker-level test runs real
``runworker`` processes of both pools.
"""

from __future__ import annotations

import os
import selectors
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_leasejobs.compat import task_backends
from django_leasejobs.leases import ClaimedJob
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker import child as process_module
from django_leasejobs.worker.execution import JobSpec, Outcome
from django_leasejobs.worker.pools import (
    Event,
    ProcessPool,
    Retracted,
    SlotDied,
    Started,
    ThreadPool,
)
from django_leasejobs.worker.pools import process as pool_module
from django_leasejobs.worker.pools.frames import Frames
from tests import tasks_worker, tasks_worker_flow
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker_harness import PREFETCHING_OPTIONS, Workers, pid_alive

Lease = tuple[int, int]


def _spec(job_id: int, task: Any, *args: Any) -> JobSpec:
    job = ClaimedJob(
        id=job_id,
        attempt=1,
        task_path=task.module_path,
        queue="default",
        priority=0,
        args=list(args),
        kwargs={},
        timeout=None,
        max_attempts=3,
        checkpoint=None,
    )
    return JobSpec(job=job, worker_id="pipelining-test", backend="default", database="default")


class Collector:
    """Everything a pool reported so far (``collect()`` polled until a condition holds)."""

    def __init__(self, pool: ProcessPool | ThreadPool) -> None:
        self.pool = pool
        self.events: list[Event] = []

    def until(self, condition: Callable[[list[Event]], bool], what: str) -> list[Event]:
        def check() -> bool:
            self.events += self.pool.collect()
            return condition(self.events)

        wait_until(check, timeout=30, what=what)
        return self.events

    def until_taken_back_after_stall(self, leases: list[Lease]) -> None:
        """Let the pool take back what is queued behind a job running over 50 ms (as the
        main loop does each pass) until ``leases`` came back."""

        def check() -> bool:
            self.pool.retract_stalled(0.05)
            self.events += self.pool.collect()
            return self.retracted() == leases

        wait_until(check, timeout=30, what=f"{leases} taken back")

    def outcome(self, lease: Lease) -> Outcome | None:
        return next((e for e in self.events if isinstance(e, Outcome) and e.lease == lease), None)

    def retracted(self) -> list[Lease]:
        return [lease for e in self.events if isinstance(e, Retracted) for lease in e.leases]

    def started(self) -> list[Lease]:
        return [lease for e in self.events if isinstance(e, Started) for lease in e.leases]


@pytest.fixture
def process_pool() -> Any:
    pool = ProcessPool(1, lock_lost_behavior="sigkill", lock_lost_grace=5.0)
    pool.start()
    try:
        yield pool
    finally:
        pool.shutdown()


@pytest.fixture
def thread_pool() -> Any:
    pool = ThreadPool(1, wake=lambda: None)
    pool.start()
    try:
        yield pool
    finally:
        pool.shutdown()


def _open_gate(marker_dir: str, name: str) -> None:
    (Path(marker_dir) / f"{name}.gate").touch()


# -- process pool ---------------------------------------------------------------------


def test_a_stop_hits_only_the_job_it_names(process_pool: ProcessPool, marker_dir: str) -> None:
    seen = Collector(process_pool)
    process_pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(2, tasks_worker_flow.record_label, marker_dir, "queued", "a"),
            _spec(3, tasks_worker_flow.record_label, marker_dir, "queued", "b"),
        ],
    )
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the first job to start")
    assert process_pool.running() == [(1, 1), (2, 1), (3, 1)]

    # A queued job is taken back, with everything behind it; the running one runs on.
    assert process_pool.stop_job((2, 1), graceful=False) == "retracted"
    seen.until(lambda _: seen.retracted() == [(2, 1), (3, 1)], "the queued jobs back")
    assert process_pool.running() == [(1, 1)]

    # The running one is killed with its process group.
    pid = int(read_lines(marker_dir, "long.started")[0])
    assert process_pool.stop_job((1, 1), graceful=False) == "killing"
    seen.until(lambda ev: any(isinstance(e, SlotDied) for e in ev), "the slot's death")
    died = [e for e in seen.events if isinstance(e, SlotDied)]
    assert [(d.lease, d.exit_description) for d in died] == [((1, 1), "was killed by SIGKILL")]
    wait_until(lambda: not _alive(pid), what="the killed child to be gone")
    assert read_lines(marker_dir, "queued.order") == []  # never ran

    # The slot was replaced and runs what it gets next.
    process_pool.submit(0, [_spec(4, tasks_worker_flow.record_label, marker_dir, "next", "c")])
    seen.until(lambda _: seen.outcome((4, 1)) is not None, "the next job's outcome")
    assert seen.outcome((4, 1)).ok  # type: ignore[union-attr]
    assert read_lines(marker_dir, "next.order") == ["c"]


def test_jobs_behind_a_long_job_are_taken_back(process_pool: ProcessPool, marker_dir: str) -> None:
    seen = Collector(process_pool)
    process_pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(2, tasks_worker_flow.record_label, marker_dir, "queued", "a"),
        ],
    )
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the first job to start")
    assert process_pool.pipelined()

    seen.until_taken_back_after_stall([(2, 1)])
    assert not process_pool.pipelined()
    _open_gate(marker_dir, "long")
    seen.until(lambda _: seen.outcome((1, 1)) is not None, "the long job's outcome")
    assert seen.outcome((1, 1)).result == "gate opened"  # type: ignore[union-attr]
    assert read_lines(marker_dir, "queued.order") == []


def test_jobs_taken_back_never_start_even_when_the_slot_gets_new_ones(
    process_pool: ProcessPool, marker_dir: str
) -> None:
    """Found by the hostile-batch tests: an earlier job's outcome let the worker hand the
    slot new jobs while the long job still ran; raising the slot's limit for them let its
    child start the jobs taken back from it, which another slot ran too. A slot gets no
    new job until its child has passed every job taken back."""
    seen = Collector(process_pool)
    process_pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.record_label, marker_dir, "first", "a"),
            _spec(2, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(3, tasks_worker_flow.record_label, marker_dir, "queued", "c"),
            _spec(4, tasks_worker_flow.record_label, marker_dir, "queued", "d"),
        ],
    )
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the long job to start")

    def taken_back() -> bool:
        process_pool.retract_stalled(0.05)
        seen.events += process_pool.collect()
        return seen.retracted() == [(3, 1), (4, 1)] and seen.outcome((1, 1)) is not None

    wait_until(taken_back, what="the queued jobs taken back and the first outcome read")
    assert process_pool.rooms(16) == []  # the long job runs, the jobs taken back not passed
    with pytest.raises(ValueError, match="taken back"):
        process_pool.submit(0, [_spec(5, tasks_worker_flow.record_label, marker_dir, "x", "e")])
    _open_gate(marker_dir, "long")
    seen.until(lambda _: seen.outcome((2, 1)) is not None, "the long job's outcome")
    # Once the child passed the jobs taken back, the slot takes new ones.
    wait_until(lambda: process_pool.rooms(16) != [], what="the slot to have room again")
    process_pool.submit(0, [_spec(6, tasks_worker_flow.record_label, marker_dir, "next", "f")])
    seen.until(lambda _: seen.outcome((6, 1)) is not None, "the new job's outcome")
    assert read_lines(marker_dir, "next.order") == ["f"]
    assert read_lines(marker_dir, "queued.order") == []  # never, not even after the new job


def test_a_dead_childs_queued_jobs_come_back_unstarted(
    process_pool: ProcessPool, marker_dir: str
) -> None:
    """Killed from outside (the OOM killer, an operator): the running job died with it,
    the queued ones never started; outcomes sent before the death count."""
    seen = Collector(process_pool)
    process_pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.record_label, marker_dir, "done", "first"),
            _spec(2, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(3, tasks_worker_flow.record_label, marker_dir, "queued", "a"),
        ],
    )
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the second job to start")
    os.killpg(int(read_lines(marker_dir, "long.started")[0]), signal.SIGKILL)
    seen.until(lambda ev: any(isinstance(e, SlotDied) for e in ev), "the slot's death")
    assert seen.outcome((1, 1)) is not None and seen.outcome((1, 1)).result == "first"  # type: ignore[union-attr]
    assert [e.lease for e in seen.events if isinstance(e, SlotDied)] == [(2, 1)]
    assert seen.retracted() == [(3, 1)]
    assert read_lines(marker_dir, "queued.order") == []


def test_many_outcomes_and_large_ones_arrive_whole(process_pool: ProcessPool) -> None:
    """One batch whose outcomes include results larger than the pipe's buffer and than
    one read: every outcome arrives, intact."""
    sizes = [10, 200_000, 5, 70_000, 1, 3_000_000, 2] + [0] * 9
    specs = [_spec(i, tasks_worker_flow.blob, size) for i, size in enumerate(sizes, start=1)]
    seen = Collector(process_pool)
    process_pool.submit(0, specs)
    seen.until(lambda ev: sum(isinstance(e, Outcome) for e in ev) == len(sizes), "all outcomes")
    for job_id, size in enumerate(sizes, start=1):
        outcome = seen.outcome((job_id, 1))
        assert outcome is not None and outcome.ok and outcome.result == "x" * size


def test_a_large_outcome_wakes_the_worker_and_arrives(process_pool: ProcessPool) -> None:
    """The worker waits on the slots' bells, not on their pipes: an outcome too large for
    the pipe must ring once the parent can start reading it, or the child would block
    writing while the worker sleeps. Every wait here ends on an event, never its timeout."""
    selector = selectors.DefaultSelector()
    for waitable in process_pool.waitables():
        selector.register(waitable, selectors.EVENT_READ)
    seen = Collector(process_pool)
    for job_id, size in ((1, 3_000_000), (2, 70_000), (3, 300_000)):
        process_pool.submit(0, [_spec(job_id, tasks_worker_flow.blob, size)])
        while seen.outcome((job_id, 1)) is None:
            assert selector.select(timeout=60), "the worker slept through a slot's outcome"
            seen.events += process_pool.collect()
        assert seen.outcome((job_id, 1)).result == "x" * size  # type: ignore[union-attr]
    selector.close()


def test_a_dead_childs_outcomes_beyond_one_read_all_count(
    process_pool: ProcessPool, marker_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child sends outcomes and dies before the worker reads any. A read of its pipe
    (64 KiB at most) that ends on a message's boundary returns what it read so far:
    forced here for every message, with one-byte reads. One look at the pool still
    reads them all, and each finished job counts as finished (read in part, the rest
    would be reported as died with the slot, and run again)."""
    monkeypatch.setattr(Frames, "CHUNK", 1)
    specs = [_spec(i, tasks_worker_flow.blob, 1_000) for i in range(1, 7)]
    specs.append(_spec(7, tasks_worker.crash_own_process, marker_dir, "crash"))
    process_pool.submit(0, specs)
    wait_until(lambda: read_lines(marker_dir, "crash.runs"), what="the last job to run")
    pid = int(read_lines(marker_dir, "crash.runs")[0].split()[1])
    wait_until(lambda: not pid_alive(pid), what="the child to die")

    events = process_pool.collect()
    outcomes = {e.lease: e for e in events if isinstance(e, Outcome)}
    assert sorted(outcomes) == [(i, 1) for i in range(1, 7)]
    assert all(o.ok and o.result == "x" * 1_000 for o in outcomes.values())
    # The death comes with that look, or with a later one (CI saw the pid gone a moment
    # before the child's sentinel was ready, on a loaded machine); it names job 7 alone.
    died = [e.lease for e in events if isinstance(e, SlotDied)] or wait_until(
        lambda: [e.lease for e in process_pool.collect() if isinstance(e, SlotDied)],
        what="the slot's death",
    )
    assert died == [(7, 1)]


def test_a_slow_replacement_slot_does_not_stall_the_worker(
    marker_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot that died is replaced from the main loop: the loop must not wait for the new
    child (which can take long on a loaded machine) while lease losses and outcomes
    wait. The new slot takes no job before it says it is ready, then it does."""
    gate = Path(marker_dir) / "replacement.gate"
    first_child = [True]

    def slow_to_start(*args: Any) -> None:  # runs in the forked child
        if not first_child[0]:
            wait_until(gate.exists, timeout=60, what="the gate")
        process_module.child_main(*args)

    monkeypatch.setattr(pool_module, "child_main", slow_to_start)
    pool = ProcessPool(1, lock_lost_behavior="sigkill", lock_lost_grace=5.0)
    pool.start()  # the first child starts at once: ready before start() returns
    first_child[0] = False
    try:
        assert len(pool.rooms(1)) == 1
        pool.submit(0, [_spec(1, tasks_worker.crash_own_process, marker_dir, "crash")])
        wait_until(lambda: read_lines(marker_dir, "crash.runs"), what="the job to run")
        pid = int(read_lines(marker_dir, "crash.runs")[0].split()[1])
        wait_until(lambda: not pid_alive(pid), what="the child to die")
        # One look: the death is reported and a replacement forked, not waited for.
        events = pool.collect()
        assert [e.lease for e in events if isinstance(e, SlotDied)] == [(1, 1)]
        assert pool.rooms(1) == [] and pool.free_slots() == 0, "no job before it is ready"
        gate.touch()
        wait_until(lambda: pool.collect() == [] and pool.rooms(1), what="the new slot ready")
        pool.submit(0, [_spec(2, tasks_worker_flow.blob, 3)])
        seen = Collector(pool)
        seen.until(lambda _: seen.outcome((2, 1)) is not None, "the new slot's outcome")
    finally:
        pool.shutdown()


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_a_pool_reports_the_start_of_queued_jobs_and_of_no_job_taken_back(
    kind: str, request: pytest.FixtureRequest, marker_dir: str
) -> None:
    """The worker announces a job's start (``job_started``, the log line) only once it
    really started: the first job handed to an idle slot as it is handed over (``submit``
    says so), a job queued behind others when its slot reports it (``Started``, before
    its outcome). A job taken back unstarted is never reported: giving it back then
    leaves no announced attempt behind."""
    pool: ProcessPool | ThreadPool = request.getfixturevalue(f"{kind}_pool")
    seen = Collector(pool)
    first = pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.record_label, marker_dir, "first", "a"),
            _spec(2, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(3, tasks_worker_flow.record_label, marker_dir, "queued", "c"),
        ],
    )
    assert first is True  # the slot was idle: job 1 starts at once
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the long job to start")
    seen.until(lambda _: seen.started() == [(2, 1)], "the long job's start reported")
    # A slot that holds jobs: what it gets now waits behind them.
    assert (
        pool.submit(0, [_spec(4, tasks_worker_flow.record_label, marker_dir, "queued", "d")])
        is False
    )
    seen.until_taken_back_after_stall([(3, 1), (4, 1)])
    _open_gate(marker_dir, "long")
    seen.until(lambda _: seen.outcome((2, 1)) is not None, "the long job's outcome")
    events = seen.events
    reported = next(
        i for i, e in enumerate(events) if isinstance(e, Started) and (2, 1) in e.leases
    )
    ended = next(i for i, e in enumerate(events) if isinstance(e, Outcome) and e.lease == (2, 1))
    assert reported < ended
    assert seen.started() == [(2, 1)]  # not job 1 (the worker announced it), never 3 or 4
    assert read_lines(marker_dir, "queued.order") == []


# -- thread pool ----------------------------------------------------------------------


def test_thread_pool_stops_flag_the_running_job_and_take_back_the_queue(
    thread_pool: ThreadPool, marker_dir: str
) -> None:
    seen = Collector(thread_pool)
    thread_pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(2, tasks_worker_flow.record_label, marker_dir, "queued", "a"),
            _spec(3, tasks_worker_flow.record_label, marker_dir, "queued", "b"),
            _spec(4, tasks_worker_flow.record_label, marker_dir, "queued", "c"),
        ],
    )
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the first job to start")
    assert thread_pool.stop_job((3, 1), graceful=False) == "retracted"
    seen.until(lambda _: seen.retracted() == [(3, 1), (4, 1)], "the tail of the queue back")
    # The running job is flagged (a thread cannot be killed); what is queued behind it
    # comes back, and the slot takes no new job until the thread returns.
    assert thread_pool.stop_job((1, 1), graceful=False) == "flagged"
    seen.until(lambda _: seen.retracted() == [(3, 1), (4, 1), (2, 1)], "the rest back")
    assert thread_pool.rooms(16) == []
    _open_gate(marker_dir, "long")
    wait_until(lambda: thread_pool.free_slots() == 1, what="the thread to return")
    assert seen.outcome((1, 1)) is None  # void: it was stopped
    assert read_lines(marker_dir, "queued.order") == []


def test_thread_pool_takes_back_jobs_behind_a_long_one(
    thread_pool: ThreadPool, marker_dir: str
) -> None:
    seen = Collector(thread_pool)
    thread_pool.submit(
        0,
        [
            _spec(1, tasks_worker_flow.gate_plain, marker_dir, "long"),
            _spec(2, tasks_worker_flow.record_label, marker_dir, "queued", "a"),
        ],
    )
    wait_until(lambda: read_lines(marker_dir, "long.started"), what="the first job to start")

    seen.until_taken_back_after_stall([(2, 1)])
    _open_gate(marker_dir, "long")
    seen.until(lambda _: seen.outcome((1, 1)) is not None, "the long job's outcome")
    assert read_lines(marker_dir, "queued.order") == []


# -- real workers -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_short_jobs_do_not_wait_behind_a_long_one(
    workers: Workers, marker_dir: str, pool: str
) -> None:
    """A backlog of short jobs (handed to slots several at a time) with one long job
    among them: every short job runs, exactly once, while the long one still runs."""
    workers.start(args=["--concurrency", "2", "--pool", pool])
    warm = [tasks_worker_flow.record_id.enqueue(marker_dir, "warm") for _ in range(30)]
    wait_until(
        lambda: (
            Job.objects.filter(pk__in=[int(r.id) for r in warm], status=JobStatus.SUCCEEDED).count()
            == len(warm)
        ),
        timeout=60,
        what="the warm-up jobs",
    )
    calls: list[Any] = [(tasks_worker_flow.record_id, [marker_dir, "quick"], {})] * 100
    calls.insert(3, (tasks_worker_flow.wait_for_gate, [marker_dir, "long"], {}))
    calls += [(tasks_worker_flow.record_id, [marker_dir, "quick"], {})] * 100
    results = task_backends["default"].bulk_enqueue(calls)
    long_id = int(results[3].id)
    quick_ids = {int(r.id) for r in results} - {long_id}
    wait_until(
        lambda: (
            Job.objects.filter(pk__in=quick_ids, status=JobStatus.SUCCEEDED).count()
            == len(quick_ids)
        ),
        timeout=30,  # (the long job gives up after 60 s)
        what="every short job",
    )
    long_job = Job.objects.get(pk=long_id)
    assert (long_job.status, long_job.attempt) == (JobStatus.RUNNING, 1)
    ran = [int(line.split()[0]) for line in read_lines(marker_dir, "quick.ids")]
    assert sorted(ran) == sorted(quick_ids)  # each exactly once
    _open_gate(marker_dir, "long")
    wait_until(
        lambda: Job.objects.get(pk=long_id).status == JobStatus.SUCCEEDED,
        what="the long job",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_jobs_taken_back_and_given_back_were_never_announced(
    workers: Workers, marker_dir: str, pool: str
) -> None:
    """Jobs queued behind a long job in the only slot are taken back after 50 ms, wait
    for a slot, and after 1 s go back to pending for other workers (their attempt
    unused). They never started, so nothing announced a start for them: every attempt
    that ran is announced once (``job_started`` feeds the metrics, which must match the
    attempts in the database), and no attempt that did not run is announced."""
    worker = workers.start(options=PREFETCHING_OPTIONS, args=["--concurrency", "1", "--pool", pool])
    warm = [tasks_worker_flow.record_id.enqueue(marker_dir, "warm") for _ in range(20)]
    warm_ids = [int(r.id) for r in warm]
    wait_until(
        lambda: (
            Job.objects.filter(pk__in=warm_ids, status=JobStatus.SUCCEEDED).count() == len(warm)
        ),
        timeout=60,
        what="the warm-up jobs (short: the next backlog is handed over in batches)",
    )
    calls: list[Any] = [(tasks_worker_flow.wait_for_gate, [marker_dir, "long"], {})]
    calls += [(tasks_worker_flow.record_id, [marker_dir, "quick"], {})] * 40
    ids = [int(r.id) for r in task_backends["default"].bulk_enqueue(calls)]
    worker.wait_for_event("prefetch_returned", timeout=30)
    _open_gate(marker_dir, "long")
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids),
        timeout=60,
        what="every job",
    )
    announced = Counter((e["job_id"], e["attempt"]) for e in worker.events("job_started"))
    attempts = dict(Job.objects.filter(pk__in=ids + warm_ids).values_list("pk", "attempt"))
    # No attempt was used up by a job that never ran, and each that ran was announced once.
    assert set(attempts.values()) == {1}, attempts
    assert announced == Counter({(pk, 1): 1 for pk in attempts}), worker.output
    ran = [int(line.split()[0]) for line in read_lines(marker_dir, "quick.ids")]
    assert sorted(ran) == sorted(ids[1:])  # each exactly once
