"""Workflow semantics through the lease protocol, in-process (``run_jobs`` claims and
writes through the worker's own fenced writes), on every database of the run."""

from __future__ import annotations

from typing import Any

import pytest

from django_leasejobs.compat import TaskResultStatus
from django_leasejobs.models import Dependency, Job, JobStatus, Workflow
from django_leasejobs.testing import run_jobs
from django_leasejobs.workflows import (
    WorkflowDoesNotExist,
    cancel_workflow,
    chain,
    chord,
    get_workflow,
    group,
    retry_failed_steps,
    step,
)
from tests import tasks_workflows as t

pytestmark = pytest.mark.django_db(transaction=True)


def statuses(result: Any) -> list[str]:
    return [Job.objects.get(pk=r.id).status for r in result.steps]


def test_a_chain_runs_in_order_and_each_step_reads_its_parents_results() -> None:
    flow = chain(step(t.value, 1), t.collect.step("x"), t.collect.step())
    result = flow.enqueue()
    assert statuses(result) == ["pending", "waiting", "waiting"]
    assert result.status == TaskResultStatus.READY
    runs = run_jobs()
    assert [run.task_path for run in runs] == [
        "tests.tasks_workflows.value",
        "tests.tasks_workflows.collect",
        "tests.tasks_workflows.collect",
    ]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert [r.return_value for r in result.steps] == [
        1,
        {"parents": [1], "args": ["x"]},
        {"parents": [{"parents": [1], "args": ["x"]}], "args": []},
    ]
    # The caller's arguments stay as given: nothing appended.
    assert Job.objects.get(pk=result.steps[1].id).args == ["x"]


def test_a_chord_waits_for_every_member_and_gets_their_results_in_order() -> None:
    flow = chord(group(*(step(t.value, n) for n in range(5))), step(t.total))
    result = flow.enqueue()
    callback = Job.objects.get(pk=result.steps[-1].id)
    assert (callback.status, callback.waiting_on) == ("waiting", 5)
    assert Dependency.objects.filter(child_id=callback.pk).count() == 5
    run_jobs(max_jobs=4)
    callback.refresh_from_db()
    assert (callback.status, callback.waiting_on) == ("waiting", 1)
    run_jobs()
    result.refresh()
    assert result.steps[-1].return_value == 10
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_nesting_a_chain_of_groups_and_a_group_of_chains() -> None:
    flow = chain(
        group(chain(step(t.value, 1), step(t.total)), chain(step(t.value, 2), step(t.total))),
        step(t.total),
    )
    result = flow.enqueue()
    assert len(result.steps) == 5
    run_jobs()
    result.refresh()
    assert result.steps[-1].return_value == 3
    assert Workflow.objects.get(pk=result.id).step_count == 5


def test_a_failed_parent_ends_its_dependants_unrun_transitively_naming_it() -> None:
    flow = chain(step(t.value, 1), step(t.boom), step(t.value, 2), step(t.value, 3))
    result = flow.enqueue()
    runs = run_jobs()
    assert [run.status for run in runs] == ["succeeded", "failed"]  # the last two never ran
    third, fourth = (Job.objects.get(pk=r.id) for r in result.steps[2:])
    assert (third.status, third.attempt, fourth.status, fourth.attempt) == (
        "failed",
        0,
        "failed",
        0,
    )
    boom_id = result.steps[1].id
    assert f"parent step #{boom_id} (tests.tasks_workflows.boom) ended failed" in third.last_error
    assert (
        f"parent step #{third.pk} (tests.tasks_workflows.value) ended failed" in fourth.last_error
    )
    assert third.last_error.startswith("django_leasejobs.exceptions.ParentFailed: not run")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.steps[2].errors  # no attempt ran; the error says why
    assert error.exception_class_path == "django_leasejobs.exceptions.ParentFailed"
    assert f"parent step #{boom_id}" in error.traceback


