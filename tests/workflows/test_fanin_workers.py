"""Fan-in counters with real ``runworker`` subprocesses: a wide chord's callback released
once; two members of one counter, or of two counters, ending at the same time in two
workers; a worker SIGKILLed inside the write that counts a counter down, and one
SIGKILLed in the middle of a wide chord's drain.

The width is lowered in the test process, which writes the workflows: the workers only
follow the counters the rows name. Helpers and tasks are those of
``test_workflow_workers.py``.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction

from django_leasejobs.leases import fanin
from django_leasejobs.models import FanIn, Job, JobStatus
from django_leasejobs.testing import run_jobs
from django_leasejobs.workflows import chord, group, step
from tests import tasks_workflow_workers as t
from tests.waiting import wait_until
from tests.worker.test_worker_faults import _kill_leftovers
from tests.worker_harness import Workers
from tests.workflows.test_workflow_workers import (
    _row_held_elsewhere,
    _rows,
    _started_ids,
    _wait_all_succeeded,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _counters(child: int) -> list[int]:
    return list(
        FanIn.objects.filter(child_id=child).order_by("id").values_list("remaining", flat=True)
    )


def _callback_ran_once(marker_dir: str, callback: int) -> list[tuple[str, int, int, int]]:
    runs = t.read_runs(marker_dir)
    assert [(j, a) for _, j, a, _ in runs if j == callback] == [(callback, 1)]
    return runs


def test_a_wide_chord_releases_its_callback_once(workers: Workers, marker_dir: str) -> None:
    members = 200  # FANIN_WIDTH 64: four counters of 50
    flow = chord(
        group(*(step(t.member, marker_dir, n) for n in range(members))),
        step(t.callback, marker_dir),
    ).enqueue()
    ids = [int(s.id) for s in flow.steps]
    callback = ids[-1]
    assert _counters(callback) == [50, 50, 50, 50]
    started = [
        workers.start(args=["--concurrency", "4", "--worker-id", name]) for name in ("w1", "w2")
    ]
    _wait_all_succeeded(ids, timeout=90, what="the wide chord")
    row = Job.objects.get(pk=callback)
    assert (row.attempt, row.waiting_on, row.result) == (1, 0, list(range(members)))
    assert _counters(callback) == [0, 0, 0, 0]
    _callback_ran_once(marker_dir, callback)
    assert _started_ids(*started) == Counter(dict.fromkeys(ids, 1))
    for worker in started:
        worker.terminate()
        assert worker.wait(timeout=15) == 0, worker.output


CHORDS = 60


@pytest.mark.parametrize("counters", ["same", "different"])
def test_two_members_ending_together_in_two_workers_release_once(
    workers: Workers, marker_dir: str, monkeypatch: pytest.MonkeyPatch, counters: str
) -> None:
    # Four members, width 2: counters (0, 1) and (2, 3). The paired members, one per
    # worker (queues "high" and "low"), meet and return together: 2 and 3 share a
    # counter, 1 and 2 count down two counters of the one callback. The others run in
    # either worker (queue "default").
    monkeypatch.setattr(fanin, "FANIN_WIDTH", 2)
    paired = (2, 3) if counters == "same" else (1, 2)
    queue = {paired[0]: "high", paired[1]: "low"}
    flows = []
    for n in range(CHORDS):
        parts = []
        for m in range(4):
            if m in paired:
                side = "a" if m == paired[0] else "b"
                task = t.member.using(queue_name=queue[m])
                parts.append(step(task, marker_dir, 4 * n + m, pair=f"{n}/{side}"))
            else:
                parts.append(step(t.member, marker_dir, 4 * n + m))
        flows.append(chord(group(*parts), step(t.callback, marker_dir)).enqueue())
    callbacks = [int(f.steps[-1].id) for f in flows]
    all_ids = [int(s.id) for f in flows for s in f.steps]
    assert Counter(Job.objects.get(pk=c).waiting_on for c in callbacks) == {2: CHORDS}
    started = [
        workers.start(args=["--concurrency", "2", "--queues", f"{q},default", "--worker-id", side])
        for side, q in (("left", "high"), ("right", "low"))
    ]
    _wait_all_succeeded(all_ids, timeout=90, what="every chord to finish")

    rows = _rows(all_ids)
    gaps = [
        abs(
            (
                rows[int(f.steps[paired[0]].id)].finished_at
                - rows[int(f.steps[paired[1]].id)].finished_at
            ).total_seconds()
        )
        for f in flows
    ]
    assert sum(gap < 0.05 for gap in gaps) >= CHORDS // 4, sorted(gaps)
    for n, (flow, callback) in enumerate(zip(flows, callbacks, strict=True)):
        row = rows[callback]
        assert (row.status, row.attempt, row.waiting_on) == (JobStatus.SUCCEEDED, 1, 0)
        assert row.result == [4 * n + m for m in range(4)]
        assert _counters(callback) == [0, 0]
        assert (
            rows[int(flow.steps[paired[0]].id)].last_worker,
            rows[int(flow.steps[paired[1]].id)].last_worker,
        ) == ("left", "right")
    runs = t.read_runs(marker_dir)
    assert Counter(j for k, j, _, _ in runs if k == "callback") == Counter(
        dict.fromkeys(callbacks, 1)
    )
    assert {a for _, _, a, _ in runs} == {1}
    assert _started_ids(*started) == Counter(dict.fromkeys(all_ids, 1))
    for worker in started:
        worker.terminate()
        assert worker.wait(timeout=15) == 0, worker.output


def test_a_worker_killed_while_it_counts_a_counter_down_loses_no_release(
    workers: Workers, marker_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test holds a counter's row, so the worker's write of its last member's
    success stops inside its transaction, at the counter; the worker is SIGKILLed
    there. Nothing of that transaction stays: the member is reaped and runs again, and
    its success empties the counter and releases the callback, which runs once."""
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("row locks held by another session: PostgreSQL and MySQL/MariaDB")
    monkeypatch.setattr(fanin, "FANIN_WIDTH", 2)
    flow = chord(
        group(*(step(t.increment, marker_dir, n) for n in range(4))),
        step(t.after_parent, marker_dir),
    ).enqueue()
    *members, callback = (int(s.id) for s in flow.steps)
    run_jobs(max_jobs=3)  # in this process: counter (0, 1) empties, (2, 3) keeps one
    last = members[3]
    assert _counters(callback) == [0, 1]
    assert Job.objects.get(pk=callback).waiting_on == 1
    held = FanIn.objects.filter(child_id=callback).order_by("id").values_list("pk", flat=True)[1]
    with transaction.atomic():
        FanIn.objects.select_for_update().get(pk=held)
        first = workers.start(args=["--concurrency", "1", "--worker-id", "first"])
        wait_until(
            lambda: (
                any(j == last for _, j, _, _ in t.read_runs(marker_dir))
                and _row_held_elsewhere(last)
            ),
            timeout=30,
            what="the worker's write of the last member's success to wait for its counter",
        )
        first.kill()
        assert first.wait(timeout=10) == -signal.SIGKILL
        _kill_leftovers(workers, first)
    wait_until(lambda: not _row_held_elsewhere(last), timeout=30, what="the killed session to end")
    assert Job.objects.get(pk=last).status == JobStatus.RUNNING  # rolled back
    assert _counters(callback) == [0, 1]

    second = workers.start(args=["--concurrency", "2", "--worker-id", "second"])
    _wait_all_succeeded([last, callback], timeout=30, what="the member's re-run and the callback")
    rows = _rows([last, callback])
    assert (rows[last].attempt, rows[callback].attempt, rows[callback].waiting_on) == (2, 1, 0)
    assert rows[callback].result == {"parents": [1, 2, 3, 4], "attempt": 1}
    assert _counters(callback) == [0, 0]
    runs = _callback_ran_once(marker_dir, callback)
    assert [(k, j, a) for k, j, a, _ in runs if j == last] == [("step", last, 1), ("step", last, 2)]
    assert _started_ids(second) == Counter({last: 1, callback: 1})
    second.terminate()
    assert second.wait(timeout=15) == 0, second.output


