"""Validation at the door: every bad ``enqueue()`` input raises the documented error,
names its place, and stores nothing.

Arguments (and results and checkpoints) that cannot be stored raise
``InvalidTaskArguments`` (an ``InvalidTask`` and a ``TypeError``); a bad ``priority``,
``run_after``, ``queue_name`` or ``key`` raises ``InvalidTask`` where Django validates a
task: when it is declared or copied with ``.using()`` (and again at enqueue).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.compat import InvalidTask, task_backends
from django_leasejobs.compat import task as django_decorator
from django_leasejobs.exceptions import InvalidTaskArguments
from django_leasejobs.lease_task import task as leasejobs_task
from django_leasejobs.models import Job
from django_leasejobs.serialization import MAX_DEPTH, MAX_INT_DIGITS, depth_limits, json_value
from tests import tasks
from tests.tasks import add, configured

pytestmark = pytest.mark.django_db


def backend() -> LeaseJobsBackend:
    found = task_backends["default"]
    assert isinstance(found, LeaseJobsBackend)
    return found


def nested(levels: int) -> list[Any]:
    """``levels`` lists nested inside each other: nested(3) == [[[]]]."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def circular_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"name": "loop"}
    value["self"] = value
    return value


def circular_list() -> list[Any]:
    inner: list[Any] = [1]
    outer: list[Any] = [0, {"items": inner}]
    inner.append(outer)
    return outer


# --------------------------------------------------------------------------- arguments


def argument_depth() -> int:
    """How deep one argument may nest in this run's database (MariaDB and MySQL store
    fewer levels than MAX_DEPTH)."""
    return depth_limits("default").argument


# (args, kwargs, the place the message must start with, a word it must contain), or a
# function returning them (when they depend on the database: called inside the test)
BadArguments = tuple[list[Any], dict[str, Any], str, str]
BAD_ARGUMENTS: dict[str, BadArguments | Callable[[], BadArguments]] = {
    "circular dict": ([circular_dict()], {}, "args[0]['self']", "circular"),
    "circular list": ([1, circular_list()], {}, "args[1][1]['items'][1]", "circular"),
    "circular kwarg": ([], {"when": [1, 2, circular_dict()]}, "kwargs['when'][2]", "circular"),
    "5000 deep": lambda: (
        [nested(5000)],
        {},
        "args[0][0][0]",
        f"deeper than {argument_depth()} levels",
    ),
    "one level too deep": lambda: (
        [],
        {"tree": nested(argument_depth() + 1)},
        "kwargs['tree']",
        f"deeper than {argument_depth()} levels",
    ),
    "one level too deep in a dict": lambda: (
        [{"k": nested(argument_depth())}],
        {},
        "args[0]['k']",
        "deeper",
    ),
    "NUL": (["a\x00b"], {}, "args[0]", "NUL"),
    "NUL nested": ([], {"when": [1, 2, 3, "\x00"]}, "kwargs['when'][3]", "NUL"),
    "NUL in a key": ([{"ok": 1, "k\x00": 2}], {}, "args[0]", "key 'k\\x00'"),
    "NUL in a kwarg name": ([], {"a\x00": 1}, "kwargs", "NUL"),
    "lone surrogate": ([1, "\ud800"], {}, "args[1]", "surrogate (U+D800)"),
    "surrogate pair as code points": (["\ud83d\ude00"], {}, "args[0]", "surrogate"),
    "lone surrogate in a key": ([{"x": {"\udfff": 1}}], {}, "args[0]['x']", "surrogate"),
    "lone surrogate in a kwarg name": ([], {"\udc80": 1}, "kwargs", "surrogate"),
    "huge int": ([10**MAX_INT_DIGITS], {}, "args[0]", f"more than {MAX_INT_DIGITS} digits"),
    "huge negative int": ([], {"n": [-(10**5000)]}, "kwargs['n'][0]", "digits"),
    "not JSON": ([{"a": [1, {"b": object()}]}], {}, "args[0]['a'][1]['b']", "not JSON"),
}


def bad_arguments(case: str) -> BadArguments:
    found = BAD_ARGUMENTS[case]
    return found() if callable(found) else found


def _enqueue(args: list[Any], kwargs: dict[str, Any]) -> Any:
    return add.enqueue(*args, **kwargs)


def _enqueue_keyed(args: list[Any], kwargs: dict[str, Any]) -> Any:
    return add.using(key="keyed").enqueue(*args, **kwargs)  # the ORM insert path


