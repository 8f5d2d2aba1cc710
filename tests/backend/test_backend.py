"""``LeaseJobsBackend``: the django.tasks API on top of the job table.

Tests that drive jobs through several lease transitions use ``transaction=True``, so
each claim / fail / reap runs in autocommit, as a worker's and a reaper's statements do.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy

from django_leasejobs import leases, registry
from django_leasejobs.backend import NOTIFY_CHANNEL, LeaseJobsBackend
from django_leasejobs.compat import (
    USING_BACKPORT,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_leasejobs.exceptions import InvalidTaskArguments, JobCancelled, LeaseExpired
from django_leasejobs.lease_task import LeaseTask
from django_leasejobs.lease_task import task as leasejobs_task
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.retry import Backoff
from django_leasejobs.signals import job_enqueued
from tests import tasks
from tests.tasks import (
    add,
    async_echo,
    configured,
    plain_django_task,
    retry_controlled,
    with_context,
)

if USING_BACKPORT:
    from django_tasks.exceptions import TaskResultMismatch
else:
    from django.tasks.exceptions import TaskResultMismatch

BACKEND_PATH = "django_leasejobs.backend.LeaseJobsBackend"
QUEUES = ["default", "high", "low"]
COMMITTED = pytest.mark.django_db(transaction=True)
LEASE = 30.0


def backend() -> LeaseJobsBackend:
    found = task_backends["default"]
    assert isinstance(found, LeaseJobsBackend)
    return found


def tasks_setting(**extra_backends: dict[str, Any]) -> dict[str, Any]:
    """TASKS: the test default plus extra LeaseJobs aliases given as OPTIONS dicts."""
    setting: dict[str, Any] = {
        "default": {"BACKEND": BACKEND_PATH, "QUEUES": QUEUES, "OPTIONS": {}}
    }
    for alias, options in extra_backends.items():
        setting[alias] = {"BACKEND": BACKEND_PATH, "QUEUES": QUEUES, "OPTIONS": options}
    return setting


def claim_one(worker: str, **kwargs: Any) -> leases.ClaimedJob:
    claimed = leases.claim(worker, limit=1, lease_duration=LEASE, **kwargs)
    assert len(claimed) == 1, claimed
    return claimed[0]


def expire_lease(job_id: int) -> None:
    assert Job.objects.filter(pk=job_id).update(locked_until=Now() - timedelta(seconds=5)) == 1


def error(n: int, cls: str = "builtins.ValueError") -> leases.ErrorInfo:
    return leases.ErrorInfo(
        cls, f"boom {n}", f"Traceback (most recent call last):\n  ...\n{cls}: boom {n}\n"
    )


def past(hours: float = 1) -> datetime:
    return dj_timezone.now() - timedelta(hours=hours)


@pytest.fixture
def signals_received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Every job_enqueued / task_enqueued sent while the test runs."""
    received: dict[str, list[dict[str, Any]]] = {"job_enqueued": [], "task_enqueued": []}

    def on_job(sender: Any, **kwargs: Any) -> None:
        received["job_enqueued"].append({"sender": sender, **kwargs})

    def on_task(sender: Any, **kwargs: Any) -> None:
        received["task_enqueued"].append({"sender": sender, **kwargs})

    job_enqueued.connect(on_job, weak=False)
    task_enqueued.connect(on_task, weak=False)
    yield received
    job_enqueued.disconnect(on_job)
    task_enqueued.disconnect(on_task)


# --------------------------------------------------------------------------- flags


def test_backend_flags_and_task_class() -> None:
    found = backend()
    assert found.supports_defer is True
    assert found.supports_priority is True
    assert found.supports_get_result is True
    assert found.supports_async_task is True
    assert found.task_class is LeaseTask
    assert found.queues == set(QUEUES)
    # Tasks declared with django.tasks' own decorator are built by the backend's task_class.
    assert type(plain_django_task) is LeaseTask
    assert type(add) is LeaseTask


# --------------------------------------------------------------------------- enqueue basics


@pytest.mark.django_db
def test_enqueue_returns_a_ready_result_and_stores_a_row() -> None:
    result = add.enqueue(1, b=2)

    assert isinstance(result, TaskResult)
    assert result.id.isdigit()
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    assert result.task is add
    assert (result.args, result.kwargs) == ([1], {"b": 2})
    assert result.enqueued_at is not None
    assert (result.started_at, result.finished_at) == (None, None)
    assert (result.errors, result.worker_ids) == ([], [])
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    job = Job.objects.get(pk=int(result.id))
    assert job.task_path == "tests.tasks.add"
    assert (job.backend, job.queue, job.priority) == ("default", "default", 0)
    assert job.status == JobStatus.PENDING
    assert (job.args, job.kwargs) == ([1], {"b": 2})
    assert (job.attempt, job.stall_count, job.locked_by, job.key) == (0, 0, None, None)
    assert job.run_after is not None


