"""The SQL fragments that differ between databases, and which path each database takes.

Two paths run the same rules (``rules.py``) with the same fences:

* **batched** (PostgreSQL, SQLite): one statement per transition, however many jobs:
  ``UPDATE ... FROM (VALUES ...) ... RETURNING`` (on PostgreSQL ``FROM unnest(...)`` of
  one array per column: :meth:`Dialect.rows_from`);
* **portable** (MySQL 8, MariaDB 10.6+, or any database forced onto it with
  :func:`portable_path`): standard SQL only, no ``RETURNING``: rows are locked with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` inside a transaction, written by one fenced
  UPDATE (or one per row where the values differ), and read back.

A :class:`Dialect` holds the rest: the database's clock, "now plus N seconds", casts
for a ``VALUES`` list, and whether rows can be locked without waiting.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import tzinfo
from typing import Any, TypeVar

from django.db import OperationalError, connections

from ..functions import MYSQL_UTC_NOW
from ..models import Job, JobAttempt

T = TypeVar("T")

_PG_TYPES = {"id": "bigint", "int": "integer", "float": "double precision"}
_PG_TYPES |= {"text": "text", "json": "jsonb", "datetime": "timestamp with time zone"}
_SQLITE_TYPES = {"id": "INTEGER", "int": "INTEGER", "float": "REAL"}
_SQLITE_TYPES |= {"text": "TEXT", "json": "TEXT"}
_SQLITE_NOW = "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')"


@dataclass(frozen=True, slots=True)
class Dialect:
    vendor: str
    using: str
    now: str
    """SQL for the database's clock: the same instant for a whole statement where the
    database allows it, UTC on every database."""
    now_plus: str
    """SQL for now plus N seconds, with one parameter made by :meth:`offset`."""
    batched: bool
    """UPDATE ... FROM (VALUES ...) ... RETURNING (else the portable path)."""
    row_locks: bool
    """SELECT ... FOR UPDATE SKIP LOCKED (SQLite serialises writers instead)."""
    deadlock_victims: bool
    """The database picks deadlock victims among the protocol's own writes and rolls the
    victim's whole transaction back (MySQL/MariaDB: InnoDB can deadlock two single-row
    writes through a secondary index, where PostgreSQL's row locks and SQLite's one
    writer cannot): the victim's transaction is run again (:func:`retry_deadlocks`), so
    it holds only what may be run again."""

    def offset(self, seconds: float) -> Any:
        """The parameter of :attr:`now_plus` for ``seconds``."""
        if self.vendor == "postgresql":
            return float(seconds)
        if self.vendor == "mysql":
            return round(seconds * 1_000_000)
        return f"{float(seconds):+.6f} seconds"

    def offset_type(self) -> str:
        """The kind (for :meth:`values`) of an :meth:`offset` parameter."""
        return "float" if self.vendor == "postgresql" else "text"

    def now_plus_value(self, offset_sql: str) -> str:
        """:attr:`now_plus` with its parameter taken from ``offset_sql``."""
        return self.now_plus.replace("%s", offset_sql)

    @property
    def skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.row_locks else ""

    def q(self, name: str) -> str:
        return connections[self.using].ops.quote_name(name)

    @property
    def jobs(self) -> str:
        return self.q(Job._meta.db_table)

    @property
    def attempts(self) -> str:
        return self.q(JobAttempt._meta.db_table)

    def param(self, kind: str) -> str:
        """A parameter of a kind (``id``, ``int``, ``float``, ``text``, ``json``) where a
        type cannot be inferred (a CASE, a VALUES list); MySQL infers them all."""
        if self.vendor == "mysql":
            return "%s"
        names = _PG_TYPES if self.vendor == "postgresql" else _SQLITE_TYPES
        return f"CAST(%s AS {names[kind]})"

    @property
    def arrays(self) -> bool:
        """The batched path on PostgreSQL: per-row values go as one array per column
        (:meth:`rows_from`, :meth:`in_ids`)."""
        return self.batched and self.vendor == "postgresql"

    def rows_from(
        self, rows: Sequence[Sequence[Any]], kinds: Sequence[str]
    ) -> tuple[str, list[Any]]:
        """Per-row values (``rows``, of one value of each kind in ``kinds``) as a FROM item
        ``v`` of columns ``column1``, ``column2``..., and its parameters (the batched path).

        On PostgreSQL ``unnest`` of one array per column (each a text parameter): the
        SQL is the same however many rows, so psycopg parses it once (its query cache
        keeps short statements with few parameters) and adapts a few strings, not every
        value; the server plans one shape. Elsewhere a ``VALUES`` list of cast
        parameters.
        """
        if self.arrays:
            arrays = ", ".join(f"%s::{_PG_TYPES[kind]}[]" for kind in kinds)
            names = ", ".join(f"column{n}" for n in range(1, len(kinds) + 1))
            columns = zip(*rows, strict=True)
            params = [_array(kind, column) for kind, column in zip(kinds, columns, strict=True)]
            return f"unnest({arrays}) AS v({names})", params
        row = "(" + ", ".join(self.param(k) for k in kinds) + ")"
        params = [value for values in rows for value in values]
        return f"(VALUES {', '.join([row] * len(rows))}) AS v", params

    def in_ids(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        """``IN`` the job ids ``ids``, and its parameters: on PostgreSQL ``= ANY`` of one
        array, the same SQL however many ids (see :meth:`rows_from`)."""
        if self.arrays:
            return "= ANY(%s::bigint[])", [_array("id", ids)]
        return f"IN ({placeholders(len(ids))})", list(ids)


def _array(kind: str, values: Sequence[Any]) -> str:
    """One column of :meth:`Dialect.rows_from` as the text of a PostgreSQL array.

    Built here rather than by psycopg, whose list adaptation is Python code per element
    (about 1 us each for numbers, 2 us for text: more than the rest of a write of 35
    rows). Every element is a number or a double-quoted string with its ``"`` and ``\\``
    escaped, so no value can split or end the array; NUL bytes and lone surrogates meet
    psycopg's adaptation of the whole text, and fail there exactly as a value of their
    own did.
    """
    if kind in ("id", "int"):
        items = ["NULL" if v is None else str(int(v)) for v in values]
    elif kind == "float":
        items = ["NULL" if v is None else repr(float(v)) for v in values]
    else:
        items = ["NULL" if v is None else _quoted(str(v)) for v in values]
    return "{" + ",".join(items) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fetch_one(using: str, sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
    """Run one statement that runs again and again with the same SQL (an enqueue); return
    its one row, its ``timestamptz`` columns as :func:`native_timestamps` reads them (give
    them :func:`django_zone`).

    On PostgreSQL through psycopg 3, when nothing hooks Django's cursors (no execute
    wrapper, no query log: ``DEBUG`` off and no ``assertNumQueries``), the statement runs
    on one psycopg cursor kept for the connection (:func:`_kept_cursor`), inside Django's
    health check, error translation, and thread and broken-transaction checks: a cursor
    made for each statement, and Django's wrapper around it, cost about a quarter of an
    enqueue's client CPU (docs/benchmarks.md, "Issue 32 at ``7c3b1dd`` and ``8cd4d1b``").
    Elsewhere, or hooked, Django's own cursor.
    """
    connection = connections[using]
    if (
        connection.vendor == "postgresql"
        and not connection.execute_wrappers
        and not connection.queries_logged
        and _on_psycopg3()
    ):
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            cursor = _kept_cursor(connection)
            cursor.execute(sql, params)
            return tuple(cursor.fetchone())
    with connection.cursor() as cursor:
        native_timestamps(cursor)
        cursor.execute(sql, params)
        return tuple(cursor.fetchone())


@dataclass
class _KeptCursor:
    """A psycopg cursor kept for one Django connection (see :func:`_kept_cursor`)."""

    raw: Any
    """The psycopg connection the cursor belongs to: Django opens a new one after a
    close (``CONN_MAX_AGE``, a failed health check), and the cursor goes with the old."""
    cursor: Any


_kept: weakref.WeakKeyDictionary[Any, _KeptCursor] = weakref.WeakKeyDictionary()


@functools.cache
def _on_psycopg3() -> bool:
    """Django's PostgreSQL backend runs on psycopg 3 (asked once)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def _kept_cursor(connection: Any) -> Any:
    """The psycopg 3 cursor :func:`fetch_one` reuses on ``connection`` (Django's,
    connected), made on first use and after each reconnection.

    It binds its parameters on the server (psycopg's plain ``Cursor``), as a bare
    psycopg statement does, whatever ``server_side_binding`` says for Django's cursors:
    the statements run here are plain INSERTs whose parameters all have a column or a
    function argument to type them. Binding on the server also lets psycopg prepare the
    statement where the site allows it (``OPTIONS["prepare_threshold"]``; Django's
    default, None, prepares nothing, so that connection poolers keep working). Django's
    connections belong to one thread each, and so does the cursor.
    """
    raw = connection.connection
    kept = _kept.get(connection)
    if kept is not None and kept.raw is raw and not kept.cursor.closed:
        return kept.cursor
    import psycopg

    cursor = psycopg.Cursor(raw)
    native_timestamps(cursor)
    _kept[connection] = _KeptCursor(raw=raw, cursor=cursor)
    return cursor


