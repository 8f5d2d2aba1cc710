"""Prometheus metrics (issue 13, point 1): the worker's counters scraped from a real
``runworker --metrics-port`` in both pools must match the database exactly; the view
refuses anyone without the permission or the token and serves the dashboard's numbers;
labels never carry a job id; without the extra, the error names it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import signal
import socket
import sys
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db.models import F, Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from django_leasejobs.checks import E_METRICS_TOKEN, check_metrics_token
from django_leasejobs.leases import database_now
from django_leasejobs.management.commands.runworker import metrics_address
from django_leasejobs.metrics import QueueCollector, WorkerMetrics
from django_leasejobs.models import (
    FINISHED_STATUSES,
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    Schedule,
    Worker,
)
from tests import tasks_metrics
from tests.waiting import wait_until
from tests.worker_harness import REPO_ROOT, Workers

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

TOKEN = "t" * 40
TASKS_MODULE = "tests.tasks_metrics"
JOB_LABELS = {"backend", "queue", "task"}
GIVEN_BACK = re.compile(r"gave back (\d+) prefetched jobs that never started")


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse(response.read().decode())


# --------------------------------------------------------------------------- worker


def enqueue_mix(pool: str) -> int:
    jobs = [tasks_metrics.succeed.enqueue() for _ in range(6)]
    jobs += [tasks_metrics.succeed_async.enqueue() for _ in range(2)]
    jobs += [tasks_metrics.fail.enqueue() for _ in range(2)]
    jobs += [tasks_metrics.fail_then_succeed.enqueue() for _ in range(3)]
    jobs.append(tasks_metrics.lose_lease_then_succeed.enqueue(4.0))
    if pool == "process":  # a killed slot would take a thread pool's worker down with it
        jobs += [tasks_metrics.die_then_succeed.enqueue() for _ in range(2)]
    return len(jobs)


def database_counts() -> dict[str, float]:
    failed_for_good = Job.objects.filter(status__in=[JobStatus.FAILED, JobStatus.DEAD]).count()
    errors = JobAttempt.objects.filter(
        outcome__in=[AttemptOutcome.ERROR, AttemptOutcome.KILLED, AttemptOutcome.TIMEOUT]
    ).count()
    succeeded = Job.objects.filter(status=JobStatus.SUCCEEDED).count()
    return {
        "leasejobs_worker_jobs_started_total": Job.objects.aggregate(n=Sum("attempt"))["n"],
        "leasejobs_worker_jobs_succeeded_total": succeeded,
        "leasejobs_worker_jobs_failed_total": failed_for_good,
        "leasejobs_worker_jobs_retried_total": errors - failed_for_good,
        "leasejobs_worker_jobs_cancelled_total": 0,
        "leasejobs_worker_jobs_lease_lost_total": JobAttempt.objects.filter(
            outcome=AttemptOutcome.LEASE_EXPIRED
        ).count(),
        "leasejobs_worker_jobs_killed_total": JobAttempt.objects.filter(
            outcome__in=[AttemptOutcome.KILLED, AttemptOutcome.TIMEOUT]
        ).count(),
        "leasejobs_worker_job_duration_seconds_count": succeeded + errors,
        "leasejobs_worker_job_start_latency_seconds_count": Job.objects.count(),
    }


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_scraped_worker_metrics_match_the_database(workers: Workers, pool: str) -> None:
    port = free_port()
    worker = workers.start(
        options={"IMPORTS": [TASKS_MODULE]},
        args=["--pool", pool, "--concurrency", "3", "--metrics-port", f"127.0.0.1:{port}"],
    )
    # (start() waited for worker_started: runworker serves the metrics before the worker
    # starts)
    count = enqueue_mix(pool)

    def unfinished() -> str:
        jobs = Job.objects.exclude(status__in=FINISHED_STATUSES)
        rows = jobs.values_list("task_path", "status", "attempt", "locked_by")
        alive = "running" if worker.popen.poll() is None else f"exited {worker.popen.returncode}"
        if worker.popen.poll() is None:  # the stacks of the worker and its slots, in its output
            for pid in [worker.pid, *worker.slot_pids()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
            with contextlib.suppress(AssertionError):
                wait_until(lambda: worker.output.count("most recent call first") >= 4, 5)
        return f"every job finished; unfinished: {list(rows)}; worker {alive}:\n{worker.output}"

    wait_until(
        lambda: Job.objects.filter(status__in=FINISHED_STATUSES).count() == count,
        60,
        what=unfinished,
    )
    expected = database_counts()

    def scraped() -> dict[str, float]:
        samples = scrape(port)
        return {name: total(samples, name) for name in expected}

    with contextlib.suppress(AssertionError):  # the assert below shows the difference
        wait_until(lambda: scraped() == expected, 10)
    assert scraped() == expected
    samples = scrape(port)
    assert expected["leasejobs_worker_jobs_lease_lost_total"] == 1
    assert expected["leasejobs_worker_jobs_killed_total"] == (2 if pool == "process" else 0)
    assert expected["leasejobs_worker_jobs_retried_total"] == (5 if pool == "process" else 3)
    # Every claimed job started, but those given back unstarted (prefetched jobs that
    # waited over 1 s for a slot, on a busy machine): they were claimed again.
    given_back = sum(int(n) for n in GIVEN_BACK.findall(worker.output))
    assert (
        total(samples, "leasejobs_worker_claim_round_jobs_sum")
        == expected["leasejobs_worker_jobs_started_total"] + given_back
    )
    assert total(samples, "leasejobs_worker_heartbeat_duration_seconds_count") > 0
    assert total(samples, "leasejobs_worker_heartbeat_failures_total") == 0
    assert_bounded_labels(samples)
    worker.terminate()
    assert worker.wait(timeout=30) == 0


def assert_bounded_labels(samples: Samples) -> None:
    tasks = {f"{TASKS_MODULE}.{name}" for name in tasks_metrics.__dict__}
    job_ids = {str(pk) for pk in Job.objects.values_list("pk", flat=True)}
    for name, labels in samples:
        found = dict(labels)
        assert set(found) - {"le"} <= JOB_LABELS, (name, found)
        assert found.get("backend", "default") == "default"
        assert found.get("queue", "default") == "default"
        assert found.get("task", f"{TASKS_MODULE}.succeed") in tasks
        assert not job_ids & set(found.values()) - {found.get("le")}, (name, found)


# --------------------------------------------------------------------------- view


@pytest.fixture
def metrics_urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_metrics"


def user_with(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw")
    ours = Permission.objects.filter(content_type__app_label="django_leasejobs")
    user.user_permissions.set(ours.filter(codename__in=codenames))
    return user


def fill_queue() -> None:
    """2 ready (the oldest due 10 minutes ago), 1 scheduled, 2 running (1 past its
    lease), 1 dead, 1 succeeded, 1 cancelled (not a failure); 1 worker online."""
    now = database_now()
    ids = [int(tasks_metrics.succeed.enqueue().id) for _ in range(7)]
    later = tasks_metrics.succeed.using(run_after=now + timedelta(hours=1))
    later.enqueue()
    Job.objects.filter(pk__in=ids[:2]).update(
        status=JobStatus.RUNNING, attempt=1, locked_by="w", locked_until=now + timedelta(hours=1)
    )
    Job.objects.filter(pk=ids[1]).update(locked_until=now - timedelta(minutes=1))
    Job.objects.filter(pk=ids[2]).update(status=JobStatus.DEAD, finished_at=now)
    Job.objects.filter(pk=ids[3]).update(status=JobStatus.SUCCEEDED, finished_at=now)
    Job.objects.filter(pk=ids[4]).update(run_after=F("run_after") - timedelta(minutes=10))
    Job.objects.filter(pk=ids[5]).update(status=JobStatus.CANCELLED, finished_at=now)
    Worker.objects.create(id="w", host="h", pid=1, pool="thread", concurrency=1)


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_urls")
def test_view_refuses_anonymous_and_unauthorised_requests(settings: Any) -> None:
    client = Client()
    anonymous = client.get("/metrics/")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    client.force_login(user_with("nobody", "retry_job"))
    assert client.get("/metrics/").status_code == 403
    # A token when none is configured, and a wrong one, are refused too.
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert Client().get("/metrics/", **bearer).status_code == 403
    settings.LEASEJOBS_METRICS_TOKEN = TOKEN
    wrong = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN[:-1]}x"}
    assert Client().get("/metrics/", **wrong).status_code == 403
    assert Client().get("/metrics/", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 403
    assert Client().get("/metrics/", **bearer).status_code == 200


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_urls")
@pytest.mark.parametrize("how", ["permission", "token"])
def test_view_serves_the_dashboard_numbers(settings: Any, how: str) -> None:
    fill_queue()
    client = Client()
    headers: dict[str, str] = {}
    if how == "token":
        settings.LEASEJOBS_METRICS_TOKEN = TOKEN
        headers["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    else:
        client.force_login(user_with("viewer", "view_job"))
    response = client.get("/metrics/", **headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = parse(response.content.decode())

    def gauge(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    states = {"ready": 2, "scheduled": 1, "running": 2, "dead": 1}
    for state, n in states.items():
        assert gauge("leasejobs_jobs", queue="default", state=state) == n, state
    assert gauge("leasejobs_jobs_lease_expired", queue="default") == 1
    assert gauge("leasejobs_jobs_finished_last_hour", queue="default", status="succeeded") == 1
    assert gauge("leasejobs_jobs_finished_last_hour", queue="default", status="failed") == 1
    assert 599 <= gauge("leasejobs_oldest_ready_job_age_seconds", queue="default") < 900
    assert gauge("leasejobs_workers_online") == 1
    for name, labels in samples:
        assert set(dict(labels)) <= {"queue", "state", "status", "backend"}, name


# --------------------------------------------------------------------------- set-up


def hide_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    for name in [m for m in sys.modules if m.startswith("django_leasejobs.metrics")]:
        monkeypatch.delitem(sys.modules, name)


def test_without_the_extra_the_import_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_prometheus(monkeypatch)
    with pytest.raises(ImproperlyConfigured, match=r"django-leasejobs\[prometheus\]"):
        importlib.import_module("django_leasejobs.metrics")


def test_without_the_extra_runworker_metrics_port_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide_prometheus(monkeypatch)
    with pytest.raises(CommandError, match=r"--metrics-port: .*django-leasejobs\[prometheus\]"):
        call_command("runworker", "--metrics-port", "9100")


def test_a_metrics_port_in_use_stops_the_worker_before_it_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot listen on 127.0.0.1:{port}"):
            call_command("runworker", "--metrics-port", f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("9100", ("0.0.0.0", 9100)),  # noqa: S104 - the default: every interface
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        ("[::1]:1", ("::1", 1)),
    ],
)
def test_metrics_port_accepts_port_or_host_and_port(value: str, address: tuple[str, int]) -> None:
    assert metrics_address(value) == address


@pytest.mark.parametrize("value", ["", "x", "0", "65536", "host:", "host:-1"])
def test_metrics_port_refuses_bad_values(value: str) -> None:
    with pytest.raises(Exception, match="expected PORT or HOST:PORT"):
        metrics_address(value)


@pytest.mark.parametrize("token", ["short", 123, "x" * 31 + " ", "y" * 20 + "\n" + "y" * 20])
def test_check_refuses_a_weak_token(settings: Any, token: Any) -> None:
    settings.LEASEJOBS_METRICS_TOKEN = token
    [error] = check_metrics_token()
    assert isinstance(error, Error)
    assert error.id == E_METRICS_TOKEN == "leasejobs.E016"


def test_check_accepts_no_token_or_a_strong_one(settings: Any) -> None:
    assert list(check_metrics_token()) == []
    settings.LEASEJOBS_METRICS_TOKEN = TOKEN
    assert list(check_metrics_token()) == []


# --------------------------------------------------------------------------- docs

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.mark.django_db
def test_the_grafana_dashboard_and_the_alert_rules_use_only_exported_metrics() -> None:
    families = [*WorkerMetrics().registry.collect(), *QueueCollector().collect()]
    exported = {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}
    dashboard = (REPO_ROOT / "docs" / "grafana-dashboard.json").read_text()
    guide = (REPO_ROOT / "docs" / "monitoring.md").read_text()
    rules = guide.split("## Alert rules", 1)[1].split("## Grafana", 1)[0]
    expressions = [
        target["expr"]
        for panel in json.loads(dashboard)["panels"]
        for target in panel.get("targets", [])
    ]
    for text in [*expressions, rules]:
        used = set(re.findall(r"\bleasejobs_[a-z_]+", text))
        assert used, text
        assert used <= exported, used - exported


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_urls")
def test_view_counts_overdue_schedules(settings: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "django_leasejobs.backend.LeaseJobsBackend",
            "OPTIONS": {
                "SCHEDULES": {
                    "late": {"task": f"{TASKS_MODULE}.succeed", "every": 60},
                    "on-time": {"task": f"{TASKS_MODULE}.succeed", "every": 60},
                    "new": {"task": f"{TASKS_MODULE}.succeed", "every": 60},
                }
            },
        }
    }
    now = database_now()
    for name, last_tick in (("late", now - timedelta(hours=1)), ("on-time", now)):
        Schedule.objects.create(
            backend="default", name=name, task_path=f"{TASKS_MODULE}.succeed", last_tick=last_tick
        )
    settings.LEASEJOBS_METRICS_TOKEN = TOKEN
    response = Client().get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    samples = parse(response.content.decode())
    assert samples[("leasejobs_schedules_overdue", (("backend", "default"),))] == 1
