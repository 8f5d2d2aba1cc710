# Written by hand (the operations Django generates, with the key index created per database).
"""Keys over time (issue 28.6): result retention per job, and an index of every job's key.

* ``leasejobs_job.result_ttl``: a nullable column without a default, so adding it changes
  only the catalog (PostgreSQL, MySQL 8 instant ADD, SQLite's ADD COLUMN) and rows written
  without it (a worker or web process of the previous release during a rolling deploy)
  stay valid: NULL means "the queue's QUEUE_RESULT_TTL, else prune_jobs' --older-than".
* ``leasejobs_job_key_idx``: ``(key, id) WHERE key IS NOT NULL``, the jobs of a dedup key
  whatever their status, for ``unique_for`` (the unique index of migration 0001 holds
  active jobs only). An index cannot be catalog-only: on PostgreSQL it is built with
  ``CREATE INDEX CONCURRENTLY`` (no lock on writes to the job table while it builds; the
  migration is not atomic for that). MySQL/MariaDB have no partial indexes: there it is a
  plain index on ``(key, id)`` (InnoDB builds it online, writes go on). On SQLite an
  ordinary ``CREATE INDEX``.
"""

from django.db import migrations, models

KEY_INDEX = models.Index(
    fields=["key", "id"],
    name="leasejobs_job_key_idx",
    condition=models.Q(key__isnull=False),
)


def key_index_forwards(apps, schema_editor):
    job = apps.get_model("django_leasejobs", "Job")
    if schema_editor.connection.vendor == "postgresql":
        q = schema_editor.quote_name
        # A build that failed half-way leaves an INVALID index behind: drop it first.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(KEY_INDEX.name)}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {q(KEY_INDEX.name)} ON {q(job._meta.db_table)} "
            f"({q('key')}, {q('id')}) WHERE {q('key')} IS NOT NULL"
        )
        return
    schema_editor.add_index(job, KEY_INDEX)


def key_index_backwards(apps, schema_editor):
    job = apps.get_model("django_leasejobs", "Job")
    if schema_editor.connection.vendor == "postgresql":
        q = schema_editor.quote_name
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(KEY_INDEX.name)}")
        return
    schema_editor.remove_index(job, KEY_INDEX)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_leasejobs", "0013_job_metadata"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="result_ttl",
            field=models.DurationField(
                blank=True,
                help_text="How long the finished job is kept: prune_jobs deletes it once its "
                "finished_at is older; null = its queue's QUEUE_RESULT_TTL, else prune_jobs' "
                "--older-than.",
                null=True,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="job", index=KEY_INDEX)],
            database_operations=[
                migrations.RunPython(key_index_forwards, key_index_backwards, elidable=False)
            ],
        ),
    ]
