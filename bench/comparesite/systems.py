"""One adapter per task system: how bench/compare.py enqueues, runs, claims and inspects it.

Every adapter has the same interface (:class:`System`); what differs between the
systems is in its class attributes and a handful of small methods:

* how jobs are enqueued one by one and in bulk (``enqueue``, ``bulk_enqueue``);
* how the system gets four executors (``drain_fleets``) and two workers for the
  recovery test (``recovery_fleets``): the management commands to start;
* the claim step its worker runs, called in-process (``claimer``);
* which statuses mean active / succeeded / failed, and how to fill its table with
  finished rows in one ``INSERT ... SELECT generate_series`` (``FINISHED_SQL``).

Import this module only after ``django.setup()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any, ClassVar

from django.db import connection, models, transaction
from django.tasks import Task, task_backends

from comparesite import tasks as bench_tasks

SHORT_LEASE_OPTIONS = {"LEASE_DURATION": 2, "HEARTBEAT_INTERVAL": 0.5, "STALE_LOCK_INTERVAL": 0.5}
OX_SHORT_LOCK_TIMEOUT = 2.0
CLAIMER_ID = "bench-claimer"


@dataclass(frozen=True)
class Fleet:
    """One way to run a system's workers: the processes to start for one measurement."""

    label: str
    """Shown in the tables, e.g. ``runworker --concurrency 4 --pool process``."""
    commands: tuple[tuple[str, ...], ...]
    """``manage.py`` arguments, one entry per process the bench starts."""
    claimers: int
    """Distinct worker ids a warm-up must see before the fleet counts as ready."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every process."""
    bound: str = ""
    """Recovery fleets: the worst case after a SIGKILL that the configuration implies."""


@dataclass(frozen=True)
class Counts:
    active: int
    succeeded: int
    failed: int


class System:
    """What every adapter provides. Subclasses fill the class attributes and methods."""

    key: ClassVar[str]
    """TASKS alias and task-name prefix (``comparesite.tasks.<key>_noop``)."""
    name: ClassVar[str]
    """The distribution's name, shown in the tables."""
    active_statuses: ClassVar[tuple[str, ...]]
    succeeded_statuses: ClassVar[tuple[str, ...]]
    failed_statuses: ClassVar[tuple[str, ...]]
    bulk_path: ClassVar[str]
    """How ``bulk_enqueue`` stores many jobs."""
    claim_step: ClassVar[str]
    """The claim step the worker runs, as ``claimer`` calls it."""
    recovery: ClassVar[str]
    """How (and whether) a job of a SIGKILLed worker runs again."""
    executors: ClassVar[str]
    """How the system got its four executors."""
    FINISHED_SQL: ClassVar[str]
    """INSERT of ``%(n)s`` succeeded rows of task ``%(task)s``, finished over 30 days."""

    @property
    def model(self) -> type[models.Model]:
        raise NotImplementedError

    @property
    def version(self) -> str:
        return version(self.name)

    def task(self, kind: str) -> Task:
        """The bench task ``kind`` (noop, stamp, warmup, sleeper) bound to this system."""
        found = getattr(bench_tasks, f"{self.key}_{kind}")
        assert isinstance(found, Task)
        return found

    def tables(self) -> list[str]:
        return [self.model._meta.db_table]

    # -- enqueueing ------------------------------------------------------------------

    def enqueue(self, task: Task, *args: Any) -> str:
        """One ``task.enqueue()`` (autocommit: one transaction); returns the result id."""
        return str(task.enqueue(*args).id)

    def bulk_enqueue(self, task: Task, count: int) -> None:
        raise NotImplementedError

    # -- workers ---------------------------------------------------------------------

    def drain_fleets(self) -> list[Fleet]:
        """Ways to run four executors; the first is the one latency and memory use."""
        raise NotImplementedError

    def recovery_fleets(self) -> list[Fleet]:
        """Two workers each (the SIGKILL test), once per timing configuration."""
        raise NotImplementedError

    # -- reading the table -----------------------------------------------------------

    def counts(self, task: Task) -> Counts:
        """Jobs of ``task`` by outcome, in one aggregate query."""
        rows = self.model._default_manager.filter(task_path=task.module_path)
        totals = rows.aggregate(
            active=models.Count("pk", filter=models.Q(status__in=self.active_statuses)),
            succeeded=models.Count("pk", filter=models.Q(status__in=self.succeeded_statuses)),
            failed=models.Count("pk", filter=models.Q(status__in=self.failed_statuses)),
        )
        return Counts(**totals)

    def warmed_workers(self) -> set[str]:
        """Ids of the workers that finished a warm-up job."""
        raise NotImplementedError

    def return_value(self, task: Task, result_id: str) -> Any:
        return task.get_result(result_id).return_value

    def delete_active(self) -> None:
        """Delete the pending and running rows (the claim measurement's leftovers)."""
        self.model._default_manager.exclude(
            status__in=(*self.succeeded_statuses, *self.failed_statuses)
        ).delete()

    def fill_finished(self, count: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                self.FINISHED_SQL.format(table=connection.ops.quote_name(self.tables()[0])),
                {"n": count, "task": self.task("noop").module_path},
            )

    # -- claiming --------------------------------------------------------------------

    def claimer(self) -> Callable[[], bool]:
        """The worker's claim step for one job, in this process; True when it got one."""
        raise NotImplementedError


