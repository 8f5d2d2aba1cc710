"""A retry of a workflow step that ended without succeeding does not release its waiting
dependants early: its end counted its finalisers (``on_parent_failure="run"``) down, and
the retry gives that count back in its own transaction (``dependants.give_back``), so its
new end counts them down once more, not twice. Through every retry path: the operator's
(``leases.retry``), the bulk retry and requeue of dead letters, and
``retry_failed_steps``; with direct counting and with fan-in counters. In-process, on
every database of the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_leasejobs import bulk, leases
from django_leasejobs.leases import fanin
from django_leasejobs.models import FanIn, Job, JobStatus
from django_leasejobs.testing import run_jobs
from django_leasejobs.workflows import chord, group, retry_failed_steps, step
from tests import tasks_workflows as t
from tests.helpers_leases import expire

pytestmark = pytest.mark.django_db(transaction=True)

LATER = "high"  # the queue of the parents that have not run yet


def _retry_one(job_id: int, workflow_id: int) -> None:
    assert leases.retry(job_id).value == "retried"


def _bulk_retry(job_id: int, workflow_id: int) -> None:
    assert bulk.retry(Job.objects.filter(pk=job_id)).count == 1


def _requeue_dead(job_id: int, workflow_id: int) -> None:
    assert bulk.requeue_dead(Job.objects.filter(pk=job_id)).count == 1


def _retry_failed_steps(job_id: int, workflow_id: int) -> None:
    assert retry_failed_steps(workflow_id) == 1


RETRIES: dict[str, Callable[[int, int], None]] = {
    "operator": _retry_one,
    "bulk": _bulk_retry,
    "requeue_dead": _requeue_dead,
    "retry_failed_steps": _retry_failed_steps,
}


def _end_for_good(job_id: int, *, dead: bool) -> None:
    """End ``job_id`` (the only job of the default queue) without succeeding: a failure
    with no attempt left, or a dead letter (its one stall used up by the reaper)."""
    if dead:
        [claimed] = leases.claim("w1", limit=1, lease_duration=30, queues=["default"])
        assert claimed.id == job_id
        assert expire(job_id) == 1
        leases.reap()
    else:
        [run] = run_jobs(queues="default")
        assert run.job_id == job_id
    assert Job.objects.get(pk=job_id).status == (JobStatus.DEAD if dead else JobStatus.FAILED)


def _flow(wide: bool) -> tuple[Any, int, int, list[int]]:
    """A finaliser F after P1 (fails on its first attempt, succeeds on its second) and
    P2, on the queue ``LATER``; wide: also after X (on the queue ``low``, in P1's fan-in
    counter) and Y (in P2's, on ``LATER``). (result, P1, F, the parents on ``LATER``)."""
    p1 = step(t.fail_first.using(max_stalls=1), "p1")
    p2 = step(t.value.using(queue_name=LATER), "p2")
    parents = [
        p1,
        step(t.value.using(queue_name="low"), "x"),
        p2,
        step(t.value.using(queue_name=LATER), "y"),
    ]
    result = chord(
        group(*(parents if wide else [p1, p2])), step(t.finaliser, on_parent_failure="run")
    ).enqueue()
    ids = [int(s.id) for s in result.steps]
    first, final = ids[0], ids[-1]
    later = [int(s.id) for s in result.steps if Job.objects.get(pk=s.id).queue == LATER]
    return result, first, final, later


def _counters(child: int) -> list[int]:
    return list(
        FanIn.objects.filter(child_id=child).order_by("id").values_list("remaining", flat=True)
    )


@pytest.mark.parametrize("how", list(RETRIES))
@pytest.mark.parametrize("shape", ["direct", "fanin-emptied", "fanin-open"])
def test_a_retried_parent_does_not_release_its_finaliser_early(
    how: str, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fanin-emptied: X ran before P1 failed, so P1's end emptied their counter (which
    # counted F down); fanin-open: X runs last, so P1's end left their counter open.
    monkeypatch.setattr(fanin, "FANIN_WIDTH", 2)  # four parents: two counters of two
    wide = shape != "direct"
    result, p1, final, later = _flow(wide)
    assert len(_counters(final)) == (2 if wide else 0)
    if shape == "fanin-emptied":
        [run] = run_jobs(queues="low")
        assert run.status == JobStatus.SUCCEEDED
    dead = how == "requeue_dead"
    _end_for_good(p1, dead=dead)
    row = Job.objects.get(pk=final)
    waits = 2 if shape == "fanin-open" else 1  # P2's count (and P1's counter, for X)
    assert (row.status, row.waiting_on) == (JobStatus.WAITING, waits)

    RETRIES[how](p1, result.id)
    row.refresh_from_db()
    assert (row.status, row.waiting_on) == (JobStatus.WAITING, 2)  # P1's count given back
    if wide:
        assert _counters(final) == [2 if shape == "fanin-open" else 1, 2]

    # P1 runs again and succeeds: the finaliser still waits for P2 (and Y, and X).
    [run] = run_jobs(queues="default")
    assert (run.job_id, run.status) == (p1, JobStatus.SUCCEEDED)
    row.refresh_from_db()
    assert (row.status, row.waiting_on) == (JobStatus.WAITING, waits)
    assert run_jobs(queues="default") == []

    # P2 (and Y) end: the finaliser is released (fanin-open: once X ran too), and runs
    # once, seeing every parent.
    assert sorted(run.job_id for run in run_jobs(queues=LATER)) == later
    if shape == "fanin-open":
        assert Job.objects.get(pk=final).status == JobStatus.WAITING
        assert run_jobs(queues="default") == []
        [run] = run_jobs(queues="low")
        assert run.status == JobStatus.SUCCEEDED
    runs = run_jobs()
    assert [(run.job_id, run.status) for run in runs] == [(final, JobStatus.SUCCEEDED)]
    row.refresh_from_db()
    assert (row.attempt, row.waiting_on) == (1, 0)
    assert row.result == {
        "parent_results": ["p1", "x", "p2", "y"] if wide else ["p1", "p2"],
        "failed": [],
    }
    assert run_jobs() == []


def test_a_finaliser_that_already_ran_keeps_its_outcome_when_its_parent_is_retried() -> None:
    _, p1, final, _ = _flow(False)
    _end_for_good(p1, dead=False)
    run_jobs(queues=LATER)
    [run] = run_jobs()
    assert (run.job_id, run.status) == (final, JobStatus.SUCCEEDED)
    assert leases.retry(p1).value == "retried"
    row = Job.objects.get(pk=final)
    assert (row.status, row.attempt, row.waiting_on) == (JobStatus.SUCCEEDED, 1, 0)
    [run] = run_jobs()
    assert (run.job_id, run.status) == (p1, JobStatus.SUCCEEDED)
    assert run_jobs() == []
    row.refresh_from_db()
    assert (row.status, row.attempt) == (JobStatus.SUCCEEDED, 1)
