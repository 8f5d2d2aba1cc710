"""The rollup table (``leasejobs_rollup``): its numbers against the job table's truth after
a mixed run of real workers, concurrent upserts, pruning, the dashboard's trend charts and
the metrics view's rollup gauges."""

from __future__ import annotations

import math
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from django_leasejobs import leases
from django_leasejobs.compat import task_backends
from django_leasejobs.conf import E_BAD_ROLLUP_OPTION, parse_options
from django_leasejobs.histograms import BUCKETS, bucket_of, lower_edge, percentile, upper_edge
from django_leasejobs.leases import RollupKey, Tally
from django_leasejobs.models import (
    ROLLUP_COUNTERS,
    RUN_COLUMNS,
    WAIT_COLUMNS,
    Job,
    JobAttempt,
    JobRollup,
    JobStatus,
)
from django_leasejobs.pruning import prune
from tests import tasks_rollups
from tests.waiting import wait_until
from tests.worker_harness import Workers

DRAIN_TIMEOUT = 120.0
Key = tuple[str, str]
"""(queue, task path)"""


def minute(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def rollup_rows() -> list[dict[str, Any]]:
    return list(JobRollup.objects.filter(backend="default").values())


def rollup_totals() -> dict[Key, Counter[str]]:
    found: dict[Key, Counter[str]] = {}
    for row in rollup_rows():
        counts = found.setdefault((row["queue"], row["task_path"]), Counter())
        for name in ROLLUP_COUNTERS:
            counts[name] += row[name]
        counts["waits"] += sum(row[c] for c in WAIT_COLUMNS)
        counts["runs"] += sum(row[c] for c in RUN_COLUMNS)
    return found


def rollup_per_minute(counter: str) -> Counter[tuple[Key, datetime]]:
    return Counter(
        {
            ((row["queue"], row["task_path"]), minute(row["minute"])): row[counter]
            for row in rollup_rows()
            if row[counter]
        }
    )


def truth_totals() -> dict[Key, Counter[str]]:
    """The job and attempt tables' truth, per queue and task."""
    attempt_rows = Counter(JobAttempt.objects.values_list("job_id", flat=True))
    found: dict[Key, Counter[str]] = {}
    for job in Job.objects.filter(backend="default"):
        counts = found.setdefault((job.queue, job.task_path), Counter())
        counts["enqueued"] += job.attempt >= 1
        counts["started"] += job.attempt
        if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD):
            counts[str(job.status)] += 1
        ended_for_good = job.status in (JobStatus.FAILED, JobStatus.DEAD)
        counts["retried"] += attempt_rows[job.id] - ended_for_good
    return found


def truth_per_minute(status: str) -> Counter[tuple[Key, datetime]]:
    jobs = Job.objects.filter(backend="default", status=status)
    return Counter(((j.queue, j.task_path), minute(j.finished_at)) for j in jobs)


# --------------------------------------------------------------------------- a mixed run


