"""A database whose renewals grow slow costs no lease: the worker asks for longer ones.

A trigger makes each renewal of a running job's lease sleep in the database server
(claims and outcome writes stay fast), a little longer each time: ``RAMP`` seconds times
its number, at most ``RAMP_TOP``, as load that builds up. The heartbeat sends a renewal
when the one before came back, so with the tests' 2 s leases the fifth renewal comes back
2.25 s after the fourth was sent (1 s + 1.25 s), past the 1.9 s local deadline of a
2 s lease with heartbeats every 0.1 s. Without stretching its leases, the worker would
call the lease lost there, stop the job, and the reaper would give it to a second run.
With them (``worker/lease_length.py``), the job runs once, at attempt 1, and the row
shows the longer lease while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_leasejobs.models import Job, JobAttempt, JobStatus
from django_leasejobs.models import Worker as WorkerRow
from tests import tasks_worker_flow
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker_harness import FAST_OPTIONS, Workers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor not in ("postgresql", "mysql"),
        reason="slows renewals with a server-side trigger that sleeps (pg_sleep, SLEEP)",
    ),
]

RAMP = 0.25
"""The n-th renewal of a running job sleeps ``RAMP * n`` seconds in the server ..."""
RAMP_TOP = 2.0
"""... at most this long."""

_TRIGGER = "leasejobs_test_slow_renewal"
_COUNTER = "leasejobs_test_renewals"


@pytest.fixture
def slow_renewals() -> Iterator[None]:
    """Install the counter and the trigger; drop both whatever happens (a flush keeps
    them)."""
    sleep = f"LEAST({RAMP_TOP}, {RAMP} * renewals)"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {_COUNTER} (n integer NOT NULL)")
        cursor.execute(f"INSERT INTO {_COUNTER} (n) VALUES (0)")
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {_TRIGGER}() RETURNS trigger AS $$ "
                "DECLARE renewals integer; "
                f"BEGIN UPDATE {_COUNTER} SET n = n + 1 RETURNING n INTO renewals; "
                f"PERFORM pg_sleep({sleep}); RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {_TRIGGER} BEFORE UPDATE ON leasejobs_job FOR EACH ROW "
                "WHEN (OLD.status = 'running' AND NEW.status = 'running' "
                "AND NEW.locked_until IS DISTINCT FROM OLD.locked_until) "
                f"EXECUTE FUNCTION {_TRIGGER}()"
            )
        else:
            cursor.execute(
                f"CREATE TRIGGER {_TRIGGER} BEFORE UPDATE ON leasejobs_job FOR EACH ROW "
                "BEGIN DECLARE renewals integer; "
                "IF OLD.status = 'running' AND NEW.status = 'running' "
                "AND NOT (NEW.locked_until <=> OLD.locked_until) THEN "
                f"UPDATE {_COUNTER} SET n = n + 1; "
                f"SELECT n INTO renewals FROM {_COUNTER}; "
                f"DO SLEEP({sleep}); END IF; END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER} ON leasejobs_job")
                cursor.execute(f"DROP FUNCTION IF EXISTS {_TRIGGER}()")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER}")
            cursor.execute(f"DROP TABLE IF EXISTS {_COUNTER}")


def _renewals() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {_COUNTER}")
        return int(cursor.fetchone()[0])


def _lease_seconds(job_id: int) -> float:
    """How long a lease the job's row holds: ``locked_until`` less the last renewal."""
    job = Job.objects.get(pk=job_id)
    if job.locked_until is None or job.heartbeat_at is None:
        return 0.0
    return (job.locked_until - job.heartbeat_at).total_seconds()


def _problem(worker_id: str) -> str:
    row = WorkerRow.objects.filter(pk=worker_id).first()
    return "" if row is None else row.problem


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_slow_renewals_stretch_the_lease_and_the_job_runs_once(
    workers: Workers, marker_dir: str, slow_renewals: None, pool: str
) -> None:
    lease = FAST_OPTIONS["LEASE_DURATION"]
    job_id = int(tasks_worker_flow.wait_for_gate.enqueue(marker_dir, "held").id)
    worker_id = f"slow-{pool}"
    worker = workers.start(
        options={"HEARTBEAT_INTERVAL": 0.1},
        args=["--pool", pool, "--concurrency", "1", "--worker-id", worker_id],
    )
    wait_until(lambda: read_lines(marker_dir, "held.started"), what="the job to start")
    # Renewed with a longer lease than LEASE_DURATION ...
    wait_until(
        lambda: _lease_seconds(job_id) > lease + 0.5,
        timeout=20,
        what=lambda: f"a stretched lease (the row holds {_lease_seconds(job_id):.2f}s)",
    )
    # ... which the worker's registry row reports (the admin, leasejobs_status) ...
    wait_until(
        lambda: "leases stretched to" in _problem(worker_id),
        timeout=20,
        what=lambda: f"the stretch on the registry row (problem: {_problem(worker_id)!r})",
    )
    # ... and renewed on, each slower, until they take RAMP_TOP (past the local deadline
    # of LEASE_DURATION two renewals in a row) and twice more.
    top = int(RAMP_TOP / RAMP) + 2
    wait_until(lambda: _renewals() >= top, timeout=60, what=f"{top} renewals")
    (Path(marker_dir) / "held.gate").touch()
    wait_until(
        lambda: Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED,
        timeout=30,
        what=lambda: f"the job to succeed ({Job.objects.get(pk=job_id).status})",
    )
    job = Job.objects.get(pk=job_id)
    assert (job.attempt, job.stall_count) == (1, 0), worker.output
    assert not JobAttempt.objects.filter(job_id=job_id).exists(), worker.output
    assert len(read_lines(marker_dir, "held.started")) == 1, worker.output
    worker.terminate()
    assert worker.wait(timeout=30) == 0, worker.output
