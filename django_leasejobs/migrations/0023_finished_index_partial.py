# Written by hand (the operations Django generates, with the index rebuilt per database).
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
(``models.PENDING_ROWS``; its planner reads neither partial index for that ``OR``).
"""

from django.db import migrations, models

OLD = models.Index(fields=["status", "finished_at"], name="leasejobs_job_finished_idx")
NEW = models.Index(
    fields=["status", "finished_at"],
    name="leasejobs_job_finished_idx",
    condition=models.Q(finished_at__isnull=False),
)


def _swap(apps, schema_editor, *, partial: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    job = apps.get_model("django_leasejobs", "Job")
    q = schema_editor.quote_name
    table = q(job._meta.db_table)
    building = f"{NEW.name}_rebuilt"
    where = f" WHERE {q('finished_at')} IS NOT NULL" if partial else ""
    # A build that failed half-way leaves an INVALID index behind: drop it first.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(building)}")
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY {q(building)} ON {table} "
        f"({q('status')}, {q('finished_at')}){where}"
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(NEW.name)}")
    schema_editor.execute(f"ALTER INDEX {q(building)} RENAME TO {q(NEW.name)}")


def forwards(apps, schema_editor):
    _swap(apps, schema_editor, partial=True)


def backwards(apps, schema_editor):
    _swap(apps, schema_editor, partial=False)


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