@pytest.mark.django_db(transaction=True)
def test_the_rollup_matches_the_job_table_after_a_mixed_run(workers: Workers) -> None:
    backend = task_backends["default"]
    quick = [(tasks_rollups.quick, (n,), {}) for n in range(40)]
    backend.bulk_enqueue(quick)
    for _ in range(10):
        tasks_rollups.quick.using(queue_name="high").enqueue(0)
    for _ in range(6):
        tasks_rollups.flaky.enqueue()
    for _ in range(4):
        tasks_rollups.broken.using(queue_name="high").enqueue()
    pill = tasks_rollups.kill_worker.using(queue_name="low").enqueue()

    # The pill's worker runs nothing else (its death then loses no count of another job);
    # the other worker runs the rest and reaps the pill (dead: max_stalls=1).
    victim = workers.start(args=["--queues", "low", "--concurrency", "1"])
    survivor = workers.start(args=["--queues", "default,high", "--concurrency", "4"])
    assert victim.wait(timeout=DRAIN_TIMEOUT) == -9

    def drained() -> bool:
        unfinished = Job.objects.exclude(
            status__in=[JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD]
        )
        return not unfinished.exists()

    wait_until(drained, DRAIN_TIMEOUT, what="every job finished")
    survivor.terminate()
    assert survivor.wait(timeout=30) == 0, survivor.output
    assert Job.objects.get(pk=int(pill.id)).status == JobStatus.DEAD

    truth = truth_totals()
    rolled = rollup_totals()
    assert set(rolled) == set(truth)
    # The pill's claim was counted in its worker's memory (written at most
    # ROLLUP_WRITE_EVERY later, or when a claim comes back empty): the SIGKILL lost it,
    # the documented loss window. Its dead letter is the reaper's count: exact.
    pill_key = ("low", tasks_rollups.kill_worker.module_path)
    held = rolled.pop(pill_key)
    assert (held["enqueued"], held["started"], held["waits"], held["dead"]) == (0, 0, 0, 1)
    del truth[pill_key]
    for key, counts in truth.items():
        got = rolled[key]
        for name in ROLLUP_COUNTERS:
            assert got[name] == counts[name], (key, name, got, counts)
        # Every first start has a wait; every attempt a worker recorded has a run time
        # (the reaped pill's has none).
        assert got["waits"] == counts["enqueued"], key
        assert got["runs"] == counts["succeeded"] + counts["failed"] + counts["retried"], key
    assert sum(c["retried"] for c in rolled.values()) == 6 + 4

    for status in ("succeeded", "failed", "dead"):
        assert rollup_per_minute(status) == truth_per_minute(status), status
    enqueued_truth = Counter(
        ((j.queue, j.task_path), minute(j.enqueued_at))
        for j in Job.objects.exclude(pk=int(pill.id))
    )
    assert rollup_per_minute("enqueued") == enqueued_truth

    # The quick jobs run about 50 ms: their run-time median is reported within the
    # histogram's bound (a factor of sqrt(2) of a value in the true median's bucket).
    runs = [0] * BUCKETS
    for row in JobRollup.objects.filter(task_path=tasks_rollups.quick.module_path).values():
        runs = [n + row[c] for n, c in zip(runs, RUN_COLUMNS, strict=True)]
    median = percentile(runs, 0.5)
    assert median is not None and 0.05 / math.sqrt(2) <= median <= 0.5


# --------------------------------------------------------------------------- the upsert


def tally_of(key: RollupKey, n: int) -> Tally:
    tally = Tally()
    tally.count(key, "succeeded", n)
    tally.count(key, "started", n)
    tally.run(key, 0.2)
    return tally


