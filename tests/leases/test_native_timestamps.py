"""The hot statements' datetimes read with psycopg's C loader come out as Django's own.

On PostgreSQL through psycopg 3 the claim, the fenced writes and ``insert_job`` read
``timestamptz`` columns with psycopg's C loader (``dialect.native_timestamps``: Django's
Python loader costs ten times as much) and then give each value Django's zone. These
tests compare every such value with what the ORM reads for the same row: equal, and
with the same ``tzinfo`` (aware in Django's zone with ``USE_TZ``, naive without).
"""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest
from django.db import connection
from django.test import override_settings

from django_leasejobs import leases
from django_leasejobs.leases.dialect import _native_timestamptz_loader, native_timestamps
from django_leasejobs.leases.values import Completion
from django_leasejobs.models import Job
from tests import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's loaders"),
]


def same(ours: datetime | None, django: datetime | None) -> None:
    assert ours is not None and django is not None
    assert ours == django
    assert ours.tzinfo == django.tzinfo, (ours.tzinfo, django.tzinfo)
    assert ours.utcoffset() == django.utcoffset()


def claim_and_complete() -> None:
    tasks.add.enqueue(1, 2)
    (job,) = leases.claim_round("w-tz", limit=1, lease_duration=60).jobs
    row = Job.objects.get(pk=job.id)
    same(job.enqueued_at, row.enqueued_at)
    same(job.started_at, row.started_at)
    same(job.last_attempted_at, row.last_attempted_at)
    done = leases.complete_many("w-tz", [Completion(job.id, job.attempt, 3, False)])
    same(done.finished_at[job.lease], Job.objects.get(pk=job.id).finished_at)


def test_the_c_loader_is_used_where_psycopg_has_one() -> None:
    loader = _native_timestamptz_loader()
    if psycopg.pq.__impl__ == "python":
        assert loader is None
        return
    assert loader is not None
    with connection.cursor() as cursor:
        native_timestamps(cursor)
        oid = psycopg.adapters.types["timestamptz"].oid
        assert cursor.cursor.adapters.get_loader(oid, psycopg.pq.Format.TEXT) is loader
    # Only that cursor: the connection's next cursor reads as Django reads.
    with connection.cursor() as cursor:
        assert cursor.cursor.adapters.get_loader(oid, psycopg.pq.Format.TEXT) is not loader


def test_claim_and_completion_read_datetimes_as_django_does() -> None:
    claim_and_complete()


@override_settings(USE_TZ=False)
def test_without_use_tz_they_are_naive_as_django_reads_them() -> None:
    claim_and_complete()
    assert Job.objects.get().enqueued_at.tzinfo is None


@override_settings(USE_TZ=False, TIME_ZONE="Asia/Kathmandu")
def test_without_use_tz_a_site_time_zone_is_the_wall_clock() -> None:
    claim_and_complete()


def test_enqueue_returns_enqueued_at_as_django_does() -> None:
    # On PostgreSQL a plain enqueue is ``leases.insert_job``: its row and NOTIFY in one
    # statement, the one whose enqueued_at the TaskResult carries.
    result = tasks.add.enqueue(1, 2)
    same(result.enqueued_at, Job.objects.get(pk=int(result.id)).enqueued_at)


@override_settings(USE_TZ=False, TIME_ZONE="Asia/Kathmandu")
def test_without_use_tz_enqueue_returns_the_naive_wall_clock() -> None:
    test_enqueue_returns_enqueued_at_as_django_does()
