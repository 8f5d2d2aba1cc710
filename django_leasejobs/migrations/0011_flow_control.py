# Written by hand (the operations Django 5.2 generates, with the claim index and the flow
# index created per database).
"""Flow control: paused queues, concurrency limits and rate limits (docs/flow-control.md).

* ``leasejobs_queue``: a queue's paused state, read by every claim.
* ``leasejobs_flow_lock``: one row per backend, locked by each claim of flow-limited
  jobs, so that such claims take turns on every worker.
* ``leasejobs_rate_start``: the starts of rate-limited jobs, kept for one period.
* ``leasejobs_job``: ``flow_group``, ``concurrency_limit``, ``rate_limit`` (nullable, no
  default: adding them rewrites no row).
* The claim index leaves the jobs of flow groups out (``flow_group IS NULL`` joins its
  condition), and two partial indexes hold them: ``leasejobs_job_flow_order_idx`` in
  claim order (the flow claim's first look) and ``leasejobs_job_flow_idx`` by group,
  each group in claim order (its skip scan): a backlog held back by a full limit is
  never walked by the claim of other jobs. On a
  big table the claim index is rebuilt here (PostgreSQL: ``DROP INDEX`` and ``CREATE
  INDEX`` lock writes to the job table while it builds).

MySQL and MariaDB have no partial indexes: there the claim index keeps its stand-in of
migration 0007 (it holds every pending row, and the portable claim filters), the flow
indexes are not created (the flow claim reads the pending jobs of flow groups through the
claim index's stand-in), and ``flow_group`` and ``scope`` get the binary collation of
``key``, so groups compare byte for byte as on PostgreSQL and SQLite.
"""

import django_leasejobs.functions
from django.db import migrations, models

from ._mysql_collation import key_collation

OLD_CLAIM = models.Index(
    "backend",
    "queue",
    models.F("priority").desc(),
    "run_after",
    "id",
    name="leasejobs_job_claim_idx",
    condition=models.Q(status="pending"),
)
NEW_CLAIM = models.Index(
    "backend",
    "queue",
    models.F("priority").desc(),
    "run_after",
    "id",
    name="leasejobs_job_claim_idx",
    condition=models.Q(status="pending", flow_group__isnull=True),
)
FLOW_ORDER = models.Index(
    "backend",
    "queue",
    models.F("priority").desc(),
    "run_after",
    "id",
    name="leasejobs_job_flow_order_idx",
    condition=models.Q(status="pending", flow_group__isnull=False),
)
FLOW = models.Index(
    "backend",
    "queue",
    "flow_group",
    models.F("priority").desc(),
    "run_after",
    "id",
    name="leasejobs_job_flow_idx",
    condition=models.Q(status="pending", flow_group__isnull=False),
)


def indexes_forwards(apps, schema_editor):
    job = apps.get_model("django_leasejobs", "Job")
    if schema_editor.connection.vendor == "mysql":
        _mysql_collations(apps, schema_editor)
        return
    schema_editor.remove_index(job, OLD_CLAIM)
    schema_editor.add_index(job, NEW_CLAIM)
    schema_editor.add_index(job, FLOW_ORDER)
    schema_editor.add_index(job, FLOW)


def indexes_backwards(apps, schema_editor):
    job = apps.get_model("django_leasejobs", "Job")
    if schema_editor.connection.vendor == "mysql":
        return
    schema_editor.remove_index(job, FLOW)
    schema_editor.remove_index(job, FLOW_ORDER)
    schema_editor.remove_index(job, NEW_CLAIM)
    schema_editor.add_index(job, OLD_CLAIM)


def _mysql_collations(apps, schema_editor):
    q = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        collation = key_collation(cursor)
    for model, column in (("Job", "flow_group"), ("RateStart", "scope")):
        found = apps.get_model("django_leasejobs", model)
        kind = found._meta.get_field(column).db_type(schema_editor.connection)
        null = "NULL" if found._meta.get_field(column).null else "NOT NULL"
        schema_editor.execute(
            f"ALTER TABLE {q(found._meta.db_table)} MODIFY {q(column)} {kind} "
            f"CHARACTER SET utf8mb4 COLLATE {collation} {null}"
        )


class Migration(migrations.Migration):

    dependencies = [
        ('django_leasejobs', '0010_job_trace_context'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='flow_group',
            field=models.CharField(blank=True, help_text='The group whose limits this job obeys: "key:" + its concurrency key, or "task:" + its task path (a task-wide concurrency or rate limit); null = none.', max_length=520, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='concurrency_limit',
            field=models.IntegerField(blank=True, help_text='Most running jobs of its flow group; null = no cap.', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='rate_limit',
            field=models.CharField(blank=True, help_text='Most starts of its task per period ("50/m"); null = none.', max_length=16, null=True),
        ),
        migrations.CreateModel(
            name='Queue',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('backend', models.CharField(default='default', max_length=64)),
                ('name', models.CharField(max_length=128)),
                ('paused', models.BooleanField(default=False)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('changed_at', models.DateTimeField(db_default=django_leasejobs.functions.DatabaseNow())),
            ],
            options={
                'verbose_name': 'queue',
                'verbose_name_plural': 'queues',
                'db_table': 'leasejobs_queue',
                'ordering': ['backend', 'name'],
                'permissions': [('pause_queue', 'Can pause and resume queues')],
                'default_permissions': ('view',),
                'constraints': [models.UniqueConstraint(fields=('backend', 'name'), name='leasejobs_queue_unique')],
            },
        ),
        migrations.CreateModel(
            name='FlowLock',
            fields=[
                ('backend', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('claims', models.BigIntegerField(default=0)),
            ],
            options={
                'verbose_name': 'flow lock',
                'verbose_name_plural': 'flow locks',
                'db_table': 'leasejobs_flow_lock',
                'default_permissions': (),
            },
        ),
        migrations.CreateModel(
            name='RateStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('backend', models.CharField(default='default', max_length=64)),
                ('scope', models.CharField(help_text='"task:" + path or "queue:" + name.', max_length=530)),
                ('started_at', models.DateTimeField(db_default=django_leasejobs.functions.DatabaseNow())),
            ],
            options={
                'verbose_name': 'rate-limited start',
                'verbose_name_plural': 'rate-limited starts',
                'db_table': 'leasejobs_rate_start',
                'default_permissions': (),
                'indexes': [models.Index(fields=['backend', 'scope', 'started_at'], name='leasejobs_rate_start_idx')],
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name='job', name='leasejobs_job_claim_idx'),
                migrations.AddIndex(model_name='job', index=NEW_CLAIM),
                migrations.AddIndex(model_name='job', index=FLOW_ORDER),
                migrations.AddIndex(model_name='job', index=FLOW),
            ],
            database_operations=[
                migrations.RunPython(indexes_forwards, indexes_backwards, elidable=False),
            ],
        ),
    ]
