"""Enqueue with prepared statements where the site allows them (PostgreSQL, psycopg 3):
``DATABASES[...]["OPTIONS"]["prepare_threshold"]`` (Django turns them off by default so
that connection poolers keep working)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction

from django_leasejobs.models import Job
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def prepared_inserts() -> int:
    """The prepared statements of this connection that insert jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements "
            "WHERE statement LIKE 'INSERT INTO %%leasejobs_job%%pg_notify%%'"
        )
        return int(cursor.fetchone()[0])


@pytest.fixture
def threshold(request: pytest.FixtureRequest) -> Iterator[int | None]:
    """The connection reopened with ``prepare_threshold`` set to the test's parameter."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (psycopg 3)")
    options = connection.settings_dict.setdefault("OPTIONS", {})
    before = options.get("prepare_threshold", "unset")
    options["prepare_threshold"] = request.param
    connection.close()
    try:
        yield request.param
    finally:
        if before == "unset":
            options.pop("prepare_threshold", None)
        else:
            options["prepare_threshold"] = before
        connection.close()


@pytest.mark.parametrize("threshold", [0, 2], indirect=True)
def test_the_enqueue_is_prepared_once_the_site_allows_it(threshold: int) -> None:
    results = [tasks.add.enqueue(n, n) for n in range(threshold + 2)]
    assert prepared_inserts() == 1
    assert Job.objects.count() == len(results)
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(9, 9)  # prepared, and still inside the caller's transaction
        raise RuntimeError("roll back")
    assert not Job.objects.filter(args=[9, 9]).exists()


@pytest.mark.parametrize("threshold", [None], indirect=True)
def test_nothing_is_prepared_by_default(threshold: None) -> None:
    for n in range(8):
        tasks.add.enqueue(n, n)
    assert prepared_inserts() == 0
    assert Job.objects.count() == 8


@pytest.mark.parametrize("threshold", [0], indirect=True)
def test_a_prepared_enqueue_still_notifies_on_commit(threshold: int) -> None:
    params = connection.get_connection_params()
    wanted = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(
        **{k: params[k] for k in wanted if params.get(k)}, autocommit=True
    ) as listener:
        listener.execute("LISTEN leasejobs")
        with transaction.atomic():
            tasks.add.enqueue(1, 1)
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # not before commit
        (note,) = list(listener.notifies(timeout=10, stop_after=1))
        assert (note.channel, note.payload) == ("leasejobs", "default")
