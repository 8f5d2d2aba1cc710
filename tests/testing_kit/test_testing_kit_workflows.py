"""The testing kit with workflows: ``run_jobs`` follows releases in order, and
``assert_workflow`` (the fixture's and the mixin's) checks a workflow's outcome and lists
its steps when it fails."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TransactionTestCase

from django_leasejobs.testing import LeaseJobsTestMixin, assert_workflow, run_jobs
from django_leasejobs.workflows import chain, chord, group, step
from tests import tasks_workflows as t

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_jobs_follows_releases_in_order_and_assert_workflow_passes() -> None:
    result = chord(group(step(t.value, 1), step(t.value, 2)), step(t.total)).enqueue()
    runs = run_jobs()
    assert [run.task_path.rsplit(".", 1)[1] for run in runs] == ["value", "value", "total"]
    found = assert_workflow(result, steps=["succeeded", "succeeded", "succeeded"])
    assert found.steps[-1].return_value == 3
    assert_workflow(result.id)  # by id too


def test_assert_workflow_lists_the_steps_when_it_fails() -> None:
    result = chain(step(t.value, 1), step(t.boom), step(t.value, 3)).enqueue()
    run_jobs()
    with pytest.raises(AssertionError) as failed:
        assert_workflow(result)
    message = str(failed.value)
    assert f"Workflow #{result.id}: status 'FAILED', expected 'SUCCESSFUL'." in message
    third = result.steps[2].id
    assert f"2. #{third} tests.tasks_workflows.value(3)" in message
    assert f"after #{result.steps[1].id}" in message
    assert "ParentFailed: not run" in message
    assert_workflow(result, status="failed", steps=["succeeded", "failed", "failed"])


def test_the_fixture_asserts_on_a_workflow(leasejobs: Any) -> None:
    result = chain(step(t.value, 1), step(t.total)).enqueue()
    leasejobs.run_jobs()
    assert leasejobs.assert_workflow(result).steps[1].return_value == 1


class MixinWorkflowTests(LeaseJobsTestMixin, TransactionTestCase):
    def test_assert_workflow(self) -> None:
        result = chain(step(t.value, 2), step(t.total)).enqueue()
        self.run_jobs()
        self.assertWorkflow(result, steps=["succeeded", "succeeded"])
