"""``manage.py runworker``: refuses bad options and bad settings without starting;
the ``Worker`` class behind it runs without ``call_command``.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from django_leasejobs.compat import task_finished
from django_leasejobs.models import Job, JobStatus, WorkerState
from django_leasejobs.models import Worker as WorkerRow
from django_leasejobs.worker import Worker, WorkerConfig
from tests import tasks, tasks_worker_flow
from tests.tasks_worker_flow import read_lines

pytestmark = pytest.mark.django_db(transaction=True)

# A worker that started would run until killed: a short timeout turns a hang into a failure.
REFUSAL_TIMEOUT = 60

USAGE = "usage: manage.py runworker"


@pytest.mark.parametrize(
    ("args", "message", "usage"),
    [
        (["--concurrency", "0"], "argument --concurrency: expected a whole number >= 1", True),
        (["--concurrency", "x"], "argument --concurrency: expected a whole number, got 'x'", True),
        (
            ["--async-concurrency", "0"],
            "argument --async-concurrency: expected a whole number >= 1",
            True,
        ),
        (["--pool", "bogus"], "argument --pool: invalid choice: 'bogus'", True),
        (["--queues", ""], "argument --queues: expected one or more queue names", True),
        (["--queues", " , "], "argument --queues: expected one or more queue names", True),
        (
            ["--queues", "high,nope"],
            "--queues names queues not in TASKS['default']['QUEUES']: nope",
            False,
        ),
        (["--shutdown-timeout", "-1"], "argument --shutdown-timeout: expected seconds >= 0", True),
        (["--shutdown-timeout", "nan"], "argument --shutdown-timeout: expected seconds >= 0", True),
        (["--max-jobs", "0"], "argument --max-jobs: expected a whole number >= 1", True),
        (["--worker-id", " "], "argument --worker-id: expected a non-empty id", True),
        (
            ["--log-level", "VERBOSE"],
            "argument --log-level: expected one of DEBUG, INFO, WARNING, ERROR",
            True,
        ),
        (["--log-format", "xml"], "argument --log-format: invalid choice: 'xml'", True),
        (["--backend", "missing"], "No task backend 'missing' in settings.TASKS", False),
    ],
    ids=[
        "concurrency-0",
        "concurrency-x",
        "async-concurrency-0",
        "pool-bogus",
        "queues-empty",
        "queues-blank",
        "queues-unknown",
        "shutdown-timeout-negative",
        "shutdown-timeout-nan",
        "max-jobs-0",
        "worker-id-blank",
        "log-level-unknown",
        "log-format-unknown",
        "backend-missing",
    ],
)
def test_bad_option_is_refused_without_starting(
    run_manage: Any, args: list[str], message: str, usage: bool
) -> None:
    done = run_manage(["runworker", *args], timeout=REFUSAL_TIMEOUT)
    assert done.returncode != 0
    assert message in done.stderr
    # argparse errors exit 2 with the usage; CommandErrors exit 1 with a one-line message.
    assert (USAGE in done.stderr) is usage
    assert done.returncode == (2 if usage else 1)
    assert "Traceback" not in done.stderr
    output = done.stdout + done.stderr
    assert "started: backend=" not in output
    assert not WorkerRow.objects.exists()


@pytest.mark.parametrize(
    ("options", "extra_env", "check_id", "message"),
    [
        ({"LEASE_DURATION": -1}, {}, "leasejobs.E002", "LEASE_DURATION must be > 0, got -1"),
        ({"MAX_ATTEMPTS": 0}, {}, "leasejobs.E002", "MAX_ATTEMPTS must be >= 1, got 0"),
        ({"BOGUS_OPTION": 1}, {}, "leasejobs.E001", "Unknown django-leasejobs option"),
        (
            {},
            {"LEASEJOBS_LOCK_LOST_BEHAVIOR": "explode"},
            "leasejobs.E003",
            "Unknown lock-lost behaviour 'explode'",
        ),
        (
            {"LEASE_DURATION": 5, "HEARTBEAT_INTERVAL": 5},
            {},
            "leasejobs.E004",
            "HEARTBEAT_INTERVAL (5s) must be shorter than LEASE_DURATION (5s)",
        ),
    ],
    ids=["E002-lease", "E002-attempts", "E001", "E003-env", "E004"],
)
@pytest.mark.parametrize("skip_checks", [False, True], ids=["checks", "skip-checks"])
def test_misconfigured_options_refuse_to_start(
    run_manage: Any,
    subprocess_env: dict[str, str],
    options: dict[str, Any],
    extra_env: dict[str, str],
    check_id: str,
    message: str,
    skip_checks: bool,
) -> None:
    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps(options), **extra_env}
    args = ["runworker", "--burst", "--concurrency", "1"]
    if skip_checks:  # the system checks do not run: the worker itself must refuse
        args.append("--skip-checks")
    done = run_manage(args, env=env, timeout=REFUSAL_TIMEOUT)
    assert done.returncode == 1, done.stderr
    assert check_id in done.stderr
    assert message in done.stderr
    assert ("SystemCheckError" in done.stderr) is not skip_checks
    if skip_checks:
        assert f"TASKS['default'] is misconfigured: [{check_id}]" in done.stderr
    assert "Traceback" not in done.stderr
    assert "started: backend=" not in done.stdout + done.stderr
    assert not WorkerRow.objects.exists()


def test_worker_class_runs_in_process_without_call_command(marker_dir: str) -> None:
    recorded = [tasks_worker_flow.record_id.enqueue(marker_dir, "inproc") for _ in range(4)]
    added = tasks.add.enqueue(20, 22)
    finished: list[Any] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    task_finished.connect(on_finished)
    try:
        worker = Worker(WorkerConfig(burst=True, concurrency=1, pool="thread"))
        code = worker.run()
    finally:
        task_finished.disconnect(on_finished)

    assert code == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    ids = [int(r.id) for r in recorded]
    assert sorted(int(line.split()[0]) for line in read_lines(marker_dir, "inproc.ids")) == ids
    # Pool threads run inside this very process.
    assert {int(line.split()[2]) for line in read_lines(marker_dir, "inproc.ids")} == {os.getpid()}
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}
    assert set(Job.objects.values_list("last_worker", flat=True)) == {worker.worker_id}
    assert tasks.add.get_result(added.id).return_value == 42
    assert sorted(int(r.id) for r in finished) == sorted([*ids, int(added.id)])
    assert {str(r.status) for r in finished} == {"SUCCESSFUL"}
    row = WorkerRow.objects.get(pk=worker.worker_id)
    assert (row.pid, row.pool, row.concurrency) == (os.getpid(), "thread", 1)
    assert row.state == WorkerState.STOPPED


def test_reload_runs_the_worker_under_the_autoreloader(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    """``--reload``: the worker runs in a child of Django's autoreloader (development)."""
    ids = [tasks.add.enqueue(i, i).id for i in range(3)]
    options = {"POLL_INTERVAL": 0.2, "STALE_LOCK_INTERVAL": 0}
    done = run_manage(
        ["runworker", "--reload", "--burst", "--pool", "thread", "--concurrency", "1"],
        env={**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps(options)},
        timeout=REFUSAL_TIMEOUT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Watching for file changes" in output
    assert "started: backend=default" in output
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }


def test_runworker_starts_without_importing_the_urlconf(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    """A worker runs the system checks it needs (models, this app's own), not the URL,
    admin or template ones: those import the site's URLconf and every view behind it,
    which a worker never serves, and every worker of a fleet pays its start-up.
    (`manage.py check` still runs them all.)"""
    result = tasks.add.enqueue(2, 3)
    env = {**subprocess_env, "LEASEJOBS_TEST_ROOT_URLCONF": "tests.urls_broken"}
    done = run_manage(["runworker", "--burst", "--concurrency", "1"], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Job.objects.get(pk=int(result.id)).status == JobStatus.SUCCEEDED
    checked = run_manage(["check"], env=env, timeout=60)
    assert "runworker imported the URLconf" in checked.stderr
