"""Finding jobs by what they carry (issue 31, point 1): the search syntax
(django_leasejobs/job_search.py) on every database, through the admin's job list, with an
exact count; on PostgreSQL the GIN indexes answer the containment test.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.db import connection, transaction
from django.test import Client

from django_leasejobs.job_search import (
    ArgumentTerm,
    JobSearch,
    SearchSyntaxError,
    apply_search,
    parse_search,
)
from django_leasejobs.models import Job
from tests.tasks import add, carry

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/django_leasejobs/job/"


# --------------------------------------------------------------------------- syntax


def test_parse_every_kind_of_word() -> None:
    search = parse_search('kwargs.customer_id:4711 args.0:"x" #12 34 sync_invoices')
    assert search == JobSearch(
        arguments=(
            ArgumentTerm("kwargs", ("customer_id",), (4711, "4711")),
            ArgumentTerm("args", (0,), ("x",)),
        ),
        ids=(12, 34),
        words=("sync_invoices",),
    )


@pytest.mark.parametrize(
    ("word", "values"),
    [
        ("kwargs.a:true", (True,)),
        ("kwargs.a:null", (None,)),
        ("kwargs.a:1.5", (1.5, "1.5")),
        ('kwargs.a:"4711"', ("4711",)),
        ("kwargs.a:plain-text", ("plain-text",)),
        ("kwargs.a:[1]", ("[1]",)),  # not a scalar: only the text
        ("kwargs.a:b:c", ("b:c",)),  # the first colon after the path ends it
        ("kwargs.a:NaN", ("NaN",)),  # not a JSON number: text
        ("kwargs.a:1e400", ("1e400",)),
        ("kwargs.a:" + "9" * 30, ("9" * 30,)),  # past 64 bits: text
    ],
)
def test_values_are_read_as_json_else_text(word: str, values: tuple[Any, ...]) -> None:
    [term] = parse_search(word).arguments
    assert term.values == values


def test_nested_paths_mix_keys_and_positions() -> None:
    [term] = parse_search("kwargs.order.lines.0.sku:A-1").arguments
    assert (term.field, term.path) == ("kwargs", ("order", "lines", 0, "sku"))


@pytest.mark.parametrize(
    ("word", "needle"),
    [
        ("kwargs.customer_id", "write a path and a value"),
        ("kwargs:4711", "write a path and a value"),
        ("kwargs..a:1", "write a path and a value"),
        ("args.first:1", "starts with a position"),
        ("kwargs.a:", "no value after the colon"),
    ],
)
def test_a_malformed_argument_search_says_how_to_write_it(word: str, needle: str) -> None:
    with pytest.raises(SearchSyntaxError, match=needle):
        parse_search(word)


# --------------------------------------------------------------------------- matching


@pytest.fixture
def carried() -> dict[str, int]:
    """Jobs whose arguments differ in the ways a search must tell apart."""
    jobs = {
        "number": carry.enqueue(customer_id=4711),
        "text": carry.enqueue(customer_id="4711"),
        "other_number": carry.enqueue(customer_id=47110),
        "nested_elsewhere": carry.enqueue(parent={"customer_id": 4711}),
        "first_42": add.enqueue(42, 1),
        "second_42": add.enqueue(1, 42),
        "order": carry.enqueue(order={"lines": [{"sku": "B-2"}, {"sku": "A-1"}]}),
        "order_first": carry.enqueue(order={"lines": [{"sku": "A-1"}]}),
        "flags": carry.enqueue(active=True, note=None),
        "lookup_named_key": carry.enqueue(contains=1, in__x=2),
    }
    return {name: int(result.id) for name, result in jobs.items()}


def found(text: str) -> set[int]:
    return set(apply_search(Job.objects.all(), parse_search(text)).values_list("pk", flat=True))


def test_a_key_of_the_kwargs(carried: dict[str, int]) -> None:
    # A bare number also finds the same digits stored as text; never a nested key.
    assert found("kwargs.customer_id:4711") == {carried["number"], carried["text"]}
    assert found('kwargs.customer_id:"4711"') == {carried["text"]}
    assert found("kwargs.parent.customer_id:4711") == {carried["nested_elsewhere"]}


def test_a_position_of_the_args(carried: dict[str, int]) -> None:
    assert found("args.0:42") == {carried["first_42"]}
    assert found("args.1:42") == {carried["second_42"]}


def test_a_nested_path_through_a_list(carried: dict[str, int]) -> None:
    # Containment alone would find both orders: the exact path keeps the position.
    assert found("kwargs.order.lines.0.sku:A-1") == {carried["order_first"]}
    assert found("kwargs.order.lines.1.sku:A-1") == {carried["order"]}


def test_true_null_and_keys_named_like_lookups(carried: dict[str, int]) -> None:
    assert found("kwargs.active:true") == {carried["flags"]}
    assert found("kwargs.note:null") == {carried["flags"]}
    assert found("kwargs.contains:1") == {carried["lookup_named_key"]}
    assert found("kwargs.in__x:2") == {carried["lookup_named_key"]}


def test_every_word_must_match(carried: dict[str, int]) -> None:
    assert found("kwargs.customer_id:4711 tests.tasks.carry") == {
        carried["number"],
        carried["text"],
    }
    assert found("kwargs.customer_id:4711 tests.tasks.add") == set()
    assert found(f"kwargs.customer_id:4711 #{carried['text']}") == {carried["text"]}


@pytest.mark.parametrize("value", ["NaN", "-Infinity", "1e400", "9" * 30])
def test_values_no_database_compares_as_numbers_find_nothing(
    carried: dict[str, int], value: str
) -> None:
    assert found(f"kwargs.customer_id:{value}") == set()


def test_free_words_find_the_error_and_the_worker(carried: dict[str, int]) -> None:
    Job.objects.filter(pk=carried["first_42"]).update(
        last_error="ConnectionError: gateway timed out", last_worker="host-b:77:abcdef"
    )
    assert found("gateway") == {carried["first_42"]}
    assert found("HOST-B:77") == {carried["first_42"]}


# --------------------------------------------------------------------------- the admin


def test_the_job_list_searches_by_argument_with_an_exact_count(
    admin_client: Client, carried: dict[str, int]
) -> None:
    response = admin_client.get(CHANGELIST, {"q": "kwargs.customer_id:4711"})
    assert response.status_code == 200
    changelist = response.context["cl"]
    assert {job.pk for job in changelist.result_list} == {carried["number"], carried["text"]}
    assert changelist.paginator.count == 2
    assert type(changelist.paginator).__name__ == "Paginator"  # not the capped one
    # The search stays in the page's links (a bookmarkable URL).
    assert "q=kwargs.customer_id%3A4711" in response.content.decode()


def test_a_malformed_search_shows_how_to_write_it_and_no_jobs(
    admin_client: Client, carried: dict[str, int]
) -> None:
    response = admin_client.get(CHANGELIST, {"q": "args.first:1"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    [message] = [str(m) for m in get_messages(response.wsgi_request)]
    assert "starts with a position (args.0:42)" in message


@pytest.mark.skipif(connection.vendor != "postgresql", reason="GIN indexes: PostgreSQL only")
def test_postgresql_answers_an_argument_search_from_the_gin_index(
    carried: dict[str, int],
) -> None:
    queryset = apply_search(Job.objects.all(), parse_search("kwargs.customer_id:4711"))
    sql, params = queryset.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        # A table this small is read whole otherwise: ask whether the index can answer.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "leasejobs_job_kwargs_gin" in plan, plan
    queryset = apply_search(Job.objects.all(), parse_search("args.0:42"))
    sql, params = queryset.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "leasejobs_job_args_gin" in plan, plan
    # (Migration 0022: jobs without arguments are not in them.)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
            [["leasejobs_job_args_gin", "leasejobs_job_kwargs_gin"]],
        )
        definitions = dict(cursor.fetchall())
    assert definitions["leasejobs_job_args_gin"].endswith("WHERE (args <> '[]'::jsonb)")
    assert definitions["leasejobs_job_kwargs_gin"].endswith("WHERE (kwargs <> '{}'::jsonb)")
