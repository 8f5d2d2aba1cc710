"""A rolling deploy: new code reaches the web before a worker.

The web enqueues a job of a task the running worker does not know yet. That worker
gives the job back (no attempt used, no stall counted) again and again, a little later
each time, until a worker running the new code takes it; only after
``UNKNOWN_TASK_GRACE`` is it dead-lettered. Real ``runworker`` processes: the "old" one
cannot import the new module at all, the "new" one has it on its path.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
from django.db import connection
from django.db.models.functions import Now

from django_leasejobs.models import Job, JobAttempt, JobStatus
from django_leasejobs.worker import Worker
from django_leasejobs.worker.housekeeping import Housekeeping
from django_leasejobs.worker.inbox import NextDue
from django_leasejobs.worker.rounds import RoundPlan
from django_leasejobs.worker.shared import WorkerStatus
from tests.helpers_leases import make_job
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

NEW_MODULE = "leasejobs_deployed_later"


@pytest.fixture
def new_code(tmp_path: Path) -> Iterator[tuple[Path, ModuleType]]:
    """A module of tasks that only the producer (this process) and the "new" worker
    can import: the code of a deploy that reached the web first."""
    code = tmp_path / "new_code"
    code.mkdir()
    (code / f"{NEW_MODULE}.py").write_text(
        textwrap.dedent(
            """
            from django_leasejobs import task

            @task
            def welcome(name: str) -> str:
                return f"welcome, {name}"
            """
        )
    )
    sys.path.insert(0, str(code))
    try:
        yield code, importlib.import_module(NEW_MODULE)
    finally:
        sys.path.remove(str(code))


def _new_worker_env(workers, code: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(code), workers.env["PYTHONPATH"]])}


def test_a_job_of_a_new_task_waits_for_a_worker_that_knows_it(workers, new_code) -> None:
    code, module = new_code
    old = workers.start(args=["--concurrency", "1", "--worker-id", "old-code"])
    result = module.welcome.enqueue("ada")

    # The old worker met it and gave it back: no attempt used, no stall counted.
    wait_until(
        lambda: Job.objects.filter(pk=result.id, unknown_task_since__isnull=False).exists(),
        timeout=30,
        what="the old worker to give the job back",
    )
    stored = Job.objects.get(pk=result.id)
    assert stored.status in (JobStatus.PENDING, JobStatus.RUNNING), old.output
    assert stored.stall_count == 0
    assert not JobAttempt.objects.filter(job_id=result.id).exists()

    # The deploy reaches the workers: a new one starts beside the old one, which keeps
    # running. The old one stands aside from the task (for a minute): the new one takes
    # the job as soon as it is due again.
    workers.start(
        args=["--concurrency", "1", "--worker-id", "new-code"],
        options={"IMPORTS": [NEW_MODULE]},
        env=_new_worker_env(workers, code),
    )
    wait_until(
        lambda: Job.objects.filter(pk=result.id, status=JobStatus.SUCCEEDED).exists(),
        timeout=60,
        what=lambda: f"the new worker to run the job: {Job.objects.filter(pk=result.id).values()}",
    )
    assert old.popen.poll() is None
    # The old worker met the job once, and left the task alone after it.
    assert old.output.count(f"task '{NEW_MODULE}.welcome' is unknown to this worker") == 1
    assert "this worker leaves the task's jobs alone for 60s" in old.output
    done = Job.objects.get(pk=result.id)
    assert (done.attempt, done.last_worker, done.result) == (1, "new-code", "welcome, ada")
    assert done.stall_count == 0
    assert not JobAttempt.objects.filter(job_id=result.id).exists()
    assert module.welcome.get_result(result.id).return_value == "welcome, ada"
    # The old worker said what happened and what will happen.
    assert f"task '{NEW_MODULE}.welcome' is unknown to this worker" in old.output
    assert "a worker running code that declares the task will take it" in old.output


def test_past_the_grace_the_job_is_dead_lettered_with_what_to_do(workers, new_code) -> None:
    _code, module = new_code
    workers.start(options={"UNKNOWN_TASK_GRACE": 1}, args=["--concurrency", "1"])
    result = module.welcome.enqueue("bob")

    wait_until(
        lambda: Job.objects.filter(pk=result.id, status=JobStatus.DEAD).exists(),
        timeout=60,
        what="the job to be dead-lettered",
    )
    [attempt] = JobAttempt.objects.filter(job_id=result.id)
    assert attempt.error_class == "django_leasejobs.exceptions.UnknownTask"
    assert f"'{NEW_MODULE}.welcome' is not a registered task" in attempt.error_message
    assert "deploy the code that declares it to the workers" in attempt.error_message
    assert Job.objects.get(pk=result.id).attempt == 1


def test_the_jobs_a_worker_stands_aside_from_do_not_bring_its_next_look_forward(
    worker: Worker,
) -> None:
    """After giving a job of a task it does not know back, a worker's claims leave that
    task's jobs alone for a while (``skip_tasks``); its next-due lookup must leave them
    out too, or, once one is due, the idle worker would look again every
    ``POLL_INTERVAL`` for a job it will not claim. (The worker's own parts, in process.)"""
    if connection.vendor != "postgresql":
        pytest.skip("the next-due lookup is PostgreSQL's (elsewhere workers poll)")
    make_job(task_path="app.tasks.new")  # due now: the task the worker stands aside from
    later = make_job()
    Job.objects.filter(pk=later.pk).update(run_after=Now() + timedelta(seconds=100))
    rounds = worker.rounds
    rounds.open()
    try:
        plan = RoundPlan(claim_limit=4, skip_tasks=("app.tasks.new",))
        rounds.start(plan, listening=True, burst=False)
        wait_until(rounds.done, 30, what="the round to end")
        _, result, _ = rounds.take()
    finally:
        rounds.close()
    assert result.error is None
    assert result.claimed == []
    assert result.next_due is not None and 90 < result.next_due <= 100


def test_the_idle_workers_safety_poll_leaves_the_tasks_it_stands_aside_from_out(
    worker: Worker,
) -> None:
    """The same rule for the idle worker's safety poll, which the housekeeping thread
    looks up on its beat: it reads the tasks to leave out from the main loop's published
    status (``WorkerStatus.skip_tasks``, from ``Recorder.skipped_tasks``)."""
    if connection.vendor != "postgresql":
        pytest.skip("the next-due lookup is PostgreSQL's (elsewhere workers poll)")
    make_job(task_path="app.tasks.new")
    later = make_job()
    Job.objects.filter(pk=later.pk).update(run_after=Now() + timedelta(seconds=100))
    housekeeping = Housekeeping(worker.thread_context(), threading.Event())

    def next_due(status: WorkerStatus) -> float | None:
        worker.status.publish(status)
        housekeeping.tick(beat=True, reap=False)
        [due] = [m for m in worker.inbox.take() if isinstance(m, NextDue)]
        return due.seconds

    assert next_due(WorkerStatus(listening=True)) == pytest.approx(0, abs=1)
    seconds = next_due(WorkerStatus(listening=True, skip_tasks=("app.tasks.new",)))
    assert seconds is not None and 90 < seconds <= 100
