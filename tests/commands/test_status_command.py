"""``manage.py leasejobs_status``: the health table, ``--json``, thresholds as exit codes.

In-process runs use ``call_command`` (a threshold passed raises ``CommandError`` with
``returncode`` 1); command-line runs check the real exit codes, so they commit their
rows (``transaction=True``) for the subprocess to see them.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from django_leasejobs import leases, queues
from django_leasejobs.models import Job, JobStatus, Schedule, Worker, WorkerState
from django_leasejobs.schedules import pause
from django_leasejobs.schedules.scheduler import lease_backend, run_pass
from tests.tasks import add

WORKER = "host-s:4242:ssssss"
LEASE = 30.0
HEADER = ["queue", "ready", "sched", "running", "expired", "dead", "ok/1h", "fail/1h", "fail%"]

DB = pytest.mark.django_db
COMMITTED = pytest.mark.django_db(transaction=True)


# --------------------------------------------------------------------------- helpers


def enqueue(**using: Any) -> int:
    task = add.using(**using) if using else add
    return int(task.enqueue(1, 2).id)


def claim(job_id: int) -> leases.ClaimedJob:
    claimed = leases.claim(WORKER, limit=1, lease_duration=LEASE)
    assert [c.id for c in claimed] == [job_id]
    return claimed[0]


def expire(job_id: int) -> None:
    changed = Job.objects.filter(pk=job_id).update(locked_until=Now() - timedelta(seconds=5))
    assert changed == 1


def running_job(**using: Any) -> int:
    job_id = enqueue(**using)
    claim(job_id)
    return job_id


def expired_job(**using: Any) -> int:
    job_id = running_job(**using)
    expire(job_id)
    return job_id


def succeeded_job(**using: Any) -> int:
    job_id = enqueue(**using)
    c = claim(job_id)
    leases.complete(c.id, c.attempt, WORKER, result=3)
    return job_id


def dead_job(**using: Any) -> int:
    job_id = expired_job(max_stalls=1, **using)
    assert [(r.id, r.status) for r in leases.reap().jobs] == [(job_id, JobStatus.DEAD)]
    return job_id


def old_ready_job(hours: float = 1) -> int:
    return enqueue(run_after=timezone.now() - timedelta(hours=hours))


def make_worker(worker_id: str, seen_ago: float = 0, **fields: Any) -> None:
    Worker.objects.create(
        id=worker_id, host="host-s", pid=4242, queues=["default"], pool="thread", concurrency=2
    )
    changes: dict[str, Any] = dict(fields)
    if seen_ago:
        changes["last_seen_at"] = Now() - timedelta(seconds=seen_ago)
    if changes:
        Worker.objects.filter(pk=worker_id).update(**changes)


def status(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("leasejobs_status", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def status_problem(*args: str) -> tuple[CommandError, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("leasejobs_status", *args, stdout=out, stderr=err)
    return excinfo.value, out.getvalue(), err.getvalue()


def table(output: str) -> dict[str, list[str]]:
    """The table's rows by queue name ("queue" for the header, "all" for the totals)."""
    rows: dict[str, list[str]] = {}
    for line in output.splitlines():
        if not line.strip():
            break  # the table ends at the blank line before the summary
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


def unreachable_database_url() -> str:
    if connection.vendor == "sqlite":
        return "sqlite:////nonexistent-leasejobs-dir/status.sqlite3"
    return "postgres://postgres@127.0.0.1:1/nope"  # nothing listens on port 1


# --------------------------------------------------------------------------- the table


@DB
def test_table_lists_each_queue_and_a_total_row() -> None:
    # default: 1 succeeded, 1 running, 2 ready (one waiting an hour); high: 1 scheduled,
    # 1 expired; low: 1 dead.
    dead_job(queue_name="low")  # first: a reap takes every expired lease
    succeeded_job()
    running_job()
    expired_job(queue_name="high")
    old_ready_job()
    enqueue()
    enqueue(queue_name="high", run_after=timezone.now() + timedelta(hours=1))
    make_worker(WORKER)

    out, err = status()

    rows = table(out)
    assert list(rows) == ["queue", "default", "high", "low", "all"]
    assert rows["queue"] == [*HEADER[1:], "oldest", "waiting"]
    # ready, sched, running, expired, dead, ok/1h, fail/1h, fail%, oldest, waiting
    assert rows["default"] == ["2", "0", "1", "0", "0", "1", "0", "0.0%", "60m", "0"]
    assert rows["high"] == ["0", "1", "1", "1", "0", "0", "0", "-", "-", "0"]
    assert rows["low"] == ["0", "0", "0", "0", "1", "0", "1", "100.0%", "-", "0"]
    assert rows["all"] == ["2", "1", "2", "1", "1", "1", "1", "50.0%", "60m", "0"]
    assert "workers online: 1" in out
    assert "running jobs listed: 2" in out
    assert err == ""


