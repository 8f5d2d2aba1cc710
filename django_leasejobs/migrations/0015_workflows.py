# Written by hand (the operations Django generates, with the indexes and the status check
# changed per database so that a big job table is never locked for a scan).
"""Workflows (issue 29): the workflow table, its edges, and three columns on the job.

* ``leasejobs_workflow`` and ``leasejobs_dependency`` (one row per edge: ``child`` waits
  for ``parent``; unique on ``(child, position)``, which orders a step's parents, and an
  index on ``parent``, which finds the steps a finished job releases).
* ``leasejobs_job.workflow_id``, ``waiting_on``, ``on_parent_failure``: nullable columns
  without a default, so adding them changes only the catalog and rows written without
  them (the previous release during a rolling deploy) stay valid plain jobs.
* The status ``waiting``: the check ``leasejobs_job_status_valid`` is replaced. On
  PostgreSQL the new one is added ``NOT VALID`` and validated after (a scan that lets
  writes go on) in one transaction with the drop.
* ``leasejobs_job_workflow_idx`` (steps of a workflow) and ``leasejobs_job_waiting_idx``
  (waiting steps) are partial: plain jobs never enter them. On PostgreSQL built
  ``CONCURRENTLY`` (the migration is not atomic for that). MySQL/MariaDB have no partial
  indexes: a plain index on ``workflow_id`` stands in for the first; waiting steps are
  found through ``leasejobs_job_finished_idx`` (led by ``status``).
"""

import django.db.models.deletion
from django.db import migrations, models, transaction

import django_leasejobs.functions

STATUSES = ["waiting", "pending", "running", "succeeded", "failed", "dead", "cancelled"]
OLD_STATUSES = STATUSES[1:]
STATUS_CHECK = models.CheckConstraint(
    condition=models.Q(status__in=STATUSES), name="leasejobs_job_status_valid"
)
OLD_STATUS_CHECK = models.CheckConstraint(
    condition=models.Q(status__in=OLD_STATUSES), name="leasejobs_job_status_valid"
)
WORKFLOW_INDEX = models.Index(
    condition=models.Q(workflow__isnull=False),
    fields=["workflow"],
    name="leasejobs_job_workflow_idx",
)
WAITING_INDEX = models.Index(
    condition=models.Q(status="waiting"), fields=["id"], name="leasejobs_job_waiting_idx"
)
MYSQL_WORKFLOW_INDEX = models.Index(fields=["workflow"], name="leasejobs_job_workflow_idx")


def _statuses_sql(statuses):
    return ", ".join(f"'{s}'" for s in statuses)


def _set_status_check(apps, schema_editor, new, old):
    job = apps.get_model("django_leasejobs", "Job")
    if schema_editor.connection.vendor == "postgresql":
        q = schema_editor.quote_name
        table, name = q(job._meta.db_table), q(STATUS_CHECK.name)
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
            schema_editor.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {name} "
                f"CHECK ({q('status')} IN ({_statuses_sql(new.condition.children[0][1])})) "
                "NOT VALID"
            )
            schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")
        return
    if schema_editor.connection.vendor == "sqlite":
        # SQLite rebuilds the table from the model's constraints: give it the new one.
        job._meta.constraints = [
            new if c.name == new.name else c for c in job._meta.constraints
        ]
        schema_editor._remake_table(job)
        return
    schema_editor.remove_constraint(job, old)
    schema_editor.add_constraint(job, new)


def status_check_forwards(apps, schema_editor):
    _set_status_check(apps, schema_editor, STATUS_CHECK, OLD_STATUS_CHECK)


def status_check_backwards(apps, schema_editor):
    _set_status_check(apps, schema_editor, OLD_STATUS_CHECK, STATUS_CHECK)


def indexes_forwards(apps, schema_editor):
    job = apps.get_model("django_leasejobs", "Job")
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        q = schema_editor.quote_name
        table = q(job._meta.db_table)
        for index, columns, where in (
            (WORKFLOW_INDEX, q("workflow_id"), f"{q('workflow_id')} IS NOT NULL"),
            (WAITING_INDEX, q("id"), f"{q('status')} = 'waiting'"),
        ):
            # A build that failed half-way leaves an INVALID index behind: drop it first.
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(index.name)}")
            schema_editor.execute(
                f"CREATE INDEX CONCURRENTLY {q(index.name)} ON {table} ({columns}) "
                f"WHERE {where}"
            )
        return
    if vendor == "mysql":
        schema_editor.add_index(job, MYSQL_WORKFLOW_INDEX)
        return
    schema_editor.add_index(job, WORKFLOW_INDEX)
    schema_editor.add_index(job, WAITING_INDEX)


def indexes_backwards(apps, schema_editor):
    job = apps.get_model("django_leasejobs", "Job")
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        q = schema_editor.quote_name
        for index in (WORKFLOW_INDEX, WAITING_INDEX):
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(index.name)}")
        return
    if vendor == "mysql":
        schema_editor.remove_index(job, MYSQL_WORKFLOW_INDEX)
        return
    schema_editor.remove_index(job, WORKFLOW_INDEX)
    schema_editor.remove_index(job, WAITING_INDEX)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_leasejobs", "0014_keys_over_time"),
    ]

    operations = [
        migrations.CreateModel(
            name="Workflow",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("backend", models.CharField(default="default", max_length=64)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django_leasejobs.functions.DatabaseNow()),
                ),
                ("step_count", models.PositiveIntegerField(default=0)),
                (
                    "step_ids",
                    models.JSONField(
                        blank=True,
                        help_text="The job of each step, in the workflow's order: its own, or "
                        "the job a step with a dedup key was deduplicated against (which may "
                        "belong to another workflow).",
                        null=True,
                    ),
                ),
            ],
            options={
                "verbose_name": "workflow",
                "verbose_name_plural": "workflows",
                "db_table": "leasejobs_workflow",
                "permissions": [
                    ("cancel_workflow", "Can cancel workflows and retry their failed steps")
                ],
            },
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("position", models.PositiveIntegerField()),
                (
                    "child",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="django_leasejobs.job",
                    ),
                ),
                (
                    "parent",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="django_leasejobs.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "dependency",
                "verbose_name_plural": "dependencies",
                "db_table": "leasejobs_dependency",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("child", "position"), name="leasejobs_dependency_child_position"
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="workflow",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                help_text="The workflow this job is a step of; null = a plain job.",
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="steps",
                to="django_leasejobs.workflow",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="waiting_on",
            field=models.IntegerField(
                blank=True,
                help_text="A workflow step's parents that have not finished yet (it is "
                "waiting while any has not); null = no parents.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="on_parent_failure",
            field=models.CharField(
                blank=True,
                help_text='"run": the step runs even when a parent failed (a finaliser); '
                "null: it fails without running.",
                max_length=8,
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("waiting", "Waiting"),
                    ("pending", "Pending"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="leasejobs_job_status_valid"),
                migrations.AddConstraint(model_name="job", constraint=STATUS_CHECK),
                migrations.AddIndex(model_name="job", index=WORKFLOW_INDEX),
                migrations.AddIndex(model_name="job", index=WAITING_INDEX),
            ],
            database_operations=[
                migrations.RunPython(
                    status_check_forwards, status_check_backwards, elidable=False
                ),
                migrations.RunPython(indexes_forwards, indexes_backwards, elidable=False),
            ],
        ),
    ]
