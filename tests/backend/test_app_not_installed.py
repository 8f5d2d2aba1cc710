"""The LeaseJobs backend in ``TASKS`` while ``django_leasejobs`` is not in
``INSTALLED_APPS``, in processes that never load the app (``manage.py`` subprocesses):
``check`` reports ``leasejobs.E008`` and fails, and ``enqueue()`` raises an error naming
the fix instead of Django's "doesn't declare an explicit app_label".

The check is the backend's ``check()``, run by the tasks system check of Django (6.x)
or of the backport (5.2): the app's own checks are registered by its ``ready()``, which
never runs here. Django 6 registers its tasks check when ``django.tasks`` is imported;
the backport's app registers it at start-up.
"""

from __future__ import annotations

from typing import Any

import django
import pytest

# The subprocesses' settings name the test database, which must exist: Django 6's model
# checks connect to a MySQL/MariaDB server (pytest-django creates the test database only
# when a django_db test asks for it).
pytestmark = pytest.mark.django_db

E008_MESSAGE = (
    "TASKS['default']: (leasejobs.E008) TASKS['default'] uses the LeaseJobs backend, but "
    "'django_leasejobs' is not in INSTALLED_APPS"
)

TIMEOUT = 60


def missing_app_env(subprocess_env: dict[str, str], settings: str) -> dict[str, str]:
    return {**subprocess_env, "DJANGO_SETTINGS_MODULE": f"tests.{settings}"}


def test_check_reports_e008_when_the_site_imports_its_tasks_at_start(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    """Every Django line: a site app imports its tasks (``django.tasks`` with them)."""
    env = missing_app_env(subprocess_env, "settings_app_missing_tasks")
    done = run_manage(["check"], env=env, timeout=TIMEOUT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert E008_MESSAGE in done.stderr
    assert "HINT: Add 'django_leasejobs' to INSTALLED_APPS and run migrate." in done.stderr
    assert "Traceback" not in done.stderr
    assert "app_label" not in done.stderr


def test_check_without_any_import_of_the_tasks_at_start(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    """Nothing imports ``django.tasks`` or this package at start-up. Django 5.2: the
    backport's app runs the tasks check, so E008 (it died with a traceback before).
    Django 6: Django runs no tasks check in such a process (it registers it when
    ``django.tasks`` is imported), so nothing can report E008; no traceback either."""
    env = missing_app_env(subprocess_env, "settings_app_missing")
    done = run_manage(["check"], env=env, timeout=TIMEOUT)
    assert "Traceback" not in done.stderr
    if django.VERSION < (6, 0):
        assert done.returncode == 1, done.stdout + done.stderr
        assert E008_MESSAGE in done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("settings", ["settings_app_missing", "settings_app_missing_tasks"])
@pytest.mark.parametrize(
    "code",
    [
        "from tests.tasks import add; add.enqueue(1, 2)",
        "from tests.tasks import add; add.get_backend().bulk_enqueue([(add, (1, 2), {})])",
        "from tests.tasks import add; add.get_result('1')",
    ],
    ids=["enqueue", "bulk_enqueue", "get_result"],
)
def test_enqueue_names_the_fix(
    run_manage: Any, subprocess_env: dict[str, str], settings: str, code: str
) -> None:
    env = missing_app_env(subprocess_env, settings)
    done = run_manage(["shell", "--no-imports", "-c", code], env=env, timeout=TIMEOUT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "django.core.exceptions.ImproperlyConfigured: [leasejobs.E008] TASKS['default'] uses "
        "the LeaseJobs backend, but 'django_leasejobs' is not in INSTALLED_APPS"
    ) in done.stderr, done.stderr
    assert "Add 'django_leasejobs' to INSTALLED_APPS and run \"manage.py migrate\"." in (
        done.stderr
    )
    assert "app_label" not in done.stderr


def test_runworker_is_not_a_command_without_the_app(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    """Django's behaviour (commands come from installed apps); E008 is what explains it."""
    env = missing_app_env(subprocess_env, "settings_app_missing")
    done = run_manage(["runworker", "--burst"], env=env, timeout=TIMEOUT)
    assert done.returncode == 1
    assert "Unknown command: 'runworker'" in done.stderr