# Finished rows: ``t`` runs from 30 days ago to now, one row per step.
_SERIES = (
    "FROM (SELECT now() - interval '30 days' * (1 - i::float8 / %(n)s) AS t "
    "FROM generate_series(1, %(n)s) AS i) AS g"
)


class LeaseJobs(System):
    key = "leasejobs"
    name = "django-leasejobs"
    active_statuses = ("pending", "running")
    succeeded_statuses = ("succeeded",)
    failed_statuses = ("failed", "dead", "cancelled")
    bulk_path = "backend.bulk_enqueue(calls), one transaction"
    claim_step = "leases.claim(limit=1): one UPDATE ... WHERE id IN (SELECT ... SKIP LOCKED)"
    recovery = (
        "lease on the row, renewed by a heartbeat; a reaper in every worker takes expired "
        "leases back"
    )
    executors = "one runworker --concurrency 4 (process pool, and a thread-pool row)"
    FINISHED_SQL = (
        "INSERT INTO {table} (backend, queue, task_path, args, kwargs, priority, run_after, "
        "status, attempt, max_attempts, stall_count, max_stalls, last_worker, "
        "cancel_requested, progress_message, last_error, result, enqueued_at, started_at, "
        "last_attempted_at, finished_at) "
        "SELECT 'leasejobs', 'default', %(task)s, '[]', '{{}}', 0, t, 'succeeded', 1, 3, 0, 3, "
        "'bench-filler', false, '', '', NULL, t, t, t, t + interval '5 milliseconds' " + _SERIES
    )

    @property
    def model(self) -> type[models.Model]:
        from django_leasejobs.models import Job

        return Job

    def tables(self) -> list[str]:
        from django_leasejobs.models import Job, JobAttempt, Worker

        return [Job._meta.db_table, JobAttempt._meta.db_table, Worker._meta.db_table]

    def bulk_enqueue(self, task: Task, count: int) -> None:
        task_backends[self.key].bulk_enqueue([(task, (), {})] * count)

    def drain_fleets(self) -> list[Fleet]:
        return [
            self._runworker("runworker --concurrency 4 --pool process", "process"),
            self._runworker("runworker --concurrency 4 --pool thread", "thread"),
        ]

    def recovery_fleets(self) -> list[Fleet]:
        short = json.dumps(SHORT_LEASE_OPTIONS)
        return [
            self._runworker(
                "2 runworkers, LEASE_DURATION=2, HEARTBEAT_INTERVAL=0.5, STALE_LOCK_INTERVAL=0.5",
                "process",
                workers=2,
                env={"COMPARE_LEASEJOBS_OPTIONS": short},
                bound="≤ 2.5 s (LEASE_DURATION + STALE_LOCK_AGE + STALE_LOCK_INTERVAL), "
                "then the next claim (POLL_INTERVAL 1 s)",
            ),
            self._runworker(
                "2 runworkers, default timings",
                "process",
                workers=2,
                bound="≤ 40 s (30 + 0 + 10), then the next claim (POLL_INTERVAL 1 s)",
            ),
        ]

    def _runworker(
        self,
        label: str,
        pool: str,
        workers: int = 1,
        env: dict[str, str] | None = None,
        bound: str = "",
    ) -> Fleet:
        commands = tuple(
            (
                "runworker",
                *("--backend", self.key, "--concurrency", "4", "--pool", pool),
                *("--worker-id", f"bench-leasejobs-{pool}-{index}"),
            )
            for index in range(workers)
        )
        return Fleet(label, commands, claimers=workers, env=env or {}, bound=bound)

    def warmed_workers(self) -> set[str]:
        rows = self.model._default_manager.filter(
            task_path=self.task("warmup").module_path, status__in=self.succeeded_statuses
        )
        return set(rows.values_list("last_worker", flat=True))

    def claimer(self) -> Callable[[], bool]:
        from django_leasejobs import leases

        def claim() -> bool:
            return bool(
                leases.claim(
                    CLAIMER_ID, limit=1, lease_duration=30, backend=self.key, queues=["default"]
                )
            )

        return claim


