"""``runworker`` logs out of the box (issue 13, point 5): in a project without
``LOGGING`` it prints its start line and a line per job on stderr, as text or JSON, at
``--log-level``; a project whose ``LOGGING`` routes the ``django_leasejobs`` logger keeps
its own handlers, format and level."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from django_leasejobs.logs import LOGGER_NAME, JsonFormatter, install_default_handler
from tests import tasks, tasks_contract

pytestmark = pytest.mark.django_db(transaction=True)

FRESH = {"DJANGO_SETTINGS_MODULE": "tests.settings_fresh"}
"""The test settings without LOGGING: a fresh project."""

OPTIONS = {"IMPORTS": ["tests.tasks_contract"]}

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented_extra_keys() -> set[str]:
    """The keys of the table of stable extra keys in docs/operations.md."""
    text = DOCS.read_text()
    section = text.split("### Stable extra keys", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^\| `(\w+)`", section, re.MULTILINE))


def json_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_a_fresh_project_prints_the_start_line_and_a_line_per_job(workers: Any) -> None:
    ok = tasks.add.enqueue(2, 3).id
    failing = tasks_contract.fails_twice.enqueue("boom").id
    worker = workers.start(
        args=["--pool", "thread", "--concurrency", "1", "--burst", "--worker-id", "fresh-1"],
        options=OPTIONS,
        env=FRESH,
    )
    assert worker.wait(timeout=60) == 0, worker.output
    output = worker.output
    prefix = r"^\S+ \S+ (INFO|WARNING|ERROR) django_leasejobs \[\d+\] "
    assert re.search(
        prefix + r"worker fresh-1 started: backend=default queues=default,high,low pool=thread "
        r"concurrency=1 lease=2s heartbeat=0\.3s reaper=0\.3s lock_lost=sigkill schedules=0$",
        output,
        re.MULTILINE,
    ), output
    assert re.search(prefix + f"job {ok} attempt 1 started: tests.tasks.add$", output, re.M)
    assert re.search(prefix + f"job {ok} attempt 1 succeeded in ", output, re.M)
    assert re.search(
        r"WARNING django_leasejobs \[\d+\] "
        + f"job {failing} attempt 1 failed \\(builtins.ValueError: boom\\) -> pending\n"
        + "Traceback \\(most recent call last\\):",
        output,
    ), output
    assert re.search(
        f"ERROR django_leasejobs .* job {failing} attempt 2 failed .* -> failed", output
    )
    assert re.search(prefix + "worker fresh-1 stopped after 3 attempts$", output, re.M)


def test_json_lines_carry_the_documented_keys(workers: Any) -> None:
    ok = int(tasks.add.enqueue(2, 3).id)
    failing = int(tasks_contract.fails_twice.enqueue("boom").id)
    worker = workers.start(
        args=["--pool", "process", "--concurrency", "1", "--burst", "--log-format", "json"],
        options=OPTIONS,
        env=FRESH,
    )
    assert worker.wait(timeout=60) == 0, worker.output
    lines = json_lines(worker.output)
    assert lines, worker.output
    base = {"time", "level", "logger", "message"}
    for line in lines:
        assert base <= line.keys()
        assert line["logger"] == LOGGER_NAME
    start = next(line for line in lines if " started: backend=" in line["message"])
    assert start["queues"] == ["default", "high", "low"]
    assert (start["pool"], start["concurrency"], start["lease_duration"]) == ("process", 1, 2.0)
    [succeeded] = [line for line in lines if "succeeded" in line["message"]]
    assert (succeeded["job_id"], succeeded["attempt"], succeeded["task"]) == (
        ok,
        1,
        "tests.tasks.add",
    )
    assert succeeded["worker"] == start["worker"]
    assert succeeded["queue"] == "default"
    assert succeeded["duration"] >= 0
    failures = [line for line in lines if line.get("job_id") == failing and "traceback" in line]
    assert [(f["level"], f["status"]) for f in failures] == [
        ("WARNING", "pending"),
        ("ERROR", "failed"),
    ]
    assert failures[-1]["error"] == "builtins.ValueError"
    assert failures[-1]["traceback"].endswith("raise ValueError(message)\nValueError: boom")

    extra = {key for line in lines for key in line} - base - {"traceback"}
    assert extra <= documented_extra_keys(), extra - documented_extra_keys()


def test_log_level_warning_keeps_only_warnings_and_errors(workers: Any) -> None:
    tasks.add.enqueue(2, 3)
    failing = tasks_contract.fails_twice.enqueue("boom").id
    worker = workers.start(
        args=["--pool", "thread", "--burst", "--log-level", "warning"],
        options=OPTIONS,
        env=FRESH,
        wait_started=False,
    )
    assert worker.wait(timeout=60) == 0, worker.output
    assert f"job {failing} attempt 2 failed" in worker.output
    assert " INFO " not in worker.output
    assert "started: backend=" not in worker.output


def test_the_projects_logging_wins(workers: Any) -> None:
    """tests/settings.py routes django_leasejobs to its own console handler and format."""
    tasks.add.enqueue(2, 3)
    worker = workers.start(
        args=["--pool", "thread", "--burst", "--log-format", "json", "--log-level", "ERROR"],
    )
    assert worker.wait(timeout=60) == 0, worker.output
    assert not json_lines(worker.output)
    assert re.search(
        r"^\S+ \S+ INFO django_leasejobs \d+ job \d+ attempt 1 succeeded", worker.output, re.M
    )


def test_the_handler_is_installed_only_where_nothing_routes_the_records() -> None:
    logger = logging.getLogger(LOGGER_NAME)
    saved_handlers, saved_level, saved_propagate = (
        logger.handlers[:],
        logger.level,
        logger.propagate,
    )
    root, on_root = logging.getLogger(), logging.NullHandler()
    try:
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        root.addHandler(on_root)
        logger.propagate = True
        install_default_handler(logging.DEBUG, "text")  # root routes them: nothing changes
        assert (logger.handlers, logger.level) == ([], logging.NOTSET)

        logger.propagate = False  # now nothing receives them
        install_default_handler(logging.DEBUG, "text")
        [handler] = logger.handlers
        assert (handler.level, logger.level) == (logging.DEBUG, logging.DEBUG)
        install_default_handler(logging.DEBUG, "text")  # a handler now: once only
        assert logger.handlers == [handler]

        logger.handlers.clear()
        logger.setLevel(logging.WARNING)  # a level the project set, without a handler
        install_default_handler(logging.INFO, "json")
        [handler] = logger.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        assert (handler.level, logger.level) == (logging.INFO, logging.WARNING)
    finally:
        root.removeHandler(on_root)
        logger.handlers[:] = saved_handlers
        logger.setLevel(saved_level)
        logger.propagate = saved_propagate
