"""Flow control survives hostile jobs and faults, with real ``runworker`` processes: a key
limited to one running job keeps that limit, and gives its slot back, when a job of the
key ends its own process or raises ``KeyboardInterrupt``/``SystemExit``, when the worker
holding the key's slot is SIGKILLed, and when the database drops the worker's connections
in the middle of its flow claims.

The jobs (``tests/tasks_flow_hostile.py``) check the limit from the inside: while one
runs it holds one of its key's ``limit`` slot files locked, and a job that finds none
free writes an ``overlap`` line. That does not depend on how long the jobs run (of two
jobs that overlap, the later one starts while the earlier one holds its file), and the
first test shows it sees jobs that do overlap.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_leasejobs.models import AttemptOutcome, FlowLock, Job, JobAttempt, JobStatus
from tests import tasks_flow_hostile as tasks
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker_harness import Workers, pid_alive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DRAIN_TIMEOUT = 60.0
HOLD = 0.1  # seconds a healthy job works: long enough to overlap if a limit let it

KILLED = "django_leasejobs.exceptions.JobKilled"

HARMS: dict[str, tuple[str, str, str]] = {
    # how: (the outcome of each attempt, its error class, what its message says)
    "os_exit": (AttemptOutcome.KILLED, KILLED, "exited with status 3"),
    "keyboard_interrupt": (AttemptOutcome.ERROR, "builtins.KeyboardInterrupt", ""),
    "system_exit": (AttemptOutcome.ERROR, "builtins.SystemExit", "2"),
}

ENDS_THE_WORKER = (
    "in the thread pool the job's process is the worker's: ending it ends the worker "
    "(docs/workers.md, Isolation)"
)


def _log(marker_dir: str, key: str, kind: str) -> list[tuple[int, int, int]]:
    """The ``kind`` lines of ``key``'s log, in order, as (job id, attempt, pid)."""
    lines = [line.split() for line in read_lines(marker_dir, f"{key}.log")]
    return [(int(job), int(attempt), int(pid)) for k, job, attempt, pid, *_ in lines if k == kind]


def _leases(marker_dir: str, key: str, kind: str) -> list[tuple[int, int]]:
    """The (job id, attempt) of the ``kind`` lines of ``key``'s log, in order."""
    return [(job, attempt) for job, attempt, _ in _log(marker_dir, key, kind)]


def _statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=ids).values_list("id", "status"))


def _succeeded(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids)


def _flow_claims() -> int:
    return sum(FlowLock.objects.values_list("claims", flat=True))


def _assert_each_ran_once(marker_dir: str, key: str, ids: list[int]) -> None:
    """Each job started once and ended once, as its first attempt, and succeeded; none
    left an attempt row."""
    for kind in ("start", "end"):
        runs = [lease for lease in _leases(marker_dir, key, kind) if lease[0] in ids]
        assert sorted(runs) == sorted((job, 1) for job in ids), (kind, runs)
    rows = Job.objects.filter(pk__in=ids).values_list("status", "attempt", "locked_by")
    assert set(rows) == {(JobStatus.SUCCEEDED, 1, None)}, set(rows)
    assert not JobAttempt.objects.filter(job_id__in=ids).exists()


def test_the_overlap_check_sees_jobs_of_a_key_that_run_at_once(
    workers: Workers, marker_dir: str
) -> None:
    """Two jobs without a limit, each waiting until both started, run at once: the
    second one to start finds the only slot file taken and writes an overlap line. (The
    other tests assert there is none.)"""
    jobs = [int(tasks.keyed.enqueue(marker_dir, "free", 1, 0.0, 2).id) for _ in range(2)]
    worker = workers.start(args=["--pool", "thread", "--concurrency", "2"])
    wait_until(lambda: _succeeded(jobs), timeout=DRAIN_TIMEOUT, what="both jobs to finish")
    assert sorted(_leases(marker_dir, "free", "start")) == [(job, 1) for job in sorted(jobs)]
    assert len(_log(marker_dir, "free", "overlap")) == 1, read_lines(marker_dir, "free.log")
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output


