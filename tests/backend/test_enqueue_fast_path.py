"""What ``enqueue()`` leaves out when it would make no difference, shown not to make one:
the signals nobody would act on (autocommit only), the check of a task object already
checked, the encoding of a call without arguments."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.utils import timezone

from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.compat import (
    TASKS_LOGGER,
    InvalidTask,
    has_other_receivers,
    task_backends,
    task_enqueued,
)
from django_leasejobs.exceptions import InvalidTaskArguments
from django_leasejobs.models import Job
from django_leasejobs.signals import job_enqueued
from tests import tasks

COMMITTED = pytest.mark.django_db(transaction=True)


def backend() -> LeaseJobsBackend:
    found = task_backends["default"]
    assert isinstance(found, LeaseJobsBackend)
    return found


@pytest.fixture
def no_receivers() -> None:
    """The tests below start with nobody listening but django.tasks' own log receiver."""
    if has_other_receivers(task_enqueued) or job_enqueued.receivers:
        pytest.skip("a receiver of the enqueue signals is connected for the whole run")


# --------------------------------------------------------------------------- signals


@COMMITTED
@pytest.mark.usefixtures("no_receivers")
def test_a_receiver_connected_after_an_unheard_enqueue_gets_the_next_one() -> None:
    tasks.add.enqueue(1, 1)  # nobody listens: nothing sent
    heard: list[tuple[str, Any]] = []

    def on_task(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(("task_enqueued", task_result.id))

    def on_job(sender: Any, job_id: int, **kwargs: Any) -> None:
        heard.append(("job_enqueued", str(job_id)))

    task_enqueued.connect(on_task, weak=False)
    try:
        first = tasks.add.enqueue(2, 2)
        job_enqueued.connect(on_job, weak=False)
        try:
            second = tasks.add.enqueue(3, 3)
        finally:
            job_enqueued.disconnect(on_job)
    finally:
        task_enqueued.disconnect(on_task)
    tasks.add.enqueue(4, 4)  # nobody again
    assert heard == [
        ("task_enqueued", first.id),
        ("task_enqueued", second.id),
        ("job_enqueued", second.id),
    ]
    assert Job.objects.count() == 4


@COMMITTED
@pytest.mark.usefixtures("no_receivers")
def test_a_receiver_connected_inside_the_transaction_is_sent_the_signal_on_commit() -> None:
    heard: list[int] = []

    def on_job(sender: Any, job_id: int, **kwargs: Any) -> None:
        heard.append(job_id)

    try:
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            job_enqueued.connect(on_job, weak=False)  # after the enqueue, before the commit
            assert heard == []
        assert heard == [int(result.id)]
    finally:
        job_enqueued.disconnect(on_job)


@COMMITTED
@pytest.mark.usefixtures("no_receivers")
@pytest.mark.parametrize("atomic", [False, True])
def test_djangos_log_receiver_still_logs_at_debug(
    caplog: pytest.LogCaptureFixture, atomic: bool
) -> None:
    with caplog.at_level(logging.INFO, logger=TASKS_LOGGER):
        tasks.add.enqueue(1, 1)
    assert not [r for r in caplog.records if r.name == TASKS_LOGGER]
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        if atomic:
            with transaction.atomic():
                result = tasks.add.enqueue(2, 2)
        else:
            result = tasks.add.enqueue(2, 2)
    logged = [r.getMessage() for r in caplog.records if r.name == TASKS_LOGGER]
    assert logged == [f"Task id={result.id} path=tests.tasks.add enqueued backend=default"]


@COMMITTED
@pytest.mark.usefixtures("no_receivers")
def test_an_unheard_enqueue_still_rolls_back_with_the_caller() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


# --------------------------------------------------------------------------- the task check


@pytest.mark.django_db
def test_a_task_is_checked_once_per_object(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[Any] = []
    original = LeaseJobsBackend.validate_task

    def counting(self: LeaseJobsBackend, task: Any) -> None:
        checked.append(task)
        original(self, task)

    monkeypatch.setattr(LeaseJobsBackend, "validate_task", counting)
    high = tasks.add.using(queue_name="high")  # a new object: checked when created...
    for n in range(3):
        tasks.add.enqueue(n, n)
        high.enqueue(n, n)
    # ... and at its first enqueue; tasks.add at its first enqueue in this backend's life.
    assert len([task for task in checked if task is high]) == 2
    assert len([task for task in checked if task is tasks.add]) <= 1
    assert Job.objects.filter(queue="high").count() == 3


@pytest.mark.django_db
def test_a_task_that_fails_its_check_fails_every_time() -> None:
    task = tasks.add.using(queue_name="high")
    backend().queues.discard("high")
    try:
        for _ in range(2):
            with pytest.raises(InvalidTask, match="Queue 'high' is not valid"):
                task.enqueue(1, 1)
    finally:
        backend().queues.add("high")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_check_of_run_after_follows_use_tz() -> None:
    naive = datetime(2030, 1, 1, 12, 0)
    with override_settings(USE_TZ=False):
        task = tasks.add.using(run_after=naive)
        task.enqueue(1, 1)  # valid, and remembered as valid with USE_TZ off
    with pytest.raises(InvalidTask, match="aware"):
        task.enqueue(2, 2)
    assert Job.objects.count() == 1


# --------------------------------------------------------------------------- arguments


@pytest.mark.django_db
def test_a_call_without_arguments_stores_empty_ones() -> None:
    result = tasks.configured.enqueue()
    assert (result.args, result.kwargs) == ([], {})
    job = Job.objects.get(pk=int(result.id))
    assert (job.args, job.kwargs) == ([], {})


@pytest.mark.django_db
def test_results_own_their_arguments() -> None:
    inner = [1, 2]
    result = tasks.configured.enqueue([inner, {"a": 3}])
    inner.append(9)
    assert result.args == [[[1, 2], {"a": 3}]]
    assert Job.objects.get(pk=int(result.id)).args == [[[1, 2], {"a": 3}]]


@pytest.mark.django_db
def test_arguments_are_still_checked_after_a_clean_call() -> None:
    tasks.add.enqueue(1, 2)
    with pytest.raises(InvalidTaskArguments, match=r"args\[1\]"):
        tasks.add.enqueue(1, object())
    with pytest.raises(InvalidTaskArguments, match="kwargs must be a dict"):
        backend().enqueue(tasks.add, [], [])  # type: ignore[arg-type]
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_without_use_tz_run_after_is_stored_in_the_zone_active_at_each_call() -> None:
    task_when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    with override_settings(USE_TZ=False, TIME_ZONE="UTC"):
        task = tasks.add.using(run_after=task_when)
        with timezone.override("Europe/Paris"):
            paris = task.enqueue(1, 1)
        with timezone.override("America/New_York"):
            new_york = task.enqueue(2, 2)
        stored = dict(Job.objects.values_list("pk", "run_after"))
    assert stored[int(paris.id)] == datetime(2030, 1, 1, 13, 0)
    assert stored[int(new_york.id)] == datetime(2030, 1, 1, 7, 0)


@pytest.mark.django_db
def test_a_deferred_task_keeps_its_run_after() -> None:
    when = datetime.now().astimezone() + timedelta(hours=1)
    task = tasks.add.using(run_after=when)
    first, second = task.enqueue(1, 1), task.enqueue(2, 2)
    stored = Job.objects.filter(pk__in=[int(first.id), int(second.id)])
    assert {job.run_after for job in stored} == {when}
    assert first.task.run_after == when


# --------------------------------------------------------------------------- the stored row

ROW_FIELDS = (
    "backend",
    "queue",
    "task_path",
    "args",
    "kwargs",
    "priority",
    "max_attempts",
    "max_stalls",
    "timeout",
    "key",
    "retry_backoff",
    "task_options",
    "trace_context",
    "flow_group",
    "concurrency_limit",
    "rate_limit",
    "status",
    "attempt",
    "stall_count",
    "snoozes",
)


def stored(result: Any) -> dict[str, Any]:
    job = Job.objects.get(pk=int(result.id))
    return {name: getattr(job, name) for name in ROW_FIELDS}


@pytest.mark.django_db
def test_a_row_without_options_stores_nulls_and_runs_at_its_enqueue() -> None:
    result = tasks.add.enqueue(1, 2)
    row = stored(result)
    assert row == {
        "backend": "default",
        "queue": "default",
        "task_path": "tests.tasks.add",
        "args": [1, 2],
        "kwargs": {},
        "priority": 0,
        "max_attempts": backend().config.max_attempts,
        "max_stalls": backend().config.max_stalls,
        "timeout": None,
        "key": None,
        "retry_backoff": None,
        "task_options": None,
        "trace_context": None,
        "flow_group": None,
        "concurrency_limit": None,
        "rate_limit": None,
        "status": "pending",
        "attempt": 0,
        "stall_count": 0,
        "snoozes": 0,
    }
    job = Job.objects.get(pk=int(result.id))
    assert job.run_after == job.enqueued_at == result.enqueued_at


@pytest.mark.django_db
def test_a_row_with_every_option_stores_them_all() -> None:
    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    task = tasks.configured.using(
        priority=7,
        queue_name="high",
        run_after=when,
        concurrency_limit=2,
        rate_limit="10/m",
        concurrency_key="customer-1",
    )
    result = task.enqueue(x={"a": [1]})
    row = stored(result)
    assert row["queue"] == "high"
    assert row["priority"] == 7
    assert (row["args"], row["kwargs"]) == ([], {"x": {"a": [1]}})
    assert (row["max_attempts"], row["max_stalls"], row["timeout"]) == (5, 2, 30)
    assert row["retry_backoff"] == {"base": 1, "factor": 3, "cap": 60, "jitter": 0}
    assert row["task_options"] == {
        "run_after": when.isoformat(),
        "max_attempts": 5,
        "max_stalls": 2,
        "concurrency_limit": 2,
        "rate_limit": "10/m",
        "concurrency_key": "customer-1",
    }
    assert row["flow_group"] == "key:customer-1"
    assert (row["concurrency_limit"], row["rate_limit"]) == (2, "10/m")
    assert Job.objects.get(pk=int(result.id)).run_after == when


# --------------------------------------------------------------------------- the cursor
# On PostgreSQL (without prepared statements) an enqueue runs on the connection's own
# cursor when nothing hooks Django's (``dialect.fetch_one``): what Django's cursor wrapper
# gives a caller must hold all the same.

POSTGRES_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement enqueue is PostgreSQL's"
)


@POSTGRES_ONLY
@pytest.mark.django_db
def test_an_execute_wrapper_sees_the_enqueue() -> None:
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        tasks.add.enqueue(1, 2)
    assert len(seen) == 1 and "pg_notify" in seen[0]
    tasks.add.enqueue(3, 4)  # (unhooked again: the fast cursor)
    assert len(seen) == 1
    assert Job.objects.count() == 2


@POSTGRES_ONLY
@pytest.mark.django_db
def test_the_query_log_sees_the_enqueue(django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(1) as captured:
        tasks.add.enqueue(1, 2)
    assert "pg_notify" in captured.captured_queries[0]["sql"]


@POSTGRES_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_database_error_is_djangos_and_breaks_the_atomic_block() -> None:
    """The error is Django's (``OperationalError``: a lock not had in time); raised through
    an atomic block without a savepoint it marks the outer block for rollback, and an
    enqueue there is refused as Django refuses any query there."""
    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"LOCK TABLE {Job._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '50ms'")
            # In a savepoint: the outer block stays usable.
            with pytest.raises(OperationalError, match="lock timeout"), transaction.atomic():
                tasks.add.enqueue(1, 2)
            assert not connection.needs_rollback
            with (
                pytest.raises(OperationalError, match="lock timeout"),
                transaction.atomic(savepoint=False),
            ):
                tasks.add.enqueue(1, 2)
            assert connection.needs_rollback
            with pytest.raises(TransactionManagementError):
                tasks.add.enqueue(1, 2)
    finally:
        holder.close()
    tasks.add.enqueue(5, 6)  # the connection works once the block rolled back
    assert Job.objects.count() == 1


@POSTGRES_ONLY
@pytest.mark.django_db(transaction=True)
def test_the_kept_cursor_follows_a_reconnection() -> None:
    """The enqueue's cursor is kept per connection: after Django closes the connection
    (``CONN_MAX_AGE``, a failed health check) the next enqueue runs on the new one."""
    first = tasks.add.enqueue(1, 2)
    server_process = connection.connection.info.backend_pid
    connection.close()
    second = tasks.add.enqueue(3, 4)
    assert connection.connection.info.backend_pid != server_process
    assert int(second.id) > int(first.id)
    assert Job.objects.count() == 2


@POSTGRES_ONLY
@pytest.mark.django_db(transaction=True)
def test_each_thread_enqueues_on_its_own_connection() -> None:
    tasks.add.enqueue(1, 2)
    main_process = connection.connection.info.backend_pid
    seen: list[int] = []

    def enqueue_in_thread() -> None:
        try:
            tasks.add.enqueue(3, 4)
            seen.append(connection.connection.info.backend_pid)
        finally:
            connection.close()

    thread = threading.Thread(target=enqueue_in_thread)
    thread.start()
    thread.join()
    assert len(seen) == 1 and seen[0] != main_process
    tasks.add.enqueue(5, 6)
    assert connection.connection.info.backend_pid == main_process
    assert Job.objects.count() == 3