def _aenqueue(args: list[Any], kwargs: dict[str, Any]) -> Any:
    return async_to_sync(add.aenqueue)(*args, **kwargs)


ENQUEUES: dict[str, Callable[[list[Any], dict[str, Any]], Any]] = {
    "enqueue": _enqueue,
    "enqueue with key": _enqueue_keyed,
    "aenqueue": _aenqueue,
}


@pytest.mark.parametrize("how", ENQUEUES)
@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_arguments_raise_invalid_task_arguments_naming_the_place(
    case: str, how: str, nothing_stored: None
) -> None:
    args, kwargs, place, needle = bad_arguments(case)
    with pytest.raises(InvalidTaskArguments) as excinfo:
        ENQUEUES[how](args, kwargs)
    message = str(excinfo.value)
    assert isinstance(excinfo.value, InvalidTask)
    assert isinstance(excinfo.value, TypeError)
    assert message.startswith(place), message
    assert needle in message, message


def test_circular_reference_names_both_places() -> None:
    with pytest.raises(InvalidTaskArguments) as excinfo:
        add.enqueue(circular_dict())
    assert str(excinfo.value).startswith("args[0]['self'] is args[0] itself (a circular ")


def test_too_deep_message_shortens_the_path() -> None:
    with pytest.raises(InvalidTaskArguments) as excinfo:
        add.enqueue(nested(5000))
    message = str(excinfo.value)
    assert message.startswith("args[0][0][0][0][0][0]...[0][0][0][0] is nested deeper than")
    assert len(message) < 300


def test_nul_and_surrogate_messages_say_why() -> None:
    with pytest.raises(InvalidTaskArguments, match="PostgreSQL cannot store in text or jsonb"):
        add.enqueue("\x00", 1)
    with pytest.raises(InvalidTaskArguments, match="cannot be encoded as UTF-8"):
        add.enqueue("fine", "caf\udce9")


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bulk_enqueue_with_one_bad_call_stores_nothing(case: str, nothing_stored: None) -> None:
    args, kwargs, place, needle = bad_arguments(case)
    calls = [
        (add, [1, 2], {}),
        (add, args, kwargs),
        (configured.using(priority=5), [], {"x": "good"}),
    ]
    with pytest.raises(InvalidTaskArguments) as excinfo:
        backend().bulk_enqueue(calls)
    message = str(excinfo.value)
    assert message.startswith(f"calls[1]: {place}"), message
    assert needle in message, message


def test_bulk_enqueue_with_a_bad_keyed_call_stores_nothing(nothing_stored: None) -> None:
    keyed = add.using(key="bulk-key")
    calls = [(keyed, [1, 2], {}), (add, [3, 4], {}), (keyed, ["\x00"], {})]
    with pytest.raises(InvalidTaskArguments, match=r"^calls\[2\]: args\[0\] contains a NUL"):
        backend().bulk_enqueue(calls)


@pytest.mark.parametrize(
    "call",
    [(add, [1, 2]), (add, [1], {}, "extra"), "add", None],
    ids=["pair", "four", "str", "none"],
)
def test_bulk_enqueue_refuses_a_call_that_is_not_a_triple(call: Any, nothing_stored: None) -> None:
    with pytest.raises(InvalidTaskArguments, match=r"^calls\[1\] must be a \(task, args, kwargs\)"):
        backend().bulk_enqueue([(add, [1, 2], {}), call])


def test_bulk_enqueue_refuses_something_that_is_not_a_task(nothing_stored: None) -> None:
    with pytest.raises(InvalidTask, match=r"^calls\[0\]: .* is not a task"):
        backend().bulk_enqueue([(tasks.not_a_task, [], {}), (add, [1, 2], {})])


def test_args_and_kwargs_of_the_wrong_type(nothing_stored: None) -> None:
    with pytest.raises(InvalidTaskArguments, match=r"^args must be a list or tuple"):
        backend().enqueue(add, "12", {})  # type: ignore[arg-type]
    with pytest.raises(InvalidTaskArguments, match=r"^kwargs must be a dict"):
        backend().enqueue(add, [1, 2], [("b", 2)])  # type: ignore[arg-type]
    with pytest.raises(InvalidTaskArguments, match=r"^kwargs has a key 1 of type int"):
        backend().enqueue(add, [], {1: 2})


