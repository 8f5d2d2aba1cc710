"""The worker's small parts on their own (issue 27): the lease table the threads share
with the main loop, and the inbox they post to. No database, no processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

from django.db import OperationalError

from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.compat import task_backends
from django_leasejobs.leases import ClaimedJob, Deferred, Progress, WriteResult
from django_leasejobs.worker.execution import Outcome
from django_leasejobs.worker.inbox import (
    CancelRequested,
    Inbox,
    JobsMayBeReady,
    LeaseLost,
    StopAsked,
)
from django_leasejobs.worker.jobs import JobBook, RunningJob
from django_leasejobs.worker.recorder import GIVE_UP_ALONE, ISOLATE_AFTER, Recorder
from django_leasejobs.worker.reporter import Reporter
from django_leasejobs.worker.rounds import Ending, RoundPlan, RoundResult
from django_leasejobs.worker.shared import LeaseTable, StatusBoard, WorkerStatus
from tests.waiting import wait_until

LEASE = 4.0
DEADLINE = LEASE - 1.0
"""The local deadline of a 4 s lease in a table whose margin is 1 s."""
Lease = tuple[int, int]


def test_every_lease_not_presumed_lost_is_renewed_with_its_progress() -> None:
    table = LeaseTable(margin=1.0)
    table.add([(1, 1)], now=100.0, seconds=LEASE)
    table.add([(2, 1)], now=100.0, seconds=LEASE)
    table.add([(3, 1)], now=100.0, seconds=LEASE)
    table.set_progress((1, 1), Progress(0.5, "half"))
    table.recording((2, 1))  # its outcome waits to be written: still renewed
    table.let_go((3, 1))  # presumed lost: never again
    renewals = table.to_renew()
    assert {lease: r.progress for lease, r in renewals.items()} == {
        (1, 1): Progress(0.5, "half"),
        (2, 1): None,
    }
    assert table.being_recorded() == {(2, 1)}
    # (9, 9): gone
    table.renewed({(1, 1): table.generation((1, 1)), (9, 9): 7}, at=105.0, seconds=LEASE)
    assert table.renewed_at((1, 1)) == 105.0
    assert table.renewed_at((2, 1)) == 100.0
    assert table.renewed_at((9, 9)) == 0.0


def test_the_watchdog_reports_a_silent_lease_once_and_never_one_being_recorded() -> None:
    table = LeaseTable(margin=1.0)
    table.add([(1, 1)], now=100.0, seconds=LEASE)
    table.add([(2, 1)], now=100.0, seconds=LEASE)
    table.recording((2, 1))  # a slow write is no fault: the fenced write decides
    assert table.overdue(100.0 + DEADLINE) == []
    [found] = table.overdue(100.0 + DEADLINE + 0.1)
    assert (found.lease, found.kind) == ((1, 1), "lease")
    assert "no successful renewal for 3.1s" in found.detail
    assert table.overdue(200.0) == []  # reported once


def test_a_timeout_counts_from_the_hand_over_to_a_slot() -> None:
    table = LeaseTable(margin=1.0)
    table.add([(1, 1)], now=100.0, seconds=1000.0)
    assert table.overdue(150.0) == []  # waiting for a slot: no clock yet
    table.handed_over((1, 1), now=150.0, timeout=5.0)
    assert table.overdue(155.0) == []
    [found] = table.overdue(155.5)
    assert (found.lease, found.kind, found.detail) == ((1, 1), "timeout", "after 5.5s")
    table.taken_back((1, 1))
    table.remove((1, 1))
    assert len(table) == 0


def test_the_inbox_keeps_the_order_of_messages_and_makes_a_notify_flood_one() -> None:
    inbox = Inbox()
    try:
        for _ in range(1000):
            inbox.post(JobsMayBeReady())
        inbox.post(LeaseLost((1, 1), "gone", 1))
        inbox.post(CancelRequested((2, 1)))
        assert inbox.take() == [
            JobsMayBeReady(),
            LeaseLost((1, 1), "gone", 1),
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
    previous = signal.signal(
        signal.SIGUSR1, lambda signum, frame: inbox.post(StopAsked("SIGUSR1", 0.0))
    )
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
        assert taken.count(StopAsked("SIGUSR1", 0.0)) == 50
    finally:
        signal.signal(signal.SIGUSR1, previous)
        inbox.close()


def test_the_status_board_hands_the_loops_status_to_the_heartbeat() -> None:
    board = StatusBoard()
    assert board.read() == WorkerStatus(state="running", problem="", listening=False)
    board.publish(WorkerStatus(state="stopping", problem="database rounds failing", listening=True))
    assert board.read().state == "stopping"


# -- the recorder: which outcomes a round writes, and what a failed round means -------------


def _recorder() -> tuple[Recorder, JobBook]:
    book = JobBook(LeaseTable(margin=1.0))
    backend = task_backends["default"]
    assert isinstance(backend, LeaseJobsBackend)
    return Recorder(book, Reporter("w", backend), backend.config.retry_backoff), book


def _finished(book: JobBook, recorder: Recorder, job_id: int, now: float) -> RunningJob:
    job = ClaimedJob(
        id=job_id,
        attempt=1,
        task_path="tests.tasks.add",
        queue="default",
        priority=0,
        args=[1, 2],
        kwargs={},
        timeout=None,
        max_attempts=3,
        checkpoint=None,
    )
    running = RunningJob(job=job, task=None, started=now)
    book.add([running], now, LEASE)
    recorder.record(running, Outcome(job.lease, ok=True, result=3))
    return running


def _fail_round(
    recorder: Recorder, plan: RoundPlan, *, skipped: frozenset[Lease] = frozenset()
) -> None:
    recorder.finish(
        plan,
        RoundResult(error=OperationalError("server closed the connection"), skipped=set(skipped)),
    )


def _renew(book: JobBook, *leases: Lease) -> None:
    book.table.renewed(
        {lease: book.table.generation(lease) for lease in leases}, time.monotonic() + 1, LEASE
    )


def test_an_outcome_that_fails_its_rounds_is_written_alone_and_given_up_only_alone() -> None:
    recorder, book = _recorder()
    poison = _finished(book, recorder, 1, time.monotonic())
    innocent = _finished(book, recorder, 2, time.monotonic())
    for _ in range(ISOLATE_AFTER):
        plan = recorder.plan(claim_limit=5)
        assert [r for r, _ in plan.successes] == [poison, innocent] and not plan.alone
        _fail_round(recorder, plan)
    # Without a renewal since, the database may be down: neither is a suspect yet, and
    # neither is tried in a batch again (a suspect never fails a batch of others).
    plan = recorder.plan(claim_limit=5)
    assert (plan.writes, plan.claim_limit) == (0, 5)
    _renew(book, (1, 1), (2, 1))
    # Both together first (after an outage, suspects are innocent): refused again.
    plan = recorder.plan(claim_limit=5)
    assert [r for r, _ in plan.successes] == [poison, innocent]
    assert plan.claim_limit == 0 and not plan.alone
    _fail_round(recorder, plan)
    _renew(book, (1, 1), (2, 1))
    for _ in range(GIVE_UP_ALONE):
        plan = recorder.plan(claim_limit=5)
        assert plan.alone and plan.claim_limit == 0
        assert [r for r, _ in plan.successes] == [poison]
        _fail_round(recorder, plan)
        _renew(book, (1, 1))
    plan = recorder.plan(claim_limit=5)  # the poison is given up, the innocent written alone
    assert recorder.given_up == 1 and (1, 1) not in book.running
    assert "alone" in recorder.problem()
    assert [r for r, _ in plan.successes] == [innocent] and plan.alone
    recorder.finish(plan, RoundResult(wrote_successes=True, statuses={(2, 1): "succeeded"}))
    assert not book.running and not recorder.writes and recorder.given_up == 1


def test_a_round_planned_ahead_takes_no_suspects_only_the_others_and_its_claim() -> None:
    """A round that waits behind another (``driver.MAX_IN_FLIGHT``) leaves suspects for
    a round of their own: what their group's round says is read when that round ends."""
    recorder, book = _recorder()
    suspect = _finished(book, recorder, 1, time.monotonic())
    for _ in range(ISOLATE_AFTER):
        _fail_round(recorder, recorder.plan(claim_limit=5))
    _renew(book, (1, 1))
    fresh = _finished(book, recorder, 2, time.monotonic())
    plan = recorder.plan(claim_limit=5, ahead=True)
    assert [r for r, _ in plan.successes] == [fresh] and plan.claim_limit == 5
    assert [r for r, _ in recorder.writes] == [suspect]
    plan = recorder.plan(claim_limit=5)  # the next round of its own: the suspect, alone
    assert [r for r, _ in plan.successes] == [suspect] and plan.claim_limit == 0


