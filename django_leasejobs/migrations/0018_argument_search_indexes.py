"""GIN indexes on the job's ``args`` and ``kwargs`` (PostgreSQL only), for the admin's
search by argument (``kwargs.customer_id:4711``, django_leasejobs/job_search.py): its
containment test (``kwargs @> '{"customer_id": 4711}'``) is answered from them.

``jsonb_path_ops``: smaller and faster than the default operator class, and containment
is the one operator the search uses. Built ``CONCURRENTLY`` (the migration is not atomic
for that): a big job table stays writable while they build. They are not in the model's
state (an index other databases cannot have); SQLite and MySQL/MariaDB get nothing and
search by a full scan.
"""

from django.db import migrations

INDEXES = (
    ("leasejobs_job_args_gin", "args"),
    ("leasejobs_job_kwargs_gin", "kwargs"),
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    job = apps.get_model("django_leasejobs", "Job")
    q = schema_editor.quote_name
    table = q(job._meta.db_table)
    for name, column in INDEXES:
        # A build that failed half-way leaves an INVALID index behind: drop it first.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(name)}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {q(name)} ON {table} USING gin ({q(column)} jsonb_path_ops)"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    for name, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(name)}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_leasejobs", "0017_attempt_outcome_collateral"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