@pytest.mark.django_db
def test_async_context_and_django_declared_tasks_enqueue() -> None:
    for declared, args in ((async_echo, ["x"]), (with_context, [5]), (plain_django_task, [2])):
        result = declared.enqueue(*args)
        stored = backend().get_result(result.id)
        assert stored.task.func is declared.func
        assert stored.args == args


# --------------------------------------------------------------------------- transactions


@COMMITTED
def test_rolled_back_enqueue_leaves_no_row_and_no_signal(
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = add.enqueue(1, 2)
        assert Job.objects.filter(pk=int(result.id)).exists()  # visible inside
        raise Rollback

    assert not Job.objects.exists()
    assert signals_received == {"job_enqueued": [], "task_enqueued": []}


@COMMITTED
def test_signals_are_sent_after_commit(signals_received: dict[str, list[dict[str, Any]]]) -> None:
    with transaction.atomic():
        result = add.using(queue_name="high").enqueue(1, 2)
        assert signals_received == {"job_enqueued": [], "task_enqueued": []}

    assert len(signals_received["job_enqueued"]) == 1
    sent = signals_received["job_enqueued"][0]
    assert sent["sender"] is LeaseJobsBackend
    assert sent["job_id"] == int(result.id)
    assert sent["backend"] == "default"
    assert sent["task_path"] == "tests.tasks.add"
    assert sent["queue"] == "high"

    assert len(signals_received["task_enqueued"]) == 1
    assert signals_received["task_enqueued"][0]["task_result"].id == result.id


@COMMITTED
def test_signals_are_sent_at_once_in_autocommit(
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    result = add.enqueue(3, 4)
    assert [s["job_id"] for s in signals_received["job_enqueued"]] == [int(result.id)]
    assert [s["task_result"].id for s in signals_received["task_enqueued"]] == [result.id]


@COMMITTED
def test_a_failing_receiver_does_not_break_enqueue() -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    job_enqueued.connect(broken, weak=False)
    try:
        result = add.enqueue(1, 2)
    finally:
        job_enqueued.disconnect(broken)
    assert Job.objects.filter(pk=int(result.id)).exists()


@COMMITTED
@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_enqueue_notifies_listeners_on_commit() -> None:
    listener = connections.create_connection("default")
    try:
        listener.ensure_connection()
        raw = listener.connection
        raw.execute(f"LISTEN {NOTIFY_CHANNEL}")
        with transaction.atomic():
            add.using(queue_name="low").enqueue(1, 2)
            # Not delivered before the commit (bounded wait for something that must not come).
            assert list(raw.notifies(timeout=0.2, stop_after=1)) == []
        notes = list(raw.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in notes] == [(NOTIFY_CHANNEL, "low")]

        # A bulk enqueue notifies once per queue, not once per job.
        backend().bulk_enqueue(
            [(add, [i, i], {}) for i in range(20)]
            + [(add.using(queue_name="high"), [i, i], {}) for i in range(20)]
        )
        notes = list(raw.notifies(timeout=10, stop_after=2))
        assert sorted(n.payload for n in notes) == ["default", "high"]
        assert list(raw.notifies(timeout=0.2, stop_after=1)) == []
    finally:
        listener.close()


# --------------------------------------------------------------------------- dedup key


@COMMITTED
def test_dedup_key_returns_the_active_job_then_allows_a_new_one(
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    first = add.using(key="k").enqueue(1, 2)
    second = add.using(key="k").enqueue(3, 4)

    assert second.id == first.id
    assert second.args == [1, 2]  # the stored call, not the duplicate's
    assert Job.objects.count() == 1
    assert Job.objects.get().key == "k"
    assert len(signals_received["job_enqueued"]) == 1  # nothing new was enqueued

    # Still deduplicated while it runs.
    claimed = claim_one("w1")
    assert claimed.id == int(first.id)
    assert add.using(key="k").enqueue(5, 6).id == first.id

    # Finished: the key is free again.
    leases.complete(claimed.id, claimed.attempt, "w1", result=3)
    third = add.using(key="k").enqueue(7, 8)
    assert third.id != first.id
    assert Job.objects.count() == 2
    assert Job.objects.get(pk=int(third.id)).status == JobStatus.PENDING
    assert backend().get_result(first.id).status == TaskResultStatus.SUCCESSFUL


@pytest.mark.django_db
def test_different_keys_make_different_jobs() -> None:
    a = add.using(key="a").enqueue(1, 1)
    b = add.using(key="b").enqueue(1, 1)
    plain = add.enqueue(1, 1)
    assert len({a.id, b.id, plain.id}) == 3


@COMMITTED
def test_concurrent_enqueues_with_one_key_make_one_job() -> None:
    threads_count = 6
    barrier = threading.Barrier(threads_count)
    ids: list[str] = []
    failures: list[BaseException] = []

    def producer() -> None:
        try:
            barrier.wait(timeout=30)
            ids.append(add.using(key="race").enqueue(1, 2).id)
        except BaseException as exc:  # report it in the main thread
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=producer) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert len(ids) == threads_count
    assert len(set(ids)) == 1
    assert Job.objects.filter(key="race").count() == 1


@pytest.mark.django_db
def test_dedup_key_of_another_task_does_not_misreport_the_task() -> None:
    add.using(key="shared").enqueue(1, 2)
    try:
        other = configured.using(key="shared").enqueue("x")
    except InvalidTask:
        return  # refusing is fine too
    assert other.task.module_path == "tests.tasks.add"


# --------------------------------------------------------------------------- bulk enqueue


def _insert_statements(queries: list[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("INSERT")]


def _fewest_inserts(rows: int, insert_sql: str) -> int:
    """INSERTs needed for ``rows`` rows given the database's bound-parameter limit."""
    columns = insert_sql.split("(", 1)[1].split(")", 1)[0].count(",") + 1
    limit = connection.features.max_query_params
    per_statement = rows if limit is None else max(limit // columns, 1)
    return math.ceil(rows / min(per_statement, rows))


@pytest.mark.django_db
def test_bulk_enqueue_500_in_one_insert() -> None:
    calls = [(add, [i, i + 1], {}) for i in range(500)]

    with CaptureQueriesContext(connection) as captured:
        results = backend().bulk_enqueue(calls)

    inserts = _insert_statements(captured.captured_queries)
    if connection.vendor == "postgresql":
        # One COPY stream (after one query for the ids), and the queue's NOTIFY.
        sqls = [
            q["sql"]
            for q in captured.captured_queries
            if q["sql"].split()[0] not in ("SAVEPOINT", "RELEASE")  # the atomic block
        ]
        assert not inserts
        assert [s.split()[0] for s in sqls] == ["SELECT", "COPY", "SELECT"]
        assert sqls[1].endswith("-- 500 rows")
        assert "nextval" in sqls[0]
        assert "pg_notify" in sqls[2]
    else:  # e.g. SQLite before Django 6 assumes 999 bound parameters per statement
        assert len(inserts) == _fewest_inserts(500, inserts[0])
    assert Job.objects.count() == 500
    assert len(results) == 500
    assert all(r.id.isdigit() for r in results)
    assert len({r.id for r in results}) == 500
    assert [r.args for r in results] == [[i, i + 1] for i in range(500)]
    assert {r.status for r in results} == {TaskResultStatus.READY}
    assert all(r.enqueued_at is not None for r in results)
    stored = dict(Job.objects.values_list("pk", "args"))
    assert all(stored[int(r.id)] == r.args for r in results)


@COMMITTED
def test_bulk_enqueue_signals_after_commit(
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    with transaction.atomic():
        results = backend().bulk_enqueue(
            [(add, [i, i], {}) for i in range(3)] + [(add.using(key="kk"), [9, 9], {})]
        )
        assert signals_received == {"job_enqueued": [], "task_enqueued": []}
    ids = sorted(int(r.id) for r in results)
    assert sorted(s["job_id"] for s in signals_received["job_enqueued"]) == ids
    assert sorted(int(s["task_result"].id) for s in signals_received["task_enqueued"]) == ids


@pytest.mark.django_db
def test_bulk_enqueue_mixes_tasks_queues_and_options() -> None:
    later = dj_timezone.now() + timedelta(hours=1)
    results = backend().bulk_enqueue(
        [
            (add, [1, 2], {}),
            (configured.using(queue_name="low", priority=-3), [], {"x": "y"}),
            (add.using(run_after=later, max_attempts=9), (3,), {"b": 4}),
        ]
    )
    jobs = [Job.objects.get(pk=int(r.id)) for r in results]
    assert [j.task_path for j in jobs] == [
        "tests.tasks.add",
        "tests.tasks.configured",
        "tests.tasks.add",
    ]
    assert (jobs[1].queue, jobs[1].priority, jobs[1].max_attempts) == ("low", -3, 5)
    assert (jobs[2].run_after, jobs[2].max_attempts) == (later, 9)
    assert (jobs[2].args, jobs[2].kwargs) == ([3], {"b": 4})


@pytest.mark.django_db
def test_bulk_enqueue_of_nothing() -> None:
    with CaptureQueriesContext(connection) as captured:
        assert backend().bulk_enqueue([]) == []
    assert _insert_statements(captured.captured_queries) == []
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_bulk_enqueue_is_all_or_nothing(
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    calls: list[tuple[Task, list[Any], dict[str, Any]]] = [(add, [i, i], {}) for i in range(10)]
    calls.insert(5, (add, [1], {"when": datetime.now(UTC)}))
    calls.append((add.using(key="bulk-k"), [1, 1], {}))

    with pytest.raises(InvalidTaskArguments, match=r"kwargs\['when'\]"):
        backend().bulk_enqueue(calls)

    assert not Job.objects.exists()
    assert signals_received == {"job_enqueued": [], "task_enqueued": []}


@COMMITTED
def test_bulk_enqueue_rolls_back_with_the_callers_transaction(
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        backend().bulk_enqueue(
            [(add, [i, i], {}) for i in range(5)] + [(add.using(key="x"), [], {})]
        )
        raise Rollback
    assert not Job.objects.exists()
    assert signals_received == {"job_enqueued": [], "task_enqueued": []}


@pytest.mark.django_db
def test_bulk_enqueue_dedupes_keyed_calls() -> None:
    existing = add.using(key="old").enqueue(0, 0)
    results = backend().bulk_enqueue(
        [
            (add.using(key="a"), [1, 1], {}),
            (add, [2, 2], {}),
            (add.using(key="a"), [3, 3], {}),
            (add.using(key="b"), [4, 4], {}),
            (add.using(key="old"), [5, 5], {}),
            (add, [6, 6], {}),
        ]
    )
    assert len(results) == 6
    assert results[0].id == results[2].id
    assert results[4].id == existing.id
    assert len({results[0].id, results[1].id, results[3].id, results[5].id, existing.id}) == 5
    assert [r.args for r in results] == [[1, 1], [2, 2], [1, 1], [4, 4], [0, 0], [6, 6]]
    assert Job.objects.count() == 5
    assert sorted(Job.objects.exclude(key=None).values_list("key", flat=True)) == ["a", "b", "old"]


# --------------------------------------------------------------------------- get_result


@pytest.mark.django_db
def test_get_result_pending() -> None:
    enqueued = add.using(priority=5, queue_name="high").enqueue(1, 2)
    result = backend().get_result(enqueued.id)
    assert result.id == enqueued.id
    assert result.status == TaskResultStatus.READY
    assert result.task.func is add.func
    assert (result.task.priority, result.task.queue_name) == (5, "high")
    assert (result.args, result.kwargs) == ([1, 2], {})
    assert (result.errors, result.worker_ids) == ([], [])
    assert result.enqueued_at == enqueued.enqueued_at
    assert result.started_at is None


@COMMITTED
def test_get_result_running() -> None:
    enqueued = add.enqueue(1, 2)
    claim_one("w1")
    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == ["w1"]
    assert result.attempts == 1
    assert result.errors == []
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is None


@COMMITTED
def test_get_result_succeeded() -> None:
    enqueued = add.enqueue(1, 2)
    claimed = claim_one("w1")
    leases.complete(claimed.id, claimed.attempt, "w1", result={"sum": 3, "parts": [1, 2]})
    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == {"sum": 3, "parts": [1, 2]}
    assert result.worker_ids == ["w1"]
    assert result.errors == []
    assert result.finished_at is not None
    assert result.finished_at >= result.started_at


@COMMITTED
def test_get_result_failed_after_every_attempt_failed() -> None:
    enqueued = add.enqueue(1, 2)
    statuses = []
    for n, worker in enumerate(["w1", "w2", "w3"], start=1):
        claimed = claim_one(worker)
        assert claimed.attempt == n
        statuses.append(leases.fail(claimed.id, n, worker, error=error(n), retry_delay=0))
    assert statuses == [JobStatus.PENDING, JobStatus.PENDING, JobStatus.FAILED]

    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert result.worker_ids == ["w1", "w2", "w3"]
    assert len(result.errors) == 3
    for n, task_error in enumerate(result.errors, start=1):
        assert task_error.exception_class_path == "builtins.ValueError"
        assert task_error.exception_class is ValueError
        assert task_error.traceback.startswith("Traceback (most recent call last):")
        assert f"boom {n}" in task_error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


@COMMITTED
def test_get_result_succeeded_after_a_failed_attempt() -> None:
    enqueued = add.enqueue(1, 2)
    first = claim_one("w1")
    leases.fail(first.id, first.attempt, "w1", error=error(1), retry_delay=0)
    second = claim_one("w2")
    leases.complete(second.id, second.attempt, "w2", result=3)
    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.worker_ids == ["w1", "w2"]
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]


@COMMITTED
def test_get_result_dead_after_too_many_stalls() -> None:
    enqueued = add.enqueue(1, 2)  # MAX_STALLS defaults to 3
    for worker in ("w1", "w2", "w3"):
        claimed = claim_one(worker)
        expire_lease(claimed.id)
        reaped = leases.reap().jobs
        assert [r.id for r in reaped] == [claimed.id]
    assert Job.objects.get(pk=int(enqueued.id)).status == JobStatus.DEAD

    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.worker_ids == ["w1", "w2", "w3"]
    assert len(result.errors) == 3
    assert {e.exception_class_path for e in result.errors} == {
        "django_leasejobs.exceptions.LeaseExpired"
    }
    assert all(e.exception_class is LeaseExpired for e in result.errors)
    assert all("lease expired" in e.traceback for e in result.errors)


@pytest.mark.django_db
def test_get_result_cancelled_while_pending() -> None:
    enqueued = add.enqueue(1, 2)
    assert leases.cancel(int(enqueued.id)) == leases.CancelResult.CANCELLED
    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    assert (result.errors, result.worker_ids) == ([], [])


@COMMITTED
def test_get_result_cancelled_while_running() -> None:
    enqueued = add.enqueue(1, 2)
    claimed = claim_one("w1")
    assert leases.cancel(claimed.id) == leases.CancelResult.REQUESTED
    assert backend().get_result(enqueued.id).status == TaskResultStatus.RUNNING
    leases.mark_cancelled(claimed.id, claimed.attempt, "w1")
    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.worker_ids == ["w1"]
    assert [e.exception_class for e in result.errors] == [JobCancelled]


@COMMITTED
def test_get_result_after_a_release_is_ready_without_errors() -> None:
    enqueued = add.enqueue(1, 2)
    claimed = claim_one("w1")
    leases.release(claimed.id, claimed.attempt, "w1")
    result = backend().get_result(enqueued.id)
    assert result.status == TaskResultStatus.READY
    assert result.errors == []  # a shutdown release is not a failure
    assert result.worker_ids == ["w1"]


@COMMITTED
def test_refresh_follows_the_job() -> None:
    result = add.enqueue(1, 2)
    assert result.status == TaskResultStatus.READY

    claimed = claim_one("w1")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == ["w1"]

    leases.complete(claimed.id, claimed.attempt, "w1", result=3)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.finished_at is not None


@pytest.mark.django_db
def test_task_get_result() -> None:
    enqueued = add.enqueue(1, 2)
    assert add.get_result(enqueued.id).id == enqueued.id
    assert add.using(priority=3).get_result(enqueued.id).id == enqueued.id
    with pytest.raises(TaskResultMismatch):
        configured.get_result(enqueued.id)


@pytest.mark.django_db
def test_get_result_reflects_the_rows_queue_and_priority() -> None:
    enqueued = configured.using(queue_name="low", priority=-7).enqueue("v")
    result = configured.get_result(enqueued.id)
    assert (result.task.queue_name, result.task.priority) == ("low", -7)
    assert result.task.max_attempts == 5


@pytest.mark.django_db
def test_get_result_of_a_row_whose_queue_was_retired() -> None:
    job = Job.objects.create(task_path="tests.tasks.add", queue="retired", args=[1, 2])
    result = backend().get_result(str(job.pk))
    assert result.status == TaskResultStatus.READY
    assert result.task.func is add.func
    assert result.task.queue_name == "default"  # the task's own, valid, queue


@pytest.mark.django_db
@pytest.mark.parametrize(
    "result_id",
    ["999999999", "0", "-1", "abc", "", "1.5", "1e3", "99999999999999999999999", None],
)
def test_unknown_result_ids(result_id: Any) -> None:
    add.enqueue(1, 2)  # something exists, just not that
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(result_id)


@pytest.mark.django_db
def test_results_of_another_backend_alias_are_not_visible() -> None:
    enqueued = add.enqueue(1, 2)
    with override_settings(TASKS=tasks_setting(other={})):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["other"].get_result(enqueued.id)
        assert task_backends["default"].get_result(enqueued.id).id == enqueued.id


# --------------------------------------------------------------------------- async


@pytest.mark.django_db
def test_aenqueue_and_aget_result() -> None:
    result = async_to_sync(add.aenqueue)(1, 2)
    assert result.status == TaskResultStatus.READY
    assert Job.objects.filter(pk=int(result.id)).exists()

    fetched = async_to_sync(backend().aget_result)(result.id)
    assert (fetched.id, fetched.args) == (result.id, [1, 2])
    assert async_to_sync(add.aget_result)(result.id).id == result.id
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.READY

    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend().aget_result)("424242424")
    with pytest.raises(InvalidTaskArguments):
        async_to_sync(add.aenqueue)(object())


@pytest.mark.django_db
def test_aenqueue_of_an_async_task() -> None:
    result = async_to_sync(async_echo.aenqueue)({"a": [1]})
    assert backend().get_result(result.id).task.func is async_echo.func
    assert Job.objects.get(pk=int(result.id)).args == [{"a": [1]}]


# --------------------------------------------------------------------------- arguments


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs", "place"),
    [
        ([object()], {}, "args[0]"),
        ([1, datetime.now(UTC)], {}, "args[1]"),
        ([], {"when": datetime.now(UTC)}, "kwargs['when']"),
        ([{1, 2}], {}, "args[0]"),
        ([b"bytes"], {}, "args[0]"),
        ([float("nan")], {}, "args[0]"),
        ([], {"x": float("inf")}, "kwargs['x']"),
        ([Decimal("1.5")], {}, "args[0]"),
        ([gettext_lazy("lazy")], {}, "args[0]"),
        ([{1: "int key"}], {}, "args[0]"),
        ([{"a": [1, {"b": object()}]}], {}, "args[0]['a'][1]['b']"),
        ([], {"nested": {"x": (1, {2, 3})}}, "kwargs['nested']['x'][1]"),
    ],
)
def test_non_json_arguments_are_rejected(
    args: list[Any],
    kwargs: dict[str, Any],
    place: str,
    signals_received: dict[str, list[dict[str, Any]]],
) -> None:
    with pytest.raises(InvalidTaskArguments) as excinfo:
        add.enqueue(*args, **kwargs)
    assert isinstance(excinfo.value, InvalidTask)
    assert isinstance(excinfo.value, TypeError)
    assert str(excinfo.value).startswith(place + " ")
    assert not Job.objects.exists()
    assert signals_received["job_enqueued"] == []


@pytest.mark.django_db
def test_int_dict_keys_message() -> None:
    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] has a key 1 of type int"):
        add.enqueue({1: "a"})


@pytest.mark.django_db
def test_json_arguments_round_trip() -> None:
    args = [None, True, 0, -(2**63), 2**70, 1.5, "ü€😀", [1, [2, [3]]], (4, 5)]
    kwargs = {"d": {"k": {"deep": [None, {"x": False}]}}, "empty": {}, "s": ""}
    result = add.enqueue(*args, **kwargs)
    expected_args = [*args[:-1], [4, 5]]  # tuples are stored as lists
    job = Job.objects.get(pk=int(result.id))
    assert job.args == expected_args
    assert job.kwargs == kwargs
    fetched = backend().get_result(result.id)
    assert (fetched.args, fetched.kwargs) == (expected_args, kwargs)


# --------------------------------------------------------------------------- run_after


def test_naive_run_after_is_rejected() -> None:
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        add.using(run_after=datetime(2030, 1, 1, 12, 0))


@pytest.mark.django_db
def test_aware_run_after_is_stored_and_respected() -> None:
    later = dj_timezone.now() + timedelta(hours=1)
    deferred = add.using(run_after=later).enqueue(1, 2)
    ready = add.using(run_after=past()).enqueue(3, 4)
    other_zone = add.using(
        run_after=(later + timedelta(minutes=1)).astimezone(timezone(timedelta(hours=5)))
    ).enqueue(5, 6)

    assert Job.objects.get(pk=int(deferred.id)).run_after == later
    assert Job.objects.get(pk=int(other_zone.id)).run_after == later + timedelta(minutes=1)
    assert deferred.task.run_after == later

    claimed = leases.claim("w1", limit=10, lease_duration=LEASE)
    assert [c.id for c in claimed] == [int(ready.id)]
    assert leases.claim("w2", limit=10, lease_duration=LEASE) == []
    assert Job.objects.get(pk=int(deferred.id)).status == JobStatus.PENDING


@pytest.mark.django_db
def test_claim_and_the_orm_agree_on_readiness() -> None:
    # One clock: run_after's db_default and JobQuerySet.ready() use Django's Now(), the
    # claim SQL must use the same (on PostgreSQL now() would be the transaction's start).
    result = add.enqueue(1, 2)
    assert Job.objects.ready().filter(pk=int(result.id)).exists()
    assert [c.id for c in leases.claim("w1", limit=1, lease_duration=LEASE)] == [int(result.id)]


# --------------------------------------------------------------------------- queue / priority


def test_unknown_queue_is_rejected() -> None:
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        add.using(queue_name="nope")


@pytest.mark.parametrize("priority", [101, -101, 1.5, 1000])
def test_out_of_range_priority_is_rejected(priority: Any) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=priority)


@COMMITTED
def test_queue_and_priority_are_stored_and_used() -> None:
    low = add.using(priority=-100).enqueue(1, 1)
    mid = add.enqueue(2, 2)
    high = add.using(priority=100).enqueue(3, 3)
    elsewhere = add.using(queue_name="high", priority=50).enqueue(4, 4)
    stored = dict(Job.objects.values_list("pk", "priority"))
    assert [stored[int(r.id)] for r in (low, mid, high, elsewhere)] == [-100, 0, 100, 50]
    assert Job.objects.get(pk=int(elsewhere.id)).queue == "high"

    order = [claim_one(f"w{i}", queues=["default"]).id for i in range(3)]
    assert order == [int(high.id), int(mid.id), int(low.id)]
    assert leases.claim("w9", limit=5, lease_duration=LEASE, queues=["low"]) == []
    assert claim_one("w10", queues=["high"]).id == int(elsewhere.id)


# --------------------------------------------------------------------------- per-task options


@pytest.mark.django_db
def test_declared_task_options_reach_the_row() -> None:
    result = configured.enqueue("x")
    job = Job.objects.get(pk=int(result.id))
    assert (job.max_attempts, job.max_stalls, job.timeout) == (5, 2, 30.0)
    assert configured.retry_backoff == Backoff(base=1, factor=3, cap=60, jitter=0)
    assert registry.resolve(job.task_path).retry_backoff == configured.retry_backoff


@pytest.mark.django_db
@pytest.mark.parametrize("declared", [add, plain_django_task], ids=["leasejobs", "django"])
def test_plain_tasks_get_the_backend_defaults(declared: Task) -> None:
    result = declared.enqueue(1, 2) if declared is add else declared.enqueue(1)
    job = Job.objects.get(pk=int(result.id))
    assert (job.max_attempts, job.max_stalls, job.timeout, job.key) == (3, 3, None, None)
    assert isinstance(declared, LeaseTask)
    assert declared.retry_backoff is None


@pytest.mark.django_db
def test_using_overrides_per_task_options() -> None:
    overridden = add.using(max_attempts=7, max_stalls=4, timeout=2.5, key="over")
    assert add.max_attempts is None  # the declaration is untouched
    job = Job.objects.get(pk=int(overridden.enqueue(1, 2).id))
    assert (job.max_attempts, job.max_stalls, job.timeout, job.key) == (7, 4, 2.5, "over")

    reset = configured.using(max_attempts=None, timeout=None)
    job = Job.objects.get(pk=int(reset.enqueue("y").id))
    assert (job.max_attempts, job.max_stalls, job.timeout) == (3, 2, None)

    chained = add.using(priority=9).using(queue_name="low").using(max_attempts=2)
    assert (chained.priority, chained.queue_name, chained.max_attempts) == (9, "low", 2)


@pytest.mark.django_db
def test_using_retry_backoff_is_kept_with_the_job() -> None:
    policy = {"base": 5, "factor": 1, "cap": 5, "jitter": 0}
    result = add.using(retry_backoff=policy).enqueue(1, 2)
    assert backend().get_result(result.id).task.retry_backoff == Backoff(**policy)


@pytest.mark.django_db
def test_backend_options_set_the_defaults() -> None:
    with override_settings(TASKS=tasks_setting(custom={"MAX_ATTEMPTS": 7, "MAX_STALLS": 4})):
        result = add.using(backend="custom").enqueue(1, 2)
        job = Job.objects.get(pk=int(result.id))
        assert (job.backend, job.max_attempts, job.max_stalls) == ("custom", 7, 4)
        assert task_backends["custom"].get_result(result.id).backend == "custom"
        # A per-task value still wins over the backend's default.
        job = Job.objects.get(pk=int(configured.using(backend="custom").enqueue().id))
        assert (job.max_attempts, job.max_stalls) == (5, 2)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"max_attempts": "3"},
        {"max_stalls": 0},
        {"timeout": -1},
        {"timeout": 0},
        {"timeout": "5"},
        {"timeout": True},
        {"retry_backoff": {"bogus": 1}},
        {"retry_backoff": {"jitter": 2}},
        {"retry_backoff": {"base": "1"}},
        {"retry_backoff": "fast"},
        {"key": ""},
        {"key": "k" * 256},
        {"key": 5},
    ],
    ids=repr,
)
def test_invalid_per_task_options_are_rejected(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidTask, match=next(iter(changes))):
        add.using(**changes)


