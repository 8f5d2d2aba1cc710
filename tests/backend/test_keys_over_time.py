"""Keys over time (issue 28.6): ``unique_for`` windows and ``debounce`` at enqueue, on every
database, with real concurrent producers; ``result_ttl`` on the row; the errors of bad
values and the system checks of ``QUEUE_RESULT_TTL``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections, transaction
from django.test import override_settings

from django_leasejobs import leases
from django_leasejobs.compat import InvalidTask, TaskResultStatus, task_backends
from django_leasejobs.conf import E_BAD_QUEUE_RESULT_TTL, E_UNKNOWN_LIMITED_QUEUE, parse_options
from django_leasejobs.functions import DatabaseNow
from django_leasejobs.models import Job, JobStatus
from tests.conftest import ListHandler
from tests.helpers_leases import claim_one, db_now, make_ready, run_in_threads
from tests.tasks import add, configured, kept_an_hour
from tests.waiting import wait_until

COMMITTED = pytest.mark.django_db(transaction=True)
HOUR = timedelta(hours=1)
ERROR = leases.ErrorInfo("builtins.ValueError", "boom", "Traceback ...\nValueError: boom\n")


def jobs_of(key: str) -> list[Job]:
    return list(Job.objects.filter(key=key).order_by("pk"))


def age(key: str, by: timedelta) -> None:
    """Move every job of ``key`` ``by`` into the past: enqueued (and finished) earlier,
    on the database's clock, which itself cannot move."""
    Job.objects.filter(key=key).update(enqueued_at=DatabaseNow() - by)


def succeed(job_id: int, result: Any = None) -> None:
    make_ready(job_id)
    claimed = claim_one("w", job_id)
    leases.complete(job_id, claimed.attempt, "w", result=result)


def fail_for_good(job_id: int) -> None:
    make_ready(job_id)
    claimed = claim_one("w", job_id)
    leases.fail(job_id, claimed.attempt, "w", error=ERROR, retry_delay=None)


# --------------------------------------------------------------------------- unique_for


@pytest.mark.django_db
def test_within_the_window_a_second_enqueue_returns_the_first_job() -> None:
    first = add.using(key="invoice-42", unique_for=HOUR).enqueue(1, 2)
    second = add.using(key="invoice-42", unique_for=3600).enqueue(3, 4)
    assert second.id == first.id
    assert second.args == [1, 2]  # the first job, as it is
    assert len(jobs_of("invoice-42")) == 1


@COMMITTED
@pytest.mark.parametrize("ending", ["succeeded", "failed"])
def test_a_finished_first_job_is_returned_within_the_window(ending: str) -> None:
    first = add.using(key="invoice-42", unique_for=HOUR).enqueue(1, 2)
    if ending == "succeeded":
        succeed(int(first.id), result=3)
    else:
        fail_for_good(int(first.id))

    again = add.using(key="invoice-42", unique_for=HOUR).enqueue(5, 6)

    assert again.id == first.id
    if ending == "succeeded":
        assert again.status == TaskResultStatus.SUCCESSFUL
        assert again.return_value == 3
    else:
        assert again.status == TaskResultStatus.FAILED
        assert [e.exception_class_path for e in again.errors] == ["builtins.ValueError"]
    assert len(jobs_of("invoice-42")) == 1


@COMMITTED
def test_after_the_window_a_new_job_is_created_and_opens_its_own_window() -> None:
    first = add.using(key="invoice-42", unique_for=HOUR).enqueue(1, 2)
    succeed(int(first.id))
    age("invoice-42", HOUR + timedelta(seconds=5))

    second = add.using(key="invoice-42", unique_for=HOUR).enqueue(3, 4)
    assert second.id != first.id
    third = add.using(key="invoice-42", unique_for=HOUR).enqueue(5, 6)
    assert third.id == second.id
    assert [j.pk for j in jobs_of("invoice-42")] == [int(first.id), int(second.id)]


