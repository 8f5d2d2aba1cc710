"""The worker's small parts on their own (issue 27): the lease table the threads share
with the main loop, and the inbox they post to. No database, no processes."""

from __future__ import annotations

import os
import signal
import threading

from django_leasejobs.leases import Progress
from django_leasejobs.worker.inbox import (
    CancelRequested,
    Inbox,
    JobsMayBeReady,
    LeaseLost,
    StopAsked,
)
from django_leasejobs.worker.shared import LeaseTable, StatusBoard, WorkerStatus

DEADLINE = 3.0


def test_every_lease_not_presumed_lost_is_renewed_with_its_progress() -> None:
    table = LeaseTable()
    table.add((1, 1), now=100.0)
    table.add((2, 1), now=100.0)
    table.add((3, 1), now=100.0)
    table.set_progress((1, 1), Progress(0.5, "half"))
    table.recording((2, 1))  # its outcome waits to be written: still renewed
    table.let_go((3, 1))  # presumed lost: never again
    assert table.to_renew() == {(1, 1): Progress(0.5, "half"), (2, 1): None}
    assert table.being_recorded() == {(2, 1)}
    table.renewed(frozenset({(1, 1), (9, 9)}), at=105.0)  # (9, 9): forgotten meanwhile
    assert table.renewed_at((1, 1)) == 105.0
    assert table.renewed_at((2, 1)) == 100.0
    assert table.renewed_at((9, 9)) == 0.0


def test_the_watchdog_reports_a_silent_lease_once_and_never_one_being_recorded() -> None:
    table = LeaseTable()
    table.add((1, 1), now=100.0)
    table.add((2, 1), now=100.0)
    table.recording((2, 1))  # a slow write is no fault: the fenced write decides
    assert table.overdue(100.0 + DEADLINE, DEADLINE) == []
    [found] = table.overdue(100.0 + DEADLINE + 0.1, DEADLINE)
    assert (found.lease, found.kind) == ((1, 1), "lease")
    assert "no successful renewal for 3.1s" in found.detail
    assert table.overdue(200.0, DEADLINE) == []  # reported once


def test_a_timeout_counts_from_the_hand_over_to_a_slot() -> None:
    table = LeaseTable()
    table.add((1, 1), now=100.0)
    assert table.overdue(150.0, 1000.0) == []  # waiting for a slot: no clock yet
    table.handed_over((1, 1), now=150.0, timeout=5.0)
    assert table.overdue(155.0, 1000.0) == []
    [found] = table.overdue(155.5, 1000.0)
    assert (found.lease, found.kind, found.detail) == ((1, 1), "timeout", "after 5.5s")
    table.taken_back((1, 1))
    table.remove((1, 1))
    assert len(table) == 0


def test_the_inbox_keeps_order_and_makes_a_notify_flood_one_message() -> None:
    inbox = Inbox()
    try:
        for _ in range(1000):
            inbox.post(JobsMayBeReady())
        inbox.post(LeaseLost((1, 1), "gone"))
        inbox.post(CancelRequested((2, 1)))
        assert inbox.take() == [
            JobsMayBeReady(),
            LeaseLost((1, 1), "gone"),
            CancelRequested((2, 1)),
        ]
        assert inbox.take() == []
        # A post wakes the loop: the pipe is readable until take() drains it.
        inbox.post(CancelRequested((3, 1)))
        assert os.read(inbox.fileno, 1) == b"x"
    finally:
        inbox.close()


def test_a_signal_handler_may_post_while_the_loop_takes() -> None:
    """Signal handlers run in the main thread between two steps of the loop, possibly in
    the middle of ``take()``: posting must never wait on anything the loop holds."""
    inbox = Inbox()
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: inbox.post(StopAsked("SIGUSR1")))
    try:
        posters = [
            threading.Thread(target=lambda: [inbox.post(JobsMayBeReady()) for _ in range(500)])
            for _ in range(2)
        ]
        for poster in posters:
            poster.start()
        taken = []
        for _ in range(50):
            os.kill(os.getpid(), signal.SIGUSR1)
            taken += inbox.take()
        for poster in posters:
            poster.join()
        taken += inbox.take()
        assert taken.count(StopAsked("SIGUSR1")) == 50
    finally:
        signal.signal(signal.SIGUSR1, previous)
        inbox.close()


def test_the_status_board_hands_the_loops_status_to_the_heartbeat() -> None:
    board = StatusBoard()
    assert board.read() == WorkerStatus(state="running", problem="", listening=False)
    board.publish(WorkerStatus(state="stopping", problem="database rounds failing", listening=True))
    assert board.read().state == "stopping"
