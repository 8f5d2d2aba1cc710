# A nullable column without a default: adding it changes only the catalog (PostgreSQL,
# MySQL 8 instant ADD), and rows written without it (a worker of the previous release
# during a rolling deploy) stay valid.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_leasejobs", "0011_flow_control"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unknown_task_since",
            field=models.DateTimeField(
                blank=True,
                help_text="When a worker first claimed this job without knowing its task (it "
                "gave the job back to wait for a worker that does: UNKNOWN_TASK_GRACE); null = "
                "never.",
                null=True,
            ),
        ),
    ]