# --------------------------------------------------------------------------- accepted


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 3


def test_values_at_the_limits_are_stored_and_read_back() -> None:
    depth = argument_depth()  # MAX_DEPTH where the database stores that many levels
    shared = [1, 2]
    args = [
        nested(depth),
        10 ** (MAX_INT_DIGITS - 1),
        -(10**MAX_INT_DIGITS - 1),
        "ü€😀 \ufffd \x01\x1f\u2028",
        {"both": shared, "again": shared},  # the same list twice is not a cycle
        {Colour.RED: Colour.RED, "size": Size.BIG},
    ]
    result = add.enqueue(*args, deep={"d": nested(depth - 1)})
    stored = Job.objects.get(pk=int(result.id))
    assert stored.args == [
        nested(depth),
        10 ** (MAX_INT_DIGITS - 1),
        -(10**MAX_INT_DIGITS - 1),
        "ü€😀 \ufffd \x01\x1f\u2028",
        {"both": [1, 2], "again": [1, 2]},
        {"red": "red", "size": 3},
    ]
    assert stored.kwargs == {"deep": {"d": nested(depth - 1)}}
    fetched = backend().get_result(result.id)
    assert fetched.args == stored.args


def test_the_depth_limits_are_ours_or_exactly_the_databases() -> None:
    limits = depth_limits("default")
    if connection.vendor != "mysql":
        assert limits == (MAX_DEPTH, MAX_DEPTH, "")
        return
    mariadb = connection.mysql_is_mariadb  # type: ignore[attr-defined]
    assert limits.refused_by == ("MariaDB" if mariadb else "MySQL")
    # An argument and a result as deep as allowed are stored and read back...
    job = Job.objects.create(task_path="tests.tasks.add", args=[nested(limits.argument)])
    Job.objects.filter(pk=job.pk).update(result=nested(limits.value))
    job.refresh_from_db()
    assert (job.args, job.result) == ([nested(limits.argument)], nested(limits.value))
    # ... and one level more, written past the validation, is refused by the database:
    # the limits are the database's own, not stricter.
    with pytest.raises(DatabaseError), transaction.atomic():
        Job.objects.create(task_path="tests.tasks.add", args=[nested(limits.argument + 1)])
    with pytest.raises(DatabaseError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(checkpoint=nested(limits.value + 1))


def test_the_depth_message_names_the_database_that_cannot_store_more(
    nothing_stored: None,
) -> None:
    limits = depth_limits("default")
    with pytest.raises(InvalidTaskArguments) as excinfo:
        add.enqueue(nested(limits.argument + 1))
    why = f"which {limits.refused_by} cannot store" if limits.refused_by else "which is refused"
    assert f"is nested deeper than {limits.argument} levels of lists and dicts, {why};" in str(
        excinfo.value
    )


def test_bulk_enqueue_of_good_calls_still_works() -> None:
    results = backend().bulk_enqueue(
        [(add, [1, 2], {}), (add.using(key="good"), [3, 4], {}), (add, ["ü"], {"b": 1})]
    )
    assert len(results) == 3
    assert Job.objects.count() == 3


# --------------------------------------------------------------------------- results, checkpoints


@pytest.mark.parametrize(
    ("value", "place"),
    [
        ({"a": "\x00"}, "the task's return value['a']"),
        (["\ud800"], "the task's return value[0]"),
        (circular_dict(), "the task's return value['self']"),
        (nested(MAX_DEPTH + 1), "the task's return value[0]"),
        (10**MAX_INT_DIGITS, "the task's return value"),
    ],
    ids=["nul", "surrogate", "circular", "deep", "int"],
)
def test_results_and_checkpoints_are_checked_the_same_way(value: Any, place: str) -> None:
    with pytest.raises(InvalidTaskArguments) as excinfo:
        json_value(value, "the task's return value")
    assert str(excinfo.value).startswith(place)
    with pytest.raises(InvalidTaskArguments) as excinfo:
        json_value(value, "checkpoint")
    assert str(excinfo.value).startswith(place.replace("the task's return value", "checkpoint"))


def test_results_and_checkpoints_are_checked_against_the_database() -> None:
    limit = depth_limits("default").value
    assert json_value(nested(limit), "checkpoint", using="default") == nested(limit)
    with pytest.raises(InvalidTaskArguments, match=rf"^checkpoint\[0\].* deeper than {limit} "):
        json_value(nested(limit + 1), "checkpoint", using="default")
    # Without a database, our own limit.
    assert json_value(nested(MAX_DEPTH), "checkpoint") == nested(MAX_DEPTH)


# --------------------------------------------------------------------------- priority

BAD_PRIORITIES = ["high", True, 1.5, float("nan"), float("inf"), 101, -101, [1], Decimal(5)]


@pytest.mark.parametrize("priority", BAD_PRIORITIES, ids=repr)
def test_bad_priority_is_refused_by_using(priority: Any, nothing_stored: None) -> None:
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        add.using(priority=priority).enqueue(1, 2)


@pytest.mark.parametrize("priority", [*BAD_PRIORITIES, None], ids=repr)
@pytest.mark.parametrize("decorator", [leasejobs_task, django_decorator], ids=["ours", "django"])
def test_bad_priority_is_refused_when_declared(
    priority: Any, decorator: Any, nothing_stored: None
) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        decorator(priority=priority)(tasks.not_a_task)


def test_bad_priority_slipped_past_using_is_refused_at_enqueue(nothing_stored: None) -> None:
    sneaky = add.using(priority=1)
    object.__setattr__(sneaky, "priority", "high")  # as if built without validation
    for call in (
        lambda: sneaky.enqueue(1, 2),
        lambda: backend().bulk_enqueue([(sneaky, [1, 2], {})]),
    ):
        with pytest.raises(InvalidTask, match="priority"):
            call()


def test_whole_float_priority_is_accepted_as_django_does() -> None:
    result = add.using(priority=7.0).enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).priority == 7


