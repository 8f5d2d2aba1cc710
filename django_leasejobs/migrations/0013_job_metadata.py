# A nullable column without a default: adding it changes only the catalog (PostgreSQL,
# MySQL 8 instant ADD), and rows written without it (the previous release during a
# rolling deploy) stay valid.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_leasejobs", "0012_job_unknown_task_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="metadata",
            field=models.JSONField(
                blank=True,
                help_text="The job's metadata: a JSON object set at enqueue "
                "(using(metadata=...)), read and saved by its task (context.metadata, "
                "save_metadata()); null = none.",
                null=True,
            ),
        ),
    ]