@COMMITTED
def test_the_window_is_measured_from_the_first_jobs_enqueued_at() -> None:
    first = add.using(key="k", unique_for=HOUR).enqueue(1, 2)
    succeed(int(first.id))
    age("k", HOUR - timedelta(minutes=1))  # still inside
    assert add.using(key="k", unique_for=HOUR).enqueue(3, 4).id == first.id
    # A shorter window at the second enqueue: it is that enqueue's window that counts.
    assert add.using(key="k", unique_for=60).enqueue(3, 4).id != first.id


@COMMITTED
def test_an_active_job_with_the_key_always_dedups_even_outside_the_window() -> None:
    first = add.using(key="k").enqueue(1, 2)  # a plain key, pending for two hours
    age("k", 2 * HOUR)
    assert add.using(key="k", unique_for=HOUR).enqueue(3, 4).id == first.id
    claim_one("w", int(first.id))  # running
    assert add.using(key="k", unique_for=HOUR).enqueue(3, 4).id == first.id
    assert len(jobs_of("k")) == 1


@COMMITTED
def test_a_plain_key_is_still_free_once_its_job_finished() -> None:
    first = add.using(key="k", unique_for=HOUR).enqueue(1, 2)
    succeed(int(first.id))
    # Without unique_for the key holds while active only, as before.
    assert add.using(key="k").enqueue(3, 4).id != first.id


@COMMITTED
def test_the_first_job_in_the_window_wins_over_later_ones() -> None:
    first = add.using(key="k").enqueue(1, 2)
    succeed(int(first.id))
    second = add.using(key="k").enqueue(3, 4)
    succeed(int(second.id))
    assert add.using(key="k", unique_for=HOUR).enqueue(5, 6).id == first.id


@pytest.mark.django_db
def test_get_result_rebuilds_the_task_with_its_window() -> None:
    result = add.using(key="k", unique_for=timedelta(minutes=5)).enqueue(1, 2)
    fetched = task_backends["default"].get_result(result.id)
    assert fetched.task.unique_for == 300.0
    assert fetched == result


@COMMITTED
def test_a_job_committed_between_the_check_and_the_insert_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The race the insert's own check closes: the first producer's job was committed and
    # even finished after the second producer looked (and found nothing) but before it
    # inserted. The unique index on active keys cannot see a finished job.
    first = add.using(key="k", unique_for=HOUR).enqueue(1, 2)
    succeed(int(first.id))
    looked: list[int] = []
    real = leases.key_holder

    def too_early(key: str, **kwargs: Any) -> Any:
        if kwargs.get("before") is None and not looked:
            looked.append(1)
            return None  # as if the first job were not committed yet
        return real(key, **kwargs)

    monkeypatch.setattr(leases, "key_holder", too_early)
    again = add.using(key="k", unique_for=HOUR).enqueue(3, 4)

    assert looked == [1]
    assert again.id == first.id
    assert [j.pk for j in jobs_of("k")] == [int(first.id)]  # the second insert rolled back


@COMMITTED
def test_concurrent_producers_make_one_job_in_the_window_while_a_worker_finishes_it() -> None:
    rounds = 4
    producers = 6
    stop = threading.Event()

    def fast_worker() -> None:
        # Finishes every job of the key as soon as it can, so that the active-key index
        # alone would let a later producer insert a second job.
        try:
            while not stop.is_set():
                for claimed in leases.claim("fast", limit=10, lease_duration=30):
                    leases.complete(claimed.id, claimed.attempt, "fast")
        finally:
            connections.close_all()

    worker = threading.Thread(target=fast_worker, daemon=True)
    worker.start()
    try:
        for n in range(rounds):
            key = f"race-{n}"
            ids = run_in_threads(
                [lambda key=key: add.using(key=key, unique_for=HOUR).enqueue(1, 2).id] * producers
            )
            assert len(set(ids)) == 1, ids
            assert len(jobs_of(key)) == 1
    finally:
        stop.set()
        worker.join(timeout=30)