def test_a_finaliser_runs_after_a_failure_and_sees_it() -> None:
    flow = chord(group(step(t.value, 1), step(t.boom)), step(t.finaliser, on_parent_failure="run"))
    result = flow.enqueue()
    run_jobs()
    final = Job.objects.get(pk=result.steps[-1].id)
    assert final.status == "succeeded"
    boom_id = int(result.steps[1].id)
    assert final.result == {
        "parent_results": [1, None],
        "failed": [[boom_id, "failed", "tests.tasks_workflows.boom"]],
    }


def test_retries_of_a_parent_do_not_release_early() -> None:
    flow = chain(step(t.fail_once, "m"), step(t.value, "after"))
    result = flow.enqueue()
    [first] = run_jobs()
    assert first.status == "pending"  # retried, with a delay
    assert Job.objects.get(pk=result.steps[1].id).status == "waiting"
    runs = run_jobs(include_scheduled=True)
    assert [run.status for run in runs] == ["succeeded", "succeeded"]


def test_cancelling_a_parent_ends_its_dependants() -> None:
    from django_leasejobs import leases

    result = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    assert leases.cancel(int(result.steps[0].id)).value == "cancelled"
    second = Job.objects.get(pk=result.steps[1].id)
    assert second.status == "failed"
    assert "ended cancelled" in second.last_error


def test_cancel_workflow_cancels_every_step_not_finished() -> None:
    result = chain(step(t.value, 1), step(t.value, 2), step(t.value, 3)).enqueue()
    run_jobs(max_jobs=1)
    done = cancel_workflow(result.id)
    assert (done.cancelled, done.requested) == (2, 0)
    assert statuses(result) == ["succeeded", "cancelled", "cancelled"]
    assert run_jobs() == []


def test_retry_failed_steps_runs_the_failed_step_and_its_dependants_again() -> None:
    result = chain(step(t.value, 1), step(t.boom), step(t.value, 3)).enqueue()
    run_jobs()
    assert statuses(result) == ["succeeded", "failed", "failed"]
    assert retry_failed_steps(result.id) == 2
    assert statuses(result) == ["succeeded", "pending", "waiting"]
    run_jobs()
    assert statuses(result) == ["succeeded", "failed", "failed"]  # boom fails again


def test_get_workflow_finds_it_again_and_refuses_unknown_ids() -> None:
    result = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    found = get_workflow(result.id)
    assert [s.id for s in found.steps] == [s.id for s in result.steps]
    assert found.status == TaskResultStatus.READY
    with pytest.raises(WorkflowDoesNotExist):
        get_workflow(10**9)
    with pytest.raises(WorkflowDoesNotExist):
        get_workflow("nope")


def test_a_waiting_step_is_not_claimed_nor_ready() -> None:
    result = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    assert not Job.objects.ready().filter(pk=result.steps[1].id).exists()
    assert Job.objects.get(pk=result.steps[1].id).status == JobStatus.WAITING


def test_the_reaper_repairs_a_waiting_step_whose_parents_all_finished() -> None:
    from django_leasejobs import leases

    result = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    # A write that did not settle (by hand): the parent succeeded, the step still waits.
    Job.objects.filter(pk=result.steps[0].id).update(status="succeeded", result=1)
    leases.reap()
    assert Job.objects.get(pk=result.steps[1].id).status == "pending"


def test_one_transaction_inside_the_callers_atomic() -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        chain(step(t.value, 1), step(t.value, 2)).enqueue()
        raise RuntimeError("rolled back")
    assert not Job.objects.exists()
    assert not Workflow.objects.exists()
    assert not Dependency.objects.exists()


def test_pruning_deletes_finished_steps_their_edges_and_the_empty_workflow() -> None:
    from datetime import timedelta

    from django_leasejobs.pruning import prune

    result = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    run_jobs()
    assert prune(older_than=timedelta(seconds=-60)).count == 2
    assert not Job.objects.filter(pk__in=[r.id for r in result.steps]).exists()
    assert not Dependency.objects.exists()
    assert not Workflow.objects.exists()


