"""A workflow's life beyond a plain success or failure, in process, on every database:
a parent that ends as a dead letter (its stalls used up by the reaper), the workflow's
status once a step was claimed, and a schedule whose task enqueues a workflow."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from django_leasejobs import leases
from django_leasejobs.compat import TaskResultStatus
from django_leasejobs.models import Job, JobStatus, ScheduleRun
from django_leasejobs.schedules.scheduler import lease_backend, run_pass
from django_leasejobs.testing import assert_workflow, run_jobs
from django_leasejobs.workflows import chain, get_workflow, group, step
from tests import tasks_workflows as t
from tests.helpers_leases import db_now, expire
from tests.schedules.test_scheduler import tasks_with

pytestmark = pytest.mark.django_db(transaction=True)

PARENT_FAILED = "django_leasejobs.exceptions.ParentFailed"


def _row(result: Any) -> Job:
    return Job.objects.get(pk=result.id)


def _claim_expire_reap(job_id: int) -> list[leases.ReapedJob]:
    """Claim ``job_id`` (the only claimable job), let its lease expire, reap it."""
    [claimed] = leases.claim("w1", limit=1, lease_duration=30)
    assert claimed.id == job_id
    assert expire(job_id) == 1
    return leases.reap().jobs


# ------------------------------------------------------------- a parent's dead letter


def test_a_parent_ending_as_a_dead_letter_ends_its_dependants_unrun_and_a_finaliser_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The parent may stall twice: its first stall puts it back and settles nothing; its
    # second makes it a dead letter, which ends the chain after it unrun (transitively,
    # each naming its own parent) and lets the finaliser beside that chain run.
    # The reaper's repair pass (which would also end them, later, in a transaction of
    # its own) is switched off: the reap's own transaction is what settles them.
    repairs: list[object] = []
    reap_module = importlib.import_module("django_leasejobs.leases.reap")  # (not leases.reap)
    monkeypatch.setattr(reap_module, "repair_waiting", lambda d, **kw: repairs.append(d))
    flow = chain(
        step(t.value.using(max_stalls=2), 1),
        group(
            chain(step(t.value, 2), step(t.value, 3)),
            step(t.finaliser, on_parent_failure="run"),
        ),
    ).enqueue()
    parent, child, grandchild, final = flow.steps
    parent_id = int(parent.id)

    [reaped] = _claim_expire_reap(parent_id)
    assert (reaped.id, reaped.status) == (parent_id, JobStatus.PENDING)
    assert (_row(parent).status, _row(parent).stall_count) == (JobStatus.PENDING, 1)
    for waiting in (child, final):
        assert (_row(waiting).status, _row(waiting).waiting_on) == (JobStatus.WAITING, 1)
    assert _row(grandchild).status == JobStatus.WAITING

    [reaped] = _claim_expire_reap(parent_id)
    assert (reaped.id, reaped.status) == (parent_id, JobStatus.DEAD)
    dead = _row(parent)
    assert (dead.status, dead.attempt, dead.stall_count) == (JobStatus.DEAD, 2, 2)
    # Ended unrun in the reaper's transaction, before anything else ran.
    second, third = _row(child), _row(grandchild)
    assert (second.status, second.attempt, third.status, third.attempt) == (
        JobStatus.FAILED,
        0,
        JobStatus.FAILED,
        0,
    )
    assert second.last_error.startswith(f"{PARENT_FAILED}: not run")
    assert f"parent step #{parent_id} (tests.tasks_workflows.value) ended dead" in (
        second.last_error
    )
    assert f"parent step #{second.pk} (tests.tasks_workflows.value) ended failed" in (
        third.last_error
    )
    assert (_row(final).status, _row(final).waiting_on) == (JobStatus.PENDING, 0)
    assert get_workflow(flow.id).status == TaskResultStatus.RUNNING  # the finaliser is left

    assert len(repairs) == 2  # (the switch held: reap() would have repaired twice)

    [run] = run_jobs()
    assert (run.job_id, run.status) == (int(final.id), JobStatus.SUCCEEDED)
    assert _row(final).result == {
        "parent_results": [None],
        "failed": [[parent_id, JobStatus.DEAD, "tests.tasks_workflows.value"]],
    }
    flow.refresh()
    assert flow.status == TaskResultStatus.FAILED
    assert [s.status for s in flow.steps] == [TaskResultStatus.FAILED] * 3 + [
        TaskResultStatus.SUCCESSFUL
    ]
    [error] = flow.steps[1].errors
    assert error.exception_class_path == PARENT_FAILED
    assert f"parent step #{parent_id}" in error.traceback and "ended dead" in error.traceback


# --------------------------------------------------------------- the RUNNING status


def test_a_workflow_is_running_once_its_first_step_is_claimed() -> None:
    flow = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    assert flow.status == TaskResultStatus.READY
    assert get_workflow(flow.id).status == TaskResultStatus.READY

    [claimed] = leases.claim("w1", limit=1, lease_duration=30)
    assert claimed.id == int(flow.steps[0].id)
    found = get_workflow(flow.id)
    assert found.status == TaskResultStatus.RUNNING and not found.is_finished
    assert [s.status for s in found.steps] == [TaskResultStatus.RUNNING, TaskResultStatus.READY]
    assert flow.status == TaskResultStatus.READY  # what enqueue() returned, until refreshed
    flow.refresh()
    assert flow.status == TaskResultStatus.RUNNING
    assert [s.status for s in flow.steps] == [TaskResultStatus.RUNNING, TaskResultStatus.READY]

    # The first step's success releases the second: still running, with a step to run.
    leases.complete(claimed.id, claimed.attempt, "w1", result=1)
    assert _row(flow.steps[1]).status == JobStatus.PENDING
    flow.refresh()
    assert flow.status == TaskResultStatus.RUNNING
    run_jobs()
    flow.refresh()
    assert flow.status == TaskResultStatus.SUCCESSFUL


# ----------------------------------------------------- a schedule enqueues a workflow


def test_a_scheduled_task_enqueues_a_workflow_that_then_runs() -> None:
    settings = tasks_with(
        {"pipeline": {"task": "tests.tasks_workflows.start_pipeline", "every": 60, "args": [5]}}
    )
    with override_settings(TASKS=settings):
        backend = lease_backend("default")
        # In the past of the database's clock, so that the tick's job is due at once.
        start = db_now() - timedelta(minutes=10)
        assert run_pass(backend, now=start).enqueued == ()  # a new schedule starts now
        [tick] = run_pass(backend, now=start + timedelta(seconds=61)).enqueued
        assert run_pass(backend, now=start + timedelta(seconds=61)).enqueued == ()
        [run_row] = ScheduleRun.objects.filter(schedule__name="pipeline")
        assert (run_row.job_id, run_row.tick) == (tick.job_id, tick.tick)

        runs = run_jobs()
        assert [(run.task_path.rsplit(".", 1)[1], run.status) for run in runs] == [
            ("start_pipeline", JobStatus.SUCCEEDED),
            ("value", JobStatus.SUCCEEDED),
            ("total", JobStatus.SUCCEEDED),
        ]
        assert runs[0].job_id == tick.job_id
        flow = assert_workflow(runs[0].result, steps=["succeeded", "succeeded"])
        assert [s.return_value for s in flow.steps] == [5, 5]
        assert [int(s.id) for s in flow.steps] == [run.job_id for run in runs[1:]]
