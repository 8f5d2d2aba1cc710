"""The GIN indexes on ``args`` and ``kwargs`` (migration 0018) hold only jobs that have
some: ``WHERE args <> '[]'`` and ``WHERE kwargs <> '{}'`` (PostgreSQL only).

An argument search asks for a containment of a value at a path (never of the empty array
or object), which no job without arguments can match; ``job_search`` says so in its query
(``AND NOT args = '[]'``), so PostgreSQL still answers it from these indexes. A job
without arguments (or without keyword arguments) then costs its GIN index nothing when it
is enqueued, claimed and finished: every change of a job's status writes a new row
version, and each index gets an entry for it (a no-op job's two GIN entries per write
were about a tenth of the server's CPU per job, docs/benchmarks.md).

Each index is built ``CONCURRENTLY`` under a new name, the old one dropped, the new one
renamed: the search never goes without its index, and the table stays writable.
"""

from django.db import migrations

from ._pg_index import rebuild_concurrently

INDEXES = (
    ("leasejobs_job_args_gin", "args", "'[]'::jsonb"),
    ("leasejobs_job_kwargs_gin", "kwargs", "'{}'::jsonb"),
)


def _rebuild(apps, schema_editor, *, partial: bool) -> None:
    q = schema_editor.quote_name
    for name, column, empty in INDEXES:
        where = f" WHERE {q(column)} <> {empty}" if partial else ""
        definition = f"USING gin ({q(column)} jsonb_path_ops){where}"
        rebuild_concurrently(apps, schema_editor, name, definition)


def forwards(apps, schema_editor):
    _rebuild(apps, schema_editor, partial=True)


def backwards(apps, schema_editor):
    _rebuild(apps, schema_editor, partial=False)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_leasejobs", "0021_fanin"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
