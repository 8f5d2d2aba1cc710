"""A failed job reaches error trackers with its traceback (issue 13, point 3).

The task's exception happened in a slot (a child process or a thread); the worker logs
the attempt's failure with a rebuilt ``TaskFailed`` as ``exc_info``, named after the
task's exception class, with the traceback recorded where it ran as the record's
``exc_text`` and as the exception's ``__cause__``; ``job_failed`` receivers get it as
``exception``, and ``job_failed`` and ``task_finished`` are sent while it is handled.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from django_leasejobs.exceptions import RemoteTraceback, TaskFailed, task_failure
from django_leasejobs.logs import JsonFormatter
from django_leasejobs.signals import job_failed
from django_leasejobs.worker import Worker, WorkerConfig
from tests import failure_capture, tasks, tasks_contract, tasks_worker_poison
from tests.conftest import ListHandler
from tests.failure_capture import CAPTURE_FILE_ENV, exception_chain

pytestmark = pytest.mark.django_db(transaction=True)

RAISE_LINE = "raise ValueError(message)"
"""The line of tests/tasks_contract.py that raises: only the child's traceback has it."""


def _captured(path: Path, kind: str, job_id: int) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in entries if e["kind"] == kind and e["job_id"] == job_id]


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_tracker_handler_in_a_worker_gets_the_traceback(
    workers: Any, tmp_path: Path, pool: str
) -> None:
    capture = tmp_path / "capture.jsonl"
    failing = int(tasks_contract.fails_twice.enqueue("boom").id)
    ok = int(tasks.add.enqueue(1, 2).id)
    worker = workers.start(
        args=["--pool", pool, "--concurrency", "1", "--burst"],
        options={"IMPORTS": ["tests.tasks_contract", "tests.failure_capture"]},
        env={CAPTURE_FILE_ENV: str(capture)},
    )
    assert worker.wait(timeout=60) == 0, worker.output

    retried, final = _captured(capture, "log", failing)
    assert (retried["level"], retried["status"]) == ("WARNING", "pending")
    assert (final["level"], final["status"]) == ("ERROR", "failed")
    assert {e["pid"] for e in (retried, final)} == {worker.pid}  # logged by the worker
    for entry in (retried, final):
        error, cause = entry["chain"]
        assert error == {"module": "builtins", "type": "ValueError", "value": "boom"}
        assert cause["type"] == "RemoteTraceback"
        assert RAISE_LINE in cause["value"]
        assert RAISE_LINE in entry["remote_traceback"]
        # logging.Formatter prints the child's own traceback under the message.
        message, traceback_text = entry["formatted"].split("\n", 1)
        assert message.endswith("failed (builtins.ValueError: boom) -> " + entry["status"])
        assert traceback_text == entry["remote_traceback"].rstrip("\n")
        assert traceback_text.startswith("Traceback (most recent call last):")
        assert 'tasks_contract.py", line' in traceback_text
        assert traceback_text.endswith("ValueError: boom")

    signalled = _captured(capture, "job_failed", failing)
    assert [e["status"] for e in signalled] == ["pending", "failed"]
    for entry in signalled:
        assert entry["handled"] is True
        assert entry["chain"][0] == {"module": "builtins", "type": "ValueError", "value": "boom"}
        assert RAISE_LINE in entry["remote_traceback"]
    [finished] = _captured(capture, "task_finished", failing)
    assert finished["status"] == "FAILED"
    assert finished["chain"][0]["type"] == "ValueError"
    assert RAISE_LINE in finished["remote_traceback"]
    [succeeded] = _captured(capture, "task_finished", ok)
    assert (succeeded["status"], succeeded["chain"]) == ("SUCCESSFUL", [])

    # The project's console handler shows the real traceback too, never "NoneType: None".
    assert RAISE_LINE in worker.output
    assert "NoneType: None" not in worker.output


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_hostile_exceptions_still_reach_the_handler(
    workers: Any, tmp_path: Path, pool: str
) -> None:
    capture = tmp_path / "capture.jsonl"
    hostile = {
        tasks_worker_poison.raise_unprintable: "Unprintable",
        tasks_worker_poison.raise_nul: "ValueError",
        tasks_worker_poison.raise_lone_surrogate: "ValueError",
        tasks_worker_poison.raise_long_class_path: None,  # cut to the column: any name
        tasks_worker_poison.raise_keyboard_interrupt: "KeyboardInterrupt",
        failure_capture.raise_huge_message: "ValueError",
    }
    ids = {int(task.enqueue().id): name for task, name in hostile.items()}
    ok = int(tasks.add.enqueue(1, 2).id)
    worker = workers.start(
        args=["--pool", pool, "--concurrency", "2", "--burst"],
        options={"IMPORTS": ["tests.tasks_worker_poison", "tests.failure_capture"]},
        env={CAPTURE_FILE_ENV: str(capture)},
    )
    assert worker.wait(timeout=60) == 0, worker.output

    for job_id, name in ids.items():
        records = _captured(capture, "log", job_id)
        assert [r["status"] for r in records] == ["pending", "failed"], (job_id, records)
        for record in records:
            if name is not None:
                assert record["chain"][0]["type"] == name
            assert len(record["chain"][0]["value"]) <= 2000  # the stored message
            assert record["remote_traceback"].startswith("Traceback (most recent call last):")
            assert "Traceback (most recent call last):" in record["formatted"]
        assert [e["status"] for e in _captured(capture, "job_failed", job_id)] == [
            "pending",
            "failed",
        ]
    assert _captured(capture, "task_finished", ok)[0]["status"] == "SUCCESSFUL"
    assert "--- Logging error ---" not in worker.output


