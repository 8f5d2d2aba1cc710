"""What holds for a job holds for a workflow step, with real ``runworker`` processes: a
step's timeout stops it and the lease protocol retries it or ends it, and its dependants
follow (released after the retry's success, ended unrun after the final failure); a
group of released steps keeps its concurrency limit across two workers.

The timeout tasks are in tests/tasks_workflow_workers.py (one line per run in
``<marker_dir>/runs``); the limited steps are tests/tasks_flow.py's ``overlap``, whose
start and end lines give the most that ran at once.
"""

from __future__ import annotations

from collections import Counter

import pytest

from django_leasejobs.compat import TaskResultStatus
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.workflows import chain, get_workflow, group, step
from tests import tasks_flow
from tests import tasks_workflow_workers as t
from tests.tasks_worker_flow import read_lines
from tests.waiting import wait_until
from tests.worker.test_worker_flow_control import most_at_once
from tests.worker_harness import Workers, pid_alive
from tests.workflows.test_workflow_workers import _rows, _started_ids, _wait_all_succeeded

pytestmark = pytest.mark.django_db(transaction=True)

TASK_TIMEOUT = "django_leasejobs.exceptions.TaskTimeout"
PARENT_FAILED = "django_leasejobs.exceptions.ParentFailed"


def _attempts(ids: list[int]) -> list[tuple[int, int, str, str]]:
    return list(
        JobAttempt.objects.filter(job_id__in=ids)
        .order_by("id")
        .values_list("job_id", "attempt", "outcome", "error_class")
    )


# ------------------------------------------------------------------ a step's timeout


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_steps_timeout_retries_or_ends_it_and_its_dependants_follow(
    workers: Workers, marker_dir: str, pool: str
) -> None:
    # Two workflows side by side: a step whose first attempt times out and whose retry
    # succeeds, releasing its child; a step with one attempt that times out, ending its
    # child and grandchild unrun.
    retried = chain(
        step(t.overrun_first_attempt, marker_dir), step(t.after_parent, marker_dir)
    ).enqueue()
    failing = chain(
        step(t.always_overrun, marker_dir),
        step(t.after_parent, marker_dir),
        step(t.after_parent, marker_dir),
    ).enqueue()
    parent, child = (int(s.id) for s in retried.steps)
    doomed, *unrun = (int(s.id) for s in failing.steps)
    worker = workers.start(args=["--concurrency", "2", "--pool", pool])

    _wait_all_succeeded([parent, child], timeout=30, what="the retried step and its child")
    wait_until(
        lambda: Job.objects.filter(pk__in=[doomed, *unrun], status=JobStatus.FAILED).count() == 3,
        timeout=30,
        what=lambda: f"the timed-out step and its dependants to fail: {_rows([doomed, *unrun])}",
    )

    rows = _rows([parent, child, doomed, *unrun])
    # The timed-out attempts, as the lease protocol records a timeout: retried once,
    # then (no attempt left) failed for good.
    assert _attempts([parent, child, doomed, *unrun]) in (
        [
            (parent, 1, AttemptOutcome.TIMEOUT, TASK_TIMEOUT),
            (doomed, 1, AttemptOutcome.TIMEOUT, TASK_TIMEOUT),
        ],
        [
            (doomed, 1, AttemptOutcome.TIMEOUT, TASK_TIMEOUT),
            (parent, 1, AttemptOutcome.TIMEOUT, TASK_TIMEOUT),
        ],
    )
    assert (rows[parent].status, rows[parent].attempt, rows[parent].result) == (
        JobStatus.SUCCEEDED,
        2,
        2,
    )
    assert (rows[child].attempt, rows[child].waiting_on) == (1, 0)
    assert rows[child].result == {"parents": [2], "attempt": 1}
    assert (rows[doomed].status, rows[doomed].attempt) == (JobStatus.FAILED, 1)
    assert rows[doomed].last_error.startswith(TASK_TIMEOUT)
    assert [(rows[i].status, rows[i].attempt) for i in unrun] == [(JobStatus.FAILED, 0)] * 2
    assert f"parent step #{doomed} (tests.tasks_workflow_workers.always_overrun) ended failed" in (
        rows[unrun[0]].last_error
    )
    assert f"parent step #{unrun[0]} (tests.tasks_workflow_workers.after_parent) ended failed" in (
        rows[unrun[1]].last_error
    )

    # Each timed-out attempt was stopped: the process pool killed its slot, a thread saw
    # its lease lost and returned (its late success refused by the fence).
    timed_out = {
        (job_id, pid)
        for kind, job_id, attempt, pid in t.read_runs(marker_dir)
        if kind == "overrun" and attempt == 1
    }
    assert {job_id for job_id, _ in timed_out} == {parent, doomed}
    if pool == "process":
        wait_until(
            lambda: not any(pid_alive(pid) for _, pid in timed_out),
            timeout=5,
            what=f"the timed-out attempts' slots to be gone: {timed_out}",
        )
        assert worker.pid not in {pid for _, pid in timed_out}
    else:
        assert {pid for _, pid in timed_out} == {worker.pid}
        wait_until(
            lambda: (
                {(j, a) for k, j, a, _ in t.read_runs(marker_dir) if k == "stopped"}
                == {(parent, 1), (doomed, 1)}
            ),
            timeout=10,
            what="both timed-out threads to see their attempt stopped",
        )

    # The child ran once, after the retry; the dependants of the failed step never ran.
    runs = [
        (kind, job_id, attempt)
        for kind, job_id, attempt, _ in t.read_runs(marker_dir)
        if kind != "stopped"
    ]
    assert [r for r in runs if r[1] in (parent, child)] == [
        ("overrun", parent, 1),
        ("overrun", parent, 2),
        ("child", child, 1),
    ]
    assert [r for r in runs if r[1] not in (parent, child)] == [("overrun", doomed, 1)]
    assert _started_ids(worker) == Counter({parent: 2, child: 1, doomed: 1})

    assert get_workflow(retried.id).status == TaskResultStatus.SUCCESSFUL
    failed = get_workflow(failing.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.steps[0].errors] == [TASK_TIMEOUT]
    assert [e.exception_class_path for s in failed.steps[1:] for e in s.errors] == [
        PARENT_FAILED
    ] * 2
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.output


