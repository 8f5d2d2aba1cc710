"""The rollup table's one write: counts added to per-minute rows, by one upsert.

A :class:`Tally` is what a writer counted in memory (a worker's database round, a reap
pass): per :class:`RollupKey` (backend, minute, queue, task), counters and two
histograms (``histograms.py``). :func:`add_tally` adds all of it to ``leasejobs_rollup``
in ONE statement, ``INSERT ... ON CONFLICT ... DO UPDATE SET c = c + excluded.c``
(PostgreSQL, SQLite) or ``ON DUPLICATE KEY UPDATE c = c + VALUES(c)`` (MySQL, MariaDB):
every column only grows by what the writer adds, so any number of writers at once lose
nothing. Rows go in key order, so two writers lock the same rows in the same order.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections

from ..histograms import BUCKETS, bucket_of
from ..models import ROLLUP_COUNTERS, RUN_COLUMNS, WAIT_COLUMNS, JobRollup
from .dialect import dialect, placeholders, retry_deadlocks

KEY_COLUMNS = ("backend", "minute", "queue", "task_path")
VALUE_COLUMNS = (*ROLLUP_COUNTERS, *WAIT_COLUMNS, *RUN_COLUMNS)


class RollupKey(NamedTuple):
    """One row of the rollup table: a backend's minute of one queue and task.

    A named tuple: a round's tally looks its rows up several times per job, and a
    tuple hashes, compares and orders (the upsert's lock order) in C."""

    backend: str
    minute: datetime
    """The minute's start (seconds and microseconds zero), UTC."""
    queue: str
    task_path: str


COUNTER_AT = {name: index for index, name in enumerate(ROLLUP_COUNTERS)}
"""Where each counter of ``ROLLUP_COUNTERS`` is in a :meth:`Tally.row`."""
_WAIT_AT = len(ROLLUP_COUNTERS)
_RUN_AT = _WAIT_AT + BUCKETS


def wait_at(seconds: float) -> int:
    """Where a wait of ``seconds`` (enqueue to claim) is counted in a :meth:`Tally.row`."""
    return _WAIT_AT + bucket_of(seconds)


def run_at(seconds: float) -> int:
    """Where a run of ``seconds`` is counted in a :meth:`Tally.row`."""
    return _RUN_AT + bucket_of(seconds)


ENDING_COUNTERS = {
    "succeeded": "succeeded",
    "failed": "failed",
    "dead": "dead",
    "pending": "retried",
}
"""The counter of an ended attempt by the job's new status: ``pending`` is a failed attempt
after which the job runs again (a snooze is not counted: it is no failure); an attempt
ending ``cancelled`` counts in none."""


def minute_of(moment: datetime) -> datetime:
    """The start of the minute ``moment`` falls in."""
    return moment.replace(second=0, microsecond=0)


class Tally:
    """Counts made in memory, added to the rollup table by :func:`add_tally`.

    Per key, one count per column of ``VALUE_COLUMNS`` (counters may be negative: a claim
    given back unused takes back its ``started``)."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[RollupKey, list[int]] = {}

    def row(self, key: RollupKey) -> list[int]:
        """The counts of ``key``'s row (zeros if new), in ``VALUE_COLUMNS`` order, to add
        to in place at :data:`COUNTER_AT`, :func:`wait_at` and :func:`run_at`: for a
        writer that counts many jobs into few rows (a worker's round)."""
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0] * len(VALUE_COLUMNS)
        return row

    def count(self, key: RollupKey, counter: str, n: int = 1) -> None:
        """Add ``n`` to ``counter`` (one of ``ROLLUP_COUNTERS``) of ``key``'s row."""
        self.row(key)[COUNTER_AT[counter]] += n

    def wait(self, key: RollupKey, seconds: float, n: int = 1) -> None:
        self.row(key)[wait_at(seconds)] += n

    def run(self, key: RollupKey, seconds: float) -> None:
        self.row(key)[run_at(seconds)] += 1

    def merge(self, other: Tally) -> None:
        """Add ``other``'s counts to this tally."""
        for key, values in other.rows.items():
            row = self.row(key)
            for index, value in enumerate(values):
                row[index] += value

    def __bool__(self) -> bool:
        return any(any(values) for values in self.rows.values())


@functools.lru_cache(maxsize=64)
def _upsert_sql(using: str, rows: int) -> str:
    """The upsert of ``rows`` rows on ``using`` (the same text for the same count)."""
    d = dialect(using)
    table = d.q(JobRollup._meta.db_table)
    columns = (*KEY_COLUMNS, *VALUE_COLUMNS)
    names = ", ".join(d.q(c) for c in columns)
    values = ", ".join([f"({placeholders(len(columns))})"] * rows)
    if d.vendor == "mysql":
        update = ", ".join(f"{d.q(c)} = {d.q(c)} + VALUES({d.q(c)})" for c in VALUE_COLUMNS)
        upsert = f"ON DUPLICATE KEY UPDATE {update}"
    else:
        update = ", ".join(
            f"{d.q(c)} = {table}.{d.q(c)} + excluded.{d.q(c)}" for c in VALUE_COLUMNS
        )
        conflict = ", ".join(d.q(c) for c in KEY_COLUMNS)
        upsert = f"ON CONFLICT ({conflict}) DO UPDATE SET {update}"
    return f"INSERT INTO {table} ({names}) VALUES {values} {upsert}"  # noqa: S608 - identifiers quoted, values bound


def add_tally(tally: Tally, *, using: str) -> int:
    """Add ``tally`` to the rollup table in one statement (in the caller's transaction,
    if any); return the rows it touched. Nothing is sent when there is nothing to add."""
    rows = sorted((key, values) for key, values in tally.rows.items() if any(values))
    if not rows:
        return 0
    connection = connections[using]
    adapt = connection.ops.adapt_datetimefield_value
    params: list[Any] = []
    for key, values in rows:
        params.extend((key.backend, adapt(key.minute), key.queue, key.task_path))
        params.extend(values)
    sql = _upsert_sql(using, len(rows))

    def upsert_rows() -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return len(rows)

    return retry_deadlocks(using, upsert_rows)  # (in a transaction: the caller's to run again)
