# Written by hand (the operations Django generates, the unique index changed per database
# so that a big job table is not locked while it is built).
"""A waiting workflow step holds its dedup key (issue 29): the unique index on the keys of
active jobs covers ``waiting`` besides ``pending`` and ``running``.

* PostgreSQL: the new partial unique index is built ``CONCURRENTLY`` under a temporary
  name, the old one dropped ``CONCURRENTLY``, the new one renamed (the migration is not
  atomic for that); writes go on meanwhile.
* SQLite: the index is dropped and created again.
* MySQL/MariaDB: the key is unique through the generated column ``active_key`` (migration
  0007): its expression changes, which rebuilds the job table (MySQL cannot change a
  STORED generated column in place). Prune finished jobs first on a big table.

No key can be held twice when this runs: before it, no step with a key could be
enqueued.
"""

from django.db import migrations, models

from ._mysql_collation import key_collation

NAME = "leasejobs_job_active_key_unique"
KEY_HOLDERS = ["waiting", "pending", "running"]
OLD_KEY_HOLDERS = ["pending", "running"]


def _constraint(statuses):
    return models.UniqueConstraint(
        fields=["key"],
        condition=models.Q(status__in=statuses) & models.Q(key__isnull=False),
        name=NAME,
    )


def _statuses(statuses):
    return ", ".join(f"'{s}'" for s in statuses)


def _change(apps, schema_editor, new, old):
    job = apps.get_model("django_leasejobs", "Job")
    connection = schema_editor.connection
    q = schema_editor.quote_name
    table = q(job._meta.db_table)
    if connection.vendor == "postgresql":
        building = q(f"{NAME}_new")
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {building}")
        schema_editor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {building} ON {table} ({q('key')}) "
            f"WHERE {q('status')} IN ({_statuses(new)}) AND {q('key')} IS NOT NULL"
        )
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(NAME)}")
        schema_editor.execute(f"ALTER INDEX {building} RENAME TO {q(NAME)}")
        return
    if connection.vendor == "mysql":
        key_type = job._meta.get_field("key").db_type(connection)
        with connection.cursor() as cursor:
            collation = key_collation(cursor)
        schema_editor.execute(
            f"ALTER TABLE {table} MODIFY {q('active_key')} {key_type} CHARACTER SET utf8mb4 "
            f"COLLATE {collation} GENERATED ALWAYS AS (CASE WHEN {q('status')} IN "
            f"({_statuses(new)}) THEN {q('key')} END) STORED"
        )
        return
    schema_editor.remove_constraint(job, _constraint(old))
    schema_editor.add_constraint(job, _constraint(new))


def forwards(apps, schema_editor):
    _change(apps, schema_editor, KEY_HOLDERS, OLD_KEY_HOLDERS)


def backwards(apps, schema_editor):
    _change(apps, schema_editor, OLD_KEY_HOLDERS, KEY_HOLDERS)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_leasejobs", "0015_workflows"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="key",
            field=models.CharField(
                blank=True,
                help_text="Optional dedup key, unique among waiting, pending and running jobs.",
                max_length=255,
                null=True,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name=NAME),
                migrations.AddConstraint(model_name="job", constraint=_constraint(KEY_HOLDERS)),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, elidable=False),
            ],
        ),
    ]