@functools.cache
def _native_timestamptz_loader() -> Any:
    """psycopg's own ``timestamptz`` loader when it is the C one (None otherwise)."""
    try:
        import psycopg
        from psycopg.pq import Format
    except ImportError:
        return None
    oid = psycopg.adapters.types["timestamptz"].oid
    loader = psycopg.adapters.get_loader(oid, Format.TEXT)
    return loader if loader is not None and loader.__module__.startswith("psycopg_") else None


def native_timestamps(cursor: Any) -> None:
    """Make ``cursor`` (Django's, or psycopg's own) read ``timestamptz`` columns with
    psycopg's C loader, where there is one (PostgreSQL through psycopg 3 with its C or
    binary implementation; elsewhere nothing changes).

    Django 5.2 registers a loader of its own (a Python subclass of psycopg's, which
    psycopg cannot swap for its C twin): 3.3 µs a value against 0.4 (Django 6 wraps the
    C loader: 0.75), and a claim reads four per job, its completion one more
    (docs/benchmarks.md, "Issue 32 at ``00270a8`` and ``a6d05cd``"). Both parse the
    same text; Django's then sets its zone. The values read here come
    aware, in the session's time zone, which Django set to its own: give each
    :func:`django_zone`, as Django's loader does. Only for this cursor: every other
    query of the connection reads as Django reads it.
    """
    loader = _native_timestamptz_loader()
    raw = getattr(cursor, "cursor", cursor)  # (Django's CursorWrapper holds psycopg's)
    adapters = getattr(raw, "adapters", None)
    if loader is not None and adapters is not None:
        adapters.register_loader("timestamptz", loader)


