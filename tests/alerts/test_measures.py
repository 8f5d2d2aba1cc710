"""What each rule kind measures, against the database (its clock, its indexes)."""

from __future__ import annotations

import pytest

from django_leasejobs.alerts.measures import measure
from django_leasejobs.leases import database_now
from django_leasejobs.models import JobStatus
from tests.alerts.helpers import jobs, rule, worker

pytestmark = pytest.mark.django_db

OTHER_TASK = "tests.tasks.fail"


def measured(*, from_rollups: bool = True, **entry: object) -> float | None:
    return measure(
        rule(**entry),
        backend="default",
        now=database_now(),
        online_after=20,
        using="default",
        from_rollups=from_rollups,
    ).value


# Finished jobs are counted from the rollup table (ROLLUPS, the default) or from the job
# rows (ROLLUPS = False): the same numbers either way.
SOURCES = pytest.mark.parametrize("from_rollups", [True, False], ids=["rollups", "job_rows"])


@SOURCES
def test_failure_rate_counts_the_window_of_the_rules_queue_and_task(from_rollups: bool) -> None:
    jobs(3, JobStatus.FAILED, finished_ago=10)
    jobs(1, JobStatus.DEAD, finished_ago=10)
    jobs(4, JobStatus.SUCCEEDED, finished_ago=10)
    jobs(3, JobStatus.CANCELLED, finished_ago=10)  # neither success nor failure
    jobs(5, JobStatus.FAILED, finished_ago=7200)  # before the window
    jobs(10, JobStatus.FAILED, queue="low", finished_ago=10)  # another queue
    jobs(2, JobStatus.SUCCEEDED, task=OTHER_TASK, finished_ago=10)  # another task

    base = {
        "kind": "failure_rate",
        "threshold": 0.5,
        "window": 600,
        "min_jobs": 5,
        "from_rollups": from_rollups,
    }
    assert measured(**base, queue="default", task="tests.tasks.add") == pytest.approx(4 / 8)
    assert measured(**base, queue="default") == pytest.approx(4 / 10)
    assert measured(**base) == pytest.approx(14 / 20)
    assert measured(**{**base, "window": 3 * 3600}, queue="default") == pytest.approx(9 / 15)
    # Fewer finished jobs than min_jobs: no verdict.
    assert measured(**{**base, "min_jobs": 11}, queue="default") is None
    assert measured(**base, queue="high") is None


@SOURCES
def test_dead_letters_count_the_jobs_dead_within_the_window(from_rollups: bool) -> None:
    jobs(2, JobStatus.DEAD, finished_ago=30)
    jobs(4, JobStatus.DEAD, finished_ago=4000)
    jobs(3, JobStatus.FAILED, finished_ago=30)
    jobs(1, JobStatus.DEAD, queue="low", finished_ago=30)

    assert (
        measured(
            from_rollups=from_rollups, kind="dead_letters", threshold=1, window=600, queue="default"
        )
        == 2
    )
    assert measured(from_rollups=from_rollups, kind="dead_letters", threshold=1, window=600) == 3
    assert (
        measured(
            from_rollups=from_rollups,
            kind="dead_letters",
            threshold=1,
            window=7200,
            queue="default",
        )
        == 6
    )
    assert measured(from_rollups=from_rollups, kind="dead_letters", threshold=1, queue="high") == 0


def test_backlog_counts_ready_jobs_only() -> None:
    jobs(3, JobStatus.PENDING, ready_ago=5)
    jobs(2, JobStatus.PENDING, ready_ago=-600)  # scheduled, not due
    jobs(2, JobStatus.RUNNING)
    jobs(4, JobStatus.PENDING, queue="low", ready_ago=5)
    jobs(1, JobStatus.PENDING, task=OTHER_TASK, ready_ago=5)

    assert measured(kind="backlog", threshold=3, queue="default", task="tests.tasks.add") == 3
    assert measured(kind="backlog", threshold=3, queue="default") == 4
    assert measured(kind="backlog", threshold=3) == 8


def test_oldest_ready_is_the_wait_since_the_oldest_ready_job_became_due() -> None:
    assert measured(kind="oldest_ready", threshold=60, queue="default") == 0
    jobs(1, JobStatus.PENDING, ready_ago=120)
    jobs(1, JobStatus.PENDING, ready_ago=10)
    jobs(1, JobStatus.PENDING, ready_ago=-600)
    jobs(1, JobStatus.PENDING, queue="low", ready_ago=5000)

    waited = measured(kind="oldest_ready", threshold=60, queue="default")
    assert waited is not None and 120 <= waited < 180
    everywhere = measured(kind="oldest_ready", threshold=60)
    assert everywhere is not None and 5000 <= everywhere < 5060


def test_no_worker_counts_online_workers_serving_the_queue() -> None:
    worker("serves-default", ["default"])
    worker("stopped-all", [], stopped=True)
    worker("gone-low", ["low"], seen_ago=3600)
    assert measured(kind="no_worker", queue="low") == 0
    assert measured(kind="no_worker", queue="default") == 1

    worker("serves-every-queue", [])  # an empty list: every queue
    assert measured(kind="no_worker", queue="low") == 1
    assert measured(kind="no_worker", queue="default") == 2
