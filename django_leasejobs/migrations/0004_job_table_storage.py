"""PostgreSQL storage settings for the job table: room for HOT updates, eager autovacuum.

* ``fillfactor = 80``: inserts leave a fifth of each page free, so a heartbeat's
  UPDATE (``locked_until``, ``heartbeat_at``, progress: no indexed column) can put
  the new row version on the same page, a HOT update that touches no index.
* Autovacuum thresholds scaled to a queue table whose rows are rewritten a few
  times each: vacuum after 1 % of the rows are dead (default 20 %), analyze after
  2 % changed (default 10 %), and vacuum after 1 % new rows, so the partial claim
  index and the visibility map stay fresh.

Other databases have no such settings: the migration does nothing there.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

TABLE = "leasejobs_job"
SETTINGS = {
    "fillfactor": "80",
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
}


def _apply(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    options = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    table = schema_editor.quote_name(TABLE)
    schema_editor.execute(f"ALTER TABLE {table} SET ({options})")


def _revert(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(TABLE)
    schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")


class Migration(migrations.Migration):
    dependencies = [("django_leasejobs", "0003_dead_letter_index")]

    operations = [migrations.RunPython(_apply, _revert, elidable=False)]
