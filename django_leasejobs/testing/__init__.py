"""A testing kit for your own test suite (docs/testing.md).

Run the jobs your code enqueued, in the test's thread and database transaction, through
the worker's own execution path and fenced writes; assert what was enqueued.

* :func:`run_jobs` runs queued jobs and returns one :class:`JobRun` per attempt
  (:func:`arun_jobs` from an ``async def`` test);
* :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`assert_not_enqueued` look at
  the job rows; :func:`assert_workflow` at a workflow's steps;
* :class:`LeaseJobsKit` bundles them for one backend alias (the pytest fixture
  ``leasejobs`` returns one: ``django_leasejobs.testing.pytest_plugin``);
* :class:`LeaseJobsTestMixin` adds ``self.run_jobs()``, ``self.assertEnqueued()`` and
  ``self.assertNotEnqueued()`` to a ``django.test.TestCase``.

Importing this package needs no settings (the names are loaded on first use), so the
pytest plugin can import it before pytest-django configures Django.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import (
        assert_enqueued,
        assert_not_enqueued,
        assert_workflow,
        describe_job,
        enqueued_jobs,
    )
    from .kit import LeaseJobsKit, LeaseJobsTestMixin
    from .runner import JobRun, arun_jobs, run_jobs

_WHERE = {
    "JobRun": "runner",
    "run_jobs": "runner",
    "arun_jobs": "runner",
    "enqueued_jobs": "assertions",
    "assert_enqueued": "assertions",
    "assert_not_enqueued": "assertions",
    "assert_workflow": "assertions",
    "describe_job": "assertions",
    "LeaseJobsKit": "kit",
    "LeaseJobsTestMixin": "kit",
}

__all__ = [
    "JobRun",
    "LeaseJobsKit",
    "LeaseJobsTestMixin",
    "arun_jobs",
    "assert_enqueued",
    "assert_not_enqueued",
    "assert_workflow",
    "describe_job",
    "enqueued_jobs",
    "run_jobs",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
