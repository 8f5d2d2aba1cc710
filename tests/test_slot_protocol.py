"""The slot protocol of the real pools (``ProcessPool``, ``ThreadPool``).

Jobs are the tasks of tests/tasks_slot_protocol.py: each notes its own start in a marker
file, so whether a job started is what the job itself says, not the pool's bookkeeping.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from django_leasejobs.leases import ClaimedJob
from django_leasejobs.worker.execution import JobSpec, Outcome
from django_leasejobs.worker.pools import (
    Event,
    ProcessPool,
    ProgressEvent,
    Retracted,
    SlotDied,
    Started,
)
from tests import tasks_slot_protocol as tasks

LOCK_LOST_GRACE = 0.2
KINDS = {"quick": tasks.quick, "fail": tasks.fail, "hold": tasks.hold, "exit": tasks.exit_slot}
ENDS = (Outcome, SlotDied, Retracted)


def _pinned_spec(marker_dir: str, job_id: int, kind: str, start_by: float = math.inf) -> JobSpec:
    job = ClaimedJob(
        id=job_id,
        attempt=1,
        task_path=KINDS[kind].module_path,
        queue="default",
        priority=0,
        args=[marker_dir, job_id],  # the job id is its hand-over token
        kwargs={},
        timeout=None,
        max_attempts=100,
        checkpoint=None,
    )
    return JobSpec(
        job=job, worker_id="slot-protocol", backend="default", database="default", start_by=start_by
    )


def _started_tokens(marker_dir: str) -> set[int]:
    path = os.path.join(marker_dir, tasks.STARTS)
    if not os.path.exists(path):
        return set()
    with open(path) as file:
        return {int(line.split()[0]) for line in file if line.endswith("\n")}


def test_started_never_names_a_job_its_child_passed_over_too_late(tmp_path: Any) -> None:
    """Found by the state machine over the slot protocol: ``collect()`` polled the slots'
    pipes, then read how far each child got (``STARTED``). A child passes over a job whose
    ``start_by`` passed (it sends MSG_EXPIRED) and starts the next one in between: the
    MSG_EXPIRED was not read in that pass, so ``Started`` named the job passed over, which
    then came back ``Retracted`` (the worker announced a start that never happened, and
    held the attempt as used).

    The race is made certain here: the pool's poll returns (nothing to read: the first job
    holds its slot), and only then does the first job end, the second get passed over
    and the third start."""
    from tests.worker_harness import wait_until

    marker_dir = str(tmp_path)
    pool = ProcessPool(1, lock_lost_behavior="sigkill", lock_lost_grace=LOCK_LOST_GRACE)
    pool.start()
    events: list[Event] = []
    try:
        pool.submit(
            0,
            [
                _pinned_spec(marker_dir, 1, "hold"),
                _pinned_spec(marker_dir, 2, "quick", start_by=time.monotonic() - 1.0),
                _pinned_spec(marker_dir, 3, "hold"),
            ],
        )

        def first_one_reported_progress() -> bool:
            events.extend(pool.collect())
            return any(isinstance(e, ProgressEvent) for e in events)

        wait_until(first_one_reported_progress, what="the first job's progress (pipe read)")
        real_poller = pool._poller

        class PollThenRace:
            def poll(self, timeout: float) -> Any:
                ready = real_poller.poll(timeout)
                tasks.gate_path(marker_dir, 1).touch()
                wait_until(lambda: 3 in _started_tokens(marker_dir), what="the third job")
                return ready

            def __getattr__(self, name: str) -> Any:
                return getattr(real_poller, name)

        pool._poller = PollThenRace()  # type: ignore[assignment]
        try:
            events.extend(pool.collect())
        finally:
            pool._poller = real_poller
        tasks.gate_path(marker_dir, 3).touch()

        def ended() -> bool:
            events.extend(pool.collect())
            return sum(isinstance(e, ENDS) for e in events) == 3

        wait_until(ended, what="every job's end")
    finally:
        pool.shutdown()
    assert 2 not in _started_tokens(marker_dir)
    assert [lease for e in events if isinstance(e, Retracted) for lease in e.leases] == [(2, 1)]
    started = [lease for e in events if isinstance(e, Started) for lease in e.leases]
    assert started == [(3, 1)], events