def django_zone(using: str) -> tzinfo | None:
    """The zone Django gives the datetimes it reads from ``using`` (its ``timezone``: None
    without ``USE_TZ``, when they are naive)."""
    zone: tzinfo | None = connections[using].timezone
    return zone


ID_CHUNK = 5000
"""Ids per ``IN`` list where a statement may get many (SQLite binds at most 32,766
parameters per statement)."""


def id_chunks(ids: Sequence[int]) -> list[list[int]]:
    """``ids`` cut into lists of at most :data:`ID_CHUNK`."""
    return [list(ids[i : i + ID_CHUNK]) for i in range(0, len(ids), ID_CHUNK)]


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


_forced_portable = False


@contextlib.contextmanager
def portable_path() -> Iterator[None]:
    """Inside the block, every database of this process takes the portable path, as MySQL
    and MariaDB always do: the test suite runs the protocol through it on PostgreSQL and
    SQLite too."""
    global _forced_portable
    before = _forced_portable
    _forced_portable = True
    try:
        yield
    finally:
        _forced_portable = before


def dialect(using: str) -> Dialect:
    """The dialect of the database ``using`` (see :func:`portable_path`)."""
    found = _dialect(using)
    if found.batched and _forced_portable:
        return replace(found, batched=False)
    return found


@functools.cache
def _dialect(using: str) -> Dialect:
    connection = connections[using]
    vendor = connection.vendor
    if vendor == "postgresql":
        found = Dialect(
            vendor,
            using,
            # what Django's Now() uses on PostgreSQL: one clock for the whole statement
            now="statement_timestamp()",
            now_plus="(statement_timestamp() + make_interval(secs => %s))",
            batched=True,
            row_locks=True,
            deadlock_victims=False,
        )
    elif vendor == "sqlite":
        # Six fractional digits, as Django stores datetimes on SQLite: text comparisons
        # between the two then agree within the same millisecond.
        found = Dialect(
            vendor,
            using,
            now=_SQLITE_NOW,
            now_plus="(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')",
            batched=True,
            row_locks=False,
            deadlock_victims=False,
        )
    elif vendor == "mysql":
        # UTC whatever the session's time_zone (Django stores UTC in DATETIME columns).
        found = Dialect(
            vendor,
            using,
            now=MYSQL_UTC_NOW,
            now_plus=f"({MYSQL_UTC_NOW} + INTERVAL %s MICROSECOND)",
            batched=False,
            row_locks=bool(connection.features.has_select_for_update_skip_locked),
            deadlock_victims=True,
        )
    else:
        raise NotImplementedError(f"django-leasejobs does not support the {vendor!r} database")
    return found


MYSQL_DEADLOCK = 1213
"""ER_LOCK_DEADLOCK: InnoDB rolled the whole transaction back; running it again is safe."""
DEADLOCK_RETRIES = 5


def retry_deadlocks(using: str, work: Callable[[], T]) -> T:
    """Run ``work`` (a whole transaction, or one statement in autocommit) and run it again
    when the database picks it as a deadlock victim (:attr:`Dialect.deadlock_victims`:
    MySQL/MariaDB).

    InnoDB can deadlock two single-row writes through a secondary index (a reaper's
    scan of running rows and a completion of one of them), where PostgreSQL's row locks
    cannot. Every transition is fenced, so running the victim again writes only what is
    still true. Inside a caller's transaction nothing is retried here: the caller's whole
    transaction was rolled back, and the error is the caller's to handle.
    """
    for attempt in range(DEADLOCK_RETRIES):
        try:
            return work()
        except OperationalError as exc:
            if (
                not dialect(using).deadlock_victims
                or not exc.args
                or exc.args[0] != MYSQL_DEADLOCK
                or connections[using].in_atomic_block
                or attempt == DEADLOCK_RETRIES - 1
            ):
                raise
            time.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 - jitter, not secrets
    raise AssertionError("unreachable")