# --------------------------------------------------------------------------- debounce


def debounced(*args: Any, delay: float = 30) -> Any:
    return add.using(key="reindex-7", debounce=delay).enqueue(*args)


def due_in(job: Job) -> float:
    return (job.run_after - db_now()).total_seconds()


@pytest.mark.django_db
def test_debounce_delays_the_job_from_the_enqueue() -> None:
    result = debounced(1, 2, delay=timedelta(seconds=30))
    job = Job.objects.get(pk=result.id)
    assert 25 < due_in(job) <= 30
    assert job.status == JobStatus.PENDING
    assert result.status == TaskResultStatus.READY


@pytest.mark.django_db
def test_the_last_enqueue_wins_and_keeps_the_first_id(leasejobs_log: ListHandler) -> None:
    first = debounced(1, 2, delay=5)
    job = Job.objects.get(pk=first.id)
    before = job.run_after

    second = debounced(3, 4, delay=600)

    assert second.id == first.id
    assert second.args == [3, 4]
    (job,) = jobs_of("reindex-7")
    assert (job.args, job.status) == ([3, 4], JobStatus.PENDING)
    assert job.run_after > before
    assert 590 < due_in(job) <= 600
    assert Job.objects.get(pk=first.id).enqueued_at == job.enqueued_at  # kept
    records = [r for r in leasejobs_log.records if r.getMessage() == "enqueue debounced by key"]
    assert [(r.job_id, r.key, r.status) for r in records] == [  # type: ignore[attr-defined]
        (job.pk, "reindex-7", "pending")
    ]


@pytest.mark.django_db
def test_debounce_replaces_the_options_of_the_call_too() -> None:
    first = add.using(key="reindex-7", debounce=30, priority=5).enqueue(1, 2)
    add.using(key="reindex-7", debounce=30, priority=-5, queue_name="low").enqueue(3, 4)
    job = Job.objects.get(pk=first.id)
    assert (job.priority, job.queue, job.task_options) == (-5, "low", {"debounce": 30.0})


@COMMITTED
def test_a_running_job_with_the_key_is_not_touched() -> None:
    first = debounced(1, 2)
    make_ready(int(first.id))
    claim_one("w", int(first.id))

    again = debounced(3, 4)

    # Unique while active: the running job is returned as it is; nothing is added.
    assert again.id == first.id
    assert again.status == TaskResultStatus.RUNNING
    assert again.args == [1, 2]
    assert [(j.status, j.args) for j in jobs_of("reindex-7")] == [("running", [1, 2])]


@COMMITTED
def test_after_the_job_finished_a_debounce_creates_a_new_one() -> None:
    first = debounced(1, 2)
    succeed(int(first.id))
    second = debounced(3, 4)
    assert second.id != first.id
    assert [j.status for j in jobs_of("reindex-7")] == ["succeeded", "pending"]


@pytest.mark.django_db
def test_another_tasks_pending_job_with_the_key_is_returned_untouched() -> None:
    other = configured.using(key="reindex-7").enqueue("x")
    again = debounced(3, 4)
    assert again.id == other.id
    assert Job.objects.get(pk=other.id).args == ["x"]


def _sessions_waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        else:
            # A statement of another session still running: the second debounce's UPDATE,
            # waiting for the row lock (the lock tables of information_schema are cached).
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                "WHERE COMMAND = 'Query' AND ID <> CONNECTION_ID() AND INFO LIKE 'UPDATE%%'"
            )
        return int(cursor.fetchone()[0])


def _sessions() -> str:
    if connection.vendor != "mysql":
        return "a session waiting on a lock"
    with connection.cursor() as cursor:
        cursor.execute("SELECT ID, COMMAND, STATE, INFO FROM information_schema.PROCESSLIST")
        return f"an UPDATE waiting on a lock; sessions: {cursor.fetchall()!r}"


