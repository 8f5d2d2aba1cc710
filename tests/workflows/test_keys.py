"""Workflow steps with dedup keys: a step whose key is held adds no job, it is the job
that holds the key, and its dependants wait for that job; a waiting step holds its key."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from django_leasejobs.models import Job, Workflow
from django_leasejobs.testing import assert_workflow, run_jobs
from django_leasejobs.workflows import chain, get_workflow, step
from tests import tasks_workflows as t

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_step_deduplicated_against_a_pending_job_waits_for_that_job() -> None:
    holder = t.value.using(key="report-2026").enqueue(7)  # a plain job, pending
    result = chain(step(t.value.using(key="report-2026"), 99), step(t.total)).enqueue()
    first, second = result.steps
    assert first.id == holder.id  # no new job for the step: it is the holder
    assert Job.objects.filter(task_path="tests.tasks_workflows.value").count() == 1
    assert Job.objects.get(pk=holder.id).workflow_id == int(result.id)  # it joined
    assert Job.objects.get(pk=second.id).status == "waiting"
    run_jobs()
    done = assert_workflow(result)
    assert [s.return_value for s in done.steps] == [7, 7]  # the holder's call ran, once


def test_a_step_deduplicated_against_a_finished_job_within_unique_for() -> None:
    holder = t.value.using(key="daily", unique_for=3600).enqueue(5)
    run_jobs()
    result = chain(step(t.value.using(key="daily", unique_for=3600), 6), step(t.total)).enqueue()
    assert result.steps[0].id == holder.id
    second = Job.objects.get(pk=result.steps[1].id)
    assert second.status == "pending"  # its parent had succeeded: released at once
    run_jobs()
    assert assert_workflow(result).steps[1].return_value == 5


def test_a_step_deduplicated_against_a_failed_job_ends_unrun() -> None:
    holder = t.boom.using(key="broken", unique_for=3600).enqueue()
    run_jobs()
    result = chain(step(t.boom.using(key="broken", unique_for=3600)), step(t.total)).enqueue()
    second = Job.objects.get(pk=result.steps[1].id)
    assert second.status == "failed"
    assert f"parent step #{holder.id}" in second.last_error


def test_a_step_deduplicated_against_another_workflows_running_step() -> None:
    keyed = t.value.using(key="shared")
    first = chain(step(keyed, 1), step(t.total)).enqueue()
    second = chain(step(keyed, 2), step(t.total)).enqueue()
    assert second.steps[0].id == first.steps[0].id
    assert Job.objects.get(pk=first.steps[0].id).workflow_id == int(first.id)  # stays
    run_jobs()
    assert assert_workflow(first).steps[1].return_value == 1
    found = assert_workflow(second)
    assert [s.id for s in found.steps] == [first.steps[0].id, second.steps[1].id]
    assert found.steps[1].return_value == 1


def test_two_steps_of_one_workflow_with_one_key_are_one_job() -> None:
    keyed = t.value.using(key="once")
    result = chain(step(keyed, 3), step(keyed, 4), step(t.total)).enqueue()
    assert result.steps[0].id == result.steps[1].id
    assert Job.objects.filter(workflow_id=result.id).count() == 2
    run_jobs()
    assert get_workflow(result.id).steps[2].return_value == 3


def test_a_waiting_step_holds_its_key() -> None:
    result = chain(step(t.value, 1), step(t.value.using(key="later"), 2)).enqueue()
    waiting = result.steps[1]
    assert Job.objects.get(pk=waiting.id).status == "waiting"
    again = t.value.using(key="later").enqueue(3)  # a plain enqueue: deduplicated
    assert again.id == waiting.id
    with pytest.raises(IntegrityError):  # and the database refuses a second holder
        Job.objects.create(task_path="tests.tasks_workflows.value", key="later")


def test_debounce_is_refused_on_a_step() -> None:
    from django_leasejobs.compat import InvalidTask

    with pytest.raises(InvalidTask, match="debounce"):
        chain(step(t.value.using(key="d", debounce=5), 1)).enqueue()
    assert not Workflow.objects.exists()


def test_retry_failed_steps_refuses_when_a_failed_steps_key_was_taken() -> None:
    from django_leasejobs.workflows import retry_failed_steps

    result = chain(step(t.boom.using(key="k-retry"))).enqueue()
    run_jobs()
    taker = t.value.using(key="k-retry").enqueue(1)  # the key is free again: taken
    with pytest.raises(ValueError, match="dedup key is held by another job"):
        retry_failed_steps(result.id)
    assert Job.objects.get(pk=result.steps[0].id).status == "failed"
    assert Job.objects.get(pk=taker.id).status == "pending"