def test_invalid_declaration_is_rejected_and_not_registered() -> None:
    with pytest.raises(InvalidTask, match="max_attempts"):
        leasejobs_task(max_attempts=0)(tasks.not_a_task)
    with pytest.raises(InvalidTask, match="retry_backoff"):
        leasejobs_task(retry_backoff={"bogus": 1})(tasks.not_a_task)
    assert "tests.tasks.not_a_task" not in registry.registered()


@pytest.mark.parametrize(
    "options",
    [
        {"retry_on": ()},
        {"retry_on": ("ValueError",)},
        {"retry_on": (int,)},
        {"dont_retry_on": None},
        {"dont_retry_on": ValueError()},
        {"max_snoozes": -1},
        {"max_snoozes": 1.5},
        {"max_snoozes": True},
        {"retry_backoff": 5},
    ],
    ids=repr,
)
def test_invalid_retry_control_is_rejected_and_not_registered(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidTask, match=next(iter(options))):
        leasejobs_task(**options)(tasks.not_a_task)
    assert "tests.tasks.not_a_task" not in registry.registered()


@pytest.mark.django_db
def test_retry_control_options_stay_in_code() -> None:
    declared = retry_controlled
    assert (declared.retry_on, declared.dont_retry_on) == ((OSError,), (FileNotFoundError,))
    assert (declared.max_snoozes, declared.snooze_limit, add.snooze_limit) == (0, 0, 10)
    assert declared.using(priority=3).retry_on == (OSError,)  # kept by using()
    # A callable backoff is never stored on the row; get_result's task still has it.
    result = declared.enqueue()
    assert Job.objects.get(pk=int(result.id)).retry_backoff is None
    assert backend().get_result(result.id).task.retry_backoff is tasks.wait_attempts