@pytest.fixture
def row_locks() -> Iterator[None]:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serialises writers: no second writer runs at once")
    yield


@COMMITTED
def test_a_debounce_waiting_on_an_uncommitted_one_writes_after_it(row_locks: None) -> None:
    first = debounced(0, 0)
    updated = threading.Event()
    release = threading.Event()
    seen: dict[str, Any] = {}

    def earlier() -> None:
        try:
            with transaction.atomic():
                seen["earlier"] = debounced(1, 1).id
                updated.set()
                release.wait(30)
        finally:
            connections.close_all()

    def later() -> None:
        try:
            seen["later"] = debounced(2, 2).id
        finally:
            connections.close_all()

    one = threading.Thread(target=earlier, daemon=True)
    two = threading.Thread(target=later, daemon=True)
    one.start()
    wait_until(updated.is_set, what="the first debounce's update")
    two.start()
    wait_until(_sessions_waiting_on_a_lock, what=_sessions)
    assert Job.objects.get(pk=first.id).args == [0, 0]  # neither committed yet
    release.set()
    one.join(30)
    two.join(30)

    assert seen == {"earlier": first.id, "later": first.id}
    assert [j.args for j in jobs_of("reindex-7")] == [[2, 2]]  # the last one's arguments


@COMMITTED
def test_concurrent_debounces_leave_one_pending_job_with_one_of_their_arguments() -> None:
    producers = 6
    ids = run_in_threads(
        [lambda n=n: debounced(n, n).id for n in range(producers)]  # type: ignore[misc]
    )
    assert len(set(ids)) == 1
    (job,) = jobs_of("reindex-7")
    assert job.status == JobStatus.PENDING
    n = job.args[0]
    assert job.args == [n, n] and 0 <= n < producers


# --------------------------------------------------------------------------- result_ttl


@pytest.mark.django_db
def test_result_ttl_is_stored_on_the_row_from_the_decorator_or_using() -> None:
    declared = kept_an_hour.enqueue(1)
    overridden = add.using(result_ttl=timedelta(days=2)).enqueue(1, 2)
    plain = add.enqueue(1, 2)
    stored = dict(Job.objects.values_list("pk", "result_ttl"))
    assert stored[int(declared.id)] == HOUR
    assert stored[int(overridden.id)] == timedelta(days=2)
    assert stored[int(plain.id)] is None
    fetched = task_backends["default"].get_result(overridden.id)
    assert fetched.task.result_ttl == 2 * 86400.0
    assert task_backends["default"].get_result(plain.id).task.result_ttl is None


@pytest.mark.django_db
def test_result_ttl_goes_through_bulk_enqueue() -> None:
    backend = task_backends["default"]
    results = backend.bulk_enqueue([(kept_an_hour, [n], {}) for n in range(3)])
    ttls = set(Job.objects.filter(pk__in=[r.id for r in results]).values_list("result_ttl"))
    assert ttls == {(HOUR,)}


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key": "k", "unique_for": -1}, "unique_for must be more than 0 seconds, got -1"),
        ({"key": "k", "unique_for": 0}, "unique_for must be more than 0 seconds"),
        ({"key": "k", "unique_for": float("nan")}, "unique_for must be more than 0 seconds"),
        ({"key": "k", "unique_for": "1h"}, "unique_for must be a number of seconds or a"),
        ({"key": "k", "unique_for": True}, "unique_for must be a number of seconds"),
        ({"key": "k", "debounce": timedelta(seconds=-5)}, "debounce must be more than 0"),
        ({"key": "k", "debounce": 10**12}, "debounce must be at most"),
        ({"result_ttl": "1d"}, "result_ttl must be a number of seconds or a"),
        ({"result_ttl": 0}, "result_ttl must be more than 0 seconds"),
        ({"unique_for": 60}, r"unique_for needs a dedup key: pass key= in the same call"),
        ({"debounce": 60}, r"debounce needs a dedup key"),
        ({"key": "k", "unique_for": 60, "debounce": 5}, "cannot be combined"),
    ],
    ids=repr,
)
def test_bad_values_are_refused_by_using(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTask, match=message):
        add.using(**options)


