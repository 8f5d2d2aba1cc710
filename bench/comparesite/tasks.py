"""The bench's tasks, declared once per system (a task is bound to one backend alias).

The bodies are the same for every system:

* ``*_noop``: does nothing (enqueue rates, drain throughput, claim latency);
* ``*_stamp``: returns ``time.time()`` when it starts (enqueue-to-start latency);
* ``*_warmup``: sleeps a little, so that every worker process of a fleet gets one
  (the bench waits for them before it measures anything);
* ``*_sleeper``: appends "<time.time()> <pid>" to a marker file, then sleeps
  (recovery: each line is one start of the job).
"""

from __future__ import annotations

import os
import time

from django.tasks import task


def _noop() -> None:
    return None


def _stamp() -> float:
    return time.time()


def _warmup(seconds: float) -> None:
    time.sleep(seconds)


def _sleeper(marker: str, seconds: float) -> None:
    with open(marker, "a") as file:
        file.write(f"{time.time():.6f} {os.getpid()}\n")
    time.sleep(seconds)


# -- django-leasejobs --------------------------------------------------------------------


@task(backend="leasejobs")
def leasejobs_noop() -> None:
    _noop()


@task(backend="leasejobs")
def leasejobs_stamp() -> float:
    return _stamp()


@task(backend="leasejobs")
def leasejobs_warmup(seconds: float) -> None:
    _warmup(seconds)


@task(backend="leasejobs")
def leasejobs_sleeper(marker: str, seconds: float) -> None:
    _sleeper(marker, seconds)


# -- django-tasks-db ---------------------------------------------------------------------


@task(backend="tasksdb")
def tasksdb_noop() -> None:
    _noop()


@task(backend="tasksdb")
def tasksdb_stamp() -> float:
    return _stamp()


@task(backend="tasksdb")
def tasksdb_warmup(seconds: float) -> None:
    _warmup(seconds)


@task(backend="tasksdb")
def tasksdb_sleeper(marker: str, seconds: float) -> None:
    _sleeper(marker, seconds)


# -- django-ox ---------------------------------------------------------------------------


@task(backend="ox")
def ox_noop() -> None:
    _noop()


@task(backend="ox")
def ox_stamp() -> float:
    return _stamp()


@task(backend="ox")
def ox_warmup(seconds: float) -> None:
    _warmup(seconds)


@task(backend="ox")
def ox_sleeper(marker: str, seconds: float) -> None:
    _sleeper(marker, seconds)
