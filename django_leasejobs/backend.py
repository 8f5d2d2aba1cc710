"""``LeaseJobsBackend``: the django.tasks backend that stores jobs in the site's database."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from . import leases, registry, tracing
from .canvas import GraphStep
from .compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    must_send,
    task_enqueued,
)
from .conf import E_APP_NOT_INSTALLED, E_UNKNOWN_DATABASE, Options, Problem, parse_options
from .exceptions import InvalidTaskArguments, WorkflowDoesNotExist
from .lease_task import LeaseTask
from .leases import NewJob
from .limits import key_group, task_group
from .models import APP_LABEL, Job, JobAttempt, JobStatus, Workflow
from .results import (
    STATUS_TO_RESULT,
    LeaseTaskResult,
    attempt_history,
    task_as_enqueued,
    task_error,
)
from .retry import Backoff
from .serialization import json_arguments, json_value
from .signals import job_enqueued
from .workflow_results import WorkflowResult, workflow_status

logger = logging.getLogger("django_leasejobs")

NOTIFY_CHANNEL = leases.NOTIFY_CHANNEL

TaskCall = tuple[Task, Sequence[Any], Mapping[str, Any]]


def _task_options(task: Task) -> dict[str, Any] | None:
    """What ``Job.task_options`` keeps of ``task``: the options it set that no other column
    keeps exactly (None when it set none)."""
    options: dict[str, Any] = {}
    if task.run_after is not None:
        options["run_after"] = task.run_after.isoformat()
    for name in (
        "max_attempts",
        "max_stalls",
        "concurrency_limit",
        "rate_limit",
        "unique_for",
        "debounce",
        "result_ttl",
    ):
        value = getattr(task, name, None)
        if value is not None:
            options[name] = value
    key = getattr(task, "concurrency_key", None)
    if isinstance(key, str):  # a callable cannot be stored: the declared task keeps it
        options["concurrency_key"] = key
    return options or None


def _metadata(task: Task, using: str) -> dict[str, Any] | None:
    """The task's ``using(metadata=...)`` as stored: a checked JSON copy (None: none)."""
    metadata = getattr(task, "metadata", None)
    if metadata is None:
        return None
    checked: dict[str, Any] = json_value(dict(metadata), "metadata", using=using)
    return checked


def _result_ttl(task: Task) -> timedelta | None:
    """``Job.result_ttl`` for a job of ``task``: its own retention, if it has one."""
    seconds = getattr(task, "result_ttl", None)
    return None if seconds is None else timedelta(seconds=seconds)


def _storable_run_after(run_after: datetime | None) -> datetime | None:
    """``run_after`` as every database stores it: naive local time when USE_TZ is off."""
    if run_after is not None and not settings.USE_TZ and timezone.is_aware(run_after):
        return timezone.make_naive(run_after)
    return run_after


def task_field_problem(task: Task) -> str:
    """Why the task's priority, run_after or queue_name cannot be stored ('' if they can).

    Checked before Django's own validation, which assumes the right types (a string
    priority would raise TypeError there, a string run_after AttributeError).
    """
    priority = task.priority
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int | float)
        or not math.isfinite(priority)
        or int(priority) != priority
        or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY
    ):
        return (
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
            f"{TASK_MAX_PRIORITY}, got {priority!r}."
        )
    run_after = task.run_after
    if run_after is not None:
        if not isinstance(run_after, datetime):
            return (
                "run_after must be a datetime.datetime (aware when USE_TZ is on), a "
                "datetime.timedelta (from the enqueue) or None, "
                f"got {run_after!r} ({type(run_after).__name__})."
            )
        if run_after.utcoffset() is not None:
            try:
                run_after.astimezone(UTC)
            except OverflowError:
                return f"run_after {run_after.isoformat()} is out of range in UTC."
    if not isinstance(task.queue_name, str):
        return f"queue_name must be a string, got {task.queue_name!r}."
    return ""


