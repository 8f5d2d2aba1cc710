"""The kit bound to one backend alias (the pytest fixture's value), and the TestCase mixin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..compat import Task
from ..models import Job
from ..workflow_results import WorkflowResult
from .assertions import (
    Statuses,
    assert_enqueued,
    assert_not_enqueued,
    assert_workflow,
    enqueued_jobs,
)
from .runner import JobRun, arun_jobs, run_jobs


class LeaseJobsKit:
    """:func:`run_jobs` and the assertions for one backend alias (``"default"`` unless
    given). The pytest fixture ``leasejobs`` is one of these."""

    def __init__(self, backend: str = "default") -> None:
        self.backend = backend

    def __repr__(self) -> str:
        return f"LeaseJobsKit(backend={self.backend!r})"

    def run_jobs(
        self,
        *,
        queues: str | Sequence[str] | None = None,
        max_jobs: int | None = None,
        include_scheduled: bool = False,
        worker_id: str = "test-worker",
    ) -> list[JobRun]:
        """:func:`django_leasejobs.testing.run_jobs` on this kit's backend."""
        return run_jobs(
            self.backend,
            queues=queues,
            max_jobs=max_jobs,
            include_scheduled=include_scheduled,
            worker_id=worker_id,
        )

    async def arun_jobs(
        self,
        *,
        queues: str | Sequence[str] | None = None,
        max_jobs: int | None = None,
        include_scheduled: bool = False,
        worker_id: str = "test-worker",
    ) -> list[JobRun]:
        """:func:`django_leasejobs.testing.arun_jobs` on this kit's backend."""
        return await arun_jobs(
            self.backend,
            queues=queues,
            max_jobs=max_jobs,
            include_scheduled=include_scheduled,
            worker_id=worker_id,
        )

    def enqueued_jobs(
        self,
        task: Task | str | None = None,
        *,
        status: Statuses = "pending",
        queues: str | Sequence[str] | None = None,
    ) -> list[Job]:
        return enqueued_jobs(task, backend=self.backend, status=status, queues=queues)

    def assert_enqueued(
        self,
        task: Task | str,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        count: int | None = 1,
        queue: str | None = None,
        priority: int | None = None,
        status: Statuses = "pending",
    ) -> list[Job]:
        return assert_enqueued(
            task,
            args=args,
            kwargs=kwargs,
            count=count,
            queue=queue,
            priority=priority,
            backend=self.backend,
            status=status,
        )

    def assert_not_enqueued(
        self,
        task: Task | str,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        status: Statuses = "pending",
    ) -> None:
        assert_not_enqueued(
            task,
            args=args,
            kwargs=kwargs,
            queue=queue,
            priority=priority,
            backend=self.backend,
            status=status,
        )

    def assert_workflow(
        self,
        workflow: WorkflowResult | str | int,
        *,
        status: str | None = "SUCCESSFUL",
        steps: Sequence[str] | None = None,
    ) -> WorkflowResult:
        return assert_workflow(workflow, status=status, steps=steps, backend=self.backend)


class LeaseJobsTestMixin:
    """For ``django.test.TestCase`` (or ``TransactionTestCase``) classes::

        class CheckoutTests(LeaseJobsTestMixin, TestCase):
            def test_receipt(self):
                checkout(order)
                self.assertEnqueued(send_receipt, args=[order.pk])
                [run] = self.run_jobs()
                self.assertTrue(run.succeeded)

    ``leasejobs_backend`` names the backend alias the methods use; they are those of
    a :class:`LeaseJobsKit` for it (``self.leasejobs_kit``), with unittest's names for
    the assertions.
    """

    leasejobs_backend = "default"

    @property
    def leasejobs_kit(self) -> LeaseJobsKit:
        """The :class:`LeaseJobsKit` of ``leasejobs_backend``: every method below is its."""
        return LeaseJobsKit(self.leasejobs_backend)

    def run_jobs(
        self,
        *,
        queues: str | Sequence[str] | None = None,
        max_jobs: int | None = None,
        include_scheduled: bool = False,
        worker_id: str = "test-worker",
    ) -> list[JobRun]:
        return self.leasejobs_kit.run_jobs(
            queues=queues,
            max_jobs=max_jobs,
            include_scheduled=include_scheduled,
            worker_id=worker_id,
        )

    def enqueued_jobs(
        self,
        task: Task | str | None = None,
        *,
        status: Statuses = "pending",
        queues: str | Sequence[str] | None = None,
    ) -> list[Job]:
        return self.leasejobs_kit.enqueued_jobs(task, status=status, queues=queues)

    def assertEnqueued(
        self,
        task: Task | str,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        count: int | None = 1,
        queue: str | None = None,
        priority: int | None = None,
        status: Statuses = "pending",
    ) -> list[Job]:
        return self.leasejobs_kit.assert_enqueued(
            task,
            args=args,
            kwargs=kwargs,
            count=count,
            queue=queue,
            priority=priority,
            status=status,
        )

    def assertNotEnqueued(
        self,
        task: Task | str,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        status: Statuses = "pending",
    ) -> None:
        self.leasejobs_kit.assert_not_enqueued(
            task, args=args, kwargs=kwargs, queue=queue, priority=priority, status=status
        )

    def assertWorkflow(
        self,
        workflow: WorkflowResult | str | int,
        *,
        status: str | None = "SUCCESSFUL",
        steps: Sequence[str] | None = None,
    ) -> WorkflowResult:
        return self.leasejobs_kit.assert_workflow(workflow, status=status, steps=steps)
