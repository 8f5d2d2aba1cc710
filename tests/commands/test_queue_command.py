"""``manage.py leasejobs_queue``: ``pause NAME``, ``resume NAME``, ``list`` (table and ``--json``).

Limits come from ``override_settings(TASKS=...)``; running jobs from real claims
(``leases.claim`` with the backend's flow rules, which also record the rate starts).
Command-line runs check the real exit codes, so they commit their rows
(``transaction=True``) and pass the limits in ``LEASEJOBS_TEST_OPTIONS``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from django_leasejobs import leases, queues
from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.models import Job, JobStatus, Queue
from django_leasejobs.schedules.scheduler import lease_backend
from tests.tasks import add

DB = pytest.mark.django_db
COMMITTED = pytest.mark.django_db(transaction=True)

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"
QUEUES = ["default", "high", "low"]
WORKER = "host-q:4242:qqqqqq"
LEASE = 30.0
LIMITS = {"QUEUE_LIMITS": {"high": 2}, "QUEUE_RATE_LIMITS": {"low": "100/m"}}
VIEW_KEYS = {
    "name",
    "paused",
    "paused_at",
    "limit",
    "rate",
    "running",
    "pending",
    "ready",
    "starts_in_window",
}
HEADER = ["queue", "paused", "limit", "rate", "running", "pending", "ready"]


def tasks_with(options: dict[str, Any], queue_names: list[str] = QUEUES) -> dict[str, Any]:
    return {"default": {"BACKEND": BACKEND, "QUEUES": queue_names, "OPTIONS": options}}


@pytest.fixture
def limited() -> Iterator[LeaseJobsBackend]:
    """The default backend with a concurrency limit on ``high`` and a rate on ``low``."""
    with override_settings(TASKS=tasks_with(LIMITS)):
        yield lease_backend("default")


def command(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("leasejobs_queue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def command_error(*args: str) -> CommandError:
    with pytest.raises(CommandError) as excinfo:
        command(*args)
    return excinfo.value


def enqueue(queue: str, **using: Any) -> int:
    return int(add.using(queue_name=queue, **using).enqueue(1, 2).id)


def claim(backend: LeaseJobsBackend, *queue_names: str, limit: int = 10) -> list[int]:
    """What one claim of a worker serving ``queue_names`` (default: all) takes, by id."""
    claimed = leases.claim(
        WORKER,
        limit=limit,
        lease_duration=LEASE,
        backend=backend.alias,
        queues=list(queue_names or QUEUES),
        using=backend.database,
        flow=backend.config.flow,
    )
    return sorted(job.id for job in claimed)


def table(output: str) -> dict[str, list[str]]:
    """The table's rows by queue name ("queue" for the header)."""
    rows: dict[str, list[str]] = {}
    for line in output.splitlines():
        if not line.strip():
            break  # the table ends at the blank line before the legend
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture
def busy(limited: LeaseJobsBackend) -> LeaseJobsBackend:
    """Jobs in every state the list counts, under ``LIMITS``; ``default`` paused.

    high: 3 enqueued, its limit of 2 running; low: 1 started (a rate start), 1 ready,
    1 scheduled an hour ahead; default: paused, 1 ready.
    """
    for _ in range(3):
        enqueue("high")
    assert len(claim(limited, "high")) == 2  # the queue's limit
    enqueue("low")
    assert len(claim(limited, "low")) == 1
    enqueue("low")
    enqueue("low", run_after=timezone.now() + timedelta(hours=1))
    enqueue("default")
    assert queues.pause("default")
    return limited


# --------------------------------------------------------------------------- pause, resume


@DB
def test_pause_and_resume_say_what_changed(limited: LeaseJobsBackend) -> None:
    assert command("pause", "low") == ("paused queue 'low'\n", "")
    assert queues.is_paused("low")
    paused_at = Queue.objects.get(name="low").paused_at
    assert paused_at is not None

    assert command("pause", "low") == ("queue 'low' was already paused\n", "")
    assert Queue.objects.get(name="low").paused_at == paused_at  # the first pause's time

    assert command("resume", "low") == ("resumed queue 'low'\n", "")
    assert not queues.is_paused("low")
    assert Queue.objects.get(name="low").paused_at is None

    assert command("resume", "low") == ("queue 'low' was not paused\n", "")
    assert command("resume", "high") == ("queue 'high' was not paused\n", "")  # never paused
    assert sorted(Queue.objects.values_list("backend", "name", "paused")) == [
        ("default", "high", False),
        ("default", "low", False),
    ]