def test_suspects_after_an_outage_are_written_together_and_a_poison_among_them_found() -> None:
    """After an outage every queued outcome failed its rounds: they are all suspects.
    They are written in one group once the database answers, not one per round; with
    one the database refuses among them, groups halve until it is alone."""
    recorder, book = _recorder()
    outcomes = [_finished(book, recorder, job_id, time.monotonic()) for job_id in range(1, 17)]
    leases = [r.job.lease for r in outcomes]
    for _ in range(ISOLATE_AFTER):
        _fail_round(recorder, recorder.plan(claim_limit=5))
    _renew(book, *leases)
    plan = recorder.plan(claim_limit=5)
    assert [r for r, _ in plan.successes] == outcomes and not plan.alone
    recorder.finish(
        plan,
        RoundResult(wrote_successes=True, statuses=dict.fromkeys(leases, "succeeded")),
    )
    assert not book.running and not recorder.writes

    # Again, with job 11 refused whenever it is in the round.
    recorder, book = _recorder()
    outcomes = [_finished(book, recorder, job_id, time.monotonic()) for job_id in range(1, 17)]
    for _ in range(ISOLATE_AFTER):
        _fail_round(recorder, recorder.plan(claim_limit=5))
    rounds = 0
    while recorder.writes and rounds < 40:
        rounds += 1
        _renew(book, *(r.job.lease for r, _ in recorder.writes))
        plan = recorder.plan(claim_limit=5)
        group = [r.job.id for r, _ in plan.successes]
        if 11 in group:
            _fail_round(recorder, plan)
        else:
            statuses = dict.fromkeys(((job_id, 1) for job_id in group), "succeeded")
            recorder.finish(plan, RoundResult(wrote_successes=True, statuses=statuses))
    assert recorder.given_up == 1 and list(book.running) == []
    assert "job 11 attempt 1" in recorder.problem()
    # (One suspect per round, as before, took 17 rounds here: 15 written, 2 refused.)
    assert rounds <= 12, f"{rounds} rounds: the groups did not halve"


