"""Is a database ready for this app's tables: reachable, this app's migrations applied,
its tables there.

``runworker`` asks before it starts a worker (``wait_until_ready``), and the other
commands when a query failed (``schema_problem``), so that a database nobody migrated
gives one line naming the fix instead of a loop of "relation does not exist" errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.apps import apps
from django.db import DatabaseError, connections
from django.db.migrations.loader import MigrationLoader

from .models import APP_LABEL

DEFAULT_DATABASE_WAIT = 30.0
"""How long ``runworker`` tries to reach its database at start (seconds)."""

FIRST_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 5.0


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What a database lacks of this app's schema (nothing: ``ready``)."""

    alias: str
    unapplied: tuple[str, ...]
    """This app's migrations (names) not recorded as applied on the database."""
    missing_tables: tuple[str, ...]
    """Tables of this app's models that the database does not have."""

    @property
    def ready(self) -> bool:
        return not self.unapplied and not self.missing_tables

    def problem(self) -> str:
        """One line: what is missing and the command that fixes it ('' when ready)."""
        if self.ready:
            return ""
        migrate = "manage.py migrate"
        if self.alias != "default":
            migrate += f" --database {self.alias}"
        if self.unapplied:
            count = len(self.unapplied)
            return (
                f"database {self.alias!r} is not migrated: {count} migration"
                f"{'s' if count != 1 else ''} of {APP_LABEL} not applied "
                f'({", ".join(self.unapplied)}); run "{migrate}".'
            )
        return (
            f"database {self.alias!r} lacks the tables {', '.join(self.missing_tables)} of "
            f"{APP_LABEL}, though its migrations are recorded as applied, so "
            f'"{migrate}" alone will not create them: restore them, or run '
            f'"manage.py migrate {APP_LABEL} zero --fake" (add --database as above) and then '
            f'"{migrate}".'
        )


class SchemaNotReady(Exception):
    """The database is reachable, but lacks this app's migrations or tables."""

    def __init__(self, state: SchemaState) -> None:
        self.state = state
        super().__init__(state.problem())


class DatabaseUnreachable(Exception):
    """The database could not be queried, for as long as the caller would wait."""

    def __init__(self, alias: str, waited: float, attempts: int, error: DatabaseError) -> None:
        self.alias = alias
        self.error = error
        detail = " ".join(str(error).split()) or type(error).__name__
        tried = f" ({attempts} attempts in {waited:.0f} s)" if attempts > 1 else ""
        super().__init__(f"database {alias!r} cannot be reached{tried}: {detail}")


def schema_state(alias: str) -> SchemaState:
    """This app's migrations and tables on the database ``alias``.

    Raises ``DatabaseError`` when the database cannot be queried: a missing table is an
    answer here, never an error (only ``django_migrations`` and the table list are read).
    """
    connection = connections[alias]
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    unapplied: tuple[str, ...] = ()
    if APP_LABEL in loader.migrated_apps:  # not when MIGRATION_MODULES turns them off
        ours = sorted(name for app, name in loader.graph.nodes if app == APP_LABEL)
        unapplied = tuple(n for n in ours if (APP_LABEL, n) not in loader.applied_migrations)
    missing: tuple[str, ...] = ()
    if not unapplied:
        expected = {
            model._meta.db_table
            for model in apps.get_app_config(APP_LABEL).get_models()
            if model._meta.managed and not model._meta.proxy
        }
        with connection.cursor() as cursor:
            present = set(connection.introspection.table_names(cursor))
        missing = tuple(sorted(expected - present))
    return SchemaState(alias, unapplied, missing)


def schema_problem(alias: str) -> str:
    """Why this app's tables cannot be used on ``alias`` ('' when they can, and when the
    database cannot be asked: the caller reports its own error then). Not asked inside a
    transaction of the caller's, whose state is not this function's to change."""
    if connections[alias].in_atomic_block:
        return ""
    try:
        return schema_state(alias).problem()
    except DatabaseError:
        return ""
    finally:
        _release(alias)


def _release(alias: str) -> None:
    """Close the connection of ``alias`` (a failed one included), unless a transaction of
    the caller's holds it."""
    connection = connections[alias]
    if not connection.in_atomic_block:
        connection.close()


def wait_until_ready(
    alias: str,
    wait: float = DEFAULT_DATABASE_WAIT,
    on_retry: Callable[[int, float, DatabaseError], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``alias`` has this app's schema; the connection is closed after.

    A database that cannot be reached is tried again, with growing pauses, for up to
    ``wait`` seconds (a worker that starts while its database restarts should not fail),
    then ``DatabaseUnreachable``. A reachable database that lacks the migrations or the
    tables raises ``SchemaNotReady`` at once: waiting does not migrate it.
    ``on_retry(attempt, delay, error)`` is called before each pause.
    """
    deadline = clock() + wait
    started = clock()
    delay = FIRST_RETRY_DELAY
    attempt = 0
    while True:
        attempt += 1
        try:
            state = schema_state(alias)
        except DatabaseError as exc:
            left = deadline - clock()
            if left <= 0:
                raise DatabaseUnreachable(alias, clock() - started, attempt, exc) from exc
            pause = min(delay, left)
            if on_retry is not None:
                on_retry(attempt, pause, exc)
            sleep(pause)
            delay = min(delay * 2, MAX_RETRY_DELAY)
            continue
        finally:
            _release(alias)
        if not state.ready:
            raise SchemaNotReady(state)
        return