@DB
def test_table_of_an_empty_database_has_only_the_total_row() -> None:
    out, _err = status()
    rows = table(out)
    assert list(rows) == ["queue", "all"]
    assert rows["all"] == ["0", "0", "0", "0", "0", "0", "0", "-", "-", "0"]
    assert "workers online: 0" in out


@DB
def test_json_output() -> None:
    succeeded_job()
    dead_job(queue_name="low")
    running_job(queue_name="high")
    enqueue()
    make_worker(WORKER)
    make_worker("host-gone:1:gggggg", seen_ago=600)

    out, _err = status("--json")

    data = json.loads(out)
    assert {"totals", "queues", "workers", "per_minute", "problems"} <= set(data)
    assert data["problems"] == []
    totals = data["totals"]
    assert (totals["queue"], totals["ready"], totals["running"], totals["dead"]) == ("all", 1, 1, 1)
    assert (totals["succeeded_last_hour"], totals["failed_last_hour"]) == (1, 1)
    assert totals["failure_rate"] == 0.5
    assert [q["queue"] for q in data["queues"]] == ["default", "high", "low"]
    low = data["queues"][2]
    assert (low["dead"], low["failure_rate"]) == (1, 1.0)
    assert {w["id"]: w["online"] for w in data["workers"]} == {
        WORKER: True,
        "host-gone:1:gggggg": False,
    }
    assert data["workers_online"] == 1
    assert len(data["per_minute"]) == 61
    assert sum(m["succeeded"] for m in data["per_minute"]) == 1
    assert sum(m["failed"] for m in data["per_minute"]) == 1
    assert [r["queue"] for r in data["running"]] == ["high"]


@DB
def test_stopped_worker_is_not_online() -> None:
    make_worker(WORKER, state=WorkerState.STOPPED, stopped_at=Now())
    data = json.loads(status("--json")[0])
    assert [(w["id"], w["online"]) for w in data["workers"]] == [(WORKER, False)]
    assert data["workers_online"] == 0


# --------------------------------------------------------------------------- thresholds


@DB
def test_max_dead() -> None:
    assert status("--max-dead", "0")[1] == ""  # nothing dead: healthy

    dead_job()

    error, out, err = status_problem("--max-dead", "0")
    assert error.returncode == 1
    assert str(error) == "1 dead letters (> 0)"
    assert "PROBLEM: 1 dead letters (> 0)" in err
    assert table(out)["all"][4] == "1"  # the table is printed all the same
    status("--max-dead", "1")  # one dead letter is not more than one


@DB
def test_max_age() -> None:
    enqueue()  # ready just now
    enqueue(run_after=timezone.now() + timedelta(hours=2))  # scheduled: not waiting yet
    status("--max-age", "60")

    old_ready_job(hours=1)

    error, _out, err = status_problem("--max-age", "60")
    assert error.returncode == 1
    assert re.fullmatch(r"oldest ready job has waited 36\d\ds \(> 60s\)", str(error)), str(error)
    assert "PROBLEM: oldest ready job has waited" in err
    status("--max-age", "7200")


@DB
def test_max_age_ignores_running_jobs_enqueued_long_ago() -> None:
    job_id = old_ready_job(hours=1)
    claim(job_id)
    status("--max-age", "60")


@DB
def test_max_expired() -> None:
    job_id = running_job()
    status("--max-expired", "0")  # a live lease

    expire(job_id)

    error, _out, err = status_problem("--max-expired", "0")
    assert error.returncode == 1
    assert str(error) == "1 running jobs past their lease (> 0)"
    assert "PROBLEM: 1 running jobs past their lease (> 0)" in err

    leases.reap()  # reaped: no longer past its lease
    status("--max-expired", "0")