def test_a_skipped_or_lost_write_is_no_failure_of_its_own() -> None:
    recorder, book = _recorder()
    running = _finished(book, recorder, 1, time.monotonic())
    for _ in range(ISOLATE_AFTER):
        _fail_round(recorder, recorder.plan(claim_limit=0))
    _renew(book, (1, 1))
    for _ in range(GIVE_UP_ALONE + 2):  # its row locked elsewhere at every try: not refused
        plan = recorder.plan(claim_limit=0)
        assert plan.alone
        _fail_round(recorder, plan, skipped=frozenset({(1, 1)}))
    assert recorder.given_up == 0 and running.failed_alone == 0
    # The database says the lease is gone: the outcome is not written again (the fence
    # would refuse it), its loss is reported, nothing is given up.
    running.lease_gone = True
    assert recorder.plan(claim_limit=0).writes == 0
    assert not book.running and recorder.given_up == 0


def test_rows_written_one_by_one_before_a_connection_error_are_not_written_again() -> None:
    recorder, book = _recorder()
    _finished(book, recorder, 1, time.monotonic())
    _finished(book, recorder, 2, time.monotonic())
    plan = recorder.plan(claim_limit=0)
    # The batch was refused, row 1 was then written alone, and the connection broke.
    result = RoundResult(statuses={(1, 1): "succeeded"}, error=OperationalError("gone"))
    recorder.finish(plan, result)
    assert [r.job.lease for r, _ in recorder.writes] == [(2, 1)]
    assert (1, 1) not in book.running


def test_a_message_about_an_old_entry_does_not_touch_a_new_one() -> None:
    table = LeaseTable(margin=1.0)
    table.add([(1, 1)], now=100.0, seconds=LEASE)
    old = table.generation((1, 1))
    table.remove((1, 1))  # given back unstarted (the attempt is given back too) ...
    table.add([(1, 1)], now=200.0, seconds=LEASE)  # ... and claimed again at the same attempt
    assert table.generation((1, 1)) != old
    table.renewed({(1, 1): old}, at=300.0, seconds=LEASE)  # a renewal of the old entry
    assert table.renewed_at((1, 1)) == 200.0


def _deferred_unknown(
    recorder: Recorder, book: JobBook, job_id: int, task: str, aside: float
) -> None:
    """One job of ``task``, which the worker does not know, given back by a round that
    tells the worker to stand aside from the task for ``aside`` seconds."""
    running = _finished(book, recorder, job_id, time.monotonic())
    recorder.writes.clear()
    running.job = replace(running.job, task_path=task)
    recorder.record(running, Ending("unknown", "no such task"))
    plan = recorder.plan(claim_limit=0)
    assert [r for r, _ in plan.deferrals] == [running]
    lease = running.job.lease
    deferred = Deferred(
        delays={lease: 1.0},
        stand_aside={lease: aside},
        waited={lease: 0.0},
        dead=WriteResult(written={}),
    )
    recorder.finish(plan, RoundResult(deferred=deferred))


def test_the_tasks_a_worker_stands_aside_from_end_each_at_its_time() -> None:
    recorder, book = _recorder()
    assert recorder.skipped_tasks() == ()
    _deferred_unknown(recorder, book, 1, "app.tasks.later", 60.0)
    _deferred_unknown(recorder, book, 2, "app.tasks.brief", 0.2)
    assert recorder.skipped_tasks() == ("app.tasks.brief", "app.tasks.later")
    assert recorder.plan(claim_limit=5).skip_tasks == ("app.tasks.brief", "app.tasks.later")
    wait_until(lambda: recorder.skipped_tasks() == ("app.tasks.later",), timeout=5)
    assert recorder.plan(claim_limit=5).skip_tasks == ("app.tasks.later",)
    # A task met again stands aside for the longer of its two spans.
    _deferred_unknown(recorder, book, 3, "app.tasks.later", 0.1)
    assert recorder.skipped_tasks() == ("app.tasks.later",)