@DB
@pytest.mark.parametrize("options", [{}, LIMITS], ids=["main-lane", "flow-claim"])
def test_a_paused_queue_is_not_claimed_until_resumed(
    lease_path: str, options: dict[str, Any]
) -> None:
    with override_settings(TASKS=tasks_with(options)):
        backend = lease_backend("default")
        low = [enqueue("low") for _ in range(2)]
        command("pause", "low")
        others = [enqueue("default"), enqueue("high")]

        assert claim(backend) == sorted(others)
        assert claim(backend) == []  # the paused queue's jobs wait
        assert claim(backend, "low") == []  # even for a worker of that queue alone
        assert set(Job.objects.filter(pk__in=low).values_list("status", flat=True)) == {
            JobStatus.PENDING
        }

        command("resume", "low")

        assert claim(backend) == sorted(low)


@DB
def test_a_queue_dropped_from_queues_can_still_be_resumed() -> None:
    with override_settings(TASKS=tasks_with({}, [*QUEUES, "old"])):
        command("pause", "old")
    with override_settings(TASKS=tasks_with({})):
        error = command_error("pause", "older")
        assert command("resume", "old")[0] == "resumed queue 'old'\n"

    assert str(error) == (
        "No queue 'older' in TASKS['default']['QUEUES']. Known queues: default, high, low, old."
    )


@DB
def test_without_declared_queues_any_name_is_a_queue() -> None:
    with override_settings(TASKS=tasks_with({}, [])):
        assert command("pause", "anything")[0] == "paused queue 'anything'\n"
        assert queues.is_paused("anything")


# --------------------------------------------------------------------------- list


@DB
def test_list_as_json(busy: LeaseJobsBackend) -> None:
    out, err = command("list", "--json")

    data = json.loads(out)
    assert err == ""
    assert isinstance(data, list)
    assert all(set(view) == VIEW_KEYS for view in data)
    views = {view.pop("name"): view for view in data}
    assert list(views) == ["default", "high", "low"]
    paused_at = views["default"].pop("paused_at")
    assert paused_at is not None and paused_at.endswith("+00:00")
    assert views["default"] == {
        "paused": True,
        "limit": None,
        "rate": None,
        "running": 0,
        "pending": 1,
        "ready": 1,
        "starts_in_window": None,
    }
    assert views["high"] == {
        "paused": False,
        "paused_at": None,
        "limit": 2,
        "rate": None,
        "running": 2,
        "pending": 1,
        "ready": 1,
        "starts_in_window": None,
    }
    assert views["low"] == {
        "paused": False,
        "paused_at": None,
        "limit": None,
        "rate": "100/m",
        "running": 1,
        "pending": 2,
        "ready": 1,
        "starts_in_window": 1,
    }


@DB
def test_list_as_a_table(busy: LeaseJobsBackend) -> None:
    out, err = command("list")

    rows = table(out)
    assert err == ""
    assert rows == {
        "queue": HEADER[1:],
        # paused, limit (running/limit), rate (starts/rate), running, pending, ready
        "default": ["PAUSED", "-", "-", "0", "1", "1"],
        "high": ["no", "2/2", "-", "2", "1", "1"],
        "low": ["no", "-", "1/100/m", "1", "2", "1"],
    }
    assert "limit: running/most at once (QUEUE_LIMITS)" in out
    assert "PAUSED: no worker claims the queue's jobs until manage.py leasejobs_queue" in out


@DB
def test_list_of_an_idle_backend(limited: LeaseJobsBackend) -> None:
    # The declared queues and the limited ones, even without jobs or rows.
    assert table(command("list")[0]) == {
        "queue": HEADER[1:],
        "default": ["no", "-", "-", "0", "0", "0"],
        "high": ["no", "0/2", "-", "0", "0", "0"],
        "low": ["no", "-", "0/100/m", "0", "0", "0"],
    }
    assert "PAUSED" not in command("list")[0]
    assert [view["name"] for view in json.loads(command("list", "--json")[0])] == QUEUES


