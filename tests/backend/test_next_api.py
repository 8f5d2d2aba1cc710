"""The spellings of Django's coming task API (django/new-features #141, #142, #144, #161,
#181), accepted today: ``@task(backoff=...)`` with ``backoff(exception, task_result)``,
``TaskTimeout`` (a ``TimeoutError``), ``enqueue_on_commit()``, ``run_after`` as a
``timedelta``; and the old spellings still working, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from django_leasejobs import exceptions, task
from django_leasejobs.compat import InvalidTask, TaskResultStatus
from django_leasejobs.models import Job
from django_leasejobs.retry import Backoff
from django_leasejobs.testing import run_jobs
from tests import tasks_next_api
from tests.helpers_leases import seconds_from_db_now

pytestmark = pytest.mark.django_db(transaction=True)

SLACK = 5.0


def test_a_backoff_function_gets_the_exception_and_the_failed_result() -> None:
    tasks_next_api.SEEN.clear()
    result = tasks_next_api.call_api.enqueue(wait=42)

    [run] = run_jobs()

    assert (run.status, run.outcome) == ("pending", "error")
    assert run.retry_delay == 42
    [(exception, task_result)] = tasks_next_api.SEEN
    assert isinstance(exception, tasks_next_api.RateLimited) and exception.wait == 42
    assert task_result.id == result.id and task_result.status == TaskResultStatus.FAILED
    assert task_result.errors[-1].exception_class_path.endswith("RateLimited")
    job = Job.objects.get(pk=result.id)
    assert abs(seconds_from_db_now(job.run_after) - 42) < SLACK


def test_a_backoff_function_returning_none_fails_the_job() -> None:
    tasks_next_api.call_api.enqueue(wait=0)
    [run] = run_jobs()
    assert run.status == "failed"
    assert run.decision == "not retried: backoff returned None"


def test_a_backoff_dict_is_a_policy() -> None:
    assert tasks_next_api.fixed_backoff.backoff == Backoff(base=5, factor=1, cap=5, jitter=0)
    tasks_next_api.fixed_backoff.enqueue()
    [run] = run_jobs()
    assert (run.status, run.retry_delay) == ("pending", 5)


def test_retry_backoff_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"retry_backoff=\.\.\.\) is deprecated"):
        old_spelling = task(retry_backoff={"base": 1, "factor": 1, "cap": 1, "jitter": 0})(
            tasks_next_api.undecorated
        )
    assert old_spelling.retry_backoff == Backoff(base=1, factor=1, cap=1, jitter=0)
    with pytest.raises(InvalidTask, match="give backoff= only"):
        task(backoff={"base": 1}, retry_backoff={"base": 2})(tasks_next_api.undecorated)


@pytest.mark.parametrize("option", ["timeout", "retry_backoff", "max_attempts"])
def test_timeout_max_attempts_and_backoff_in_using_are_deprecated(option: str) -> None:
    value = {"base": 1, "factor": 1, "cap": 1, "jitter": 0} if option == "retry_backoff" else 5
    with pytest.warns(DeprecationWarning, match=rf"using\({option}=\.\.\.\) is deprecated"):
        changed = tasks_next_api.noop.using(**{option: value})
    assert getattr(changed, option) in (5, Backoff(base=1, factor=1, cap=1, jitter=0))


def test_task_timeout_is_a_timeout_error_and_job_timeout_its_deprecated_name() -> None:
    assert issubclass(exceptions.TaskTimeout, TimeoutError)
    with pytest.warns(DeprecationWarning, match="JobTimeout is deprecated: use TaskTimeout"):
        old = exceptions.JobTimeout
    assert old is exceptions.TaskTimeout


def test_run_after_may_be_a_timedelta_on_the_database_clock() -> None:
    result = tasks_next_api.noop.using(run_after=timedelta(minutes=5)).enqueue(1)
    job = Job.objects.get(pk=result.id)
    assert abs(seconds_from_db_now(job.run_after) - 300) < SLACK
    assert run_jobs() == []  # not due yet
    with pytest.raises(InvalidTask, match="timedelta >= 0"):
        tasks_next_api.noop.using(run_after=timedelta(seconds=-1))


def test_enqueue_on_commit_waits_for_the_commit_and_never_enqueues_on_rollback() -> None:
    with transaction.atomic():
        assert tasks_next_api.noop.enqueue_on_commit(1) is None
        assert not Job.objects.exists()  # not before the commit
    assert list(Job.objects.values_list("args", flat=True)) == [[1]]

    with pytest.raises(RuntimeError), transaction.atomic():
        tasks_next_api.noop.enqueue_on_commit(2)
        raise RuntimeError("rolled back")
    assert Job.objects.count() == 1

    tasks_next_api.noop.enqueue_on_commit(3)  # no transaction: at once
    assert Job.objects.count() == 2


def test_the_new_spellings_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        new_spelling = task(timeout=30, backoff=tasks_next_api.wait_as_told)(
            tasks_next_api.undecorated
        )
        new_spelling.using(run_after=timedelta(seconds=1), priority=3)


# -- metadata (django/new-features#141) ----------------------------------------------------


def test_metadata_is_stored_at_enqueue_and_read_from_every_result() -> None:
    from django_leasejobs.compat import task_backends

    assert task_backends["default"].supports_metadata is True
    result = tasks_next_api.noop.using(metadata={"trace_id": 123}).enqueue(1)
    assert result.metadata == {"trace_id": 123}
    assert Job.objects.get(pk=result.id).metadata == {"trace_id": 123}
    assert tasks_next_api.noop.get_result(result.id).metadata == {"trace_id": 123}
    assert tasks_next_api.noop.enqueue(2).metadata == {}  # none: an empty dict


@pytest.mark.parametrize(
    ("metadata", "needle"),
    [([1, 2], "metadata must be a dict"), ({1: "x"}, "metadata must be a dict with string keys")],
)
def test_metadata_that_is_not_a_json_object_is_refused(metadata: object, needle: str) -> None:
    with pytest.raises(InvalidTask, match=needle):
        tasks_next_api.noop.using(metadata=metadata)


def test_metadata_that_is_not_json_is_refused_at_enqueue() -> None:
    with pytest.raises(exceptions.InvalidTaskArguments, match="metadata"):
        tasks_next_api.noop.using(metadata={"when": object()}).enqueue()
    assert not Job.objects.exists()


def test_the_task_changes_its_metadata_and_it_is_saved_when_the_attempt_ends() -> None:
    result = tasks_next_api.count_runs.using(metadata={"source": "test"}).enqueue(fail_first=True)
    first, second = run_jobs(include_scheduled=True)
    assert (first.status, second.status) == ("pending", "succeeded")
    assert second.result == 2  # the failed attempt's change was kept
    done = tasks_next_api.count_runs.get_result(result.id)
    assert done.metadata == {"source": "test", "runs": 2}


def test_refresh_reloads_the_metadata_with_the_rest_in_one_lookup(
    django_assert_max_num_queries: Any,
) -> None:
    result = tasks_next_api.count_runs.using(metadata={"source": "test"}).enqueue()
    run_jobs()
    with django_assert_max_num_queries(2):  # get_result's: the job row, its attempts
        result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 1
    assert result.metadata == {"source": "test", "runs": 1}


def test_save_metadata_stores_it_during_the_run() -> None:
    result = tasks_next_api.save_midway.enqueue()
    [run] = run_jobs()
    assert run.result == {"step": "saved"}
    assert tasks_next_api.save_midway.get_result(result.id).metadata == {"step": "done"}


def test_metadata_not_json_at_the_attempts_end_is_left_as_stored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The attempt's outcome stands (the job succeeds); the stored metadata stays as it
    was, and a WARNING on the package's logger says which job and why."""
    result = tasks_next_api.unstorable_metadata.using(metadata={"tenant": "acme"}).enqueue()
    with caplog.at_level("WARNING", logger="django_leasejobs"):
        [run] = run_jobs()
    assert (run.status, run.result) == ("succeeded", "done")
    assert tasks_next_api.unstorable_metadata.get_result(result.id).metadata == {"tenant": "acme"}
    [record] = [r for r in caplog.records if "metadata" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert record.job_id == int(result.id)  # type: ignore[attr-defined]
    assert "not saved at the attempt's end" in record.getMessage()
