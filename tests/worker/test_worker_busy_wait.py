"""A worker whose every slot is busy waits for news instead of spinning (issue 27 review).

The claim timer moved on only after an empty claim, so with every slot busy on long jobs
the main loop found a claim "due" it could not make (no free slot) and slept 0 s, pass
after pass: a CPU core burnt for as long as the jobs ran, taken from the renewals of its
own and every other worker's leases. An in-process worker, its passes counted between
heartbeats (events, not timings).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_leasejobs.signals import heartbeat_sent
from django_leasejobs.worker import Worker, WorkerConfig
from tests.tasks_worker_shutdown import wait_for_go
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

OPTIONS = {"LEASE_DURATION": 4.0, "HEARTBEAT_INTERVAL": 0.3, "POLL_INTERVAL": 0.5}
BEATS = 4


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_worker_with_every_slot_busy_sleeps_until_something_happens(
    marker_dir: str, pool: str
) -> None:
    backend = {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend", "OPTIONS": OPTIONS}
    with override_settings(TASKS={"default": backend}):
        wait_for_go.enqueue(marker_dir, "long")
        worker = Worker(WorkerConfig(pool=pool, concurrency=1, burst=True, prefetch=0))
        passes = 0
        sleep = worker.inbox.wait

        def counted(waitables: list[int], timeout: float) -> None:
            nonlocal passes
            passes += 1
            sleep(waitables, timeout)

        worker.inbox.wait = counted  # type: ignore[method-assign]
        beats: list[int] = []
        window = threading.Event()

        def beat(**_: Any) -> None:
            if (Path(marker_dir) / "long.started").exists():
                beats.append(passes)
                if len(beats) > BEATS:
                    window.set()

        heartbeat_sent.connect(beat, dispatch_uid="test-busy-wait")

        def release() -> None:
            window.wait(60)
            (Path(marker_dir) / "long.go").touch()

        releaser = threading.Thread(target=release)
        releaser.start()
        try:
            assert worker.run() == 0
        finally:
            heartbeat_sent.disconnect(dispatch_uid="test-busy-wait")
            window.set()
            releaser.join()
    wait_until(lambda: (Path(marker_dir) / "long.runs").exists(), what="the long job's end")
    assert len(beats) > BEATS
    per_beat = (beats[BEATS] - beats[0]) / BEATS
    # Woken by its heartbeat's messages and its poll timer at most: a few passes a beat,
    # not thousands.
    assert per_beat < 20, f"{per_beat:.0f} passes of the main loop per heartbeat (0.3 s)"
