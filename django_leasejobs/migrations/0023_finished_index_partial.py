# Written by hand (the operations Django generates, with the index rebuilt on PostgreSQL only).
"""On PostgreSQL ``leasejobs_job_finished_idx`` holds finished jobs only: ``(status,
finished_at) WHERE finished_at IS NOT NULL`` (issue 32).

Every change of a job's status writes a new row version, and an index of every row takes
an entry for each: the enqueue, the claim and the end of every job. Only finished jobs
have a ``finished_at``, and every reader of this index asks for a range of it (pruning,
the dashboard's last hour, alerts with ``ROLLUPS = False``), so the enqueue and the claim
now leave it alone: a third of its writes. Readers of pending and running jobs use the
partial indexes that hold them (``models.PENDING_ROWS``, ``ACTIVE_ROWS``).

The new index is built ``CONCURRENTLY`` under another name, the old one dropped, the
new one renamed: pruning never goes without its index, and the table stays writable (the
migration is not atomic for that). Nothing runs on other databases: MySQL and MariaDB
have no partial indexes (Django makes the model's index there without its condition),
and SQLite keeps its index of every row, which it reads ``status = 'pending'`` from
(``models.PENDING_ROWS``; its planner reads neither partial index for that ``OR``). A
later migration that makes SQLite rebuild the job table creates the model's partial index
there: its readers work either way, the pending ones then through the two lanes' indexes.
"""

from django.db import migrations, models

from ._pg_index import rebuild_concurrently

OLD = models.Index(fields=["status", "finished_at"], name="leasejobs_job_finished_idx")
NEW = models.Index(
    fields=["status", "finished_at"],
    name="leasejobs_job_finished_idx",
    condition=models.Q(finished_at__isnull=False),
)


def _definition(schema_editor, *, partial: bool) -> str:
    q = schema_editor.quote_name
    where = f" WHERE {q('finished_at')} IS NOT NULL" if partial else ""
    return f"({q('status')}, {q('finished_at')}){where}"


def forwards(apps, schema_editor):
    rebuild_concurrently(apps, schema_editor, NEW.name, _definition(schema_editor, partial=True))


def backwards(apps, schema_editor):
    rebuild_concurrently(apps, schema_editor, OLD.name, _definition(schema_editor, partial=False))


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_leasejobs", "0022_argument_indexes_skip_empty"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name=OLD.name),
                migrations.AddIndex(model_name="job", index=NEW),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
