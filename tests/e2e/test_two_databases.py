"""Two backends on two databases: queues split across servers by ``TASKS`` aliases.

``alpha`` keeps its jobs in ``default``, ``beta`` in ``leasejobs_second`` (tests/settings.py:
a real second database on the same server, or a second SQLite file), each with its own
``runworker --backend`` subprocesses. Nothing of one backend may show up in, or be done
by, the other: enqueue, bulk enqueue, dedup keys, results, claims, the worker registry,
recovery after SIGKILL, the commands and an operator's cancel and retry. The two
databases' id sequences are independent, so the same job id exists in both: every read
and write must go through the backend's database, never find "a job 1" elsewhere.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.urls import reverse

from django_leasejobs import leases
from django_leasejobs.compat import TaskResultDoesNotExist, task_backends
from django_leasejobs.conf import BACKEND_PATH
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus, Schedule
from django_leasejobs.models import Worker as WorkerRow
from tests.tasks_worker_shutdown import record_job, wait_for_go
from tests.waiting import wait_until
from tests.worker_harness import FAST_OPTIONS

SECOND = "leasejobs_second"
pytestmark = pytest.mark.django_db(
    transaction=True, reset_sequences=True, databases=["default", SECOND]
)

TASKS: dict[str, Any] = {
    "default": {"BACKEND": BACKEND_PATH, "QUEUES": ["default"], "OPTIONS": {}},
    "alpha": {
        "BACKEND": BACKEND_PATH,
        "QUEUES": ["default"],
        "OPTIONS": {**FAST_OPTIONS, "DATABASE": "default"},
    },
    "beta": {
        "BACKEND": BACKEND_PATH,
        "QUEUES": ["default"],
        "OPTIONS": {**FAST_OPTIONS, "DATABASE": SECOND},
    },
}
DATABASE = {"alpha": "default", "beta": SECOND}

two_backends = override_settings(TASKS=TASKS)


@pytest.fixture(autouse=True)
def _two_backends() -> Any:
    with two_backends:
        yield


def jobs(alias: str) -> Any:
    return Job.objects.using(DATABASE[alias])


def start_worker(workers: Any, alias: str, *args: str) -> Any:
    """``runworker --backend alias`` in a subprocess that has both backends in TASKS."""
    return workers.start(
        args=["--backend", alias, "--worker-id", f"{alias}-worker", *args],
        env={"LEASEJOBS_TEST_TASKS": json.dumps(TASKS)},
    )


def runs(marker_dir: str, name: str) -> list[tuple[int, int]]:
    """``(job id, attempt)`` of every run ``record_job``/``wait_for_go`` recorded."""
    path = Path(marker_dir) / f"{name}.runs"
    if not path.exists():
        return []
    return [
        (int(a), int(b))
        for a, b, _ in (line.split() for line in path.read_text().split("\n") if line)
    ]


def test_the_second_alias_is_a_database_of_its_own() -> None:
    """The premise: two databases, not two names of one."""
    default, second = connections["default"].settings_dict, connections[SECOND].settings_dict
    assert default["NAME"] != second["NAME"]
    Job.objects.using("default").create(task_path="tests.tasks.add", args=[1, 2])
    assert Job.objects.using(SECOND).count() == 0


def test_enqueue_bulk_enqueue_and_results_stay_in_the_backends_database(marker_dir: str) -> None:
    a = record_job.using(backend="alpha").enqueue(marker_dir, "alpha")
    b = record_job.using(backend="beta").enqueue(marker_dir, "beta")
    assert (a.backend, b.backend) == ("alpha", "beta")
    # Independent sequences: the first job of each database has the same id.
    assert a.id == b.id
    assert list(jobs("alpha").values_list("backend", flat=True)) == ["alpha"]
    assert list(jobs("beta").values_list("backend", flat=True)) == ["beta"]

    bulk = task_backends["beta"].bulk_enqueue(
        [(record_job.using(backend="beta"), (marker_dir, "beta"), {}) for _ in range(5)]
    )
    assert len(bulk) == 5
    assert jobs("beta").count() == 6 and jobs("alpha").count() == 1
    assert set(jobs("beta").values_list("backend", flat=True)) == {"beta"}

    # get_result reads the backend's own database: the same id is two different jobs.
    assert task_backends["alpha"].get_result(a.id).args == [marker_dir, "alpha"]
    assert task_backends["beta"].get_result(b.id).args == [marker_dir, "beta"]
    last = bulk[-1].id
    assert task_backends["beta"].get_result(last).status.name == "READY"
    with pytest.raises(TaskResultDoesNotExist):  # alpha's database has no such job
        task_backends["alpha"].get_result(last)


def test_dedup_keys_are_per_database(marker_dir: str) -> None:
    a1 = record_job.using(backend="alpha", key="nightly").enqueue(marker_dir, "alpha")
    a2 = record_job.using(backend="alpha", key="nightly").enqueue(marker_dir, "alpha")
    b1 = record_job.using(backend="beta", key="nightly").enqueue(marker_dir, "beta")
    b2 = record_job.using(backend="beta", key="nightly").enqueue(marker_dir, "beta")
    assert a1.id == a2.id and b1.id == b2.id
    assert jobs("alpha").filter(key="nightly").count() == 1
    assert jobs("beta").filter(key="nightly").count() == 1
    # Keyed calls in a bulk enqueue, too.
    (b3,) = task_backends["beta"].bulk_enqueue(
        [(record_job.using(backend="beta", key="nightly"), (marker_dir, "beta"), {})]
    )
    assert b3.id == b1.id and jobs("beta").count() == 1


def test_each_backends_workers_run_only_its_jobs(workers: Any, marker_dir: str) -> None:
    alpha_ids = [
        int(record_job.using(backend="alpha").enqueue(marker_dir, "alpha").id) for _ in range(6)
    ]
    beta_ids = [
        int(r.id)
        for r in task_backends["beta"].bulk_enqueue(
            [(record_job.using(backend="beta"), (marker_dir, "beta"), {}) for _ in range(8)]
        )
    ]
    alpha = start_worker(workers, "alpha", "--pool", "thread", "--concurrency", "2")
    wait_until(
        lambda: jobs("alpha").filter(status=JobStatus.SUCCEEDED).count() == 6,
        what="alpha's jobs done",
    )
    # Alpha's worker has drained its database and never touched beta's.
    assert sorted(j for j, _ in runs(marker_dir, "alpha")) == sorted(alpha_ids)
    assert runs(marker_dir, "beta") == []
    assert set(jobs("beta").values_list("status", flat=True)) == {JobStatus.PENDING}
    assert not jobs("beta").exclude(locked_by=None).exists()

    beta = start_worker(workers, "beta", "--pool", "thread", "--concurrency", "2")
    wait_until(
        lambda: jobs("beta").filter(status=JobStatus.SUCCEEDED).count() == 8,
        what="beta's jobs done",
    )
    assert sorted(j for j, _ in runs(marker_dir, "beta")) == sorted(beta_ids)
    assert set(jobs("beta").values_list("last_worker", flat=True)) == {"beta-worker"}
    assert set(jobs("alpha").values_list("last_worker", flat=True)) == {"alpha-worker"}

    # Each worker's registry row lives in its own database only.
    assert list(WorkerRow.objects.using("default").values_list("id", flat=True)) == ["alpha-worker"]
    assert list(WorkerRow.objects.using(SECOND).values_list("id", flat=True)) == ["beta-worker"]

    # Jobs enqueued while both run go to their own workers.
    late_a = int(record_job.using(backend="alpha").enqueue(marker_dir, "alpha-late").id)
    late_b = int(record_job.using(backend="beta").enqueue(marker_dir, "beta-late").id)
    wait_until(
        lambda: (
            jobs("alpha").get(pk=late_a).status == JobStatus.SUCCEEDED
            and jobs("beta").get(pk=late_b).status == JobStatus.SUCCEEDED
        ),
        what="the late jobs done",
    )
    assert jobs("alpha").get(pk=late_a).last_worker == "alpha-worker"
    assert jobs("beta").get(pk=late_b).last_worker == "beta-worker"

    for worker in (alpha, beta):
        worker.terminate()
        assert worker.wait(timeout=20) == 0, worker.output


@pytest.fixture
def manage(run_manage: Any, subprocess_env: dict[str, str]) -> Any:
    """``manage(*args)``: ``manage.py`` in a subprocess that has both backends in TASKS."""
    env = {**subprocess_env, "LEASEJOBS_TEST_TASKS": json.dumps(TASKS)}
    return lambda *args: run_manage(list(args), env=env)


def _now(alias: str) -> Any:
    return leases.database_now(alias)


def _hold_and_kill(workers: Any, marker_dir: str) -> int:
    """An alpha job whose worker was SIGKILLed mid-attempt (and beta's job of the same id)."""
    a = int(wait_for_go.using(backend="alpha").enqueue(marker_dir, "held").id)
    b = int(record_job.using(backend="beta").enqueue(marker_dir, "beta").id)
    assert a == b
    worker = start_worker(workers, "alpha", "--pool", "thread", "--no-scheduler")
    wait_until(lambda: (Path(marker_dir) / "held.started").exists(), what="the job started")
    worker.kill()
    worker.wait(timeout=10)
    assert jobs("alpha").get(pk=a).status == JobStatus.RUNNING
    return a


def test_a_killed_workers_job_is_recovered_in_its_own_database(
    workers: Any, marker_dir: str, manage: Any
) -> None:
    a = _hold_and_kill(workers, marker_dir)
    wait_until(
        lambda: jobs("alpha").filter(pk=a, locked_until__lt=_now("default")).exists(),
        timeout=15,
        what="alpha's lease expired",
    )
    # Beta's reaper looks at beta's database: nothing stale there, its job untouched.
    reaped = manage("reap_stale_locks", "--backend", "beta")
    assert reaped.returncode == 0, reaped.stderr
    assert "count=0" in reaped.stdout
    assert jobs("alpha").get(pk=a).status == JobStatus.RUNNING

    reaped = manage("reap_stale_locks", "--backend", "alpha")
    assert reaped.returncode == 0, reaped.stderr
    assert "count=1" in reaped.stdout
    job = jobs("alpha").get(pk=a)
    assert (job.status, job.stall_count) == (JobStatus.PENDING, 1)
    assert list(
        JobAttempt.objects.using("default").filter(job_id=a).values_list("attempt", "outcome")
    ) == [(1, AttemptOutcome.LEASE_EXPIRED)]
    assert not JobAttempt.objects.using(SECOND).exists()
    assert jobs("beta").get(pk=a).status == JobStatus.PENDING

    # A new worker of alpha runs attempt 2; beta's job still waits for beta's workers.
    (Path(marker_dir) / "held.go").touch()
    again = start_worker(workers, "alpha", "--pool", "thread", "--no-scheduler")
    wait_until(lambda: jobs("alpha").get(pk=a).status == JobStatus.SUCCEEDED, what="attempt 2 done")
    assert runs(marker_dir, "held") == [(a, 2)]
    assert jobs("beta").get(pk=a).status == JobStatus.PENDING
    again.terminate()
    assert again.wait(timeout=20) == 0, again.output


def test_a_workers_own_reaper_recovers_its_databases_jobs_only(
    workers: Any, marker_dir: str
) -> None:
    a = _hold_and_kill(workers, marker_dir)
    # Beta's job of the same id, "held" by a dead worker whose lease is long gone.
    jobs("beta").filter(pk=a).update(
        status=JobStatus.RUNNING,
        attempt=1,
        locked_by="gone",
        locked_until=_now(SECOND) - timedelta(minutes=5),
    )
    (Path(marker_dir) / "held.go").touch()
    again = start_worker(workers, "alpha", "--pool", "thread", "--no-scheduler")
    wait_until(
        lambda: jobs("alpha").get(pk=a).status == JobStatus.SUCCEEDED,
        timeout=30,
        what="alpha's own reaper and attempt 2",
    )
    assert runs(marker_dir, "held") == [(a, 2)]
    # Beta's expired job is for beta's reapers: alpha's worker never saw it.
    assert jobs("beta").get(pk=a).status == JobStatus.RUNNING
    assert not JobAttempt.objects.using(SECOND).exists()
    again.terminate()
    assert again.wait(timeout=20) == 0, again.output


def test_status_and_prune_read_and_delete_in_the_backends_database(
    marker_dir: str, manage: Any
) -> None:
    for _ in range(2):
        record_job.using(backend="alpha").enqueue(marker_dir, "alpha")
    for _ in range(3):
        record_job.using(backend="beta").enqueue(marker_dir, "beta")
    jobs("beta").filter(pk=1).update(status=JobStatus.DEAD, finished_at=_now(SECOND))

    def totals(alias: str) -> dict[str, Any]:
        done = manage("leasejobs_status", "--backend", alias, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["totals"]

    alpha, beta = totals("alpha"), totals("beta")
    assert (alpha["ready"], alpha["dead"]) == (2, 0)
    assert (beta["ready"], beta["dead"]) == (2, 1)
    probe = manage("leasejobs_status", "--backend", "beta", "--max-dead", "0")
    assert probe.returncode == 1 and "1 dead letters" in probe.stderr
    assert manage("leasejobs_status", "--backend", "alpha", "--max-dead", "0").returncode == 0

    # Finished long ago in both databases, ids overlapping: each prune deletes its own.
    old = _now("default") - timedelta(days=30)
    for alias in ("alpha", "beta"):
        jobs(alias).update(status=JobStatus.SUCCEEDED, finished_at=old)
    pruned = manage("prune_jobs", "--backend", "beta", "--older-than", "7d")
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned finished jobs count=3" in pruned.stdout
    assert jobs("beta").count() == 0 and jobs("alpha").count() == 2


def test_cancel_and_retry_go_to_the_backends_database(marker_dir: str) -> None:
    a = int(record_job.using(backend="alpha").enqueue(marker_dir, "alpha").id)
    b = int(record_job.using(backend="beta").enqueue(marker_dir, "beta").id)
    assert a == b
    assert leases.cancel(b, backend="beta") == leases.CancelResult.CANCELLED
    assert jobs("beta").get(pk=b).status == JobStatus.CANCELLED
    assert jobs("alpha").get(pk=a).status == JobStatus.PENDING

    jobs("alpha").filter(pk=a).update(status=JobStatus.FAILED, attempt=1, max_attempts=1)
    assert leases.retry(a, backend="alpha") == leases.RetryResult.RETRIED
    assert jobs("alpha").get(pk=a).status == JobStatus.PENDING
    assert jobs("beta").get(pk=b).status == JobStatus.CANCELLED
    # beta's job is cancelled, not failed: nothing to retry there.
    assert leases.retry(b, backend="beta") != leases.RetryResult.RETRIED


def test_the_admin_lists_the_jobs_of_the_default_routers_database(
    admin_client: Any, marker_dir: str
) -> None:
    """Documented limit: without a database router, the admin reads ``default`` only."""
    record_job.using(backend="alpha").enqueue(marker_dir, "alpha")
    for _ in range(3):
        record_job.using(backend="beta").enqueue(marker_dir, "beta")
    response = admin_client.get(reverse("admin:django_leasejobs_job_changelist"))
    assert response.status_code == 200
    listed = response.context["cl"].result_list
    assert [job.backend for job in listed] == ["alpha"]
    dashboard = admin_client.get(reverse("admin:django_leasejobs_queuedashboard_changelist"))
    assert dashboard.status_code == 200
    assert dashboard.context["totals"].ready == 1


class LeaseJobsReadsFromSecond:
    """A database router that sends the app's reads (so the admin's) to the second database."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return SECOND if model._meta.app_label == "django_leasejobs" else None


@override_settings(DATABASE_ROUTERS=[f"{__name__}.LeaseJobsReadsFromSecond"])
def test_a_router_points_the_admin_at_another_database(admin_client: Any, marker_dir: str) -> None:
    a = int(record_job.using(backend="alpha").enqueue(marker_dir, "alpha").id)
    for _ in range(3):
        record_job.using(backend="beta").enqueue(marker_dir, "beta")
    changelist = reverse("admin:django_leasejobs_job_changelist")
    response = admin_client.get(changelist)
    assert response.status_code == 200
    assert {job.backend for job in response.context["cl"].result_list} == {"beta"}
    assert len(response.context["cl"].result_list) == 3
    dashboard = admin_client.get(reverse("admin:django_leasejobs_queuedashboard_changelist"))
    assert dashboard.context["totals"].ready == 3
    detail = admin_client.get(reverse("admin:django_leasejobs_job_change", args=[a]))
    assert detail.status_code == 200 and detail.context["original"].backend == "beta"

    # An action on beta's job (the same id as alpha's) writes to beta's database.
    response = admin_client.post(
        changelist, {"action": "cancel_jobs", "_selected_action": [a]}, follow=True
    )
    assert response.status_code == 200
    assert jobs("beta").get(pk=a).status == JobStatus.CANCELLED
    assert jobs("alpha").get(pk=a).status == JobStatus.PENDING


def test_a_transaction_covers_one_database_only(marker_dir: str) -> None:
    """``atomic()`` on default does not hold back a job enqueued to beta's database;
    ``atomic(using=...)`` on beta's alias, or ``on_commit`` of default, does."""
    with pytest.raises(RuntimeError), transaction.atomic():
        record_job.using(backend="alpha").enqueue(marker_dir, "alpha")
        record_job.using(backend="beta").enqueue(marker_dir, "beta")
        raise RuntimeError("roll back")
    assert jobs("alpha").count() == 0
    assert jobs("beta").count() == 1  # committed on its own: two databases, two transactions

    with pytest.raises(RuntimeError), transaction.atomic(using=SECOND):
        record_job.using(backend="beta").enqueue(marker_dir, "beta")
        raise RuntimeError("roll back")
    assert jobs("beta").count() == 1

    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(lambda: record_job.using(backend="beta").enqueue(marker_dir, "beta"))
        raise RuntimeError("roll back")
    assert jobs("beta").count() == 1
    with transaction.atomic():
        transaction.on_commit(lambda: record_job.using(backend="beta").enqueue(marker_dir, "beta"))
    assert jobs("beta").count() == 2


def test_the_admin_schedules_follow_their_backends_database(admin_client: Any) -> None:
    """Beta's schedule: its state row in beta's database (created by the admin's visit),
    in the dashboard's next runs (one overview per backend), not in the schedule list
    (which reads the routed database, default)."""
    tasks = {
        **TASKS,
        "beta": {
            **TASKS["beta"],
            "OPTIONS": {
                **TASKS["beta"]["OPTIONS"],
                "SCHEDULES": {"beta-hourly": {"task": "tests.tasks.add", "every": 3600}},
            },
        },
    }
    with override_settings(TASKS=tasks):
        listed = admin_client.get(reverse("admin:django_leasejobs_schedule_changelist"))
        assert listed.status_code == 200
        assert list(listed.context["cl"].result_list) == []
        dashboard = admin_client.get(reverse("admin:django_leasejobs_queuedashboard_changelist"))
        assert [run.view.name for run in dashboard.context["schedules"].next_runs] == [
            "beta-hourly"
        ]
    assert list(Schedule.objects.using(SECOND).values_list("backend", "name")) == [
        ("beta", "beta-hourly")
    ]
    assert not Schedule.objects.using("default").exists()
