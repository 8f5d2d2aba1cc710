"""pytest plugin: the ``leasejobs`` fixture (docs/testing.md).

Register it with ``-p django_leasejobs.testing.pytest_plugin``, ``pytest_plugins`` in
your root ``conftest.py``, or through the package's ``pytest11`` entry point. pytest loads
plugins before pytest-django configures Django, so this module imports nothing from
Django (or from the rest of django_leasejobs) until a test asks for the fixture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_leasejobs.testing.kit import LeaseJobsKit


@pytest.fixture
def leasejobs(request: pytest.FixtureRequest) -> LeaseJobsKit:
    """Run queued jobs in-process and assert what was enqueued, on the ``default`` backend.

    Gives database access like pytest-django's ``db`` (the test runs in a transaction
    that is rolled back), unless the test already has it another way (``transactional_db``,
    ``django_db(transaction=True)``). ``leasejobs.run_jobs()``,
    ``leasejobs.assert_enqueued(task, args=[...])``, ``leasejobs.assert_not_enqueued(task)``,
    ``leasejobs.enqueued_jobs(task)``; ``LeaseJobsKit("other")`` for another backend alias.
    """
    if "transactional_db" not in request.fixturenames:
        request.getfixturevalue("db")
    from django_leasejobs.testing.kit import LeaseJobsKit

    return LeaseJobsKit()