# --------------------------------------------------------------------------- run_after

LATER = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("run_after", "needle"),
    [
        ("tomorrow", "run_after must be a datetime.datetime"),
        (date(2030, 1, 1), "run_after must be a datetime.datetime"),
        (1893456000, "run_after must be a datetime.datetime"),
        (datetime(2030, 1, 1, 12, 0), "run_after must be an aware datetime"),
        (datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))), "out of range"),
        (datetime.min.replace(tzinfo=timezone(timedelta(hours=5))), "out of range"),
    ],
    ids=["str", "date", "int", "naive", "past-year-9999", "before-year-1"],
)
def test_bad_run_after_is_refused(run_after: Any, needle: str, nothing_stored: None) -> None:
    with pytest.raises(InvalidTask, match=needle):
        add.using(run_after=run_after).enqueue(1, 2)


def test_aware_run_after_in_any_zone_is_accepted() -> None:
    zoned = LATER.astimezone(timezone(timedelta(hours=-5)))
    result = add.using(run_after=zoned).enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).run_after == LATER


@pytest.mark.django_db(transaction=True)
def test_without_use_tz_an_aware_run_after_is_stored_as_local_time() -> None:
    # Django stores naive local times when USE_TZ is off; SQLite and MySQL refuse an
    # aware datetime then, so enqueue converts it to the current time zone first.
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        naive = add.using(run_after=datetime(2030, 1, 1, 13, 0)).enqueue(1, 2)
        aware = add.using(run_after=LATER.astimezone(timezone(timedelta(hours=-5)))).enqueue(3)
        stored = dict(Job.objects.values_list("pk", "run_after"))
    assert stored[int(naive.id)] == datetime(2030, 1, 1, 13, 0)  # 12:00 UTC in Paris
    assert stored[int(aware.id)] == datetime(2030, 1, 1, 13, 0)


# --------------------------------------------------------------------------- queue, key, backend


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"queue_name": ["default"]}, "queue_name must be a string"),
        ({"queue_name": "nope"}, "Queue 'nope' is not valid"),
        ({"key": "a\x00b"}, "key 'a\\\\x00b' contains a NUL"),
        ({"key": "a\ud800"}, "surrogate"),
    ],
    ids=["queue-list", "queue-unknown", "key-nul", "key-surrogate"],
)
def test_bad_queue_and_key_are_refused(
    changes: dict[str, Any], needle: str, nothing_stored: None
) -> None:
    with pytest.raises(InvalidTask, match=needle):
        add.using(**changes).enqueue(1, 2)


def test_backend_that_is_not_an_alias_is_refused(nothing_stored: None) -> None:
    with pytest.raises(InvalidTask, match="backend must be a TASKS alias"):
        leasejobs_task(backend=["default"])(tasks.not_a_task)  # type: ignore[arg-type]
