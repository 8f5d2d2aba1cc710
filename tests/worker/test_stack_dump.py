"""``kill -USR1`` prints every thread's stack of a worker, or of one of its slots, to its
standard error, and the worker goes on (how to see where a hung worker or slot waits)."""

from __future__ import annotations

import os
import signal

import pytest

from tests.waiting import wait_until
from tests.worker_harness import Workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_sigusr1_prints_the_stacks_and_the_worker_goes_on(workers: Workers, pool: str) -> None:
    worker = workers.start(args=["--pool", pool, "--concurrency", "1"])
    os.kill(worker.pid, signal.SIGUSR1)
    # The main thread's frames are in the worker's loop module: in ``_main_loop``, or
    # still in ``run`` just before it (worker_started is sent from there: on a loaded
    # machine the signal can come first).
    wait_until(
        lambda: "django_leasejobs/worker/loop.py" in worker.output,
        20,
        what="the main loop's stack",
    )
    assert "leasejobs-heartbeat" in worker.output or "heartbeat.py" in worker.output
    if pool == "process":
        [slot] = worker.slot_pids()
        dumps = worker.output.count("most recent call first")
        os.kill(slot, signal.SIGUSR1)
        wait_until(
            lambda: (
                worker.output.count("most recent call first") > dumps
                and "child_main" in worker.output
            ),
            20,
            what="the slot's stack",
        )
        assert worker.slot_pids() == [slot]  # the slot lives on
    assert worker.popen.poll() is None
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output
