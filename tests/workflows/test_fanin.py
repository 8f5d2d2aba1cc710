"""Fan-in counters (leases/fanin.py): a step with more than ``FANIN_WIDTH`` parents counts
them in several rows of contiguous positions, and its parents' settles take its row lock
only when a counter reaches zero. In-process (``run_jobs``), on both paths of the lease
protocol where the database has them; the width is lowered by patching the constant
(only the workflow's writer reads it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections

from django_leasejobs import leases
from django_leasejobs.leases import fanin
from django_leasejobs.models import Dependency, FanIn, Job, JobStatus
from django_leasejobs.testing import run_jobs
from django_leasejobs.workflows import cancel_workflow, chord, group, retry_failed_steps, step
from tests import tasks_workflows as t

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def width(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(fanin, "FANIN_WIDTH", 8)
    return 8


def wide_chord(members: int, *, callback: Any = None, boom_at: int | None = None) -> Any:
    parts = [step(t.boom) if n == boom_at else step(t.value, n) for n in range(members)]
    return chord(group(*parts), callback or step(t.total)).enqueue()


def counters_of(child: int) -> list[tuple[int, int]]:
    return list(FanIn.objects.filter(child_id=child).order_by("id").values_list("id", "remaining"))


def test_runs_are_contiguous_and_as_even_as_can_be() -> None:
    assert fanin.waits_for(fanin.FANIN_WIDTH) == fanin.FANIN_WIDTH
    assert fanin.runs(fanin.FANIN_WIDTH) == []
    assert fanin.waits_for(fanin.FANIN_WIDTH + 1) == 2
    assert fanin.runs(200) == [50, 50, 50, 50]
    assert Counter(fanin.runs(10_000)) == {63: 48, 64: 109}
    assert sum(fanin.runs(10_001)) == 10_001


def test_a_wide_chord_of_200_members_releases_its_callback_once(lease_path: str) -> None:
    result = wide_chord(200)
    callback = int(result.steps[-1].id)
    assert [remaining for _, remaining in counters_of(callback)] == [50, 50, 50, 50]
    assert Job.objects.get(pk=callback).waiting_on == 4
    # Each counter holds a contiguous run of positions, in counter id order.
    edges = list(
        Dependency.objects.filter(child_id=callback)
        .order_by("position")
        .values_list("fanin_id", "parent_id")
    )
    assert [fanin_id for fanin_id, _ in edges] == sorted(fanin_id for fanin_id, _ in edges)
    assert Counter(fanin_id for fanin_id, _ in edges) == dict.fromkeys(
        (i for i, _ in counters_of(callback)), 50
    )
    assert all(a < b for (_, a), (_, b) in pairwise(edges))  # members in id order

    from django_leasejobs.queues import waiting_reasons

    [reason] = waiting_reasons(Job.objects.get(pk=callback))
    assert "it waits for 200 of its 200 parent steps" in reason
    run_jobs(max_jobs=199)
    row = Job.objects.get(pk=callback)
    [reason] = waiting_reasons(row)
    assert "it waits for 1 of its 200 parent steps" in reason
    assert (row.status, row.waiting_on) == (JobStatus.WAITING, 1)
    assert [remaining for _, remaining in counters_of(callback)] == [0, 0, 0, 1]
    runs = run_jobs()
    assert [run.task_path for run in runs] == ["tests.tasks_workflows.value", t.total.module_path]
    row.refresh_from_db()
    assert (row.status, row.waiting_on, row.attempt) == (JobStatus.SUCCEEDED, 0, 1)
    assert row.result == sum(range(200))


def test_a_narrow_chord_keeps_direct_counting(width: int) -> None:
    result = wide_chord(width)
    callback = int(result.steps[-1].id)
    assert not FanIn.objects.exists()
    assert not Dependency.objects.filter(fanin__isnull=False).exists()
    assert Job.objects.get(pk=callback).waiting_on == width
    run_jobs()
    assert Job.objects.get(pk=callback).result == sum(range(width))


def test_a_failed_member_ends_the_callback_unrun(width: int, lease_path: str) -> None:
    result = wide_chord(30, boom_at=17)
    callback = int(result.steps[-1].id)
    runs = run_jobs()
    assert Counter(run.status for run in runs) == {"succeeded": 29, "failed": 1}
    row = Job.objects.get(pk=callback)
    assert (row.status, row.attempt) == (JobStatus.FAILED, 0)
    assert f"parent step #{result.steps[17].id} (tests.tasks_workflows.boom)" in row.last_error


def test_a_finaliser_runs_once_every_member_ended(width: int, lease_path: str) -> None:
    result = wide_chord(30, callback=step(t.finaliser, on_parent_failure="run"), boom_at=3)
    callback = int(result.steps[-1].id)
    run_jobs()
    row = Job.objects.get(pk=callback)
    assert (row.status, row.attempt, row.waiting_on) == (JobStatus.SUCCEEDED, 1, 0)
    boom = int(result.steps[3].id)
    assert row.result == {
        "parent_results": [None if n == 3 else n for n in range(30)],
        "failed": [[boom, "failed", "tests.tasks_workflows.boom"]],
    }


def test_cancelling_a_member_ends_the_callback_and_cancel_workflow_works(width: int) -> None:
    result = wide_chord(20)
    assert leases.cancel(int(result.steps[5].id)).value == "cancelled"
    assert Job.objects.get(pk=result.steps[-1].id).status == JobStatus.FAILED
    done = cancel_workflow(result.id)
    assert (done.cancelled, done.requested) == (19, 0)


def test_retry_failed_steps_resets_the_counters(width: int, lease_path: str) -> None:
    result = wide_chord(30, boom_at=17)
    callback = int(result.steps[-1].id)
    run_jobs()
    assert retry_failed_steps(result.id) == 2
    row = Job.objects.get(pk=callback)
    # Only the counter of the failed member is open again, at one.
    assert (row.status, row.waiting_on) == (JobStatus.WAITING, 1)
    assert sorted(remaining for _, remaining in counters_of(callback)) == [0, 0, 0, 1]
    runs = run_jobs()
    assert [run.status for run in runs] == ["failed"]  # boom fails again
    assert Job.objects.get(pk=callback).status == JobStatus.FAILED


def test_the_reaper_repairs_a_callback_whose_members_finished_unsettled(width: int) -> None:
    result = wide_chord(20)
    callback = int(result.steps[-1].id)
    # A write that did not settle (by hand): every member succeeded, the callback waits.
    Job.objects.filter(pk__in=[s.id for s in result.steps[:-1]]).update(
        status=JobStatus.SUCCEEDED, result=1
    )
    leases.reap()
    assert Job.objects.get(pk=callback).status == JobStatus.PENDING
    run_jobs()
    assert Job.objects.get(pk=callback).result == 20


def test_pruning_deletes_the_counters_with_their_step(width: int) -> None:
    from datetime import timedelta

    from django_leasejobs.pruning import prune

    wide_chord(20)
    run_jobs()
    assert FanIn.objects.count() == 3
    assert prune(older_than=timedelta(seconds=-60)).count == 21
    assert not FanIn.objects.exists() and not Dependency.objects.exists()


def test_a_member_deduplicated_against_a_finished_job(width: int) -> None:
    holder = t.value.using(key="daily", unique_for=3600).enqueue(100)
    run_jobs()
    keyed = t.value.using(key="daily", unique_for=3600)
    parts = [step(keyed, 0) if n == 0 else step(t.value, n) for n in range(20)]
    result = chord(group(*parts), step(t.total)).enqueue()
    callback = int(result.steps[-1].id)
    assert result.steps[0].id == holder.id
    # The holder had succeeded: taken from its counter when the workflow was written.
    assert [remaining for _, remaining in counters_of(callback)] == [5, 7, 7]
    run_jobs()
    row = Job.objects.get(pk=callback)
    assert (row.status, row.result) == (JobStatus.SUCCEEDED, 100 + sum(range(1, 20)))


def test_a_member_deduplicated_against_a_running_job(width: int) -> None:
    keyed = t.value.using(key="shared")
    holder = keyed.enqueue(100)
    [claimed] = leases.claim("w1", limit=1, lease_duration=30)
    assert claimed.id == int(holder.id)
    parts = [step(keyed, 0) if n == 0 else step(t.value, n) for n in range(20)]
    result = chord(group(*parts), step(t.total)).enqueue()
    callback = int(result.steps[-1].id)
    run_jobs()
    assert Job.objects.get(pk=callback).status == JobStatus.WAITING
    leases.complete_many("w1", [leases.Completion(claimed.id, claimed.attempt, 100)])
    assert Job.objects.get(pk=callback).status == JobStatus.PENDING
    run_jobs()
    assert Job.objects.get(pk=callback).result == 100 + sum(range(1, 20))


# ------------------------------------------------------------------ round trips


def test_the_counters_are_written_in_one_statement(width: int) -> None:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        result = wide_chord(100)
    counters = [q["sql"] for q in captured.captured_queries if "leasejobs_fanin" in q["sql"]]
    assert len(counters) == (1 if connection.features.can_return_rows_from_bulk_insert else 13)
    assert FanIn.objects.filter(child_id=result.steps[-1].id).count() == 13


def test_a_wide_chord_is_enqueued_in_one_round_trip_per_statement_kind(width: int) -> None:
    from tests.bench.scripts import load_bench

    if not leases.can_copy(DEFAULT_DB_ALIAS):
        pytest.skip("COPY: PostgreSQL with psycopg 3")
    members = [step(t.value, n) for n in range(500)]
    canvas = chord(group(*members), step(t.total))
    with load_bench("workflows").RoundTrips() as trips:
        canvas.enqueue()
    assert trips.kinds["INSERT leasejobs_fanin"] == 1
    assert trips.kinds["COPY leasejobs_dependency"] == 1
    assert trips.kinds["COPY leasejobs_job"] == 1
    assert max(trips.kinds.values()) == 1, trips.kinds
    assert FanIn.objects.count() == 63


# ------------------------------------------------- no lock every member waits on


@pytest.fixture
def callback_locked_elsewhere() -> Iterator[Any]:
    """``hold(job_id)`` locks a job's row from another connection until the test ends;
    this test's own connection waits at most 2 s for a lock (then the write fails)."""
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("row locks held by another session: PostgreSQL and MySQL/MariaDB")
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    other.set_autocommit(False)
    short = (
        "SET lock_timeout = '2s'"
        if connection.vendor == "postgresql"
        else "SET SESSION innodb_lock_wait_timeout = 2"
    )
    with connection.cursor() as cursor:
        cursor.execute(short)

    def hold(job_id: int) -> None:
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [job_id]
            )

    try:
        yield hold
    finally:
        other.rollback()
        other.close()
        connection.close()  # (its lock timeout goes with it)


def test_a_members_settle_takes_no_callback_lock_until_its_counter_empties(
    width: int, lease_path: str, callback_locked_elsewhere: Any
) -> None:
    result = wide_chord(16)  # two counters of 8
    callback = int(result.steps[-1].id)
    claimed = {c.id: c for c in leases.claim("w1", limit=16, lease_duration=60)}
    assert len(claimed) == 16
    first, second = [int(s.id) for s in result.steps[:8]], [int(s.id) for s in result.steps[8:16]]
    callback_locked_elsewhere(callback)
    # Seven members of each counter commit while another session holds the callback's
    # row: their settles never ask for it (lock_timeout would fail them).
    for job_id in first[:7] + second[:7]:
        leases.complete(job_id, claimed[job_id].attempt, "w1", result=1)
    assert [remaining for _, remaining in counters_of(callback)] == [1, 1]
    # The last member of a counter empties it and must count the callback down: it
    # waits for the row, and fails after the lock timeout, rolled back whole.
    with pytest.raises(DatabaseError):
        leases.complete(first[7], claimed[first[7]].attempt, "w1", result=1)
    assert Job.objects.get(pk=first[7]).status == JobStatus.RUNNING
    assert [remaining for _, remaining in counters_of(callback)] == [1, 1]
