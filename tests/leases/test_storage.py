"""The job table's PostgreSQL storage settings, and heartbeats as HOT updates.

A heartbeat changes ``locked_until``, ``heartbeat_at`` and progress only: none is
indexed, and the migration leaves a fifth of each page free (``fillfactor = 80``),
so PostgreSQL can write the new row version on the same page without touching any
index (a heap-only tuple update). ``pg_stat_user_tables.n_tup_hot_upd`` counts them.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_leasejobs import leases
from django_leasejobs.models import Job

from ..waiting import wait_until

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="storage parameters and HOT are PostgreSQL's"
)


def _reloptions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'leasejobs_job'::regclass")
        (options,) = cursor.fetchone()
    return dict(option.split("=", 1) for option in options or [])


def _update_counts() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relid = 'leasejobs_job'::regclass"
        )
        updates, hot = cursor.fetchone()
    return int(updates), int(hot)


@pytest.mark.django_db
def test_migration_sets_fillfactor_and_autovacuum_thresholds() -> None:
    assert _reloptions() == {
        "fillfactor": "80",
        "autovacuum_vacuum_scale_factor": "0.01",
        "autovacuum_vacuum_insert_scale_factor": "0.01",
        "autovacuum_analyze_scale_factor": "0.02",
    }


@pytest.mark.django_db(transaction=True)
def test_heartbeats_are_hot_updates() -> None:
    Job.objects.bulk_create(Job(task_path="tests.tasks.noop") for _ in range(5))
    claimed = leases.claim("w1", limit=5, lease_duration=30)
    assert len(claimed) == 5
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    before_updates, before_hot = wait_until(_update_counts, what="table statistics")
    beats = 40
    for beat in range(beats):
        progress = {job.lease: leases.Progress(beat / beats, f"step {beat}") for job in claimed}
        result = leases.renew("w1", progress, lease_duration=30)
        assert result.held == {job.lease for job in claimed}
    # Statistics reach the shared counters when this backend reports them; ask it to
    # report at the end of the next statement, then poll until they arrived.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")

    def arrived() -> tuple[int, int] | None:
        updates, hot = _update_counts()
        return (updates, hot) if updates - before_updates >= beats * len(claimed) else None

    updates, hot = wait_until(arrived, timeout=20, what="the renewals in pg_stat_user_tables")
    renewed = updates - before_updates
    hot_renewed = hot - before_hot
    assert renewed == beats * len(claimed)
    # An index on a column a renewal writes would make none of them HOT. A few may not be
    # on a busy machine: PostgreSQL prunes a page's dead versions only when it gets the
    # page's cleanup lock at once (the checkpointer writing the page out holds a pin), and
    # an update that does not fit then goes to another page (seen: 175 of 200).
    assert hot_renewed >= renewed * 3 // 4, (
        f"only {hot_renewed} of {renewed} heartbeat updates were HOT"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT a.attname FROM pg_index i JOIN pg_attribute a "
            "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = 'leasejobs_job'::regclass"
        )
        indexed = {name for (name,) in cursor.fetchall()}
    renewal_writes = {"locked_until", "heartbeat_at", "progress", "progress_message"}
    assert not indexed & renewal_writes