@DB
def test_a_running_job_past_its_lease_does_not_count(busy: LeaseJobsBackend) -> None:
    Job.objects.filter(queue="high", status=JobStatus.RUNNING).update(
        locked_until=Now() - timedelta(minutes=5)  # the database's clock
    )
    views = {view["name"]: view for view in json.loads(command("list", "--json")[0])}
    assert views["high"]["running"] == 0


# --------------------------------------------------------------------------- bad input


@DB
@pytest.mark.parametrize("args", [["pause", "low"], ["resume", "low"], ["list"]])
def test_unknown_backend_is_rejected(args: list[str]) -> None:
    error = command_error(*args, "--backend", "nope")
    assert "No task backend 'nope' in settings.TASKS" in str(error)
    assert not Queue.objects.exists()


@DB
@pytest.mark.parametrize("action", ["pause", "resume"])
def test_unknown_queue_names_the_known_ones(limited: LeaseJobsBackend, action: str) -> None:
    error = command_error(action, "lwo")
    assert str(error) == (
        "No queue 'lwo' in TASKS['default']['QUEUES']. Known queues: default, high, low."
    )
    assert not Queue.objects.exists()


@DB
@pytest.mark.parametrize("name", ["", "q" * 129])
def test_a_name_that_cannot_be_a_queue_is_a_usage_error(name: str) -> None:
    error = command_error("pause", name)
    assert f"argument NAME: expected a queue name of 1 to 128 characters, got {name!r}" in str(
        error
    )
    assert not Queue.objects.exists()


@DB
def test_the_action_is_required() -> None:
    assert "the following arguments are required: {pause,resume,list}" in str(command_error())
    assert "invalid choice: 'stop'" in str(command_error("stop", "low"))
    assert "the following arguments are required: NAME" in str(command_error("pause"))


# --------------------------------------------------------------------------- command line


@COMMITTED
def test_from_the_command_line(run_manage: Any, subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps(LIMITS)}
    with override_settings(TASKS=tasks_with(LIMITS)):  # what the subprocess has
        backend = lease_backend("default")
        for _ in range(3):
            enqueue("high")
        assert len(claim(backend, "high")) == 2
        low = enqueue("low")

        paused = run_manage(["leasejobs_queue", "pause", "low"], env=env)
        again = run_manage(["leasejobs_queue", "pause", "low", "--backend", "default"], env=env)
        assert (paused.returncode, paused.stdout, paused.stderr) == (0, "paused queue 'low'\n", "")
        assert (again.returncode, again.stdout, again.stderr) == (
            0,
            "queue 'low' was already paused\n",
            "",
        )
        assert claim(backend) == []  # high at its limit, low paused

        listed = run_manage(["leasejobs_queue", "list", "--json"], env=env)
        assert listed.returncode == 0, listed.stderr
        views = {view["name"]: view for view in json.loads(listed.stdout)}
        assert [views["high"][k] for k in ("paused", "limit", "running", "pending")] == [
            False,
            2,
            2,
            1,
        ]
        assert [views["low"][k] for k in ("paused", "rate", "running", "pending")] == [
            True,
            "100/m",
            0,
            1,
        ]
        text = run_manage(["leasejobs_queue", "list"], env=env)
        assert text.returncode == 0, text.stderr
        rows = table(text.stdout)
        assert (rows["high"][:2], rows["low"][:3]) == (["no", "2/2"], ["PAUSED", "-", "0/100/m"])

        resumed = run_manage(["leasejobs_queue", "resume", "low"], env=env)
        assert (resumed.returncode, resumed.stdout, resumed.stderr) == (
            0,
            "resumed queue 'low'\n",
            "",
        )
        assert claim(backend) == [low]


@DB
@pytest.mark.parametrize(
    ("args", "returncode", "message"),
    [
        (["pause", "nope"], 1, "CommandError: No queue 'nope' in TASKS['default']['QUEUES']."),
        (["list", "--backend", "nope"], 1, "CommandError: No task backend 'nope'"),
        (["resume", "q" * 129], 2, "argument NAME: expected a queue name of 1 to 128 characters"),
        (["pause"], 2, "the following arguments are required: NAME"),
        ([], 2, "the following arguments are required: {pause,resume,list}"),
    ],
)
def test_bad_input_from_the_command_line(
    run_manage: Any, args: list[str], returncode: int, message: str
) -> None:
    done = run_manage(["leasejobs_queue", *args])

    assert done.returncode == returncode
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    if returncode == 2:
        assert "usage: manage.py leasejobs_queue" in done.stderr