def test_nan_timeout_is_rejected() -> None:
    with pytest.raises(InvalidTask, match="timeout"):
        add.using(timeout=float("nan"))


# --------------------------------------------------------------------------- configuration


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "check_id"),
    [
        ({"LEASE_DURATION": "30"}, "leasejobs.E002"),
        ({"MAX_ATTEMPTS": 0}, "leasejobs.E002"),
        ({"LEASE_DURATON": 30}, "leasejobs.E001"),
        ({"LOCK_LOST_BEHAVIOR": "sighup"}, "leasejobs.E003"),
        ({"LEASE_DURATION": 10, "HEARTBEAT_INTERVAL": 10}, "leasejobs.E004"),
        ({"LEASE_DURATION": 3e6}, "leasejobs.E007"),
    ],
)
def test_misconfigured_backend_refuses_to_enqueue(options: dict[str, Any], check_id: str) -> None:
    with override_settings(TASKS=tasks_setting(bad=options)):
        bad = add.using(backend="bad")
        calls: list[Callable[[], Any]] = [
            lambda: bad.enqueue(1, 2),
            lambda: task_backends["bad"].bulk_enqueue([(bad, [1, 2], {})]),
            lambda: async_to_sync(bad.aenqueue)(1, 2),
            lambda: bad.using(key="k").enqueue(1, 2),
        ]
        for call in calls:
            with pytest.raises(ImproperlyConfigured) as excinfo:
                call()
            assert f"[{check_id}]" in str(excinfo.value)
            assert "TASKS['bad']" in str(excinfo.value)
        # The correctly configured backend next to it still works.
        assert add.enqueue(1, 2).status == TaskResultStatus.READY
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_env_var_misconfiguration_refuses_to_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEJOBS_LOCK_LOST_BEHAVIOR", "sigstop")
    # The backends are rebuilt, with the variable set, inside override_settings.
    with (
        override_settings(TASKS=tasks_setting()),
        pytest.raises(ImproperlyConfigured, match=r"\[leasejobs\.E003\]"),
    ):
        add.enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "warnings"),
    [
        ({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 15}, ["leasejobs.W001"]),
        (
            {"LEASE_DURATION": 0.5, "HEARTBEAT_INTERVAL": 0.05, "POLL_INTERVAL": 0.01},
            ["leasejobs.W002", "leasejobs.W004", "leasejobs.W003"],
        ),
    ],
    ids=["slow-heartbeat", "fast-timings"],
)
def test_warnings_do_not_block_enqueue(options: dict[str, Any], warnings: list[str]) -> None:
    with override_settings(TASKS=tasks_setting(warned=options)):
        found = task_backends["warned"]
        assert isinstance(found, LeaseJobsBackend)
        assert sorted(p.id for p in found.problems) == sorted(warnings)
        found.require_valid_config()
        result = add.using(backend="warned").enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).backend == "warned"


@pytest.mark.django_db
def test_unknown_database_alias_refuses_to_enqueue_with_the_check_id() -> None:
    with (
        override_settings(TASKS=tasks_setting(elsewhere={"DATABASE": "jobs"})),
        pytest.raises(ImproperlyConfigured, match=r"leasejobs\.E005"),
    ):
        add.using(backend="elsewhere").enqueue(1, 2)
