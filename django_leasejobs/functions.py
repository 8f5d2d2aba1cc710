"""Database functions of our own."""

from __future__ import annotations

from typing import Any

from django.db.models import BigIntegerField, Func
from django.db.models.functions import Now

MYSQL_UTC_NOW = "UTC_TIMESTAMP(6)"
"""The database's clock in UTC on MySQL/MariaDB (``leases/dialect.py`` uses it too)."""


class DatabaseNow(Now):
    """The database's clock, in UTC on every database: use it wherever ``Now()`` would go.

    It is ``Now()`` everywhere (the same SQL on PostgreSQL, SQLite and the others) but
    MySQL/MariaDB, where ``Now()`` is ``CURRENT_TIMESTAMP(6)``: the time in the
    *session's* ``time_zone``, while Django stores UTC in ``DATETIME`` columns (and the
    lease protocol compares them with ``UTC_TIMESTAMP(6)``, ``leases/dialect.py``).
    There it is ``UTC_TIMESTAMP(6)``, whatever the session's or the server's time zone.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template=MYSQL_UTC_NOW, **extra_context)


class OctetLength(Func):
    """The length of a text in bytes (UTF-8), on every database: what the text takes as a
    file. ``OCTET_LENGTH`` on PostgreSQL and MySQL/MariaDB; SQLite has it only from 3.43
    on, so there it is the length of the text cast to a BLOB."""

    function = "OCTET_LENGTH"
    arity = 1
    output_field = BigIntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra_context
        )