def _hostile_cases() -> list[Any]:
    cases = []
    for how in HARMS:
        for pool in ("process", "thread"):
            marks = []
            if how == "os_exit" and pool == "thread":
                marks.append(pytest.mark.skip(reason=ENDS_THE_WORKER))
            cases.append(pytest.param(how, pool, marks=marks, id=f"{how}-{pool}"))
    return cases


@pytest.mark.parametrize(("how", "pool"), _hostile_cases())
def test_a_hostile_job_of_a_key_neither_breaks_its_limit_nor_keeps_its_slot(
    workers: Workers, marker_dir: str, how: str, pool: str
) -> None:
    """Three healthy jobs, a hostile one and three more share the key ``k`` (limit 1) on
    a worker of three slots. The jobs run one at a time, in their claim order; the
    hostile job fails both its attempts with attempt rows saying why; every healthy job
    succeeds exactly once; and the worker, alive, runs a job of the key enqueued after
    all that, then exits 0 on SIGTERM."""
    key = "k"
    healthy_task = tasks.keyed.using(concurrency_key=key)
    hostile_task = tasks.keyed_harm.using(concurrency_key=key, concurrency_limit=1)
    before = [int(healthy_task.enqueue(marker_dir, key, 1, HOLD).id) for _ in range(3)]
    hostile = int(hostile_task.enqueue(marker_dir, key, 1, how).id)
    after = [int(healthy_task.enqueue(marker_dir, key, 1, HOLD).id) for _ in range(3)]
    healthy = before + after
    worker = workers.start(args=["--pool", pool, "--concurrency", "3"])
    wait_until(
        lambda: _succeeded(healthy) and _statuses([hostile])[hostile] == JobStatus.FAILED,
        timeout=DRAIN_TIMEOUT,
        what="the healthy jobs to succeed and the hostile one to fail",
    )
    print(worker.output)  # pytest shows it when an assertion below fails
    assert worker.popen.poll() is None, "the worker died"
    last = int(healthy_task.enqueue(marker_dir, key, 1, 0.0).id)
    wait_until(lambda: _succeeded([last]), timeout=DRAIN_TIMEOUT, what="the last job")
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output

    assert _log(marker_dir, key, "overlap") == [], read_lines(marker_dir, f"{key}.log")
    # One at a time, in claim order (the hostile job's retry came due after the others).
    first_attempts = [job for job, attempt in _leases(marker_dir, key, "start") if attempt == 1]
    assert first_attempts == [*before, hostile, *after, last]
    _assert_each_ran_once(marker_dir, key, [*healthy, last])

    # The hostile job ran both its attempts, neither reached its end, and its rows say why.
    assert [lease for lease in _leases(marker_dir, key, "start") if lease[0] == hostile] == [
        (hostile, 1),
        (hostile, 2),
    ]
    raised = [] if how == "os_exit" else [(hostile, 1), (hostile, 2)]
    assert _leases(marker_dir, key, "raised") == raised
    job = Job.objects.get(pk=hostile)
    assert (job.status, job.attempt, job.locked_by) == (JobStatus.FAILED, 2, None)
    outcome, error_class, says = HARMS[how]
    attempts = list(JobAttempt.objects.filter(job_id=hostile).order_by("attempt"))
    assert [(a.attempt, a.outcome, a.error_class) for a in attempts] == [
        (1, outcome, error_class),
        (2, outcome, error_class),
    ]
    for attempt in attempts:
        assert says in attempt.error_message, attempt.error_message
    if how == "os_exit":
        # Each attempt ended its own slot process; the worker forked a fresh one.
        pids = [pid for job, _, pid in _log(marker_dir, key, "start") if job == hostile]
        assert pids[0] != pids[1], pids


