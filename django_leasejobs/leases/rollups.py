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

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections

from ..histograms import BUCKETS, bucket_of
from ..models import ROLLUP_COUNTERS, RUN_COLUMNS, WAIT_COLUMNS, JobRollup
from .dialect import dialect, placeholders, retry_deadlocks

KEY_COLUMNS = ("backend", "minute", "queue", "task_path")
VALUE_COLUMNS = (*ROLLUP_COUNTERS, *WAIT_COLUMNS, *RUN_COLUMNS)


@dataclass(frozen=True, slots=True, order=True)
class RollupKey:
    """One row of the rollup table: a backend's minute of one queue and task."""

    backend: str
    minute: datetime
    """The minute's start (seconds and microseconds zero), UTC."""
    queue: str
    task_path: str


@dataclass(slots=True)
class RollupCounts:
    """What is added to one row: counters (may be negative: a claim given back unused
    takes back its ``started``) and bucket counts of wait and run times."""

    enqueued: int = 0
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    wait: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    run: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def values(self) -> list[int]:
        """In ``VALUE_COLUMNS`` order."""
        counters = [getattr(self, name) for name in ROLLUP_COUNTERS]
        return [*counters, *self.wait, *self.run]

    @property
    def empty(self) -> bool:
        return not any(self.values())


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
    """Counts made in memory, added to the rollup table by :func:`add_tally`."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[RollupKey, RollupCounts] = {}

    def _row(self, key: RollupKey) -> RollupCounts:
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = RollupCounts()
        return row

    def count(self, key: RollupKey, counter: str, n: int = 1) -> None:
        """Add ``n`` to ``counter`` (one of ``ROLLUP_COUNTERS``) of ``key``'s row."""
        row = self._row(key)
        setattr(row, counter, getattr(row, counter) + n)

    def wait(self, key: RollupKey, seconds: float, n: int = 1) -> None:
        self._row(key).wait[bucket_of(seconds)] += n

    def run(self, key: RollupKey, seconds: float) -> None:
        self._row(key).run[bucket_of(seconds)] += 1

    def merge(self, other: Tally) -> None:
        """Add ``other``'s counts to this tally."""
        for key, counts in other.rows.items():
            row = self._row(key)
            for name in ROLLUP_COUNTERS:
                setattr(row, name, getattr(row, name) + getattr(counts, name))
            row.wait = [a + b for a, b in zip(row.wait, counts.wait, strict=True)]
            row.run = [a + b for a, b in zip(row.run, counts.run, strict=True)]

    def __bool__(self) -> bool:
        return any(not counts.empty for counts in self.rows.values())


def add_tally(tally: Tally, *, using: str) -> int:
    """Add ``tally`` to the rollup table in one statement (in the caller's transaction,
    if any); return the rows it touched. Nothing is sent when there is nothing to add."""
    rows = sorted((key, counts) for key, counts in tally.rows.items() if not counts.empty)
    if not rows:
        return 0
    d = dialect(using)
    connection = connections[using]
    adapt = connection.ops.adapt_datetimefield_value
    table = d.q(JobRollup._meta.db_table)
    columns = (*KEY_COLUMNS, *VALUE_COLUMNS)
    names = ", ".join(d.q(c) for c in columns)
    values = ", ".join([f"({placeholders(len(columns))})"] * len(rows))
    if d.vendor == "mysql":
        update = ", ".join(f"{d.q(c)} = {d.q(c)} + VALUES({d.q(c)})" for c in VALUE_COLUMNS)
        upsert = f"ON DUPLICATE KEY UPDATE {update}"
    else:
        update = ", ".join(
            f"{d.q(c)} = {table}.{d.q(c)} + excluded.{d.q(c)}" for c in VALUE_COLUMNS
        )
        conflict = ", ".join(d.q(c) for c in KEY_COLUMNS)
        upsert = f"ON CONFLICT ({conflict}) DO UPDATE SET {update}"
    params: list[Any] = []
    for key, counts in rows:
        params.extend((key.backend, adapt(key.minute), key.queue, key.task_path))
        params.extend(counts.values())
    sql = f"INSERT INTO {table} ({names}) VALUES {values} {upsert}"  # noqa: S608 - identifiers quoted, values bound

    def upsert_rows() -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return len(rows)

    return retry_deadlocks(d.using, upsert_rows)  # (in a transaction: the caller's to run again)