class TasksDB(System):
    key = "tasksdb"
    name = "django-tasks-db"
    active_statuses = ("READY", "RUNNING")
    succeeded_statuses = ("SUCCESSFUL",)
    failed_statuses = ("FAILED",)
    bulk_path = "no bulk API: enqueue() N times inside one transaction.atomic()"
    claim_step = (
        "in one transaction: ready()...select_for_update(skip_locked=True).first(), then "
        "DBTaskResult.claim() (an UPDATE)"
    )
    recovery = "none: the row of a killed worker's job stays RUNNING (no lease, no reaper)"
    executors = (
        "4 db_worker processes (a worker runs one task at a time; it has no concurrency option)"
    )
    FINISHED_SQL = (
        "INSERT INTO {table} (id, status, args_kwargs, priority, task_path, queue_name, "
        "backend_name, run_after, enqueued_at, started_at, finished_at, return_value, "
        "exception_class_path, traceback, worker_ids) "
        "SELECT gen_random_uuid(), 'SUCCESSFUL', '{{\"args\": [], \"kwargs\": {{}}}}', 0, "
        "%(task)s, 'default', 'tasksdb', '9999-01-01 00:00:00+00', t, t, "
        "t + interval '5 milliseconds', NULL, '', '', '[\"bench-filler\"]' " + _SERIES
    )

    @property
    def model(self) -> type[models.Model]:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult

    def bulk_enqueue(self, task: Task, count: int) -> None:
        with transaction.atomic():
            for _ in range(count):
                task.enqueue()

    def _db_workers(self, label: str, count: int, bound: str = "") -> Fleet:
        # --verbosity 0: at its default of 1, db_worker logs two INFO lines per task.
        commands = tuple(
            (
                "db_worker",
                *("--backend", self.key, "--queue-name", "default", "--no-reload"),
                *("--worker-id", f"bench-tasksdb-{index}", "--verbosity", "0"),
            )
            for index in range(count)
        )
        return Fleet(label, commands, claimers=count, bound=bound)

    def drain_fleets(self) -> list[Fleet]:
        return [self._db_workers("4 db_worker processes", 4)]

    def recovery_fleets(self) -> list[Fleet]:
        return [
            self._db_workers("2 db_worker processes", 2, bound="never: nothing takes the job back")
        ]

    def warmed_workers(self) -> set[str]:
        rows = self.model._default_manager.filter(
            task_path=self.task("warmup").module_path, status__in=self.succeeded_statuses
        )
        return {ids[-1] for ids in rows.values_list("worker_ids", flat=True) if ids}

    def claimer(self) -> Callable[[], bool]:
        from django_tasks_db.models import DBTaskResult
        from django_tasks_db.utils import exclusive_transaction

        def claim() -> bool:
            # The statements of db_worker's Worker.run(), for one loop iteration.
            ready = DBTaskResult.objects.ready().filter(backend_name=self.key)
            ready = ready.filter(queue_name__in=["default"])
            with exclusive_transaction(ready.db):
                row = ready.get_locked()
                if row is not None:
                    row.claim(CLAIMER_ID)
            return row is not None

        return claim


