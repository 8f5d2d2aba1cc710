"""No job can stop a worker: hostile outcomes, broken exceptions and locked rows stay with
their own job (issue 9, cases 1-6), in both pools, with real ``runworker`` subprocesses.

Every test runs the bad jobs beside healthy ones and checks that the bad job ends in a
clear terminal state with an attempt row saying why, that every healthy job succeeds
(once), and that the worker is still alive and claiming (``--burst`` exits 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.models import Worker as WorkerRow
from tests import tasks_worker_poison as poison
from tests.helpers_leases import locked_elsewhere, refusing_to_finish
from tests.tasks_worker_shutdown import record_job, slow_job
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

POOLS = ["process", "thread"]
BURST_BOUND = 90  # seconds: a wedged worker never exits; a healthy one takes a few

INVALID_ARGUMENTS = "django_leasejobs.exceptions.InvalidTaskArguments"


def _healthy(marker_dir: str, count: int = 6) -> list[int]:
    return [int(record_job.enqueue(marker_dir, "healthy").id) for _ in range(count)]


def _assert_healthy_ran_once(ids: list[int], marker_dir: str) -> None:
    statuses = dict(Job.objects.filter(pk__in=ids).values_list("id", "status"))
    assert set(statuses.values()) == {JobStatus.SUCCEEDED}, statuses
    runs = (Path(marker_dir) / "healthy.runs").read_text().splitlines()
    assert sorted(int(line.split()[0]) for line in runs) == sorted(ids)
    assert set(Job.objects.filter(pk__in=ids).values_list("attempt", flat=True)) == {1}


def _attempts(job_id: int) -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt"))


@pytest.mark.parametrize("pool", POOLS)
def test_poison_outcomes_fail_their_own_job_and_the_worker_goes_on(
    workers, marker_dir: str, pool: str
) -> None:
    # Enqueued first, so claimed first: with one slot, every healthy job runs after them.
    bad = {
        "return_nul": poison.return_nul.enqueue(),
        "raise_nul": poison.raise_nul.enqueue(),
        "raise_long_class_path": poison.raise_long_class_path.enqueue(),
        "raise_lone_surrogate": poison.raise_lone_surrogate.enqueue(),
        "raise_keyboard_interrupt": poison.raise_keyboard_interrupt.enqueue(),
        "raise_unprintable": poison.raise_unprintable.enqueue(),
    }
    ids = {name: int(result.id) for name, result in bad.items()}
    progress = int(poison.progress_nul.enqueue(60).id)
    healthy = _healthy(marker_dir)

    worker = workers.start(args=["--pool", pool, "--concurrency", "1", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output

    _assert_healthy_ran_once(healthy, marker_dir)
    jobs = {name: Job.objects.get(pk=job_id) for name, job_id in ids.items()}
    for name, job in jobs.items():
        assert job.status == JobStatus.FAILED, (name, job.status, job.last_error)
        assert job.locked_by is None
        assert job.finished_at is not None

    # A result the database cannot store is refused: not retryable, nothing stored.
    [attempt] = _attempts(ids["return_nul"])
    assert (attempt.outcome, attempt.error_class) == (AttemptOutcome.ERROR, INVALID_ARGUMENTS)
    assert "NUL" in attempt.error_message, attempt.error_message
    assert jobs["return_nul"].result is None

    # Errors are stored escaped or cut, and retried like any error (two attempts each).
    raised = {name: _attempts(job_id) for name, job_id in ids.items() if name != "return_nul"}
    for name, attempts in raised.items():
        assert [a.attempt for a in attempts] == [1, 2], name
        assert {a.outcome for a in attempts} == {AttemptOutcome.ERROR}, name
    nul = raised["raise_nul"][0]
    assert (nul.error_class, nul.error_message) == ("builtins.ValueError", "bad \\x00 byte")
    assert jobs["raise_nul"].last_error == "builtins.ValueError: bad \\x00 byte"
    long_path = raised["raise_long_class_path"][0].error_class
    assert len(long_path) == 512
    assert long_path.startswith("tests.tasks_worker_poison.VeryLongLong")
    assert long_path.endswith("characters]")
    surrogate = raised["raise_lone_surrogate"][0]
    assert surrogate.error_message == "half a pair: \\ud800"
    interrupt = raised["raise_keyboard_interrupt"][0]
    assert interrupt.error_class == "builtins.KeyboardInterrupt"
    assert "KeyboardInterrupt" in interrupt.traceback
    unprintable = raised["raise_unprintable"][0]
    assert unprintable.error_class == "tests.tasks_worker_poison.Unprintable"
    assert unprintable.error_message == "<unprintable Unprintable: str() raised RuntimeError>"
    assert "Unprintable" in unprintable.traceback

    # Progress no column can hold is stored escaped (the task saw it on its row: "finished");
    # the job's heartbeats carried on, and its success cleared the message.
    job = Job.objects.get(pk=progress)
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 1), job.last_error
    assert job.result == "finished"
    assert job.progress_message == ""
    assert not JobAttempt.objects.filter(job_id=progress).exists()


@pytest.mark.parametrize("pool", POOLS)
def test_rows_with_wrong_json_types_fail_as_their_own_attempt(
    workers, marker_dir: str, pool: str
) -> None:
    # Rows written by hand or by another program: kwargs an array, args an object or a
    # string. Nothing may be called with them.
    bad_kwargs = int(record_job.enqueue(marker_dir, "malformed").id)
    bad_args = int(record_job.enqueue(marker_dir, "malformed").id)
    string_args = int(record_job.enqueue(marker_dir, "malformed").id)
    Job.objects.filter(pk=bad_kwargs).update(kwargs=[1, 2])
    Job.objects.filter(pk=bad_args).update(args={"marker_dir": marker_dir})
    Job.objects.filter(pk=string_args).update(args="marker")
    healthy = _healthy(marker_dir)

    worker = workers.start(args=["--pool", pool, "--concurrency", "1", "--burst"])
    assert worker.wait(timeout=BURST_BOUND) == 0, worker.output

    _assert_healthy_ran_once(healthy, marker_dir)
    assert not (Path(marker_dir) / "malformed.runs").exists(), "a malformed row was called"
    expected = {
        bad_kwargs: "kwargs is a JSON array, not an object",
        bad_args: "args is a JSON object, not an array",
        string_args: "args is a JSON string, not an array",
    }
    for job_id, why in expected.items():
        job = Job.objects.get(pk=job_id)
        # Failed for good at once: the row will not get better on a retry.
        assert (job.status, job.attempt) == (JobStatus.FAILED, 1), job.last_error
        [attempt] = _attempts(job_id)
        assert attempt.error_class == INVALID_ARGUMENTS
        assert why in attempt.error_message, attempt.error_message
        assert "nothing was called" in attempt.error_message


@pytest.mark.parametrize("pool", POOLS)
def test_an_outcome_the_database_refuses_is_given_up_and_reaped(
    workers, marker_dir: str, pool: str
) -> None:
    # The job succeeds every time, but the database refuses to record it (and the
    # fallback failure too). The worker must stop renewing that lease instead of
    # retrying for ever, say so on its registry row, and go on with the others; the
    # reaper takes the job back, and MAX_STALLS makes it a dead letter.
    refused = int(record_job.using(max_stalls=2, max_attempts=5).enqueue(marker_dir, "r").id)
    with refusing_to_finish(refused):
        healthy = _healthy(marker_dir)
        worker = workers.start(args=["--pool", pool, "--concurrency", "2"])
        row = WorkerRow.objects.filter(state="running")
        # (Its problem may name a stretched lease first, on a loaded machine: the give-up
        # joins it.)
        wait_until(
            lambda: row.filter(problem__contains="gave up recording").exists(),
            timeout=30,
            what=lambda: (
                "the worker to report the attempt it gave up (problem: "
                f"{list(row.values_list('problem', flat=True))})"
            ),
        )
        problem = row.get().problem
        assert "gave up recording 1 attempt(s) since it started" in problem, problem
        assert f"job {refused} attempt 1" in problem, problem
        assert "refused by the test trigger" in problem, problem
        wait_until(
            lambda: Job.objects.filter(pk=refused, status=JobStatus.DEAD).exists(),
            timeout=45,
            what="the refused job to be reaped twice and dead-lettered",
        )
        _assert_healthy_ran_once(healthy, marker_dir)
        # Still claiming after giving up twice.
        later = _healthy(marker_dir, 3)
        wait_until(
            lambda: Job.objects.filter(pk__in=later, status=JobStatus.SUCCEEDED).count() == 3,
            timeout=30,
            what="jobs enqueued after the give-ups to succeed",
        )

    job = Job.objects.get(pk=refused)
    assert (job.stall_count, job.attempt, job.locked_by) == (2, 2, None)
    assert [(a.attempt, a.outcome) for a in _attempts(refused)] == [
        (1, AttemptOutcome.LEASE_EXPIRED),
        (2, AttemptOutcome.LEASE_EXPIRED),
    ]
    runs = (Path(marker_dir) / "r.runs").read_text().splitlines()
    assert [line.split()[1] for line in runs] == ["1", "2"], "each attempt ran once"
    assert worker.popen.poll() is None, worker.output
    assert "could not record job" in worker.output
    worker.terminate()
    assert worker.wait(timeout=20) == 0, worker.output


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite triggers raise constraint errors only"
)
@pytest.mark.parametrize("pool", POOLS)
def test_an_outcome_that_fails_its_whole_round_is_isolated_then_given_up(
    workers, marker_dir: str, pool: str
) -> None:
    # The database fails every round that carries this job's outcome as if the moment
    # were wrong (query_canceled / ER_QUERY_INTERRUPTED), not the row, while it keeps
    # renewing the lease. The worker retries (a slow or failing write is no fault), then
    # writes the outcome alone (issue 27: ISOLATE_AFTER), and gives it up when that fails
    # too. Outcomes that shared its rounds are recorded, each job ran once.
    refused = int(record_job.using(max_stalls=1).enqueue(marker_dir, "r").id)
    with refusing_to_finish(refused, as_connection_error=True):
        healthy = _healthy(marker_dir)
        worker = workers.start(args=["--pool", pool, "--concurrency", "2"])
        row = WorkerRow.objects.filter(state="running")
        wait_until(
            lambda: "gave up recording" in (row.values_list("problem", flat=True).first() or ""),
            timeout=60,
            what="the worker to give the outcome up",
        )
        problem = row.get().problem
        assert f"job {refused} attempt 1" in problem, problem
        assert "while it renewed the lease, 2 of them alone" in problem, problem
        wait_until(
            lambda: Job.objects.filter(pk__in=healthy, status=JobStatus.SUCCEEDED).count() == 6,
            timeout=30,
            what="the healthy jobs to be recorded",
        )
        _assert_healthy_ran_once(healthy, marker_dir)
        wait_until(
            lambda: Job.objects.filter(pk=refused, status=JobStatus.DEAD).exists(),
            timeout=30,
            what="the given-up job to be reaped (MAX_STALLS 1: dead)",
        )
    runs = (Path(marker_dir) / "r.runs").read_text().splitlines()
    assert [line.split()[1] for line in runs] == ["1"], "the refused job ran once"
    assert worker.popen.poll() is None, worker.output
    worker.terminate()
    assert worker.wait(timeout=20) == 0, worker.output


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no row lock another session could hold (it serialises writers)",
)
@pytest.mark.parametrize("pool", POOLS)
def test_a_row_locked_elsewhere_never_costs_the_other_jobs_their_leases(
    workers, marker_dir: str, pool: str
) -> None:
    # Two healthy jobs run for longer than the lease (2 s); a third job's row is locked by
    # another session (an admin edit, a migration, a stray SELECT ... FOR UPDATE) while
    # they run. Renewals must skip that row and renew the others: no re-runs.
    long_jobs = [int(slow_job.enqueue(marker_dir, "long", 4.0).id) for _ in range(2)]
    locked = int(slow_job.enqueue(marker_dir, "locked", 6.0).id)
    worker = workers.start(args=["--pool", pool, "--concurrency", "3"])
    started = Path(marker_dir) / "locked.started"
    wait_until(started.exists, timeout=20, what="the job to lock to start")

    with locked_elsewhere(locked):
        wait_until(
            lambda: Job.objects.filter(pk__in=long_jobs, status=JobStatus.SUCCEEDED).count() == 2,
            timeout=30,
            what="the long jobs to succeed while the other row is locked",
        )
    # Both ran once, as their first attempt: their leases were renewed all along.
    assert set(Job.objects.filter(pk__in=long_jobs).values_list("attempt", flat=True)) == {1}
    assert not JobAttempt.objects.filter(job_id__in=long_jobs).exists()
    assert "renewal skipped 1 leases" in worker.output

    # The locked job could not be renewed for longer than its lease: it was stopped on
    # the normal lost-lease path, reaped once the lock was gone, and ran again.
    wait_until(
        lambda: Job.objects.filter(pk=locked, status=JobStatus.SUCCEEDED).exists(),
        timeout=45,
        what="the once-locked job to be reaped and succeed",
    )
    job = Job.objects.get(pk=locked)
    assert job.attempt == 2
    [attempt] = _attempts(locked)
    assert (attempt.attempt, attempt.outcome) == (1, AttemptOutcome.LEASE_EXPIRED)
    assert "lease lost for job" in worker.output
    assert worker.popen.poll() is None, worker.output
    worker.terminate()
    assert worker.wait(timeout=20) == 0, worker.output
