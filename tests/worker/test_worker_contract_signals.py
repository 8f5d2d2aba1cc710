"""``task_started`` / ``task_finished`` receivers connected inside a real ``runworker``
process get the timestamps, the errors and the workers of each job (issue 10); the
``django.tasks`` ERROR line of a failed job carries its error."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from django_leasejobs.compat import task_backends
from django_leasejobs.models import Job
from tests import tasks, tasks_contract

pytestmark = pytest.mark.django_db(transaction=True)


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_receivers_in_a_worker_get_timestamps_errors_and_workers(
    workers, tmp_path: Path, pool: str
) -> None:
    log = tmp_path / "signals.jsonl"
    ok = tasks.add.enqueue(20, 22)
    failing = tasks_contract.fails_twice.enqueue("boom")
    worker = workers.start(
        args=["--pool", pool, "--concurrency", "1", "--burst", "--worker-id", f"w-{pool}"],
        options={"IMPORTS": ["tests.tasks_contract"]},
        env={tasks_contract.SIGNAL_FILE_ENV: str(log)},
    )
    assert worker.wait(timeout=60) == 0, worker.output

    records = [json.loads(line) for line in log.read_text().splitlines()]
    backend = task_backends["default"]

    def only(kind: str, result_id: str) -> list[dict[str, Any]]:
        return [r for r in records if r["signal"] == kind and r["id"] == result_id]

    # Every record was written by the worker process, not by this test.
    assert {r["pid"] for r in records} == {worker.pid}

    fetched = backend.get_result(ok.id)
    [started] = only("started", ok.id)
    [finished] = only("finished", ok.id)
    job = Job.objects.get(pk=ok.id)
    assert _moment(started["enqueued_at"]) == job.enqueued_at
    assert _moment(started["started_at"]) == job.started_at
    assert _moment(started["last_attempted_at"]) == job.last_attempted_at
    assert started["finished_at"] is None
    assert (finished["status"], finished["errors"]) == ("SUCCESSFUL", [])
    assert _moment(finished["finished_at"]) == fetched.finished_at is not None
    assert finished["worker_ids"] == fetched.worker_ids == [f"w-{pool}"]

    fetched = backend.get_result(failing.id)
    assert len(only("started", failing.id)) == 2  # one per attempt
    [finished] = only("finished", failing.id)  # only the final outcome
    assert finished["status"] == "FAILED"
    assert [path for path, _ in finished["errors"]] == ["builtins.ValueError"] * 2
    assert [[e.exception_class_path, e.traceback] for e in fetched.errors] == finished["errors"]
    assert "ValueError: boom" in finished["errors"][-1][1]
    assert _moment(finished["finished_at"]) == fetched.finished_at is not None
    assert _moment(finished["started_at"]) == fetched.started_at
    assert finished["worker_ids"] == fetched.worker_ids == [f"w-{pool}"] * 2

    # Django's own receiver logs a failed job at ERROR with the exception being handled:
    # the attempt's error, rebuilt with the traceback recorded where it ran as its cause,
    # not "NoneType: None".
    output = worker.output
    django_line = f"Task id={failing.id} path=tests.tasks_contract.fails_twice state=FAILED\n"
    assert django_line + "django_leasejobs.exceptions.RemoteTraceback: " in output
    assert "NoneType: None" not in output
    assert "raise ValueError(message)" in output.split(django_line, 1)[1]
    assert "direct cause of the following exception" in output