def test_the_slot_of_a_killed_worker_comes_free_only_when_its_lease_expired(
    workers: Workers, marker_dir: str
) -> None:
    """Worker A runs a long job of the key ``k`` (limit 1) while worker B looks for work
    with four more jobs of the key pending. A is SIGKILLed (its job's process dies with
    it). B claims no job of the key before the long job's lease expired (by the
    database's clock), reaps the long job, and runs the others and the long job's attempt
    2, each exactly once, one at a time. (A slot is freed when its lease expires, before
    any reaper runs: docs/flow-control.md, "A slot is a lease".)"""
    key = "k"
    long_job = int(tasks.keyed_until_gate.using(concurrency_key=key).enqueue(marker_dir, key, 1).id)
    healthy_task = tasks.keyed.using(concurrency_key=key)
    rest = [int(healthy_task.enqueue(marker_dir, key, 1, HOLD).id) for _ in range(4)]
    a_id, b_id = (f"flow-hostile-{name}-{uuid.uuid4().hex[:8]}" for name in "ab")
    worker_a = workers.start(args=["--concurrency", "2", "--worker-id", a_id])
    [(job, attempt, long_pid)] = wait_until(
        lambda: _log(marker_dir, key, "start"), timeout=DRAIN_TIMEOUT, what="the long job"
    )
    assert (job, attempt) == (long_job, 1)
    worker_b = workers.start(args=["--concurrency", "2", "--worker-id", b_id])
    # Both workers look again and again (a job held back by a full limit keeps idle
    # workers polling); none of their claims takes a job of the key.
    looked = _flow_claims()
    wait_until(lambda: _flow_claims() >= looked + 6, timeout=DRAIN_TIMEOUT, what="more claims")
    assert set(_statuses(rest).values()) == {JobStatus.PENDING}
    assert len(_log(marker_dir, key, "start")) == 1

    worker_a.kill()
    assert worker_a.wait(timeout=15) == -9
    leases: list[datetime] = []

    def reaped() -> bool:
        # Once reaped, the job is pending, or running again as attempt 2 already (the
        # reaper wakes B at once): only attempt 1's lease is of interest.
        row = Job.objects.values("status", "attempt", "locked_until").get(pk=long_job)
        if (row["status"], row["attempt"]) == (JobStatus.RUNNING, 1):
            leases.append(row["locked_until"])  # (a renewal sent before the kill may land)
            return False
        return True

    wait_until(reaped, timeout=DRAIN_TIMEOUT, interval=0.02, what="the long job to be reaped")
    assert leases, "the long job was reaped before its lease was read"
    expired_at = max(leases)
    assert not pid_alive(long_pid), "the long job's process outlived its worker"
    (Path(marker_dir) / f"{key}.gate").touch()  # attempt 2 may end
    wait_until(
        lambda: _succeeded([long_job, *rest]),
        timeout=DRAIN_TIMEOUT,
        what="every job to succeed",
    )
    print(worker_b.output)
    assert worker_b.popen.poll() is None, "worker B died"
    worker_b.terminate()
    assert worker_b.wait(timeout=15) == 0, worker_b.output

    assert _log(marker_dir, key, "overlap") == [], read_lines(marker_dir, f"{key}.log")
    # The long job: attempt 1 started on A and never ended, attempt 2 ran once on B.
    assert [lease for lease in _leases(marker_dir, key, "start") if lease[0] == long_job] == [
        (long_job, 1),
        (long_job, 2),
    ]
    assert [lease for lease in _leases(marker_dir, key, "end") if lease[0] == long_job] == [
        (long_job, 2)
    ]
    job = Job.objects.get(pk=long_job)
    assert (job.status, job.attempt, job.last_worker) == (JobStatus.SUCCEEDED, 2, b_id)
    [stalled] = JobAttempt.objects.filter(job_id=long_job)
    assert (stalled.attempt, stalled.outcome, stalled.worker) == (
        1,
        AttemptOutcome.LEASE_EXPIRED,
        a_id,
    )
    assert f"reaped job {long_job} attempt 1 of worker {a_id} -> pending" in worker_b.output
    # The others ran once each, on B, claimed no earlier than the lease's expiry.
    _assert_each_ran_once(marker_dir, key, rest)
    claimed = dict(Job.objects.filter(pk__in=rest).values_list("id", "last_attempted_at"))
    early = {job: at for job, at in claimed.items() if at < expired_at}
    assert not early, f"claimed before the lease expired at {expired_at}: {early}"
    assert set(Job.objects.filter(pk__in=rest).values_list("last_worker", flat=True)) == {b_id}
    before_reap = sorted(job for job, at in claimed.items() if at < stalled.finished_at)
    print(
        f"lease expired at {expired_at}, reaped at {stalled.finished_at}; "
        f"claimed after the expiry but before the reap: {before_reap}"
    )


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="finds the connection inside a flow claim by its lock on leasejobs_flow_lock "
    "(pg_locks) and cuts it with pg_terminate_backend(): PostgreSQL only",
)