@DB
def test_max_worker_problems() -> None:
    make_worker(WORKER)
    make_worker("host-s:1:quiet")
    make_worker("host-s:2:gone", seen_ago=3600, problem="an old problem of a gone worker")
    out, _ = status("--max-worker-problems", "0")
    assert "reports:" not in out

    Worker.objects.filter(pk=WORKER).update(
        problem="gave up recording 1 attempt(s) since it started; last: job 7 attempt 1: x"
    )

    error, out, err = status_problem("--max-worker-problems", "0")
    assert error.returncode == 1
    assert str(error) == "1 online workers report problems (> 0)"
    assert f"worker {WORKER} reports: gave up recording 1 attempt(s)" in out
    assert "gone" not in out  # only online workers count
    assert "PROBLEM: 1 online workers report problems (> 0)" in err
    status("--max-worker-problems", "1")
    data = json.loads(status("--json")[0])
    problems = {w["id"]: w["problem"] for w in data["workers"]}
    assert problems[WORKER].startswith("gave up recording")
    assert problems["host-s:1:quiet"] == ""


@DB
def test_every_problem_is_reported_and_json_lists_them() -> None:
    dead_job()
    expired_job()
    old_ready_job()

    error, out, _err = status_problem(
        "--json", "--max-dead", "0", "--max-expired", "0", "--max-age", "60"
    )

    assert error.returncode == 1
    problems = json.loads(out)["problems"]
    assert len(problems) == 3
    assert problems[1:] == ["1 dead letters (> 0)", "1 running jobs past their lease (> 0)"]
    assert problems[0].startswith("oldest ready job has waited")
    assert str(error) == "; ".join(problems)


@DB
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-dead", "-1"], "argument --max-dead: expected a whole number >= 0, got '-1'"),
        (["--max-dead", "1.5"], "argument --max-dead: expected a whole number, got '1.5'"),
        (["--max-expired", "x"], "argument --max-expired: expected a whole number, got 'x'"),
        (["--max-age", "x"], "argument --max-age: expected a number of seconds, got 'x'"),
        (["--max-age", "-5"], "argument --max-age: expected seconds >= 0, got '-5'"),
        (["--max-age", "nan"], "argument --max-age: expected seconds >= 0, got 'nan'"),
        (["--max-age", "inf"], "argument --max-age: expected seconds >= 0, got 'inf'"),
    ],
)
def test_bad_threshold_values_are_rejected(args: list[str], message: str) -> None:
    error, out, _err = status_problem(*args)
    assert message in str(error)
    assert out == ""


@DB
def test_unknown_backend_is_rejected() -> None:
    error, _out, _err = status_problem("--backend", "nope")
    assert "No task backend 'nope'" in str(error)


# --------------------------------------------------------------------------- schedules

EVERY_MINUTE = {"task": "tests.tasks.add", "every": 60, "args": [1, 2]}


def with_schedules(*names: str) -> Any:
    """TASKS with the default backend and an every-minute schedule of each name."""
    return override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
                "QUEUES": ["default", "high", "low"],
                "OPTIONS": {"SCHEDULES": dict.fromkeys(names, EVERY_MINUTE)},
            }
        }
    )


def unattended(name: str, minutes: int = 10) -> None:
    """Simulate schedules no worker ran: the cursor ``minutes`` periods back."""
    cursor = leases.database_now() - timedelta(minutes=minutes)
    assert Schedule.objects.filter(name=name).update(last_tick=cursor) == 1


@DB
def test_overdue_schedule_is_reported_without_changing_the_exit_code() -> None:
    with with_schedules("late", "fine", "held"):
        run_pass(lease_backend("default"))
        unattended("late")
        unattended("held")
        pause("held")  # paused: late on purpose

        out, err = status()
        data = json.loads(status("--json")[0])
        error, _out, problem = status_problem("--max-overdue-schedules", "0")
        status("--max-overdue-schedules", "1")

    (line,) = [line for line in out.splitlines() if line.startswith("schedule ")]
    assert re.fullmatch(
        r"schedule late overdue: its tick of \S+ \S+ is (9|10)m late; no worker is running "
        r"the schedules \(see manage.py leasejobs_schedules\)",
        line,
    ), line
    assert err == ""
    (overdue,) = data["overdue_schedules"]
    assert (overdue["name"], overdue["state"], overdue["overdue"]) == ("late", "active", True)
    assert 9 * 60 <= overdue["overdue_seconds"] < 11 * 60
    assert overdue["next_tick"].endswith("+00:00")
    assert data["problems"] == []
    assert error.returncode == 1
    assert str(error) == "1 schedules overdue (> 0)"
    assert "PROBLEM: 1 schedules overdue (> 0)" in problem


@DB
def test_healthy_and_new_schedules_are_not_overdue() -> None:
    with with_schedules("fine", "fresh"):
        with with_schedules("fine"):
            run_pass(lease_backend("default"))
        # "fresh" is new: declared, never seen by a scheduler.

        out, err = status("--max-overdue-schedules", "0")
        data = json.loads(status("--json")[0])

    assert "overdue" not in out
    assert err == ""
    assert data["overdue_schedules"] == []


