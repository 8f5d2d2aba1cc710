"""Leases stretch while renewals come back late, and only then (``worker/lease_length.py``).

A renewal answered late (a slow database, a busy machine) is no fault: the worker asks
for longer leases rather than call them lost and have their jobs run again. A renewal
answered after its lease had run out (a freeze, a partition) is a fault and stretches
nothing. The tests first drive ``LeaseLength`` by the clock values they give it, then
through real heartbeat ticks; the end to end case, with a real worker and a database
whose renewals are slow, is in ``test_slow_renewals.py``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, connection

from django_leasejobs import leases
from django_leasejobs.worker import Worker
from django_leasejobs.worker.heartbeat import Heartbeat
from django_leasejobs.worker.lease_length import HEADROOM, MAX_STRETCH, MEMORY, LeaseLength
from tests import tasks
from tests.waiting import wait_until

LEASE, BEAT = 4.0, 1.0


def _series(length: LeaseLength, trips: list[float], start: float = 100.0) -> float:
    """Renewals one heartbeat apart, each answered ``trip`` seconds after its send; the
    time after the last."""
    sent = start
    for trip in trips:
        length.renewed(sent, sent + trip, length.seconds)
        sent += max(BEAT, trip)
    return sent


def test_renewals_on_time_keep_the_configured_lease() -> None:
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.01, 0.05, 0.2, 0.3] * 10)
    assert length.seconds == LEASE
    assert length.problem() == ""  # nothing on the worker's registry row


def test_a_late_renewal_stretches_the_lease_in_quarters_up_to_the_cap() -> None:
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.05])
    # Answered 1.5 s after the previous send (100.0), one heartbeat meant: 0.5 s late.
    stretch = length.renewed(101.0, 101.5, length.seconds)
    assert stretch is None  # 2 * 1 + 3 * 0.5 = 3.5 s: the 4 s lease covers it
    # The next one 1.4 s late: 2 + 3 * 1.4 = 6.2 s, in quarters of 4 s: 7 s.
    stretch = length.renewed(102.0, 103.4, length.seconds)
    assert stretch is not None
    assert (stretch.seconds, round(stretch.delay, 6)) == (7.0, 1.4)
    assert length.seconds == 7.0
    assert length.problem() == (
        "renewals came back up to 1.40s late: leases stretched to 7s (LEASE_DURATION 4s)"
    )
    # However late (within the 7 s the one before asked for), never more than
    # MAX_STRETCH leases.
    length.renewed(104.0, 104.05, length.seconds)
    length.renewed(105.0, 104.0 + 6.5, length.seconds)
    assert length.seconds == MAX_STRETCH * LEASE


def test_a_renewal_answered_after_its_lease_ran_out_stretches_nothing() -> None:
    """A frozen or cut-off worker lost its leases anyway: that is a fault, not load."""
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.05])
    assert length.renewed(101.0, 101.0 + 30.0, length.seconds) is None  # 30 s after 100.0: > 4 s
    assert length.seconds == LEASE
    # The first renewal after a claim has no predecessor: its own round trip counts.
    length.idle()
    assert length.renewed(200.0, 200.0 + LEASE + 0.1, length.seconds) is None


def test_the_lease_shrinks_back_once_the_late_renewals_are_forgotten() -> None:
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.05])
    length.renewed(101.0, 102.0, length.seconds)  # 1 s late
    assert length.seconds == pytest.approx(5.0)  # 2 + 3 * 1 = 5 s
    changes = []
    sent = 102.0
    for _ in range(MEMORY):
        change = length.renewed(sent, sent + 0.05, length.seconds)
        if change is not None:
            changes.append(change.seconds)
        sent += BEAT
    assert changes == [LEASE]  # back to the configured lease once, after MEMORY on time


def test_an_idle_heartbeat_starts_a_new_series() -> None:
    """The first renewal after the worker held no lease is not late for the time it
    held none."""
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.05])
    length.idle()
    assert length.renewed(103.0, 103.05, length.seconds) is None  # 3 s after 100.0: no matter
    assert length.seconds == LEASE


def test_the_headroom_covers_a_renewal_headroom_times_as_late() -> None:
    """A stretched lease still holds when the next renewal comes back HEADROOM times as
    late as the one that stretched it (its answer before the local deadline)."""
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.05])
    late = 2.0
    length.renewed(101.0, 100.0 + BEAT + late, length.seconds)
    deadline = length.seconds - BEAT  # the local deadline of the lease asked for next
    assert BEAT + HEADROOM * late <= deadline


# -- the main loop's part: its claims (and its registration) feed the lease length too


def test_a_claim_that_took_long_stretches_the_lease_the_next_claims_ask_for() -> None:
    """A claimed job's lease runs from the claim's send: a claim whose jobs reached the
    loop 1.5 s after it was sent asks the next ones to cover that, the heartbeat's
    renewals too (reported with the next renewal)."""
    length = LeaseLength(LEASE, BEAT)
    length.trip_came_back(100.0, 100.2, LEASE)
    assert length.seconds == LEASE  # 2 + 3 * 0.2 = 2.6 s: the 4 s lease covers it
    length.trip_came_back(101.0, 102.5, LEASE)
    assert length.seconds == 7.0  # 2 + 3 * 1.5 = 6.5 s, in quarters of 4 s
    assert length.problem() == (
        "claims came back up to 1.50s late: leases stretched to 7s (LEASE_DURATION 4s)"
    )
    stretch = length.renewed(103.0, 103.05, length.seconds)
    assert stretch is not None
    assert (stretch.seconds, stretch.delay) == (7.0, 1.5)
    assert length.renewed(104.0, 104.05, length.seconds) is None  # reported once
    # Claims ask for a beat more than renewals, stretched or not (their first renewal
    # comes at the heartbeat's next beat).
    assert length.claim_seconds == 7.0 + BEAT


def test_quick_claims_never_push_a_late_renewal_out_of_mind() -> None:
    """The claims and the renewals are remembered apart: many quick claims (a busy
    worker claims many times a second) leave the lease a late renewal asked for."""
    length = LeaseLength(LEASE, BEAT)
    _series(length, [0.05])
    length.renewed(101.0, 102.4, length.seconds)  # 1.4 s late: 7 s
    for n in range(MEMORY * 2):
        length.trip_came_back(104.0 + n / 100, 104.01 + n / 100, length.seconds)
    assert length.seconds == 7.0
    # ... and quick renewals leave the lease a slow claim asked for.
    length = LeaseLength(LEASE, BEAT)
    length.trip_came_back(100.0, 101.5, LEASE)
    _series(length, [0.05] * (MEMORY * 2), start=102.0)
    assert length.seconds == 7.0


def test_a_claim_answered_after_its_lease_ran_out_stretches_nothing() -> None:
    length = LeaseLength(LEASE, BEAT)
    length.trip_came_back(100.0, 100.0 + LEASE + 0.5, LEASE)  # frozen or cut off: a fault
    assert length.seconds == LEASE


def test_the_claims_memory_forgets_a_slow_claim_after_memory_quick_ones() -> None:
    length = LeaseLength(LEASE, BEAT)
    length.trip_came_back(100.0, 101.5, LEASE)
    for n in range(MEMORY - 1):
        length.trip_came_back(102.0 + n, 102.05 + n, length.seconds)
    assert length.seconds == 7.0
    length.trip_came_back(200.0, 200.05, length.seconds)
    assert length.seconds == LEASE


# -- the heartbeat's part: its renewals feed the lease length; a failed one breaks the series


class FailRenewals:
    """An execute wrapper: the renewals (UPDATEs of the job table) fail as a dropped
    connection does."""

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if sql.lstrip().upper().startswith(("UPDATE", "WITH")) and "leasejobs_job" in sql:
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fails_between", [False, True])
def test_a_failed_renewal_breaks_the_series(worker: Worker, fails_between: bool) -> None:
    """Two renewals 0.9 s apart with 2 s leases and 0.3 s heartbeats: the second came back
    0.6 s late, which stretches the lease (2 * 0.3 + 3 * 0.6 > 2). With a failed renewal
    between them, the gap is an outage's, and nothing stretches."""
    tasks.add.enqueue(1, 2)
    (claimed,) = leases.claim(worker.worker_id, limit=1, lease_duration=60)
    length = LeaseLength(2.0, 0.3)
    ctx = dataclasses.replace(worker.thread_context(), lease_length=length)
    ctx.table.add([claimed.lease], time.monotonic(), 60.0)
    heartbeat = Heartbeat(ctx, threading.Event())
    heartbeat.tick()
    first = ctx.table.renewed_at(claimed.lease)
    assert first > 0
    if fails_between:
        with connection.execute_wrapper(FailRenewals()):
            heartbeat.tick()
        assert ctx.table.renewed_at(claimed.lease) == first  # not renewed
    wait_until(lambda: time.monotonic() > first + 0.9, what="0.9 s after the first renewal")
    heartbeat.tick()
    assert ctx.table.renewed_at(claimed.lease) > first
    assert (length.seconds > 2.0) is not fails_between, length.seconds