class Ox(System):
    key = "ox"
    name = "django-ox"
    active_statuses = ("READY", "RUNNING", "WAITING")
    succeeded_statuses = ("SUCCESSFUL",)
    failed_statuses = ("FAILED", "LOST", "DISCARDED")
    bulk_path = "django_ox.bulk.enqueue_many(): bulk_create, 1,000 rows per INSERT"
    claim_step = (
        "Worker.claim_one(): one UPDATE ... WHERE id = (SELECT ... SKIP LOCKED) RETURNING *"
    )
    recovery = (
        "lease (LOCK_TIMEOUT, default 300 s) renewed every LOCK_TIMEOUT / 3; every worker "
        "reaps expired leases every min(30, LOCK_TIMEOUT / 2) s"
    )
    executors = (
        "one ox_worker --concurrency 4 (a thread pool), and a row for --processes 4 "
        "(4 worker processes under its supervisor)"
    )
    FINISHED_SQL = (
        "INSERT INTO {table} (id, task_path, args, kwargs, queue_name, priority, "
        "takes_context, backend_name, status, run_after, attempts, max_attempts, "
        "return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at, "
        "finished_at, lease_epoch) "
        "SELECT gen_random_uuid(), %(task)s, '[]', '{{}}', 'default', 0, false, 'ox', "
        "'SUCCESSFUL', NULL, 1, 3, NULL, '[]', '[\"bench-filler\"]', t, t, t, "
        "t + interval '5 milliseconds', 1 " + _SERIES
    )

    @property
    def model(self) -> type[models.Model]:
        from django_ox.models import OxTask

        return OxTask

    def tables(self) -> list[str]:
        from django_ox.models import OxScheduleTick, OxTask

        return [OxTask._meta.db_table, OxScheduleTick._meta.db_table]

    def bulk_enqueue(self, task: Task, count: int) -> None:
        from django_ox.bulk import enqueue_many

        enqueue_many(task, [((), {})] * count)

    def _ox_worker(
        self, label: str, *flags: str, workers: int = 1, claimers: int = 1, bound: str = ""
    ) -> Fleet:
        command = ("ox_worker", "--backend", self.key, *flags)
        return Fleet(label, (command,) * workers, claimers=claimers, bound=bound)

    def drain_fleets(self) -> list[Fleet]:
        return [
            self._ox_worker("ox_worker --concurrency 4", "--concurrency", "4"),
            self._ox_worker("ox_worker --processes 4", "--processes", "4", claimers=4),
        ]

    def recovery_fleets(self) -> list[Fleet]:
        short = f"{OX_SHORT_LOCK_TIMEOUT:g}"
        return [
            self._ox_worker(
                "2 ox_workers --concurrency 4, default LOCK_TIMEOUT (300 s)",
                *("--concurrency", "4"),
                workers=2,
                claimers=2,
                bound="≈ 300-330 s (LOCK_TIMEOUT, then the next reap, every 30 s)",
            ),
            self._ox_worker(
                f"2 ox_workers --concurrency 4 --lock-timeout {short}",
                *("--concurrency", "4", "--lock-timeout", short),
                workers=2,
                claimers=2,
                bound=f"≈ {OX_SHORT_LOCK_TIMEOUT:g}-{OX_SHORT_LOCK_TIMEOUT + 1:g} s "
                "(LOCK_TIMEOUT, then the next reap, every 1 s)",
            ),
        ]

    def warmed_workers(self) -> set[str]:
        rows = self.model._default_manager.filter(
            task_path=self.task("warmup").module_path, status__in=self.succeeded_statuses
        )
        return {ids[-1] for ids in rows.values_list("worker_ids", flat=True) if ids}

    def claimer(self) -> Callable[[], bool]:
        from django_ox.worker import Worker

        worker = Worker(backend_alias=self.key, queues=["default"], concurrency=1)

        def claim() -> bool:
            return worker.claim_one() is not None

        return claim


SYSTEMS: dict[str, type[System]] = {"leasejobs": LeaseJobs, "tasksdb": TasksDB, "ox": Ox}


def make_systems(keys: Sequence[str]) -> list[System]:
    return [SYSTEMS[key]() for key in keys]