@pytest.mark.django_db(transaction=True)
def test_two_writers_at_once_lose_nothing() -> None:
    now = minute(datetime.now(UTC))
    keys = [RollupKey("default", now - timedelta(minutes=i), "q", f"t{i % 3}") for i in range(6)]
    rounds = 30
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(order: list[RollupKey]) -> None:
        try:
            start.wait()
            for _ in range(rounds):
                tally = Tally()
                for key in order:
                    tally.merge(tally_of(key, 1))
                leases.add_tally(tally, using="default")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=writer, args=(keys,)),
        threading.Thread(target=writer, args=(list(reversed(keys)),)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    rows = {(minute(r["minute"]), r["task_path"]): r for r in rollup_rows()}
    assert len(rows) == len(keys)
    for key in keys:
        row = rows[(key.minute, key.task_path)]
        assert row["succeeded"] == row["started"] == 2 * rounds
        assert row[RUN_COLUMNS[bucket_of(0.2)]] == 2 * rounds


@pytest.mark.django_db
def test_nothing_to_count_sends_nothing(django_assert_num_queries: Any) -> None:
    empty = Tally()
    key = RollupKey("default", minute(datetime.now(UTC)), "q", "t")
    empty.count(key, "started", 1)
    empty.count(key, "started", -1)  # a claim given back unused
    with django_assert_num_queries(0):
        assert leases.add_tally(empty, using="default") == 0


def test_a_duration_falls_in_the_bucket_whose_edges_hold_it_even_at_an_edge() -> None:
    for bucket in range(1, BUCKETS):
        assert bucket_of(lower_edge(bucket)) == bucket
        assert bucket_of(math.nextafter(lower_edge(bucket), 0.0)) == bucket - 1
    assert bucket_of(0.5119999999999999) == 9  # below upper_edge(9), 0.512 (log2 said 10)
    assert bucket_of(-0.001) == 0
    assert bucket_of(math.inf) == BUCKETS - 1
    assert bucket_of(math.nan) == BUCKETS - 1  # (a clock's NaN counts, never raises)


def test_percentiles_stay_within_the_documented_bound() -> None:
    for seconds in (0.0012, 0.05, 0.3, 7.0, 3600.0):
        bucket = bucket_of(seconds)
        assert lower_edge(bucket) <= seconds < upper_edge(bucket)
        counts = [0] * BUCKETS
        counts[bucket] = 1
        reported = percentile(counts, 0.95)
        assert reported is not None
        assert 1 / math.sqrt(2) <= reported / seconds <= math.sqrt(2) * 1.0001, seconds
    assert percentile([0] * BUCKETS, 0.5) is None


# --------------------------------------------------------------------------- options, pruning


def test_rollup_options_are_checked() -> None:
    options, problems = parse_options({"ROLLUPS": False, "ROLLUP_RETENTION": timedelta(days=9)})
    assert not problems
    assert options.rollups is False and options.rollup_retention == 9 * 86400
    assert parse_options({})[0].rollup_retention == 8 * 86400
    for bad in ({"ROLLUPS": "yes"}, {"ROLLUP_RETENTION": 0}, {"ROLLUP_RETENTION": "8d"}):
        _, problems = parse_options(bad)
        assert [p.id for p in problems] == [E_BAD_ROLLUP_OPTION], bad


def add_rows(*ages: timedelta, backend: str = "default", n: int = 1) -> None:
    now = minute(leases.database_now())
    tally = Tally()
    for age in ages:
        key = RollupKey(backend, minute(now - age), "default", "tests.tasks_rollups.quick")
        tally.count(key, "succeeded", n)
        tally.count(key, "failed", n)
        tally.count(key, "enqueued", n)
        tally.wait(key, 0.01 * n)
        tally.run(key, 0.1)
    leases.add_tally(tally, using="default")


@pytest.mark.django_db
def test_prune_deletes_rollup_rows_past_their_retention() -> None:
    add_rows(timedelta(days=9), timedelta(days=8, minutes=5), timedelta(days=7), timedelta(0))
    add_rows(timedelta(days=30), backend="other")
    result = prune(older_than=None, rollup_retention=8 * 86400.0, backend="default", batch_size=1)
    assert result.rollups == 2
    ages = sorted(minute(leases.database_now()) - r["minute"] for r in rollup_rows())
    assert len(ages) == 2 and ages[-1] <= timedelta(days=7, minutes=1)
    assert JobRollup.objects.filter(backend="other").count() == 1  # another backend's


# --------------------------------------------------------------------------- dashboard, metrics


@pytest.mark.django_db
@pytest.mark.parametrize("range_name", ["hour", "day", "week"])
def test_the_dashboard_charts_each_range(range_name: str) -> None:
    add_rows(timedelta(minutes=2), timedelta(hours=5), timedelta(days=3), n=3)
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="pw"))
    response = client.get("/admin/django_leasejobs/job/dashboard/", {"range": range_name})
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-range="{range_name}"' in html
    assert 'aria-current="page"' in html
    expected = {"hour": 3, "day": 6, "week": 9}[range_name]  # the rows within the range
    assert f'<span id="lj-trend-succeeded">{expected}</span>' in html
    assert "succeeded 3, retried 0, failed 3, dead 0</title>" in html
    assert "<polyline" in html and "wait p50" in html
    fragment = client.get(
        "/admin/django_leasejobs/job/dashboard/", {"range": range_name, "fragment": 1}
    )
    assert f'<span id="lj-trend-succeeded">{expected}</span>' in fragment.content.decode()


@pytest.mark.django_db
def test_a_bad_range_shows_the_last_hour_and_text_is_escaped() -> None:
    now = minute(leases.database_now())
    tally = Tally()
    tally.count(RollupKey("default", now, "<q>", "<script>alert(1)</script>"), "succeeded")
    leases.add_tally(tally, using="default")
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="pw"))
    html = client.get("/admin/django_leasejobs/job/dashboard/", {"range": "<x>"}).content.decode()
    assert 'data-range="hour"' in html
    assert "<x>" not in html and "<script>alert" not in html


@pytest.mark.django_db
def test_the_metrics_collector_exports_the_rollup() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from django_leasejobs.metrics import QueueCollector

    add_rows(timedelta(minutes=1), timedelta(minutes=30), n=2)
    registry = CollectorRegistry()
    registry.register(QueueCollector())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    labels = {"backend": "default", "queue": "default", "task": "tests.tasks_rollups.quick"}

    def sample(name: str, **more: str) -> float:
        return samples[(name, tuple(sorted({**labels, **more}.items())))]

    assert sample("leasejobs_rollup_jobs_last_minute", event="succeeded") == 2
    assert sample("leasejobs_rollup_jobs_last_hour", event="succeeded") == 4
    assert sample("leasejobs_rollup_jobs_last_hour", event="failed") == 4
    assert sample("leasejobs_rollup_jobs_last_hour", event="enqueued") == 4
    run = sample("leasejobs_rollup_run_seconds_last_hour", quantile="0.95")
    assert 0.1 / math.sqrt(2) <= run <= 0.1 * math.sqrt(2)
    assert sample("leasejobs_rollup_wait_seconds_last_hour", quantile="0.5") > 0