def test_a_worker_killed_in_a_wide_chords_drain_loses_no_release(
    workers: Workers, marker_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker is SIGKILLed once two counters emptied (their commits stay) while it runs
    members (they run again after their leases expire); another worker finishes the
    chord, and the callback runs once."""
    monkeypatch.setattr(fanin, "FANIN_WIDTH", 8)
    members = 80  # ten counters of 8: the first two of fast members, the rest held
    fast = 16
    parts = [
        step(t.increment, marker_dir, n) if n < fast else step(t.held, marker_dir, n)
        for n in range(members)
    ]
    flow = chord(group(*parts), step(t.after_parent, marker_dir)).enqueue()
    ids = [int(s.id) for s in flow.steps]
    callback = ids[-1]
    hold = Path(marker_dir) / t.HOLD
    hold.touch()
    first = workers.start(args=["--concurrency", "2", "--worker-id", "first"])
    wait_until(
        lambda: (
            _counters(callback).count(0) == 2
            and any(k == "held" for k, _, _, _ in t.read_runs(marker_dir))
        ),
        timeout=30,
        what="two counters to empty and the worker to run a held member",
    )
    first.kill()
    assert first.wait(timeout=10) == -signal.SIGKILL
    _kill_leftovers(workers, first)
    hold.unlink()
    assert Job.objects.get(pk=callback).status == JobStatus.WAITING
    assert Job.objects.get(pk=callback).waiting_on == 8
    second = workers.start(args=["--concurrency", "2", "--worker-id", "second"])
    _wait_all_succeeded(ids, timeout=60, what="the rest of the chord")
    row = Job.objects.get(pk=callback)
    assert (row.attempt, row.waiting_on, row.last_worker) == (1, 0, "second")
    assert row.result == {
        "parents": [n + 1 if n < fast else n for n in range(members)],
        "attempt": 1,
    }
    assert _counters(callback) == [0] * 10
    runs = _callback_ran_once(marker_dir, callback)
    assert {a for k, _, a, _ in runs if k == "held"} <= {1, 2}
    second.terminate()
    assert second.wait(timeout=15) == 0, second.output
