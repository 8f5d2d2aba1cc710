"""``kill -USR1`` prints every thread's stack of a worker, or of one of its slots, to its
standard error, and the worker goes on (how to see where a hung worker or slot waits)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import pytest

from django_leasejobs.models import Job, JobStatus
from django_leasejobs.worker import stacks
from tests import tasks
from tests.waiting import wait_until
from tests.worker_harness import WorkerProcess, Workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DUMP = "most recent call first"
"""What a stack print shows above each thread's stack (``faulthandler``'s layout)."""


def _dumped(worker: WorkerProcess, pid: int, shows: Callable[[str], bool]) -> None:
    """Send ``pid`` SIGUSR1 until the worker's output shows a new dump for which ``shows``
    holds (again every 5 s: one dump that came before the frames wanted, on a loaded
    machine, is not the end); fail at once, with the output, if the worker exits."""
    before = worker.output.count(DUMP)
    asked: list[float] = []

    def seen() -> bool:
        if worker.popen.poll() is not None:
            raise AssertionError(f"the worker exited ({worker.popen.returncode}):\n{worker.output}")
        output = worker.output
        if output.count(DUMP) > before and shows(output):
            return True
        if not asked or time.monotonic() - asked[-1] > 5:
            os.kill(pid, signal.SIGUSR1)
            asked.append(time.monotonic())
        return False

    wait_until(
        seen, 30, what=lambda: f"a stack dump of {pid}; the worker printed:\n{worker.output}"
    )


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_sigusr1_prints_the_stacks_and_the_worker_goes_on(workers: Workers, pool: str) -> None:
    worker = workers.start(args=["--pool", pool, "--concurrency", "1"])
    # The main thread's frames are in the worker's loop module: in ``_main_loop``, or
    # still in ``run`` just before it (worker_started is sent from there).
    _dumped(worker, worker.pid, lambda output: "django_leasejobs/worker/loop.py" in output)
    assert "leasejobs-heartbeat" in worker.output or "heartbeat.py" in worker.output
    if pool == "process":
        [slot] = worker.slot_pids()
        _dumped(worker, slot, lambda output: "child_main" in output)
        assert worker.slot_pids() == [slot]  # the slot lives on
    assert worker.popen.poll() is None
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_many_stack_prints_while_the_worker_runs_jobs_crash_nothing(
    workers: Workers, pool: str
) -> None:
    """The stacks are printed from the main thread with the interpreter's view of every
    thread, never read from threads as they run (``faulthandler`` did that, and a worker
    whose other thread was importing a module at that moment died of SIGSEGV): prints
    one after another while the worker starts and runs jobs leave it and its slot alive."""
    worker = workers.start(args=["--pool", pool, "--concurrency", "1"])
    for n in range(300):
        tasks.add.enqueue(n, n)
    pids = [worker.pid, *worker.slot_pids()]
    for _ in range(15):
        for pid in pids:
            printed = worker.output.count(DUMP)
            os.kill(pid, signal.SIGUSR1)
            wait_until(
                lambda printed=printed: (
                    worker.popen.poll() is not None or worker.output.count(DUMP) > printed
                ),
                30,
                what=lambda: f"a stack print; the worker printed:\n{worker.output}",
            )
            assert worker.popen.poll() is None, worker.output
    assert worker.slot_pids() == pids[1:]
    wait_until(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 300,
        60,
        what="the jobs to run",
    )
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output


def test_a_print_that_cannot_be_written_raises_nothing_into_the_main_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler runs inside whatever the main thread was doing, which may be writing
    to standard error itself (a reentrant write raises RuntimeError): nothing reaches it."""

    class Busy:
        def write(self, text: str) -> int:
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

        def flush(self) -> None:
            raise RuntimeError("reentrant call")

    monkeypatch.setattr(sys, "stderr", Busy())
    stacks.print_stacks(signal.SIGUSR1, None)  # (raises nothing)