# -------------------------------------------------- flow limits of released steps

MEMBERS = 6
HOLD = 0.3


@pytest.mark.parametrize("limit", ["task", "queue"])
def test_released_steps_keep_a_concurrency_limit_of_two_across_two_workers(
    workers: Workers, marker_dir: str, limit: str
) -> None:
    # One parent releases six steps at once, limited to two running at a time by their
    # task's concurrency_limit or by their queue's QUEUE_LIMITS entry; two workers (one
    # per pool) with four slots each could run all six together. Each step holds its slot
    # HOLD seconds, so steps the limit let through would overlap.
    member, options = tasks_flow.overlap, {"QUEUE_LIMITS": {"low": 2}}
    if limit == "task":
        member, options = tasks_flow.overlap.using(concurrency_limit=2), {}
    flow = chain(
        step(tasks_flow.plain, 0),
        group(*(step(member, marker_dir, "g", HOLD) for _ in range(MEMBERS))),
    ).enqueue()
    parent, *members = (int(s.id) for s in flow.steps)
    rows = _rows(members)
    assert {(rows[m].status, rows[m].waiting_on) for m in members} == {(JobStatus.WAITING, 1)}
    if limit == "task":
        assert {rows[m].flow_group for m in members} == {"task:tests.tasks_flow.overlap"}

    for pool in ("process", "thread"):
        workers.start(
            options=options,
            args=["--queues", "low,default", "--concurrency", "4", "--pool", pool],
        )
    _wait_all_succeeded([parent, *members], timeout=60, what="the parent and its limited steps")

    lines = read_lines(marker_dir, "overlap.log")
    assert len(lines) == 2 * MEMBERS
    # Never more than two at once, and two at once did happen: the limit, not a lack of
    # slots or of released work, is what held the others back.
    assert most_at_once(lines) == {"g": 2}
    # Released by the parent's success (database clock): none started before it ended.
    rows = _rows([parent, *members])
    finished = rows[parent].finished_at
    assert finished is not None
    assert all(rows[m].started_at >= finished for m in members), [
        (rows[m].started_at, finished) for m in members
    ]
    assert {rows[m].attempt for m in members} == {1}
