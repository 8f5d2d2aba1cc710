"""Flow-control options at the door: task options, ``using()``, the concurrency key's
callable, the stored columns, and the system checks of QUEUE_LIMITS / QUEUE_RATE_LIMITS."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_leasejobs import task
from django_leasejobs.compat import InvalidTask
from django_leasejobs.conf import (
    E_BAD_QUEUE_LIMIT,
    E_BAD_RATE_LIMIT,
    E_UNKNOWN_LIMITED_QUEUE,
    parse_options,
)
from django_leasejobs.limits import FlowRules, Rate, parse_rate, rate_problem
from django_leasejobs.models import Job
from tests import tasks_flow

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"


def stored(result: Any) -> Job:
    return Job.objects.get(pk=int(result.id))


# --------------------------------------------------------------------------- stored columns


@pytest.mark.django_db
def test_a_task_limit_is_stored_as_the_tasks_group() -> None:
    job = stored(tasks_flow.two_at_a_time.enqueue(1))
    assert (job.flow_group, job.concurrency_limit, job.rate_limit) == (
        "task:tests.tasks_flow.two_at_a_time",
        2,
        None,
    )
    assert job.concurrency_key is None


@pytest.mark.django_db
def test_a_callable_key_is_called_with_the_jobs_arguments_and_defaults_to_one() -> None:
    job = stored(tasks_flow.import_customer.enqueue(7, source="csv"))
    assert (job.flow_group, job.concurrency_limit) == ("key:customer-7", 1)
    assert job.concurrency_key == "customer-7"


@pytest.mark.django_db
def test_using_sets_a_key_and_a_limit_for_one_enqueue() -> None:
    job = stored(tasks_flow.plain.using(concurrency_key="acme").enqueue(1))
    assert (job.flow_group, job.concurrency_limit) == ("key:acme", 1)
    job = stored(tasks_flow.plain.using(concurrency_key="acme", concurrency_limit=3).enqueue(1))
    assert (job.flow_group, job.concurrency_limit) == ("key:acme", 3)
    job = stored(tasks_flow.shared_key.enqueue(1))
    assert (job.flow_group, job.concurrency_limit) == ("key:shared", 3)
    assert stored(tasks_flow.plain.enqueue(1)).flow_group is None


@pytest.mark.django_db
def test_a_rate_is_stored_normalised_under_the_tasks_group() -> None:
    job = stored(tasks_flow.rated.enqueue(1))
    assert (job.flow_group, job.concurrency_limit, job.rate_limit) == (
        "task:tests.tasks_flow.rated",
        None,
        "50/m",
    )


@pytest.mark.django_db(transaction=True)
def test_bulk_enqueue_resolves_each_calls_key() -> None:
    backend = tasks_flow.import_customer.get_backend()
    results = backend.bulk_enqueue(
        [(tasks_flow.import_customer, [n], {}) for n in (1, 2)] + [(tasks_flow.plain, [3], {})]
    )
    groups = [stored(r).flow_group for r in results]
    assert groups == ["key:customer-1", "key:customer-2", None]


@pytest.mark.django_db
def test_get_result_of_a_limited_job_works() -> None:
    result = tasks_flow.import_customer.enqueue(3)
    again = tasks_flow.import_customer.get_backend().get_result(result.id)
    assert again.args == [3]
    assert again.task.concurrency_key is tasks_flow.import_customer.concurrency_key


# --------------------------------------------------------------------------- refused at the door


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_limit": 0}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_limit": True}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_limit": "2"}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_key": ""}, "concurrency_key must be a non-empty string"),
        ({"concurrency_key": "x" * 256}, "concurrency_key must be a non-empty string"),
        ({"concurrency_key": 5}, "concurrency_key must be a non-empty string"),
        ({"concurrency_key": "a\x00b"}, "NUL"),
        ({"concurrency_key": "a\udcffb"}, "lone surrogate"),
        ({"rate_limit": "50/min"}, 'rate_limit must look like "50/m"'),
        ({"rate_limit": "0/m"}, "rate_limit must allow between 1"),
        ({"rate_limit": 50}, "rate_limit must be a string"),
    ],
    ids=repr,
)
@pytest.mark.django_db
def test_bad_values_raise_invalid_task_and_store_nothing(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTask, match=message.replace("(", r"\(")):
        tasks_flow.plain.using(**options).enqueue(1)
    with pytest.raises(InvalidTask, match=message.replace("(", r"\(")):
        task(**options)(lambda x: x)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (tasks_flow.key_raises, "concurrency_key of tests.tasks_flow.key_raises failed"),
        (tasks_flow.key_not_a_string, "must be a non-empty string"),
    ],
)
@pytest.mark.django_db
def test_a_key_callable_that_fails_or_gives_no_key_refuses_the_enqueue(
    declared: Any, message: str
) -> None:
    with pytest.raises(InvalidTask, match=message):
        declared.enqueue(1)
    backend = declared.get_backend()
    with pytest.raises(InvalidTask, match=message):
        backend.bulk_enqueue([(tasks_flow.plain, [1], {}), (declared, [2], {})])
    assert not Job.objects.exists()


# --------------------------------------------------------------------------- rates


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("1/s", Rate(1, 1.0, "1/s")),
        ("50/m", Rate(50, 60.0, "50/m")),
        (" 7/h", Rate(7, 3600.0, "7/h")),
    ],
)
def test_rates_parse(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize(
    "text", ["", "5", "5/d", "-1/s", "1.5/m", "5 / m", "1/s/s", "0/s", "2000000/s"]
)
def test_malformed_rates_are_refused(text: str) -> None:
    assert rate_problem(text)
    with pytest.raises(ValueError, match="rate_limit"):
        parse_rate(text)


# --------------------------------------------------------------------------- system checks


def leasejobs_messages(options: Any, **extra: Any) -> list[Any]:
    tasks = {"default": {"BACKEND": BACKEND, "OPTIONS": options, **extra}}
    with override_settings(TASKS=tasks):
        return [m for m in run_checks() if str(m.id).startswith("leasejobs.")]


def test_good_queue_limits_and_rates_are_read_and_silent() -> None:
    options = {"QUEUE_LIMITS": {"imports": 4}, "QUEUE_RATE_LIMITS": {"emails": "100/m"}}
    assert leasejobs_messages(options, QUEUES=["default", "imports", "emails"]) == []
    config, problems = parse_options(options, environ={})
    assert problems == []
    assert config.flow == FlowRules(
        queue_limits={"imports": 4}, queue_rates={"emails": parse_rate("100/m")}
    )


@pytest.mark.parametrize(
    ("options", "check_id"),
    [
        ({"QUEUE_LIMITS": {"imports": 0}}, E_BAD_QUEUE_LIMIT),
        ({"QUEUE_LIMITS": {"imports": 2.5}}, E_BAD_QUEUE_LIMIT),
        ({"QUEUE_LIMITS": {"imports": "4"}}, E_BAD_QUEUE_LIMIT),
        ({"QUEUE_LIMITS": {"": 4}}, E_BAD_QUEUE_LIMIT),
        ({"QUEUE_LIMITS": ["imports"]}, E_BAD_QUEUE_LIMIT),
        ({"QUEUE_RATE_LIMITS": {"emails": "100/min"}}, E_BAD_RATE_LIMIT),
        ({"QUEUE_RATE_LIMITS": {"emails": 100}}, E_BAD_RATE_LIMIT),
        ({"QUEUE_RATE_LIMITS": "100/m"}, E_BAD_RATE_LIMIT),
    ],
    ids=repr,
)
def test_a_bad_limit_or_rate_is_a_check_error(options: dict[str, Any], check_id: str) -> None:
    messages = leasejobs_messages(options)
    assert [str(m.id) for m in messages] == [check_id]
    assert messages[0].level >= 40  # an Error: the worker refuses to start
    config, _ = parse_options(options, environ={})
    assert config.flow == FlowRules()  # a bad entry limits nothing


def test_a_limit_on_a_queue_the_backend_does_not_serve_is_a_check_error() -> None:
    options = {"QUEUE_LIMITS": {"imprts": 4}, "QUEUE_RATE_LIMITS": {"emails": "1/s"}}
    messages = leasejobs_messages(options, QUEUES=["default", "imports"])
    assert [str(m.id) for m in messages] == [E_UNKNOWN_LIMITED_QUEUE] * 2
    assert "'imprts'" in messages[0].msg
    # Without QUEUES Django serves its default queue alone; an empty list serves every queue.
    assert [str(m.id) for m in leasejobs_messages(options)] == [E_UNKNOWN_LIMITED_QUEUE] * 2
    assert leasejobs_messages(options, QUEUES=[]) == []


def test_check_ids_are_stable() -> None:
    assert (E_BAD_QUEUE_LIMIT, E_UNKNOWN_LIMITED_QUEUE, E_BAD_RATE_LIMIT) == (
        "leasejobs.E020",
        "leasejobs.E021",
        "leasejobs.E022",
    )


# --------------------------------------------------------------------------- a paused queue


@pytest.mark.django_db(transaction=True)
def test_a_paused_queue_still_takes_enqueues_and_schedule_ticks() -> None:
    from datetime import UTC, datetime, timedelta

    from django_leasejobs import queues
    from django_leasejobs.schedules.scheduler import lease_backend, run_pass

    schedules = {"s": {"task": "tests.tasks_flow.plain", "every": 60, "args": [1]}}
    tasks = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "high", "low"],
            "OPTIONS": {"SCHEDULES": schedules},
        }
    }
    t0 = datetime(2026, 1, 1, 10, 0, 0, 500_000, tzinfo=UTC)
    with override_settings(TASKS=tasks):
        assert queues.pause("default") is True
        enqueued = stored(tasks_flow.plain.enqueue(5))
        run_pass(lease_backend("default"), now=t0)
        (tick,) = run_pass(lease_backend("default"), now=t0 + timedelta(seconds=60)).enqueued
        assert Job.objects.get(pk=tick.job_id).status == "pending"
        assert enqueued.status == "pending"
        assert queues.is_paused("default") is True