@dataclass(frozen=True, slots=True)
class _CheckedTask:
    """A task ``validate_task`` passed (see ``LeaseJobsBackend._checked``)."""

    task: Task
    """Held, so that no other object takes its ``id()``, the cache's key, while cached."""
    use_tz: bool
    """``settings.USE_TZ`` when checked: the check of ``run_after`` reads it."""
    columns: NewJob
    """What every job of the task stores alike (``LeaseJobsBackend._task_columns``)."""


_CHECKED_TASKS_MAX = 1024


def _app_missing(alias: str) -> str:
    return (
        f"TASKS[{alias!r}] uses the LeaseJobs backend, but {APP_LABEL!r} is not in "
        "INSTALLED_APPS: its tables, admin and commands (runworker, ...) are missing."
    )


class _KeyTaken(Exception):
    """Raised inside an insert's transaction to roll it back: ``job`` holds the key."""

    def __init__(self, job: Job) -> None:
        super().__init__(job.pk)
        self.job = job


@dataclass(frozen=True, slots=True)
class _WrittenWorkflow:
    workflow_id: int
    steps: list[TaskResult]
    new: list[bool]
    """Whether each step added a job (False: deduplicated by its key)."""


class LeaseJobsBackend(BaseTaskBackend):  # type: ignore[misc]
    """Jobs in the database, run by ``manage.py runworker`` under row leases."""

    task_class = LeaseTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_metadata = True
    """Jobs carry a metadata dict (``using(metadata=...)``, ``context.metadata``,
    ``context.save_metadata()``, ``TaskResult.metadata``): Django's coming API
    (django/new-features#141) asks backends to say so."""
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.config: Options
        self.problems: list[Problem]
        self.config, self.problems = parse_options(params.get("OPTIONS", {}))
        self._checked_tasks: dict[int, _CheckedTask] = {}
        self._app_installed = False
        """``django_leasejobs`` was found in ``INSTALLED_APPS`` (looked up until it is)."""
        if self.config.database not in settings.DATABASES:
            self.problems.append(
                Problem(
                    E_UNKNOWN_DATABASE,
                    f"DATABASE {self.config.database!r} is not in settings.DATABASES.",
                )
            )

    # ------------------------------------------------------------------ helpers

    @property
    def database(self) -> str:
        return self.config.database

    def require_valid_config(self) -> None:
        """Raise ImproperlyConfigured if the app is not installed (check ``E008``) or the
        OPTIONS have errors (checks report them too)."""
        self.require_app_installed()
        errors = [p for p in self.problems if not p.warning]
        if errors:
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}] is misconfigured: "
                + " ".join(f"[{p.id}] {p.msg}" for p in errors)
            )

    def require_app_installed(self) -> None:
        """Raise ImproperlyConfigured, naming the fix, when ``django_leasejobs`` is not in
        ``INSTALLED_APPS``: before any query, which would fail on a table that ``migrate``
        never created (it only migrates installed apps)."""
        if self._app_installed:
            return
        if not apps.is_installed(APP_LABEL):
            raise ImproperlyConfigured(
                f"[{E_APP_NOT_INSTALLED}] {_app_missing(self.alias)} Add {APP_LABEL!r} to "
                'INSTALLED_APPS and run "manage.py migrate".'
            )
        self._app_installed = True

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Run by Django's tasks system check (and the backport's) for every backend.

        It is what reports ``E008`` (the app not installed): this app's own checks are
        registered by its ``AppConfig.ready()``, which then never runs. The module imports
        without the app (the models name their app label), so the check can run."""
        messages = list(super().check(**kwargs))
        if not apps.is_installed(APP_LABEL):
            messages.append(
                checks.Error(
                    _app_missing(self.alias),
                    hint=f"Add {APP_LABEL!r} to INSTALLED_APPS and run migrate.",
                    obj=f"TASKS[{self.alias!r}]",
                    id=E_APP_NOT_INSTALLED,
                )
            )
        return messages

    def validate_task(self, task: Task) -> None:
        problem = task_field_problem(task)
        if problem:
            raise InvalidTask(problem)
        super().validate_task(task)
        registry.register(task)

    def _checked(self, task: Task) -> _CheckedTask:
        """``task`` validated, with the columns every job of it stores alike.

        Checked once per task object: a Task is frozen, and what else its check reads
        (this backend's QUEUES and OPTIONS) is fixed for the backend's life, but for
        ``USE_TZ``, which is part of the entry. ``using()`` makes a new object, checked anew.
        """
        use_tz = settings.USE_TZ
        found = self._checked_tasks.get(id(task))
        if found is not None and found.task is task and found.use_tz is use_tz:
            return found
        self.validate_task(task)
        found = _CheckedTask(task, use_tz, self._task_columns(task))
        if len(self._checked_tasks) >= _CHECKED_TASKS_MAX:
            self._checked_tasks.clear()
        self._checked_tasks[id(task)] = found
        return found

    def _task_columns(self, task: Task) -> NewJob:
        """The columns of a job of ``task`` that do not depend on the call: not the
        arguments, the trace context, ``run_after`` (without USE_TZ, stored in the time zone
        active at the call), nor the flow group of a callable concurrency key."""
        backoff = getattr(task, "backoff", None) or getattr(task, "retry_backoff", None)
        flow_group, concurrency_limit, rate_limit = None, None, None
        if isinstance(task, LeaseTask):
            concurrency_limit = task.effective_concurrency_limit
            rate_limit = task.rate_limit
            if isinstance(task.concurrency_key, str):
                flow_group = key_group(task.concurrency_key)
            elif task.concurrency_key is None and (
                concurrency_limit is not None or rate_limit is not None
            ):
                flow_group = task_group(task.module_path)
        return NewJob(
            backend=self.alias,
            queue=task.queue_name,
            task_path=task.module_path,
            args=[],
            kwargs={},
            priority=task.priority,
            max_attempts=getattr(task, "max_attempts", None) or self.config.max_attempts,
            max_stalls=getattr(task, "max_stalls", None) or self.config.max_stalls,
            timeout=getattr(task, "timeout", None),
            key=getattr(task, "key", None),
            # A callable backoff cannot be stored: the worker takes it from its registered task.
            retry_backoff=asdict(backoff) if isinstance(backoff, Backoff) else None,
            run_after=None,
            task_options=_task_options(task),
            flow_group=flow_group,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            metadata=_metadata(task, self.database),
            result_ttl=_result_ttl(task),
        )

    def _run_after(self, task: Task) -> datetime | None:
        """When a job of ``task`` may run: its ``run_after``, or now (the database's clock)
        plus a ``run_after`` given as a timedelta."""
        delay = getattr(task, "run_after_delay", None)
        if delay is None:
            return task.run_after
        return leases.database_now(self.database) + delay

    def _job_fields(
        self,
        task: Task,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        workflow_id: int | None = None,
        waiting_on: int | None = None,
        on_parent_failure: str | None = None,
    ) -> NewJob:
        """The columns of a new job row for one call (task and arguments checked: JSON
        only); a workflow step's columns given as they are."""
        columns = self._checked(task).columns
        json_args, json_kwargs = json_arguments(args, kwargs, using=self.database)
        flow_group = columns.flow_group
        if isinstance(task, LeaseTask) and callable(task.concurrency_key):
            key = task.resolve_concurrency_key(args, kwargs)
            if key is not None:
                flow_group = key_group(key)
        return NewJob(
            backend=columns.backend,
            queue=columns.queue,
            task_path=columns.task_path,
            args=json_args,
            kwargs=json_kwargs,
            priority=columns.priority,
            max_attempts=columns.max_attempts,
            max_stalls=columns.max_stalls,
            timeout=columns.timeout,
            key=columns.key,
            retry_backoff=columns.retry_backoff,
            run_after=_storable_run_after(self._run_after(task)),
            task_options=columns.task_options,
            trace_context=tracing.current_context(),
            flow_group=flow_group,
            concurrency_limit=columns.concurrency_limit,
            rate_limit=columns.rate_limit,
            metadata=columns.metadata,
            result_ttl=columns.result_ttl,
            workflow_id=workflow_id,
            waiting_on=waiting_on,
            on_parent_failure=on_parent_failure,
        )

    def _new_job(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
        return self._job_from_row(self._job_fields(task, args, kwargs))

    @staticmethod
    def _job_from_row(row: NewJob) -> Job:
        """An unsaved Job for checked columns (run_after left to the database if None)."""
        fields = asdict(row)
        run_after = fields.pop("run_after")
        job = Job(**fields)
        if run_after is not None:
            job.run_after = run_after
        if row.waiting_on:
            job.status = JobStatus.WAITING
        return job

    def _notify(self, queues: Iterable[str]) -> None:
        """Wake idle workers. Inside a transaction PostgreSQL delivers it on commit only."""
        leases.notify(NOTIFY_CHANNEL, queues, using=self.database)

    def _announce(self, results: list[TaskResult]) -> None:
        """Send ``task_enqueued`` and ``job_enqueued`` for ``results`` once the enqueue commits.

        In autocommit "on commit" is now: when no receiver would act on either signal
        (Django's own ``task_enqueued`` receiver logs at DEBUG: nothing with its logger
        off), nothing is scheduled. Inside a transaction the receivers are the ones
        connected at commit, as ever.
        """
        connection = connections[self.database]
        if (
            not connection.in_atomic_block
            and connection.get_autocommit()
            and not job_enqueued.receivers
            and not must_send(task_enqueued, logging.DEBUG)
        ):
            return

        def send() -> None:
            # The jobs are stored: a failing receiver is logged, never raised into enqueue().
            for result in results:
                responses = [
                    *task_enqueued.send_robust(type(self), task_result=result),
                    *job_enqueued.send_robust(
                        type(self),
                        job_id=int(result.id),
                        backend=self.alias,
                        task_path=result.task.module_path,
                        queue=result.task.queue_name,
                    ),
                ]
                for receiver, response in responses:
                    if isinstance(response, Exception):
                        logger.error(
                            "enqueue signal receiver %r failed",
                            receiver,
                            exc_info=response,
                            extra={"job_id": int(result.id), "backend": self.alias},
                        )

        transaction.on_commit(send, using=self.database)

    def _save_keyed(self, job: Job, key: str, unique_for: float | None) -> None:
        """Insert a job with a dedup key; with ``unique_for``, keep it only if no job with
        the key came first within the window (:func:`leases.key_holder` after the insert,
        in the insert's transaction: of two producers racing on one key, the later one
        sees the earlier one's job, finished or not, and rolls its own back)."""
        with transaction.atomic(using=self.database):
            job.save(using=self.database)
            if unique_for is not None:
                first = leases.key_holder(
                    key, unique_for=unique_for, before=job.pk, using=self.database
                )
                if first is not None:
                    raise _KeyTaken(first)

    def _insert_keyed(self, task: Task, job: Job) -> tuple[Job, str]:
        """Insert a job with a dedup key, or find the job that holds the key.

        Returns the job and what happened: ``"created"``, ``"deduplicated"`` (the key's
        holder, :func:`leases.key_holder`) or ``"debounced"`` (the pending job of the key,
        updated in place to this call: :func:`leases.debounce`).
        """
        jobs = Job.objects.using(self.database)
        unique_for: float | None = getattr(task, "unique_for", None)
        delay: float | None = getattr(task, "debounce", None)
        key: str = job.key  # type: ignore[assignment]
        for _ in range(5):
            if delay is not None:
                replaced = leases.debounce(self._row_of(job), delay, using=self.database)
                if replaced is not None:
                    return jobs.get(pk=replaced), "debounced"
            existing = leases.key_holder(key, unique_for=unique_for, using=self.database)
            if existing is not None:
                return existing, "deduplicated"
            if delay is not None:
                job.run_after = leases.runnable_after(delay)
            try:
                # Producers racing on one key can deadlock on MySQL/MariaDB's unique index.
                leases.retry_deadlocks(
                    self.database, lambda: self._save_keyed(job, key, unique_for)
                )
            except IntegrityError:
                # Another producer inserted the key between our read and write: read again
                # (with debounce: update that job to this call, the later one).
                job.pk = None
            except _KeyTaken as taken:
                job.pk = None
                return taken.job, "deduplicated"
            else:
                if delay is not None:  # run_after was an expression: read what it became
                    job.refresh_from_db(using=self.database, fields=["run_after"])
                return job, "created"
        raise IntegrityError(f"could not enqueue or find the job with key {key!r}")

    @staticmethod
    def _row_of(job: Job) -> NewJob:
        """The producer's columns of an unsaved job (see :meth:`_job_from_row`)."""
        values = {f.name: getattr(job, f.name) for f in fields(NewJob) if f.name != "run_after"}
        return NewJob(**values, run_after=None)

    # ------------------------------------------------------------------ django.tasks API

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Store a job. Participates in the caller's transaction: a rollback leaves no job."""
        self.require_valid_config()
        if getattr(task, "key", None) is None and leases.can_insert_notify(self.database):
            # PostgreSQL: the row and its wake-up in one statement, one round trip.
            row = self._job_fields(task, args, kwargs)
            job_id, enqueued_at = leases.insert_job(row, notify=NOTIFY_CHANNEL, using=self.database)
            result = self._fresh_result(task, row, job_id, enqueued_at)
            self._announce([result])
            return result
        job = self._new_job(task, args, kwargs)
        outcome = "created"
        if job.key is not None:
            job, outcome = self._insert_keyed(task, job)
        else:
            job.save(using=self.database)
        if outcome != "created":
            logger.info(
                f"enqueue {outcome} by key",
                extra={
                    "job_id": job.pk,
                    "key": job.key,
                    "queue": job.queue,
                    "backend": self.alias,
                    "status": job.status,
                },
            )
            # The key may be held by another task's job: report that job as it is.
            same_task = job.task_path == task.module_path
            return self.result_from_job(job, task=task if same_task else None)
        self._notify([job.queue])
        result = self.result_from_job(job, task=task, attempts=[])
        self._announce([result])
        return result

    def bulk_enqueue(self, calls: Iterable[TaskCall]) -> list[TaskResult]:
        """Enqueue many task calls at once; all or nothing.

        ``calls`` holds ``(task, args, kwargs)`` triples. On PostgreSQL with psycopg 3
        the rows go in with one ``COPY`` (ids taken from the sequence first, in one
        query); elsewhere, and when a call's task carries a dedup ``key``, with
        multi-row INSERTs, keyed calls through :meth:`enqueue` one by one (same
        transaction). Every task is validated before any call's arguments are checked.
        """
        self.require_valid_config()
        calls = list(calls)
        for number, call in enumerate(calls):
            if not isinstance(call, tuple | list) or len(call) != 3:
                raise InvalidTaskArguments(
                    f"calls[{number}] must be a (task, args, kwargs) triple, got {call!r}."
                )
            task = call[0]
            if not isinstance(task, Task):
                raise InvalidTask(f"calls[{number}]: {task!r} is not a task.")
            self._checked(task)
        rows = []
        for number, (task, args, kwargs) in enumerate(calls):
            try:
                rows.append(self._job_fields(task, args, kwargs))
            except InvalidTaskArguments as exc:
                raise InvalidTaskArguments(f"calls[{number}]: {exc}") from None
        if rows and leases.can_copy(self.database) and all(row.key is None for row in rows):
            with transaction.atomic(using=self.database):
                ids, now = leases.copy_jobs(rows, using=self.database)
                self._notify(row.queue for row in rows)
            copied = [
                self._fresh_result(task, row, job_id, now)
                for (task, _, _), row, job_id in zip(calls, rows, ids, strict=True)
            ]
            self._announce(copied)
            return copied
        prepared = [
            (task, self._job_from_row(row)) for (task, _, _), row in zip(calls, rows, strict=True)
        ]
        results: list[TaskResult | None] = [None] * len(prepared)
        with transaction.atomic(using=self.database):
            plain = [(i, task, job) for i, (task, job) in enumerate(prepared) if job.key is None]
            jobs = [job for _, _, job in plain]
            if connections[self.database].features.can_return_rows_from_bulk_insert:
                created = Job.objects.using(self.database).bulk_create(jobs, batch_size=1000)
            else:  # MySQL: no INSERT ... RETURNING, so no ids from a multi-row INSERT
                for job in jobs:
                    job.save(using=self.database)
                created = jobs
            fresh = []
            for (i, task, _), job in zip(plain, created, strict=True):
                results[i] = self.result_from_job(job, task=task, attempts=[])
                fresh.append(results[i])
            for i, (task, job) in enumerate(prepared):
                if job.key is not None:
                    results[i] = self.enqueue(task, job.args, job.kwargs)
            self._notify(job.queue for _, _, job in plain)
        self._announce([r for r in fresh if r is not None])
        return [r for r in results if r is not None]

    # ------------------------------------------------------------------ workflows

    def enqueue_workflow(self, graph: Sequence[GraphStep]) -> WorkflowResult:
        """Write a workflow (``Canvas.graph()``) in one transaction: a workflow row, a job
        per step (``waiting`` while it has parents), an edge per parent. Called by
        ``Canvas.enqueue()``; every step's task must use this backend.

        A step whose task has a dedup ``key`` held by a job (``leases.key_holder``: an
        unfinished one, or one within ``unique_for``), or by an earlier step of the same
        workflow, adds no job: it *is* that job, and its dependants wait for it.
        """
        self.require_valid_config()
        for number, spec in enumerate(graph):
            task = spec.step.task
            if task.backend != self.alias:
                raise InvalidTask(
                    f"step {number} ({task.module_path}) uses TASKS[{task.backend!r}], but the "
                    f"workflow is written to TASKS[{self.alias!r}] (its first step's): every "
                    "step of a workflow must use the same backend."
                )
            self._checked(task)
            if getattr(task, "debounce", None) is not None:
                raise InvalidTask(
                    f"step {number} ({task.module_path}) has a debounce: a workflow step "
                    "cannot replace another job's arguments. Use unique_for, or enqueue "
                    "the debounced job outside the workflow."
                )
        for attempt in range(5):
            try:
                written = self._write_workflow(graph)
            except IntegrityError:
                # Another producer took a step's key between the lookup and the insert:
                # look again (its job is now the holder).
                if attempt == 4:
                    raise
            else:
                break
        self._announce([r for r, new in zip(written.steps, written.new, strict=True) if new])
        return WorkflowResult(
            id=str(written.workflow_id),
            backend=self.alias,
            status=TaskResultStatus.READY,
            steps=written.steps,
        )

    def _write_workflow(self, graph: Sequence[GraphStep]) -> _WrittenWorkflow:
        using = self.database
        with transaction.atomic(using=using):
            workflow = Workflow.objects.using(using).create(
                backend=self.alias, step_count=len(graph)
            )
            holders = self._key_holders(graph)
            rows: list[NewJob] = []
            numbers: list[int] = []  # the step number of each row
            for number, spec in enumerate(graph):
                if number in holders:
                    continue
                try:
                    rows.append(
                        self._job_fields(
                            spec.step.task,
                            spec.step.args,
                            spec.step.kwargs,
                            workflow_id=workflow.pk,
                            waiting_on=leases.waits_for(len(spec.parents)) or None,
                            on_parent_failure=spec.step.parent_failure_column,
                        )
                    )
                except InvalidTaskArguments as exc:
                    raise InvalidTaskArguments(f"step {number}: {exc}") from None
                numbers.append(number)
            new_ids, now = self._insert_rows(rows)
            job_of: dict[int, int] = dict(zip(numbers, new_ids, strict=True))
            for number, holder in holders.items():
                job_of[number] = holder if isinstance(holder, int) else holder.pk
            for number, holder in holders.items():  # a step aliasing an earlier one
                if isinstance(holder, int):
                    job_of[number] = job_of[holder]
            step_ids = [job_of[number] for number in range(len(graph))]
            Workflow.objects.using(using).filter(pk=workflow.pk).update(step_ids=step_ids)
            # Only new steps wait: an edge into a job that was already there means nothing.
            leases.insert_edges(
                [
                    (job_of[parent], job_of[number], position)
                    for number in numbers
                    for position, parent in enumerate(graph[number].parents)
                ],
                using=using,
            )
            found = {h.pk: h for h in holders.values() if isinstance(h, Job)}
            self._join_holders(workflow.pk, found.values())
            self._settle_finished_holders(graph, job_of, numbers, found)
            self._notify(row.queue for row in rows if not row.waiting_on)
        results: dict[int, TaskResult] = {
            job_of[number]: self._fresh_result(graph[number].step.task, row, job_of[number], now)
            for number, row in zip(numbers, rows, strict=True)
        }
        results.update((pk, self.result_from_job(job)) for pk, job in found.items())
        added = set(numbers)
        return _WrittenWorkflow(
            workflow.pk,
            [results[job_of[number]] for number in range(len(graph))],
            [number in added for number in range(len(graph))],
        )

    def _key_holders(self, graph: Sequence[GraphStep]) -> dict[int, Job | int]:
        """The steps whose key is held: by a job (locked for the rest of the transaction,
        so its status is what the workflow is written against), or by an earlier step of
        this workflow (its number)."""
        holders: dict[int, Job | int] = {}
        first_with: dict[str, int] = {}
        jobs = Job.objects.using(self.database)
        for number, spec in enumerate(graph):
            key = getattr(spec.step.task, "key", None)
            if key is None:
                continue
            if key in first_with:
                holders[number] = first_with[key]
                continue
            holder = leases.key_holder(
                key, unique_for=getattr(spec.step.task, "unique_for", None), using=self.database
            )
            if holder is None:
                first_with[key] = number
            else:
                holders[number] = jobs.select_for_update().get(pk=holder.pk)
        return holders

    def _join_holders(self, workflow_id: int, holders: Iterable[Job]) -> None:
        """A plain job that a step was deduplicated against joins the workflow: its end
        then settles the step's dependants, as a step's does."""
        plain = [h.pk for h in holders if h.workflow_id is None and not h.is_finished]
        if plain:
            Job.objects.using(self.database).filter(pk__in=plain, workflow__isnull=True).update(
                workflow_id=workflow_id
            )

    def _settle_finished_holders(
        self,
        graph: Sequence[GraphStep],
        job_of: Mapping[int, int],
        numbers: Sequence[int],
        holders: Mapping[int, Job],
    ) -> None:
        """New steps that wait for a job that had already finished: settled now, as its end
        would have settled them (released, or ended unrun)."""
        finished = {pk: job for pk, job in holders.items() if job.is_finished}
        if not finished:
            return
        waiting = {
            job_of[number]
            for number in numbers
            if any(job_of[parent] in finished for parent in graph[number].parents)
        }
        if waiting:
            ended = [
                leases.EndedStep(pk, job.status == JobStatus.SUCCEEDED, job.task_path, job.status)
                for pk, job in finished.items()
            ]
            leases.settle_new_steps(ended, only=sorted(waiting), using=self.database)

    def _insert_rows(self, rows: list[NewJob]) -> tuple[list[int], Any]:
        """Insert checked rows without dedup keys; their ids in order and the insert time.
        ``COPY`` on PostgreSQL with psycopg 3, else multi-row INSERTs (MySQL: one by one,
        it returns no ids from a multi-row INSERT)."""
        if leases.can_copy(self.database):
            return leases.copy_jobs(rows, using=self.database)
        jobs = [self._job_from_row(row) for row in rows]
        if connections[self.database].features.can_return_rows_from_bulk_insert:
            Job.objects.using(self.database).bulk_create(jobs, batch_size=1000)
        else:
            for job in jobs:
                job.save(using=self.database)
        now = jobs[0].enqueued_at if jobs else None
        if jobs and not isinstance(now, datetime):
            now = leases.database_now(self.database)
        return [int(job.pk) for job in jobs], now

    def get_workflow(self, workflow_id: str | int) -> WorkflowResult:
        """A workflow and the TaskResult of each of its steps (three queries)."""
        self.require_app_installed()
        try:
            pk = int(workflow_id)
        except (TypeError, ValueError):
            raise WorkflowDoesNotExist(workflow_id) from None
        workflow = Workflow.objects.using(self.database).filter(pk=pk, backend=self.alias).first()
        if workflow is None:
            raise WorkflowDoesNotExist(workflow_id)
        jobs = Job.objects.using(self.database)
        found = {job.pk: job for job in jobs.filter(workflow_id=pk)}
        order = workflow.step_ids if isinstance(workflow.step_ids, list) else sorted(found)
        elsewhere = [job_id for job_id in order if job_id not in found]  # deduplicated steps
        if elsewhere:
            found.update((job.pk, job) for job in jobs.filter(pk__in=elsewhere))
        attempts: dict[int, list[JobAttempt]] = {}
        for attempt in (
            JobAttempt.objects.using(self.database)
            .filter(Q(job__workflow_id=pk) | Q(job_id__in=elsewhere))
            .order_by("id")
        ):
            attempts.setdefault(attempt.job_id, []).append(attempt)
        # A step whose job was deleted (pruned) is left out.
        steps = [
            self.result_from_job(found[job_id], attempts=attempts.get(job_id, []))
            for job_id in order
            if job_id in found
        ]
        return WorkflowResult(
            id=str(pk),
            backend=self.alias,
            status=workflow_status(
                (job.status for job in found.values()),
                started=any(job.started_at is not None for job in found.values()),
            ),
            steps=steps,
        )

    def _fresh_result(self, task: Task, row: NewJob, job_id: int, now: Any) -> TaskResult:
        """The django.tasks view of a job just inserted (no query needed; ``row``'s
        arguments are checked copies of the call's, the result's own)."""
        return LeaseTaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=row.args,
            kwargs=row.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
            metadata=dict(row.metadata or {}),
        )

    def get_result(self, result_id: str) -> TaskResult:
        self.require_app_installed()
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(self.database).filter(pk=job_id, backend=self.alias).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_from_job(job)

    # ------------------------------------------------------------------ from async code
    # Each runs its sync twin with sync_to_async(thread_sensitive=True), as Django's async
    # ORM runs a query: the event loop only awaits, and the database work happens in the
    # thread that runs the current request's sync code, on that thread's connection and
    # in its transaction, if it has one. Errors are the sync twin's. Why this and not a
    # thread pool: docs/concepts.md, "From async code".

    async def aenqueue(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult:
        """:meth:`enqueue` from async code, off the event loop."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    async def aget_result(self, result_id: str) -> TaskResult:
        """:meth:`get_result` from async code, off the event loop."""
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    async def aget_workflow(self, workflow_id: str | int) -> WorkflowResult:
        """:meth:`get_workflow` from async code, off the event loop."""
        return await sync_to_async(self.get_workflow, thread_sensitive=True)(workflow_id)

    # ------------------------------------------------------------------ mapping

    def result_from_job(
        self,
        job: Job,
        *,
        task: Task | None = None,
        attempts: Sequence[JobAttempt] | None = None,
    ) -> TaskResult:
        """The django.tasks view of a job row (and its failed attempts)."""
        if attempts is None:
            attempts = list(JobAttempt.objects.using(self.database).filter(job_id=job.pk))
        if task is None:
            task = self._task_for(job)
        errors, worker_ids = attempt_history(attempts, job.attempt, job.last_worker)
        unrun = f"{leases.PARENT_FAILED_CLASS}: "
        if not errors and job.status == JobStatus.FAILED and job.last_error.startswith(unrun):
            # A workflow step ended unrun by a parent's failure: no attempt, one error.
            errors = [task_error(leases.PARENT_FAILED_CLASS, job.last_error[len(unrun) :], "")]
        result: TaskResult = LeaseTaskResult(
            task=task,
            id=str(job.pk),
            status=STATUS_TO_RESULT[JobStatus(job.status)],
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            last_attempted_at=job.last_attempted_at,
            args=list(job.args),
            kwargs=dict(job.kwargs),
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
            metadata=job.metadata if isinstance(job.metadata, dict) else {},
        )
        if job.status == JobStatus.SUCCEEDED:
            object.__setattr__(result, "_return_value", job.result)
        return result

    def _task_for(self, job: Job) -> Task:
        """The task this job was enqueued with (see :func:`task_as_enqueued`)."""
        return task_as_enqueued(registry.resolve(job.task_path), job, self.alias)