def test_a_steps_own_options_hold_queue_priority_and_run_after() -> None:
    from datetime import timedelta

    later = t.value.using(queue_name="high", priority=7, run_after=timedelta(hours=1))
    result = chain(step(t.value, 1), step(later, 2)).enqueue()
    second = Job.objects.get(pk=result.steps[1].id)
    assert (second.queue, second.priority, second.status) == ("high", 7, "waiting")
    run_jobs(queues=["default"])
    second.refresh_from_db()
    assert second.status == "pending"  # released, and still not due for an hour
    assert not Job.objects.ready().filter(pk=second.pk).exists()
    assert run_jobs(queues=["high"]) == []


def test_bad_input_names_the_step_and_writes_nothing() -> None:
    from django_leasejobs.exceptions import InvalidTaskArguments

    with pytest.raises(InvalidTaskArguments, match="step 1"):
        chain(step(t.value, 1), step(t.value, object())).enqueue()
    with pytest.raises(TypeError, match="pass steps"):
        chain(step(t.value, 1), t.value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_parent_failure"):
        step(t.value, 1, on_parent_failure="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one step"):
        group().enqueue()
    assert not Job.objects.exists() and not Workflow.objects.exists()


def test_aenqueue_and_arefresh() -> None:
    from asgiref.sync import async_to_sync

    async def enqueue_and_refresh() -> Any:
        result = await chain(step(t.value, 1), step(t.value, 2)).aenqueue()
        await result.arefresh()
        return result

    result = async_to_sync(enqueue_and_refresh)()
    assert result.status == TaskResultStatus.READY and len(result.steps) == 2


def test_a_job_enqueues_a_workflow_as_a_scheduled_task_does() -> None:
    from django_leasejobs.testing import assert_workflow

    t.start_pipeline.enqueue(5)
    runs = run_jobs()
    assert [run.task_path.rsplit(".", 1)[1] for run in runs] == ["start_pipeline", "value", "total"]
    assert assert_workflow(runs[0].result).steps[-1].return_value == 5


def test_a_released_step_obeys_its_flow_limits() -> None:
    from tests import tasks_flow

    result = chain(
        step(t.value, 1), group(*(step(tasks_flow.two_at_a_time, n) for n in range(3)))
    ).enqueue()
    limited = [Job.objects.get(pk=r.id) for r in result.steps[1:]]
    assert {job.flow_group for job in limited} == {"task:tests.tasks_flow.two_at_a_time"}
    run_jobs()
    assert statuses(result) == ["succeeded"] * 4


def test_cancel_workflow_asks_the_worker_of_a_running_step_to_stop_it() -> None:
    from django_leasejobs import leases

    result = chain(step(t.value, 1), step(t.value, 2)).enqueue()
    [claimed] = leases.claim("w1", limit=1, lease_duration=30)
    assert claimed.id == int(result.steps[0].id) and claimed.workflow_id == int(result.id)
    done = cancel_workflow(result.id)
    assert (done.cancelled, done.requested) == (1, 1)
    running = Job.objects.get(pk=claimed.id)
    assert (running.status, running.cancel_requested) == ("running", True)
    # Its worker stops it and records the cancel: nothing is left to release.
    leases.mark_cancelled(claimed.id, claimed.attempt, "w1")
    assert statuses(result) == ["cancelled", "cancelled"]
    assert get_workflow(result.id).status == TaskResultStatus.FAILED


def test_the_claim_reads_a_steps_parents_so_its_task_need_not() -> None:
    from django_leasejobs import leases

    result = chord(
        group(step(t.value, 1), step(t.boom)), step(t.finaliser, on_parent_failure="run")
    )
    flow = result.enqueue()
    run_jobs(max_jobs=2)
    [claimed] = leases.claim("w1", limit=1, lease_duration=30)
    assert claimed.id == int(flow.steps[-1].id)
    assert claimed.parents is not None
    assert [(p.job_id, p.status, p.result) for p in claimed.parents] == [
        (int(flow.steps[0].id), "succeeded", 1),
        (int(flow.steps[1].id), "failed", None),
    ]
    assert "ValueError: boom" in claimed.parents[1].error
    plain = t.value.enqueue(3)
    [claimed_plain] = leases.claim("w1", limit=1, lease_duration=30)
    assert (claimed_plain.id, claimed_plain.parents) == (int(plain.id), None)