def test_debounce_with_run_after_is_refused() -> None:
    from django.utils import timezone

    with pytest.raises(InvalidTask, match="pass debounce or run_after, not both"):
        add.using(key="k", debounce=5, run_after=timezone.now())
    with pytest.raises(InvalidTask, match="pass debounce or run_after, not both"):
        add.using(key="k", debounce=5).using(run_after=timezone.now())


def test_a_bad_result_ttl_in_the_decorator_is_refused() -> None:
    from django_leasejobs import task

    with pytest.raises(InvalidTask, match="result_ttl must be more than 0 seconds, got -3"):
        task(result_ttl=-3)(lambda: None)


@pytest.mark.django_db
def test_nothing_is_stored_when_using_refuses() -> None:
    with pytest.raises(InvalidTask):
        add.using(key="k", unique_for=-1).enqueue(1, 2)
    assert not Job.objects.exists()


# --------------------------------------------------------------------------- system checks


def leasejobs_messages(options: Any, **extra: Any) -> list[Any]:
    entry = {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend", "OPTIONS": options}
    with override_settings(TASKS={"default": {**entry, **extra}}):
        return [m for m in run_checks() if str(m.id).startswith("leasejobs.")]


def test_a_good_queue_result_ttl_is_read_and_silent() -> None:
    options = {"QUEUE_RESULT_TTL": {"reports": 86400, "default": timedelta(hours=2)}}
    assert leasejobs_messages(options, QUEUES=["default", "reports"]) == []
    config, problems = parse_options(options, environ={})
    assert problems == []
    assert config.queue_result_ttl == {"reports": 86400.0, "default": 7200.0}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"QUEUE_RESULT_TTL": {"default": 0}}, "QUEUE_RESULT_TTL['default'] must be more than 0"),
        ({"QUEUE_RESULT_TTL": {"default": -60}}, "must be more than 0 seconds, got -60"),
        ({"QUEUE_RESULT_TTL": {"default": "1d"}}, "must be a number of seconds or a"),
        ({"QUEUE_RESULT_TTL": {"": 60}}, "keys must be queue names"),
        ({"QUEUE_RESULT_TTL": [60]}, "must be a dict of queue name -> duration"),
    ],
    ids=repr,
)
def test_a_bad_queue_result_ttl_is_a_check_error(options: dict[str, Any], message: str) -> None:
    messages = leasejobs_messages(options)
    assert [str(m.id) for m in messages] == [E_BAD_QUEUE_RESULT_TTL]
    assert message in messages[0].msg
    assert messages[0].level >= 40
    config, _ = parse_options(options, environ={})
    assert config.queue_result_ttl == {}  # a bad entry keeps nothing


def test_a_result_ttl_for_a_queue_the_backend_does_not_serve_is_a_check_error() -> None:
    messages = leasejobs_messages({"QUEUE_RESULT_TTL": {"reprots": 60}}, QUEUES=["reports"])
    assert [str(m.id) for m in messages] == [E_UNKNOWN_LIMITED_QUEUE]
    assert "'reprots'" in messages[0].msg
    assert "remove its retention" in messages[0].hint


@pytest.mark.django_db
def test_a_bad_queue_result_ttl_refuses_to_enqueue() -> None:
    entry = {
        "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
        "OPTIONS": {"QUEUE_RESULT_TTL": {"default": -1}},
    }
    with (
        override_settings(TASKS={"default": entry}),
        pytest.raises(ImproperlyConfigured, match=r"\[leasejobs.E023\]"),
    ):
        add.enqueue(1, 2)
    assert not Job.objects.exists()