@DB
def test_no_schedules_nothing_overdue() -> None:
    data = json.loads(status("--json", "--max-overdue-schedules", "0")[0])
    assert data["overdue_schedules"] == []


# --------------------------------------------------------------------------- paused queues


@DB
def test_paused_queues_are_shown_without_changing_the_exit_code() -> None:
    enqueue()
    enqueue(queue_name="low")
    enqueue(queue_name="low", run_after=timezone.now() + timedelta(hours=1))
    assert queues.pause("low")
    assert queues.pause("high")  # no jobs: listed all the same

    out, err = status("--max-dead", "0", "--max-age", "3600")
    data = json.loads(status("--json")[0])

    rows = table(out)
    assert list(rows) == ["queue", "default", "low", "all"]  # the table as it was
    assert rows["low"][:2] == ["1", "1"]  # ready, sched
    paused = [line for line in out.splitlines() if " PAUSED " in line]
    assert len(paused) == 2
    assert re.fullmatch(
        r"queue high PAUSED since \S+ \S+: 0 pending job\(s\) wait, no worker claims them "
        r"\(manage.py leasejobs_queue resume high\)",
        paused[0],
    ), paused[0]
    assert paused[1].startswith("queue low PAUSED since ")
    assert ": 2 pending job(s) wait, no worker claims them" in paused[1]
    assert err == ""

    assert {q["queue"]: q["paused"] for q in data["queues"]} == {"default": False, "low": True}
    assert "paused" not in data["totals"]
    assert [view["name"] for view in data["paused_queues"]] == ["high", "low"]
    low = data["paused_queues"][1]
    assert (low["paused"], low["pending"], low["ready"], low["running"]) == (True, 2, 1, 0)
    assert low["paused_at"].endswith("+00:00")
    assert data["problems"] == []

    queues.resume("low")
    queues.resume("high")
    out, _err = status()
    data = json.loads(status("--json")[0])
    assert "PAUSED" not in out
    assert data["paused_queues"] == []
    assert not any(q["paused"] for q in data["queues"])


@COMMITTED
def test_paused_queue_from_the_command_line(run_manage: Any) -> None:
    enqueue(queue_name="low")
    assert queues.pause("low")

    done = run_manage(["leasejobs_status", "--json", "--max-dead", "0"])

    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [(view["name"], view["pending"]) for view in data["paused_queues"]] == [("low", 1)]
    assert [(q["queue"], q["paused"]) for q in data["queues"]] == [("low", True)]


# --------------------------------------------------------------------------- command line


@COMMITTED
def test_exit_codes_from_the_command_line(run_manage: Any) -> None:
    healthy = run_manage(["leasejobs_status", "--max-dead", "0", "--max-expired", "0"])
    assert healthy.returncode == 0, healthy.stderr
    assert table(healthy.stdout)["all"][:5] == ["0", "0", "0", "0", "0"]
    assert healthy.stderr == ""

    dead_job()
    dead = run_manage(["leasejobs_status", "--max-dead", "0"])
    assert dead.returncode == 1
    assert "PROBLEM: 1 dead letters (> 0)" in dead.stderr
    assert "Traceback" not in dead.stderr
    assert run_manage(["leasejobs_status", "--max-dead", "1"]).returncode == 0

    expired_job()
    old_ready_job()  # after the claims: they would take it first
    late = run_manage(["leasejobs_status", "--max-age", "60"])
    assert late.returncode == 1
    assert "oldest ready job has waited" in late.stderr
    expired = run_manage(["leasejobs_status", "--json", "--max-expired", "0"])
    assert expired.returncode == 1
    assert json.loads(expired.stdout)["problems"] == ["1 running jobs past their lease (> 0)"]


@DB
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-dead", "-1"], "argument --max-dead: expected a whole number >= 0, got '-1'"),
        (["--max-age", "x"], "argument --max-age: expected a number of seconds, got 'x'"),
    ],
)
def test_bad_values_from_the_command_line_exit_with_usage(
    run_manage: Any, args: list[str], message: str
) -> None:
    done = run_manage(["leasejobs_status", *args])
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_unreachable_database_exits_2(run_manage: Any, subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "DATABASE_URL": unreachable_database_url()}
    env["LEASEJOBS_TEST_SUBPROCESS"] = "1"

    done = run_manage(["leasejobs_status", "--max-dead", "0"], env=env)

    assert done.returncode == 2
    assert "database 'default' unreachable or failing" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
