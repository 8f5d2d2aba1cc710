"""The testing kit with pytest: the ``leasejobs`` fixture (pytest-django's ``db``), the
plugin loaded by ``-p`` in a pytest of its own, and Django's ImmediateBackend and
DummyBackend next to the kit (docs/testing.md)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_leasejobs.compat import USING_BACKPORT, TaskResultStatus, task_backends
from django_leasejobs.models import Job, JobAttempt
from django_leasejobs.testing import LeaseJobsKit, assert_enqueued, run_jobs
from django_leasejobs.testing import pytest_plugin as plugin
from tests import tasks_testing_kit as kit_tasks

REPO_ROOT = Path(__file__).resolve().parents[2]

leasejobs = plugin.leasejobs  # registers the plugin's fixture in this module


@pytest.fixture(autouse=True)
def _fresh_seen() -> None:
    kit_tasks.SEEN.clear()


def test_fixture_gives_a_kit_with_database_access(leasejobs: LeaseJobsKit) -> None:
    assert isinstance(leasejobs, LeaseJobsKit)
    assert leasejobs.backend == "default"
    assert connection.in_atomic_block  # pytest-django's db: a transaction rolled back after
    result = kit_tasks.multiply.enqueue(3, 4)
    [job] = leasejobs.assert_enqueued(kit_tasks.multiply, args=[3, 4])
    assert job.pk == int(result.id)
    [run] = leasejobs.run_jobs()
    assert (run.job_id, run.status, run.result) == (int(result.id), "succeeded", 12)
    leasejobs.assert_not_enqueued(kit_tasks.multiply)
    assert [j.status for j in leasejobs.enqueued_jobs(kit_tasks.multiply, status=None)] == [
        "succeeded"
    ]


def test_retry_then_success(leasejobs: LeaseJobsKit) -> None:
    result = kit_tasks.flaky.enqueue(failures=1)
    [first] = leasejobs.run_jobs()
    assert (first.attempt, first.status, first.retry_delay) == (1, "pending", 60)
    assert leasejobs.run_jobs() == []
    [second] = leasejobs.run_jobs(include_scheduled=True)
    assert (second.attempt, second.status) == (2, "succeeded")
    assert second.result == {"attempt": 2, "job_id": int(result.id)}


def test_checkpoint_and_progress(leasejobs: LeaseJobsKit) -> None:
    resumed = kit_tasks.resumes_from_checkpoint.enqueue()
    progress = kit_tasks.reports_progress.enqueue(2, fail=True)
    runs = leasejobs.run_jobs(include_scheduled=True)
    by_job = {(r.job_id, r.attempt): r for r in runs}
    assert by_job[(int(resumed.id), 2)].result == {"resumed_at": 500}
    assert by_job[(int(progress.id), 1)].status == "failed"
    row = Job.objects.get(pk=progress.id)
    assert (row.progress, row.progress_message) == (1.0, "step 2 of 2")


def test_cancel_and_timeout(leasejobs: LeaseJobsKit) -> None:
    cancelled = kit_tasks.cancelled_while_running.enqueue()
    late = kit_tasks.overruns_timeout.enqueue()
    runs = leasejobs.run_jobs()
    statuses = {r.job_id: (r.status, r.outcome) for r in runs}
    assert statuses[int(cancelled.id)] == ("cancelled", "cancelled")
    assert statuses[int(late.id)] == ("pending", "timeout")


def test_unknown_task_and_queue_filter(leasejobs: LeaseJobsKit) -> None:
    unknown = Job.objects.create(task_path="tests.tasks_testing_kit.gone", queue="low")
    low = kit_tasks.low_priority_work.enqueue("kept")
    kit_tasks.multiply.enqueue(1, 1)
    runs = leasejobs.run_jobs(queues=["low"])
    assert {r.job_id: r.status for r in runs} == {unknown.pk: "failed", int(low.id): "succeeded"}
    assert JobAttempt.objects.get(job_id=unknown.pk).error_class == (
        "django_leasejobs.exceptions.UnknownTask"
    )
    leasejobs.assert_enqueued(kit_tasks.multiply, args=[1, 1], queue="default")


def test_assertion_messages(leasejobs: LeaseJobsKit) -> None:
    kit_tasks.multiply.enqueue(2, 3)
    kit_tasks.low_priority_work.using(priority=5).enqueue("x")
    with pytest.raises(AssertionError) as caught:
        leasejobs.assert_enqueued(kit_tasks.multiply, kwargs={"a": 2})
    message = str(caught.value)
    assert message.startswith(
        "Expected 1 pending job(s) of tests.tasks_testing_kit.multiply kwargs={'a': 2}, found 0."
    )
    assert "Pending jobs in backend 'default':" in message
    assert "tests.tasks_testing_kit.multiply(2, 3) queue='default' priority=0" in message
    assert "tests.tasks_testing_kit.low_priority_work('x') queue='low' priority=5" in message
    with pytest.raises(AssertionError, match=r"Expected 1 pending job\(s\) .* priority=4, found 0"):
        leasejobs.assert_enqueued(kit_tasks.low_priority_work, priority=4)
    with pytest.raises(AssertionError, match=r"Expected no pending job of .*low_priority_work"):
        leasejobs.assert_not_enqueued(kit_tasks.low_priority_work, queue="low")
    with pytest.raises(AssertionError, match=r"found 1\.\n"):
        assert_enqueued(kit_tasks.multiply, count=2)
    with pytest.raises(ValueError, match="count must be >= 0"):
        assert_enqueued(kit_tasks.multiply, count=-1)


def test_other_backend_alias(leasejobs: LeaseJobsKit, settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "second": {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend", "QUEUES": ["default"]},
    }
    other = LeaseJobsKit("second")
    kit_tasks.multiply.using(backend="second").enqueue(5, 5)
    leasejobs.assert_not_enqueued(kit_tasks.multiply)
    other.assert_enqueued(kit_tasks.multiply, args=[5, 5])
    assert leasejobs.run_jobs() == []
    [run] = other.run_jobs()
    assert run.result == 25


@pytest.mark.django_db(transaction=True)
def test_works_outside_a_transaction_too(leasejobs: LeaseJobsKit) -> None:
    assert not connection.in_atomic_block  # transaction=True wins over the fixture's db
    kit_tasks.flaky.enqueue(failures=1)
    runs = leasejobs.run_jobs(include_scheduled=True)
    assert [r.status for r in runs] == ["pending", "succeeded"]


# -- Django's own backends next to the kit ---------------------------------------------------


def _django_backend(name: str) -> str:
    package = "django_tasks" if USING_BACKPORT else "django.tasks"
    return f"{package}.backends.{name.lower()}.{name}Backend"


@pytest.fixture
def django_backends(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "immediate": {"BACKEND": _django_backend("Immediate")},
        "dummy": {"BACKEND": _django_backend("Dummy")},
    }


@pytest.mark.django_db
@pytest.mark.usefixtures("django_backends")
def test_set_progress_breaks_under_immediate_backend() -> None:
    """What the issue reported: Django's TaskContext has no set_progress (nor job_id,
    checkpoint...), and ImmediateBackend records the AttributeError as the task's failure
    without raising it from enqueue()."""
    result = kit_tasks.calls_set_progress.using(backend="immediate").enqueue()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.AttributeError"]
    assert "set_progress" in result.errors[0].traceback
    assert not Job.objects.exists()  # ImmediateBackend stores nothing


@pytest.mark.usefixtures("django_backends")
def test_the_portable_progress_idiom_runs_everywhere(leasejobs: LeaseJobsKit) -> None:
    immediate = kit_tasks.progress_anywhere.using(backend="immediate").enqueue()
    assert immediate.status == TaskResultStatus.SUCCESSFUL
    assert immediate.return_value == "done"
    stored = kit_tasks.progress_anywhere.enqueue()
    [run] = leasejobs.run_jobs()
    assert (run.job_id, run.result) == (int(stored.id), "done")
    assert Job.objects.get(pk=stored.id).progress == 1.0  # reported (NULL if never)
    # The kit is the way to run the direct call: it gets the LeaseJobs context.
    direct = kit_tasks.calls_set_progress.enqueue()
    [run] = leasejobs.run_jobs()
    assert (run.job_id, run.status) == (int(direct.id), "succeeded")


@pytest.mark.django_db
@pytest.mark.usefixtures("django_backends")
def test_dummy_backend_keeps_results_in_memory_only() -> None:
    result = kit_tasks.multiply.using(backend="dummy").enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    dummy = task_backends["dummy"]
    assert [r.id for r in dummy.results] == [result.id]
    assert not Job.objects.exists()
    with pytest.raises(TypeError, match="DummyBackend, not django_leasejobs"):
        run_jobs("dummy")


# -- the plugin, loaded as pytest loads it -----------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    paths = [str(REPO_ROOT), str(REPO_ROOT / "testproject")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def test_plugin_module_imports_nothing_that_needs_settings() -> None:
    code = (
        "import sys\n"
        "import django_leasejobs.testing.pytest_plugin as p\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('django_leasejobs.'))\n"
        "assert 'django_leasejobs.models' not in loaded, loaded\n"
        "print('ok', p.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "django_leasejobs.testing.pytest_plugin"]


def test_plugin_loaded_with_dash_p(tmp_path: Path) -> None:
    """A user's project: the plugin registered by ``-p`` (as the pytest11 entry point
    does), pytest-django configuring Django after it, a test using the fixture."""
    (tmp_path / "test_user_project.py").write_text(
        textwrap.dedent(
            """
            from tests import tasks_testing_kit as kit_tasks


            def test_runs_a_job(leasejobs):
                kit_tasks.multiply.enqueue(2, 5)
                leasejobs.assert_enqueued(kit_tasks.multiply, args=[2, 5])
                [run] = leasejobs.run_jobs()
                assert run.result == 10


            def test_assertion_fails(leasejobs):
                kit_tasks.low_priority_work.enqueue("here")
                leasejobs.assert_enqueued(kit_tasks.multiply)
            """
        )
    )
    database = tmp_path / "outer.sqlite3"  # tests/settings.py puts the test database aside
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "django_leasejobs.testing.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--ds=tests.settings",
            "--rootdir",
            str(tmp_path),
            "-q",
            str(tmp_path / "test_user_project.py"),
        ],
        env=_env(DATABASE_URL=f"sqlite:///{database}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    assert "Expected 1 pending job(s) of tests.tasks_testing_kit.multiply, found 0." in done.stdout
    assert "tests.tasks_testing_kit.low_priority_work('here') queue='low'" in done.stdout


@pytest.mark.parametrize(
    ("entry_point", "works"),
    [("django_leasejobs.testing.pytest_plugin", True), ("leasejobs", False)],
)
def test_entry_point_name_and_dash_p(tmp_path: Path, entry_point: str, works: bool) -> None:
    """The pytest11 entry point pyproject.toml should declare: named after the module, it
    lets ``-p`` (and ``pytest_plugins``) name the plugin too; under a short name pytest
    refuses the module's second registration. A distribution of its own on PYTHONPATH
    stands in for the installed package's entry point."""
    site = tmp_path / "site"
    info = site / "leasejobs_entry_point-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: leasejobs-entry-point\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[pytest11]\n{entry_point} = django_leasejobs.testing.pytest_plugin\n"
    )
    (tmp_path / "test_it.py").write_text(
        "def test_kit(leasejobs):\n    assert leasejobs.run_jobs() == []\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "django_leasejobs.testing.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--ds=tests.settings",
            "--rootdir",
            str(tmp_path),
            "-q",
            "test_it.py",
        ],
        env=_env(
            DATABASE_URL=f"sqlite:///{tmp_path / 'outer.sqlite3'}",
            PYTHONPATH=os.pathsep.join([str(site), str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    if works:
        assert done.returncode == 0 and "1 passed" in done.stdout, output
    else:
        assert done.returncode != 0
        assert "Plugin already registered under a different name" in output, output


# -- docs/testing.md, run as written ---------------------------------------------------------

GUIDE_BLOCK = re.compile(
    r"<!-- testing-doc: (?P<directive>[^>]*?) -->\n```(?P<language>\w*)\n(?P<code>.*?)```", re.S
)
# A stand-in for startproject's mysite/settings.py: the suite's settings (its database).
STARTPROJECT_SETTINGS = (
    "from tests.settings import *  # noqa: F403\n"
    "INSTALLED_APPS = [*INSTALLED_APPS, 'myapp']  # noqa: F405\n"
)
MANAGE_PY = """#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""


def _guide_blocks() -> list[tuple[str, str, str]]:
    """(directive, language, code) of every block of docs/testing.md with a directive."""
    text = (REPO_ROOT / "docs" / "testing.md").read_text()
    return [(m["directive"], m["language"], m["code"]) for m in GUIDE_BLOCK.finditer(text)]


def test_the_guide_names_what_to_install_and_it_is_installed() -> None:
    """The set-up's `pip install` line: what the example project below runs with (the
    suite's test dependencies hold it, so it is checked, not installed here)."""
    [code] = [code for directive, _, code in _guide_blocks() if directive == "install"]
    [line] = code.strip().splitlines()
    assert line.startswith("pip install "), line
    names = line.split()[2:]
    assert {"pytest", "pytest-django"} <= set(names), names
    for name in names:
        assert importlib.metadata.version(name), name


def _project(root: Path, blocks: list[tuple[str, str, str]]) -> list[str]:
    """The guide's project in ``root``: manage.py, mysite/settings.py, myapp and the tests
    (the write and append blocks); returns the test files."""
    (root / "manage.py").write_text(MANAGE_PY)
    for package in ("mysite", "myapp"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    (root / "mysite" / "settings.py").write_text(STARTPROJECT_SETTINGS)
    for directive, language, code in blocks:
        mode, _, path = directive.partition(" ")
        if mode not in ("write", "append"):
            continue
        assert language == "python", directive
        target = root / path
        if mode == "write":
            assert not target.exists(), f"{path} written twice"
            target.write_text(code)
        else:
            assert target.exists(), f"{path} appended to before it was written"
            target.write_text(target.read_text() + "\n\n" + code)
    return sorted(p.name for p in root.glob("test_*.py"))


def _pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pytest` as a user runs it in the project's directory: the console script, no
    settings given (DJANGO_SETTINGS_MODULE unset: the configuration file names them), the
    plugins loaded from their entry points, the project found by pytest-django's
    manage.py search (not on PYTHONPATH, which holds only the suite's settings)."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "pytest"), "-p", "no:cacheprovider", "-q", *args],
        env=_env(DATABASE_URL=f"sqlite:///{root / 'outer.sqlite3'}"),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    """Builds the guide's project from its marked blocks (settings, tasks, the enqueuing
    code, pytest and TestCase tests), writes the guide's pytest.ini and runs `pytest` in
    it, as the set-up says; then the same with the pyproject.toml variant alone."""
    blocks = _guide_blocks()
    configs = {
        directive.split()[1]: code
        for directive, _, code in blocks
        if directive.startswith("config ")
    }
    assert set(configs) == {"pytest.ini", "pyproject.toml"}
    assert sum(directive.split()[0] in ("write", "append") for directive, _, _ in blocks) >= 6
    # Side by side, not nested: pytest looks for its configuration in the parents too.
    project, other = tmp_path / "project", tmp_path / "other"
    project.mkdir()
    other.mkdir()
    test_files = _project(project, blocks)
    expected = sum(
        len(re.findall(r"^\s*def test_", (project / name).read_text(), re.M)) for name in test_files
    )
    (project / "pytest.ini").write_text(configs["pytest.ini"])
    done = _pytest_in(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{expected} passed" in done.stdout, done.stdout

    _project(other, blocks)
    unset = _pytest_in(other, "test_rebuild_index.py")  # no configuration: no settings
    assert unset.returncode != 0 and "1 passed" not in unset.stdout, unset.stdout
    (other / "pyproject.toml").write_text(configs["pyproject.toml"])
    done = _pytest_in(other, "test_rebuild_index.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout
