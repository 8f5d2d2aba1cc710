"""pytest plugin: the ``leasejobs`` fixture (docs/testing.md).

The package's ``pytest11`` entry point registers it under this module's dotted name, so
``-p django_leasejobs.testing.pytest_plugin`` or ``pytest_plugins`` in a root
``conftest.py`` (where autoloading is off) find it already loaded instead of registering
the module a second time, which pytest refuses. pytest loads
plugins before pytest-django configures Django, so this module imports nothing that needs
settings (no model, no app registry) until a test asks for the fixture. The fixture needs
pytest-django (its ``db`` fixture).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_leasejobs.testing.kit import LeaseJobsKit


@pytest.fixture
def leasejobs(db: None) -> LeaseJobsKit:
    """Run queued jobs in-process and assert what was enqueued, on the ``default`` backend.

    Uses pytest-django's ``db`` (the test runs in a transaction that is rolled back at
    its end); a test that also asks for ``transactional_db`` (or is marked
    ``django_db(transaction=True)``) gets that instead. ``db`` is a parameter, not
    requested from inside: pytest-django sets up only the databases that the collected
    tests' fixtures name. ``leasejobs.run_jobs()``,
    ``leasejobs.assert_enqueued(task, args=[...])``, ``leasejobs.assert_not_enqueued(task)``,
    ``leasejobs.enqueued_jobs(task)``; ``LeaseJobsKit("other")`` for another backend alias.
    """
    from django_leasejobs.testing.kit import LeaseJobsKit

    return LeaseJobsKit()
