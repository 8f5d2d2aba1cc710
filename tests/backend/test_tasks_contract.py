"""The ``django.tasks`` contract this backend keeps, pinned (issue 10).

Written here, from Django's documented behaviour of ``Task`` / ``TaskResult`` and its
reference backends, and run on every Django line CI covers (5.2 with the backport,
6.0, 6.x):

* ``get_result(id)`` returns what ``enqueue()`` returned, for every way of enqueueing:
  options never set stay unset, ``run_after`` round-trips exactly;
* results seen by ``task_started`` / ``task_finished`` receivers and by a task's own
  context carry the timestamps, the errors and the workers;
* each kind of failure is recorded with its own exception class.

The worker side runs a real in-process ``Worker`` (burst mode) against the test
database; tests/test_worker_contract_signals.py shows the same from a receiver connected
inside a real ``runworker`` process.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import django
import pytest
from django.utils import timezone

from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.compat import (
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from django_leasejobs.models import Job
from django_leasejobs.retry import Backoff
from django_leasejobs.worker.loop import Worker, WorkerConfig
from tests import tasks, tasks_contract, tasks_flow
from tests.helpers_leases import expire

pytestmark = pytest.mark.django_db(transaction=True)


def backend() -> LeaseJobsBackend:
    found = task_backends["default"]
    assert isinstance(found, LeaseJobsBackend)
    return found


# --------------------------------------------------------------------------- enqueue == get_result


AT = datetime(2031, 5, 4, 3, 2, 1, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: tasks.add, id="declared"),
        pytest.param(lambda: tasks.add.using(priority=7), id="priority"),
        pytest.param(lambda: tasks.add.using(queue_name="high"), id="queue"),
        pytest.param(lambda: tasks.add.using(run_after=AT), id="run_after-utc"),
        pytest.param(
            lambda: tasks.add.using(run_after=AT.astimezone(timezone.get_fixed_timezone(-300))),
            id="run_after-offset",
        ),
        pytest.param(lambda: tasks.add.using(max_attempts=2), id="max_attempts"),
        pytest.param(lambda: tasks.add.using(max_stalls=4), id="max_stalls"),
        pytest.param(lambda: tasks.add.using(timeout=12.5), id="timeout"),
        pytest.param(lambda: tasks.add.using(key="k-1"), id="key"),
        pytest.param(
            lambda: tasks.add.using(retry_backoff={"base": 1, "factor": 2, "cap": 9, "jitter": 0}),
            id="retry_backoff",
        ),
        pytest.param(lambda: tasks.add.using(concurrency_key="c-1"), id="concurrency_key"),
        pytest.param(
            lambda: tasks.add.using(concurrency_key="c-1", concurrency_limit=3),
            id="concurrency_key-and-limit",
        ),
        pytest.param(lambda: tasks.add.using(concurrency_limit=2), id="concurrency_limit"),
        pytest.param(lambda: tasks.add.using(rate_limit="5/m"), id="rate_limit"),
        pytest.param(lambda: tasks_flow.import_customer, id="declared-key-callable"),
        pytest.param(lambda: tasks.configured, id="declared-with-options"),
        pytest.param(lambda: tasks.configured.using(max_attempts=9), id="declared-overridden"),
        pytest.param(lambda: tasks.plain_django_task, id="django-decorator"),
    ],
)
def test_get_result_returns_what_enqueue_returned(make: Any) -> None:
    task = make()
    args = [1] if task is tasks.plain_django_task else []
    enqueued = task.enqueue(*args) if args else _enqueue(task)
    fetched = task.get_result(enqueued.id)

    assert fetched == enqueued
    assert fetched.task == task  # every option, set or unset, as enqueued
    assert fetched.task.run_after == task.run_after
    for name in (
        "max_attempts",
        "max_stalls",
        "timeout",
        "key",
        "retry_backoff",
        "concurrency_key",
        "concurrency_limit",
        "rate_limit",
    ):
        assert getattr(fetched.task, name, None) == getattr(task, name, None), name


def _enqueue(task: Any) -> TaskResult:
    if task.func is tasks.configured.func:
        return task.enqueue(3)
    if task.func is tasks_flow.import_customer.func:
        return task.enqueue(7)
    return task.enqueue(1, 2)


def test_options_never_set_stay_unset_while_the_row_runs_with_the_defaults() -> None:
    result = tasks.add.enqueue(1, 2)
    fetched = backend().get_result(result.id)
    assert fetched.task.run_after is None
    assert (fetched.task.max_attempts, fetched.task.max_stalls) == (None, None)
    assert (fetched.task.timeout, fetched.task.key, fetched.task.retry_backoff) == (None,) * 3
    # The row itself holds what the worker needs: the backend's defaults, runnable now.
    job = Job.objects.get(pk=result.id)
    assert (job.max_attempts, job.max_stalls) == (3, 3)
    assert job.run_after == job.enqueued_at
    assert job.task_options is None


def test_run_after_round_trips_and_defers() -> None:
    later = timezone.now() + timedelta(hours=3)
    result = tasks.add.using(run_after=later).enqueue(1, 2)
    fetched = backend().get_result(result.id)
    assert fetched.task.run_after == later
    assert fetched.status == TaskResultStatus.READY
    assert Job.objects.get(pk=result.id).run_after == later


def test_bulk_enqueued_results_equal_their_fetched_results() -> None:
    calls = [
        (tasks.add, [1, 2], {}),
        (tasks.add.using(run_after=AT, max_attempts=4), [3, 4], {}),
        (tasks.configured.using(priority=-3), [], {"x": 1}),
    ]
    for result in backend().bulk_enqueue(calls):
        assert backend().get_result(result.id) == result


# ---------------------------------------------------------------------- worker: signals, context


@pytest.fixture
def received() -> Iterator[dict[str, list[TaskResult]]]:
    seen: dict[str, list[TaskResult]] = {"started": [], "finished": []}

    def on_started(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        seen["started"].append(task_result)

    def on_finished(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        seen["finished"].append(task_result)

    task_started.connect(on_started, weak=False)
    task_finished.connect(on_finished, weak=False)
    try:
        yield seen
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)


def run_worker(pool: str = "thread") -> None:
    """Run every ready job with a real in-process worker, then return."""
    config = WorkerConfig(concurrency=2, pool=pool, burst=True)  # type: ignore[arg-type]
    assert Worker(config).run() == 0


def _by_id(results: list[TaskResult], result_id: str) -> TaskResult:
    [found] = [r for r in results if r.id == result_id]
    return found


def test_signals_carry_timestamps_and_the_worker(received: dict[str, list[TaskResult]]) -> None:
    result = tasks.add.enqueue(2, 3)
    run_worker()
    fetched = backend().get_result(result.id)

    started = _by_id(received["started"], result.id)
    assert started.status == TaskResultStatus.RUNNING
    assert started.enqueued_at == fetched.enqueued_at
    assert started.started_at == fetched.started_at is not None
    assert started.last_attempted_at == fetched.last_attempted_at is not None
    assert started.finished_at is None
    assert started.errors == []

    finished = _by_id(received["finished"], result.id)
    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 5
    assert finished.enqueued_at == fetched.enqueued_at
    assert finished.started_at == fetched.started_at
    assert finished.last_attempted_at == fetched.last_attempted_at
    assert finished.finished_at == fetched.finished_at is not None
    assert finished.worker_ids == fetched.worker_ids and len(finished.worker_ids) == 1
    assert finished.errors == []
    assert finished.task == result.task


def test_a_failed_job_finishes_with_every_attempts_error(
    received: dict[str, list[TaskResult]],
) -> None:
    result = tasks_contract.fails_twice.enqueue("boom")
    run_worker()
    fetched = backend().get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED

    finished = _by_id(received["finished"], result.id)
    assert finished.status == TaskResultStatus.FAILED
    assert finished.errors == fetched.errors
    assert [e.exception_class_path for e in finished.errors] == ["builtins.ValueError"] * 2
    assert "ValueError: boom" in finished.errors[-1].traceback
    assert finished.finished_at == fetched.finished_at is not None
    assert finished.worker_ids == fetched.worker_ids and len(finished.worker_ids) == 2
    assert finished.started_at == fetched.started_at
    assert finished.last_attempted_at == fetched.last_attempted_at
    # Only the final outcome finishes a job: the first attempt was retried.
    assert [r.id for r in received["finished"]].count(result.id) == 1
    assert [r.id for r in received["started"]].count(result.id) == 2


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_the_task_context_carries_the_timestamps(pool: str) -> None:
    result = tasks_contract.report_context.enqueue()
    run_worker(pool)
    job = Job.objects.get(pk=result.id)
    seen = job.result
    assert seen["status"] == "RUNNING"
    assert seen["id"] == result.id
    assert datetime.fromisoformat(seen["enqueued_at"]) == job.enqueued_at
    assert datetime.fromisoformat(seen["started_at"]) == job.started_at
    assert datetime.fromisoformat(seen["last_attempted_at"]) == job.last_attempted_at
    assert seen["finished_at"] is None
    assert seen["attempt"] == 1


# --------------------------------------------------------------------------- failure kinds


@pytest.mark.parametrize(
    ("task_name", "exception_class_path"),
    [
        # The task's own exception, whatever it is.
        ("raises_value_error", "builtins.ValueError"),
        ("raises_keyboard_interrupt", "builtins.KeyboardInterrupt"),
        ("raises_system_exit", "builtins.SystemExit"),
        # A return value that is not JSON: InvalidTaskArguments, a TypeError (as Django's
        # own backends record a TypeError), not retried.
        ("returns_a_set", "django_leasejobs.exceptions.InvalidTaskArguments"),
        # Stopped by the worker.
        ("overruns_its_timeout", "django_leasejobs.exceptions.TaskTimeout"),
    ],
)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_each_failure_kind_is_recorded_with_its_exception(
    pool: str, task_name: str, exception_class_path: str
) -> None:
    result = getattr(tasks_contract, task_name).enqueue()
    run_worker(pool)
    fetched = backend().get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in fetched.errors] == [exception_class_path]
    error = fetched.errors[0]
    assert error.traceback
    if exception_class_path == "django_leasejobs.exceptions.InvalidTaskArguments":
        assert issubclass(error.exception_class, TypeError)


def test_a_killed_process_and_an_expired_lease_are_recorded_as_such() -> None:
    from django_leasejobs import leases

    killed = tasks_contract.kills_itself.enqueue()
    run_worker("process")
    [error] = backend().get_result(killed.id).errors
    assert error.exception_class_path == "django_leasejobs.exceptions.JobKilled"
    assert "SIGKILL" in error.traceback

    expired = tasks.add.using(max_stalls=1).enqueue(1, 1)
    leases.claim("gone-worker", limit=1, lease_duration=60)
    assert expire(int(expired.id)) == 1
    [reaped] = leases.reap().jobs
    assert reaped.id == int(expired.id)
    fetched = backend().get_result(expired.id)
    assert [e.exception_class_path for e in fetched.errors] == [
        "django_leasejobs.exceptions.LeaseExpired"
    ]
    assert fetched.worker_ids == ["gone-worker"]


def test_backoff_values_round_trip_as_backoff_objects() -> None:
    policy = Backoff(base=3, factor=1.5, cap=30, jitter=0)
    result = tasks.add.using(retry_backoff=policy).enqueue(1, 2)
    assert backend().get_result(result.id).task.retry_backoff == policy


# --------------------------------------------------------------------------- decorators


def test_djangos_own_decorator_takes_this_backends_options_where_django_passes_them() -> None:
    """``@django.tasks.task(max_attempts=5)`` builds this backend's ``LeaseTask`` where
    Django's decorator passes extra keywords to the backend's ``task_class``: Django 6.1+
    and the 5.2 backport. Django 6.0's decorator takes no extra keywords (TypeError);
    ``django_leasejobs.task`` takes them on every line."""
    from django_leasejobs.compat import USING_BACKPORT
    from django_leasejobs.compat import task as django_task
    from django_leasejobs.lease_task import LeaseTask

    if not USING_BACKPORT and django.VERSION[:2] == (6, 0):
        with pytest.raises(TypeError):
            django_task(max_attempts=5)
    else:
        declared = django_task(max_attempts=5)(tasks_contract.plain_function)
        assert isinstance(declared, LeaseTask)
        assert declared.max_attempts == 5
    plain = django_task(tasks_contract.plain_function)
    assert isinstance(plain, LeaseTask)  # the backend's task_class on every line
    assert plain.max_attempts is None
