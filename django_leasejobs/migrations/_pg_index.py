"""An index of the job table rebuilt on PostgreSQL without locking writes out
(migrations 0022 and 0023)."""


def rebuild_concurrently(apps, schema_editor, name, definition):
    """Replace the index ``name`` by one of ``definition`` (what follows ``ON <table>``),
    on PostgreSQL only: built ``CONCURRENTLY`` under another name, the old one dropped, the
    new one renamed, so that its readers never go without an index and the table stays
    writable. ``CONCURRENTLY`` cannot run in a transaction: the calling migration is not
    atomic."""
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    table = q(apps.get_model("django_leasejobs", "Job")._meta.db_table)
    building = f"{name}_rebuilt"
    # A build that failed half-way leaves an INVALID index behind: drop it first.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(building)}")
    schema_editor.execute(f"CREATE INDEX CONCURRENTLY {q(building)} ON {table} {definition}")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(name)}")
    schema_editor.execute(f"ALTER INDEX {q(building)} RENAME TO {q(name)}")