IN_A_FLOW_CLAIM = (
    "SELECT DISTINCT l.pid FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation "
    "WHERE c.relname = 'leasejobs_flow_lock' AND l.pid <> pg_backend_pid() "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
"""The backends inside a flow claim: the claim's first statement updates the flow lock's
row, and the table lock it took is held until the claim's transaction ends."""


def _cut_inside_a_flow_claim() -> int:
    """Terminate the connections seen inside a flow claim; how many there were."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
            f"FROM ({IN_A_FLOW_CLAIM}) AS f"
        )
        return int(cursor.fetchone()[0])


def _cut_the_others() -> int:
    """Terminate every other connection to the test database (the heartbeat's, the
    listener's); how many there were."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def _other_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@postgresql_only
def test_flow_claims_cut_off_by_the_database_keep_the_limits_and_run_each_job_once(
    workers: Workers, marker_dir: str
) -> None:
    """A worker of three slots drains 60 jobs of the key ``a`` (limit 1) and 60 of ``b``
    (limit 2), each run by a flow claim. Three times, the test terminates the worker's
    connection while it is inside a flow claim (its transaction holds the flow lock),
    and right after every other connection of the worker. The worker reconnects each
    time; every job succeeds, its code ran exactly once, and neither key ever ran more
    jobs at once than its limit. A claim whose outcome was lost with the connection
    only delays its jobs: their lease expires, the reaper puts them back (an attempt row
    says so), and they run as their next attempt."""
    limits = {"a": 1, "b": 2}
    ids: dict[str, list[int]] = {}
    for key, limit in limits.items():
        task = tasks.keyed.using(concurrency_key=key, concurrency_limit=limit)
        ids[key] = [int(task.enqueue(marker_dir, key, limit, 0.02).id) for _ in range(60)]
    every = [job for jobs in ids.values() for job in jobs]
    worker = workers.start(args=["--concurrency", "3"])
    cuts: list[tuple[int, int]] = []  # (inside a flow claim, the others)
    for _ in range(3):
        done = Job.objects.filter(pk__in=every, status=JobStatus.SUCCEEDED).count()
        # Once the worker got on with the backlog since the last cut, with its
        # connections back: cut the one inside a flow claim the moment there is one.
        wait_until(
            lambda done=done: (
                Job.objects.filter(pk__in=every, status=JobStatus.SUCCEEDED).count() >= done + 5
                and _other_connections() >= 2
            ),
            timeout=DRAIN_TIMEOUT,
            what="progress since the last cut",
        )
        inside = wait_until(
            _cut_inside_a_flow_claim, timeout=20, interval=0.001, what="a flow claim to cut"
        )
        cuts.append((inside, _cut_the_others()))
    assert not _succeeded(every), "the backlog drained before the last cut"
    wait_until(
        lambda: _succeeded(every),
        timeout=DRAIN_TIMEOUT,
        what="every job to succeed",
    )
    print(worker.output)
    print(f"connections cut (inside a flow claim, the others): {cuts}")
    assert worker.popen.poll() is None, "the worker died"
    assert "database error in the worker" in worker.output
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output

    for key, jobs in ids.items():
        assert _log(marker_dir, key, "overlap") == [], (key, read_lines(marker_dir, f"{key}.log"))
        # Each job's code started and ended exactly once, as its last attempt.
        final = dict(Job.objects.filter(pk__in=jobs).values_list("id", "attempt"))
        for kind in ("start", "end"):
            assert sorted(_leases(marker_dir, key, kind)) == sorted(final.items()), kind
        # Its earlier attempts never ran: their claims were lost, and reaped.
        reaped = set(
            JobAttempt.objects.filter(job_id__in=jobs).values_list("job_id", "attempt", "outcome")
        )
        expected = {
            (job, attempt, AttemptOutcome.LEASE_EXPIRED)
            for job, last in final.items()
            for attempt in range(1, last)
        }
        assert reaped == expected, (key, reaped)
        print(f"key {key}: jobs claimed again after a lost claim: {len(reaped)}")