# --------------------------------------------------------------------------- in process


def test_job_failed_receivers_get_the_exception_in_process(leasejobs_log: ListHandler) -> None:
    received: list[dict[str, Any]] = []

    def on_failed(sender: Any, **kwargs: Any) -> None:
        received.append({**kwargs, "handled": sys.exc_info()[1]})

    job_failed.connect(on_failed, weak=False)
    try:
        failing = int(tasks_contract.fails_twice.enqueue("boom").id)
        config = WorkerConfig(concurrency=1, pool="thread", burst=True)
        assert Worker(config).run() == 0
    finally:
        job_failed.disconnect(on_failed)

    assert [r["status"] for r in received] == ["pending", "failed"]
    for entry in received:
        exception = entry["exception"]
        assert entry["handled"] is exception
        assert isinstance(exception, TaskFailed)
        assert (type(exception).__module__, type(exception).__qualname__) == (
            "builtins",
            "ValueError",
        )
        assert str(exception) == "boom"
        assert (exception.job_id, exception.exception_class_path) == (
            failing,
            "builtins.ValueError",
        )
        assert exception.remote_traceback == entry["error"].traceback
        assert RAISE_LINE in exception.remote_traceback
        assert isinstance(exception.__cause__, RemoteTraceback)

    records = [r for r in leasejobs_log.records if r.exc_info and r.job_id == failing]  # type: ignore[attr-defined]
    assert [r.levelno for r in records] == [logging.WARNING, logging.ERROR]
    assert [r.exc_info[1] for r in records] == [e["exception"] for e in received]  # type: ignore[index]
    formatted = logging.Formatter("%(message)s").format(records[-1])
    assert formatted.endswith(received[-1]["exception"].remote_traceback.rstrip("\n"))
    assert json.loads(JsonFormatter().format(records[-1]))["traceback"].endswith("ValueError: boom")


def test_a_task_failure_survives_pickling_and_hostile_class_paths() -> None:
    trace = "Traceback (most recent call last):\n  ...\nmyapp.errors.Boom: no\n"
    failure = task_failure("myapp.errors.Boom", "no", trace, 7, 2, "w1")
    assert (type(failure).__module__, type(failure).__qualname__) == ("myapp.errors", "Boom")
    again = pickle.loads(pickle.dumps(failure))  # noqa: S301 - our own bytes
    assert type(again) is type(failure)  # one class per class path
    assert (again.job_id, again.attempt, again.worker_id, str(again)) == (7, 2, "w1", "no")
    assert exception_chain(again)[1]["value"] == f'\n"""\n{trace.rstrip()}\n"""'

    for path in ("bad.\x00name", "bad.\ud800", "", "NoModule"):
        odd = task_failure(path, "msg", "", 1, 1, "w")
        assert isinstance(odd, TaskFailed)
        assert odd.__cause__ is None  # no recorded traceback: nothing to chain
        logging.Formatter().formatException((type(odd), odd, None))
        json.dumps(exception_chain(odd))
