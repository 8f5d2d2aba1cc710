"""The worker builds a ``TaskResult`` for django.tasks' signals only when someone reads it.

Building one costs more than the rest of a short job's bookkeeping (issue 18). Django
connects its own log receivers to ``task_started`` and ``task_finished``; when they are
the only receivers and their logger is off for the level they would log at, the worker
skips the signal. A receiver of the site's, or the logger on, and the signal is sent as
before: both shown here, with real workers.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from django_leasejobs import compat
from django_leasejobs.compat import (
    TASKS_LOGGER,
    has_other_receivers,
    log_task_enqueued,
    log_task_finished,
    log_task_started,
    must_send,
    task_enqueued,
    task_finished,
    task_started,
)
from tests import tasks, tasks_contract


@pytest.fixture
def tasks_logger_level() -> Iterator[logging.Logger]:
    logger = logging.getLogger(TASKS_LOGGER)
    before = logger.level
    try:
        yield logger
    finally:
        logger.setLevel(before)


def _receiver(**kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def only_djangos_receiver(signal: Any) -> Iterator[None]:
    """``signal`` with django.tasks' own log receiver alone (the test project connects
    receivers of its own when tests.tasks_contract is imported); as before afterwards."""
    own = {"task_enqueued": log_task_enqueued, "task_started": log_task_started}
    own["task_finished"] = log_task_finished
    keep = next(f for name, f in own.items() if getattr(compat, name) is signal)
    with signal.lock:
        before = signal.receivers
        signal.receivers = [r for r in before if r[0][0] == id(keep)]
        signal.sender_receivers_cache.clear()
    try:
        yield
    finally:
        with signal.lock:
            signal.receivers = before
            signal.sender_receivers_cache.clear()


@pytest.mark.parametrize("signal", [task_enqueued, task_started, task_finished])
def test_only_djangos_log_receiver_with_its_logger_off_needs_nothing(
    signal: Any, tasks_logger_level: logging.Logger
) -> None:
    with only_djangos_receiver(signal):
        _check_needs(signal, tasks_logger_level)


def _check_needs(signal: Any, tasks_logger_level: logging.Logger) -> None:
    tasks_logger_level.setLevel(logging.WARNING)
    assert not has_other_receivers(signal)
    assert not must_send(signal, logging.INFO)
    assert must_send(signal, logging.ERROR)  # a failure is logged at ERROR
    tasks_logger_level.setLevel(logging.DEBUG)
    assert must_send(signal, logging.DEBUG)
    tasks_logger_level.setLevel(logging.WARNING)
    signal.connect(_receiver)
    try:
        assert has_other_receivers(signal)
        assert must_send(signal, logging.DEBUG)
    finally:
        signal.disconnect(_receiver)
    assert not must_send(signal, logging.INFO)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_djangos_log_receivers_still_log_when_their_logger_is_on(workers: Any, pool: str) -> None:
    ok = tasks.add.enqueue(2, 3).id
    failing = tasks_contract.fails_twice.enqueue("boom").id
    worker = workers.start(
        args=["--pool", pool, "--concurrency", "1", "--burst"],
        options={"IMPORTS": ["tests.tasks_contract"]},
        env={"LEASEJOBS_TEST_TASKS_LOG_LEVEL": "INFO"},
    )
    assert worker.wait(timeout=60) == 0, worker.output
    lines = worker.output.splitlines()
    for job_id, last in ((ok, "SUCCESSFUL"), (failing, "FAILED")):
        states = [
            m.group(1)
            for line in lines
            if (m := re.search(rf"^Task id={job_id} path=\S+ state=(\w+)", line))
        ]
        # Each attempt's start, and how the job ended (a retry is no ending).
        assert states.count("RUNNING") >= 1, worker.output
        assert states[-1] == last, worker.output


@pytest.mark.django_db(transaction=True)
def test_nothing_is_logged_for_djangos_receivers_when_their_logger_is_off(workers: Any) -> None:
    ok = tasks.add.enqueue(2, 3).id
    worker = workers.start(
        args=["--concurrency", "1", "--burst"],
        env={"LEASEJOBS_TEST_TASKS_LOG_LEVEL": "WARNING"},
    )
    assert worker.wait(timeout=60) == 0, worker.output
    assert f"Task id={ok} " not in worker.output
