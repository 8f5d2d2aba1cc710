"""The job store: jobs (with their lease), failed attempts, and the worker registry."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .functions import DatabaseNow
from .histograms import BUCKETS
from .limits import KEY_GROUP

APP_LABEL = "django_leasejobs"
"""Every model names its app, so that this module imports (and the backend with it) in a
process where the app is not in ``INSTALLED_APPS``: the backend's ``check()`` then reports
``leasejobs.E008`` and ``enqueue()`` names the fix, instead of Django's "doesn't declare an
explicit app_label" error. It is the label the app has when installed."""

MIN_PRIORITY = -100
MAX_PRIORITY = 100


class JobStatus(models.TextChoices):
    WAITING = "waiting", _("Waiting")
    """A workflow step whose parents have not all succeeded yet: never claimed, not ready."""
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    DEAD = "dead", _("Dead")
    CANCELLED = "cancelled", _("Cancelled")


ACTIVE_STATUSES = (JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING)
"""The statuses of a job that has not finished: they hold its dedup key."""
FINISHED_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)

PENDING_ROWS = Q(status=JobStatus.PENDING) & (
    Q(flow_group__isnull=True) | Q(flow_group__isnull=False)
)
"""Pending jobs, in a form every database reads from an index. On PostgreSQL no index
holds every row's status (``leasejobs_job_finished_idx`` holds finished jobs only,
migration 0023: an index of every row takes an entry at each change of each job's
status), and the ``OR`` of the two lanes' conditions lets it read the claim index and the
flow lane's index (a BitmapOr). MySQL, MariaDB and SQLite read ``status = 'pending'``
from an index led by the status."""
ACTIVE_ROWS = Q(status__in=[JobStatus.PENDING, JobStatus.RUNNING]) & (
    Q(status=JobStatus.PENDING, flow_group__isnull=True)
    | Q(status=JobStatus.PENDING, flow_group__isnull=False)
    | Q(status=JobStatus.RUNNING)
)
"""Pending and running jobs, as ``PENDING_ROWS``: on PostgreSQL from the claim index, the
flow lane's and the running jobs' (each ``OR`` arm is one's condition)."""


class AttemptOutcome(models.TextChoices):
    ERROR = "error", _("Error")
    TIMEOUT = "timeout", _("Timeout")
    LEASE_EXPIRED = "lease_expired", _("Lease expired")
    KILLED = "killed", _("Killed")
    CANCELLED = "cancelled", _("Cancelled")
    RELEASED = "released", _("Released at shutdown")
    COLLATERAL = "collateral", _("Released: killed for another job")
    SNOOZED = "snoozed", _("Snoozed")


class JobQuerySet(models.QuerySet["Job"]):
    def pending(self) -> JobQuerySet:
        return self.filter(PENDING_ROWS)

    def running(self) -> JobQuerySet:
        return self.filter(status=JobStatus.RUNNING)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=FINISHED_STATUSES)

    def ready(self) -> JobQuerySet:
        """Pending jobs whose ``run_after`` has passed (database clock)."""
        return self.filter(PENDING_ROWS, run_after__lte=DatabaseNow())

    def expired(self) -> JobQuerySet:
        """Running jobs whose lease has expired (database clock)."""
        return self.filter(status=JobStatus.RUNNING, locked_until__lt=DatabaseNow())


class Job(models.Model):
    """One unit of work. A running job always carries a lease: locked_by, locked_until, attempt."""

    backend = models.CharField(max_length=64, default="default")
    queue = models.CharField(max_length=128, default="default")
    task_path = models.CharField(max_length=512)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0)
    run_after = models.DateTimeField(db_default=DatabaseNow())
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)

    attempt = models.PositiveIntegerField(
        default=0, help_text="Incremented by every claim; the fencing token of the lease."
    )
    max_attempts = models.PositiveIntegerField(default=3)
    stall_count = models.PositiveIntegerField(
        default=0, help_text="Attempts whose lease expired and were reaped."
    )
    max_stalls = models.PositiveIntegerField(default=3)
    # Not PositiveIntegerField: its CHECK (snoozes >= 0) would make adding the column
    # scan the whole job table under an exclusive lock (migration 0009). Only ever 0+1+1...
    snoozes = models.IntegerField(
        default=0,
        db_default=0,  # rows written without it (raw SQL, an older release) stay valid
        help_text="Times the task raised Retry without using an attempt (each also raised "
        "max_attempts by one).",
    )

    locked_by = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    locked_until = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_worker = models.CharField(max_length=255, blank=True, default="")
    cancel_requested = models.BooleanField(default=False)

    key = models.CharField(  # noqa: DJ001 - NULL means "no dedup key", unlike ""
        max_length=255,
        null=True,
        blank=True,
        help_text="Optional dedup key, unique among waiting, pending and running jobs.",
    )
    timeout = models.FloatField(null=True, blank=True, help_text="Seconds per attempt.")
    retry_backoff = models.JSONField(
        null=True,
        blank=True,
        help_text="This job's backoff policy; null = the task's or backend's.",
    )
    task_options = models.JSONField(
        null=True,
        blank=True,
        help_text="Options the enqueued task had set (run_after, max_attempts, max_stalls), "
        "so get_result() returns the same task; null = none.",
    )
    flow_group = models.CharField(  # noqa: DJ001 - NULL means "no flow limit", unlike ""
        max_length=520,
        null=True,
        blank=True,
        help_text='The group whose limits this job obeys: "key:" + its concurrency key, or '
        '"task:" + its task path (a task-wide concurrency or rate limit); null = none.',
    )
    # Not PositiveIntegerField: its CHECK would make adding the column scan the table.
    concurrency_limit = models.IntegerField(
        null=True, blank=True, help_text="Most running jobs of its flow group; null = no cap."
    )
    rate_limit = models.CharField(  # noqa: DJ001 - NULL means "no rate limit", unlike ""
        max_length=16,
        null=True,
        blank=True,
        help_text='Most starts of its task per period ("50/m"); null = none.',
    )
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="The enqueuing code's W3C trace context (OpenTelemetry), continued by the "
        "worker's span; null = none.",
    )

    metadata = models.JSONField(
        null=True,
        blank=True,
        help_text="The job's metadata: a JSON object set at enqueue (using(metadata=...)), "
        "read and saved by its task (context.metadata, save_metadata()); null = none.",
    )
    unknown_task_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When a worker first claimed this job without knowing its task (it gave "
        "the job back to wait for a worker that does: UNKNOWN_TASK_GRACE); null = never.",
    )

    workflow = models.ForeignKey(
        "Workflow",
        null=True,
        blank=True,
        # Pruning deletes finished jobs in raw batches; a workflow row outlives its steps.
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # leasejobs_job_workflow_idx: partial, plain jobs cost nothing
        related_name="steps",
        help_text="The workflow this job is a step of; null = a plain job.",
    )
    waiting_on = models.IntegerField(
        null=True,
        blank=True,
        help_text="A workflow step's parents that have not finished yet (it is waiting "
        "while any has not); null = no parents.",
    )
    on_parent_failure = models.CharField(  # noqa: DJ001 - NULL means the default, "fail"
        max_length=8,
        null=True,
        blank=True,
        help_text='"run": the step runs even when a parent failed (a finaliser); null: it '
        "fails without running.",
    )

    result_ttl = models.DurationField(
        null=True,
        blank=True,
        help_text="How long the finished job is kept: prune_jobs deletes it once its "
        "finished_at is older; null = its queue's QUEUE_RESULT_TTL, else prune_jobs' "
        "--older-than.",
    )

    progress = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=255, blank=True, default="")
    checkpoint = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    enqueued_at = models.DateTimeField(db_default=DatabaseNow())
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_job"
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        permissions = [
            ("retry_job", "Can retry failed or dead jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("requeue_job", "Can requeue dead jobs"),
            ("purge_job", "Can delete finished jobs"),
        ]
        indexes = [
            # Matches the claim's WHERE and ORDER BY, and stays small: only pending rows
            # outside flow groups (a backlog held back by a full limit is never walked).
            models.Index(
                "backend",
                "queue",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="leasejobs_job_claim_idx",
                condition=Q(status="pending", flow_group__isnull=True),
            ),
            # The flow lane in claim order (the flow claim's window).
            models.Index(
                "backend",
                "queue",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="leasejobs_job_flow_order_idx",
                condition=Q(status="pending", flow_group__isnull=False),
            ),
            # The flow lane by group, each group's in claim order (its skip scan).
            models.Index(
                "backend",
                "queue",
                "flow_group",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="leasejobs_job_flow_idx",
                condition=Q(status="pending", flow_group__isnull=False),
            ),
            # The reaper and renewals scan running rows only. Neither locked_until nor
            # heartbeat_at is indexed anywhere, so heartbeat UPDATEs stay HOT.
            models.Index(
                fields=["locked_by"],
                name="leasejobs_job_running_idx",
                condition=Q(status="running"),
            ),
            # Finished jobs by status and age (pruning, the dashboard's last hour, alerts).
            # On PostgreSQL partial: a job's enqueue and claim leave it alone (migration
            # 0023; only a finished job has a finished_at). The condition is on
            # finished_at, not on the status, so that a query over every finished status
            # keeps its status as an index condition (PostgreSQL drops a condition the
            # index's own implies). SQLite, MySQL and MariaDB keep an index of every row,
            # which their readers of pending jobs use (models.PENDING_ROWS).
            models.Index(
                fields=["status", "finished_at"],
                name="leasejobs_job_finished_idx",
                condition=Q(finished_at__isnull=False),
            ),
            # The jobs of a dedup key whatever their status, oldest first: the holder of a
            # key within a unique_for window (leases/keys.py). On MySQL/MariaDB, without
            # partial indexes, an index on (key, id) of every row.
            models.Index(
                fields=["key", "id"],
                name="leasejobs_job_key_idx",
                condition=Q(key__isnull=False),
            ),
            # The steps of a workflow, and nothing for plain jobs (migration 0015).
            models.Index(
                fields=["workflow"],
                name="leasejobs_job_workflow_idx",
                condition=Q(workflow__isnull=False),
            ),
            # Waiting steps: the reaper's repair of a step whose parents all finished.
            models.Index(
                fields=["id"], name="leasejobs_job_waiting_idx", condition=Q(status="waiting")
            ),
            # Dead letters per queue (dashboard): an index-only scan of the dead rows, which
            # otherwise sit one per heap page all over the table.
            models.Index(
                fields=["queue"], name="leasejobs_job_dead_idx", condition=Q(status="dead")
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=MIN_PRIORITY) & Q(priority__lte=MAX_PRIORITY),
                name="leasejobs_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="leasejobs_job_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="running")
                | (Q(locked_by__isnull=False) & Q(locked_until__isnull=False)),
                name="leasejobs_job_running_has_lease",
            ),
            models.UniqueConstraint(
                fields=["key"],
                condition=Q(status__in=["waiting", "pending", "running"]) & Q(key__isnull=False),
                name="leasejobs_job_active_key_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.task_path} ({self.status})"

    @property
    def concurrency_key(self) -> str | None:
        """The concurrency key this job was enqueued with (None: none)."""
        group = self.flow_group or ""
        return group[len(KEY_GROUP) :] if group.startswith(KEY_GROUP) else None

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


class Workflow(models.Model):
    """A graph of jobs written at once (``django_leasejobs.workflows``): its steps are the
    jobs that name it; the order between them is ``Dependency`` rows."""

    backend = models.CharField(max_length=64, default="default")
    created_at = models.DateTimeField(db_default=DatabaseNow())
    step_count = models.PositiveIntegerField(default=0)
    step_ids = models.JSONField(
        null=True,
        blank=True,
        help_text="The job of each step, in the workflow's order: its own, or the job a "
        "step with a dedup key was deduplicated against (which may belong to another "
        "workflow).",
    )

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_workflow"
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        permissions = [("cancel_workflow", "Can cancel workflows and retry their failed steps")]

    def __str__(self) -> str:
        return f"workflow #{self.pk}"


class Dependency(models.Model):
    """One edge of a workflow: ``child`` waits for ``parent``. ``position`` orders a
    step's parents (``context.parent_results``)."""

    parent = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    child = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    position = models.PositiveIntegerField()
    fanin = models.ForeignKey(
        "FanIn",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # read from the parent's side (its index), never looked up by counter
        related_name="+",
        help_text="The fan-in counter this edge counts down (a child with more parents "
        "than leases.FANIN_WIDTH); null = the edge counts the child down directly.",
    )

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_dependency"
        verbose_name = _("dependency")
        verbose_name_plural = _("dependencies")
        constraints = [
            models.UniqueConstraint(
                fields=["child", "position"], name="leasejobs_dependency_child_position"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.child_id} after #{self.parent_id}"


class FanIn(models.Model):
    """A counter of a workflow step with many parents: how many of one contiguous run of
    its parents (by position) have not finished. The step's ``waiting_on`` counts its
    counters that have not reached zero, so the parents of different counters never wait
    for one lock (``leases/fanin.py``)."""

    child = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    remaining = models.IntegerField(
        help_text="The parents of this counter that have not finished yet."
    )

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_fanin"
        verbose_name = _("fan-in counter")
        verbose_name_plural = _("fan-in counters")
        default_permissions = ()

    def __str__(self) -> str:
        return f"#{self.child_id} waits for {self.remaining} more"


class QueueDashboard(Job):
    """Proxy that gives the admin's queue dashboard its place in the app's model list."""

    class Meta:
        app_label = APP_LABEL
        proxy = True
        verbose_name = _("queue dashboard")
        verbose_name_plural = _("queue dashboard")
        default_permissions = ()


class JobAttempt(models.Model):
    """One attempt of a job that did not succeed (successful attempts only touch the job row)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=255, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    error_class = models.CharField(max_length=512, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    decision = models.CharField(
        max_length=500,
        blank=True,
        default="",
        db_default="",  # rows written without it (raw SQL, an older release) stay valid
        help_text="Why the job was retried, snoozed or not (empty: not a retry decision).",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(db_default=DatabaseNow())

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_attempt"
        verbose_name = _("job attempt")
        verbose_name_plural = _("job attempts")
        ordering = ["job", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="leasejobs_attempt_unique"),
        ]

    def __str__(self) -> str:
        return f"job #{self.job_id} attempt {self.attempt}: {self.outcome}"


class WorkerState(models.TextChoices):
    RUNNING = "running", _("Running")
    STOPPING = "stopping", _("Stopping")
    STOPPED = "stopped", _("Stopped")


class Worker(models.Model):
    """Registry row of a worker process, for operators. Recovery never reads it: leases decide."""

    id = models.CharField(max_length=255, primary_key=True)
    backend = models.CharField(max_length=64, default="default")
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    pool = models.CharField(max_length=16)
    concurrency = models.PositiveIntegerField()
    state = models.CharField(
        max_length=16, choices=WorkerState.choices, default=WorkerState.RUNNING
    )
    started_at = models.DateTimeField(db_default=DatabaseNow())
    last_seen_at = models.DateTimeField(db_default=DatabaseNow())
    stopped_at = models.DateTimeField(null=True, blank=True)
    problem = models.TextField(
        blank=True,
        default="",
        db_default="",  # rows written without it (raw SQL, an older release) stay valid
        help_text="What keeps the worker from working normally, as of its last heartbeat "
        "(outcomes it cannot record, failing database rounds); empty when all is well.",
    )

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_worker"
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.id


class Schedule(models.Model):
    """The state of one schedule of ``OPTIONS["SCHEDULES"]`` (the definition lives in settings).

    ``last_tick`` is the schedule's cursor: every tick up to it has been enqueued or
    skipped, and no tick at or before it is ever enqueued again. The definition columns
    are a copy of the settings, kept for display and for history once a schedule is
    removed from settings (``removed_at``).
    """

    backend = models.CharField(max_length=64, default="default")
    name = models.CharField(max_length=200)
    task_path = models.CharField(max_length=512)
    expression = models.CharField(max_length=255, help_text="Cron expression or 'every Ns'.")
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True, help_text="As declared in settings.")
    paused = models.BooleanField(default=False, help_text="Paused by an operator.")
    paused_at = models.DateTimeField(null=True, blank=True)
    removed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When a scheduler pass (a worker or the admin) found it gone from settings.",
    )
    last_tick = models.DateTimeField(
        null=True, blank=True, help_text="Every tick up to this one was enqueued or skipped."
    )
    next_tick = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=DatabaseNow())
    updated_at = models.DateTimeField(db_default=DatabaseNow())

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_schedule"
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["backend", "name"]
        permissions = [
            ("pause_schedule", "Can pause and resume schedules"),
            ("run_schedule", "Can run a schedule now"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["backend", "name"], name="leasejobs_schedule_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class RunKind(models.TextChoices):
    TICK = "tick", _("Tick")
    MANUAL = "manual", _("Run now")


class ScheduleRun(models.Model):
    """One job a schedule enqueued. (schedule, tick) is unique: a tick runs at most once."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    tick = models.DateTimeField(null=True, blank=True, help_text="Empty for 'run now'.")
    kind = models.CharField(max_length=8, choices=RunKind.choices, default=RunKind.TICK)
    job_id = models.BigIntegerField(null=True, blank=True)
    enqueued_at = models.DateTimeField(db_default=DatabaseNow())

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_schedule_run"
        verbose_name = _("schedule run")
        verbose_name_plural = _("schedule runs")
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "tick"], name="leasejobs_schedule_run_tick_unique"
            ),
        ]
        indexes = [models.Index(fields=["enqueued_at"], name="leasejobs_schedule_run_age_idx")]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.tick or 'now'}"


class Queue(models.Model):
    """The operators' state of one queue of a backend: paused or not.

    Every claim reads it (``leases/flow.py``), so a pause holds on every worker at its
    next claim, without a restart. A queue without a row is not paused.
    """

    backend = models.CharField(max_length=64, default="default")
    name = models.CharField(max_length=128)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField(db_default=DatabaseNow())

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_queue"
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        ordering = ["backend", "name"]
        default_permissions = ("view",)
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.UniqueConstraint(fields=["backend", "name"], name="leasejobs_queue_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class FlowLock(models.Model):
    """One row per backend: a claim of flow-limited jobs locks it first, so that such
    claims on every worker take turns and each counts what the previous one started."""

    backend = models.CharField(max_length=64, primary_key=True)
    claims = models.BigIntegerField(default=0)

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_flow_lock"
        verbose_name = _("flow lock")
        verbose_name_plural = _("flow locks")
        default_permissions = ()

    def __str__(self) -> str:
        return self.backend


class RateStart(models.Model):
    """One job start under a rate limit (a task's or a queue's), kept for one period."""

    backend = models.CharField(max_length=64, default="default")
    scope = models.CharField(max_length=530, help_text='"task:" + path or "queue:" + name.')
    started_at = models.DateTimeField(db_default=DatabaseNow())

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_rate_start"
        verbose_name = _("rate-limited start")
        verbose_name_plural = _("rate-limited starts")
        default_permissions = ()
        indexes = [
            models.Index(fields=["backend", "scope", "started_at"], name="leasejobs_rate_start_idx")
        ]

    def __str__(self) -> str:
        return f"{self.scope} @ {self.started_at}"


ROLLUP_COUNTERS = ("enqueued", "started", "succeeded", "failed", "retried", "dead")
"""The rollup's counters, in column order (their meaning: docs/monitoring.md#trends)."""
WAIT_COLUMNS = tuple(f"wait_{bucket:02d}" for bucket in range(BUCKETS))
"""The wait-time histogram's bucket counts (``histograms.py``), one column each."""
RUN_COLUMNS = tuple(f"run_{bucket:02d}" for bucket in range(BUCKETS))
"""The run-time histogram's bucket counts, one column each."""


class JobRollup(models.Model):
    """Per minute, queue and task: what the workers counted as they wrote outcomes (the
    trends of the dashboard and the metrics view); kept for ``ROLLUP_RETENTION``.

    Rows are only ever upserted by adding to every column (``leases.rollups``), so any
    number of workers write the same row at once without losing a count."""

    backend = models.CharField(max_length=64, default="default")
    minute = models.DateTimeField(help_text="The minute (UTC, database clock) counted.")
    queue = models.CharField(max_length=128)
    task_path = models.CharField(max_length=512)
    enqueued = models.BigIntegerField(default=0)
    started = models.BigIntegerField(default=0)
    succeeded = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    dead = models.BigIntegerField(default=0)

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_rollup"
        verbose_name = _("job rollup")
        verbose_name_plural = _("job rollups")
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["backend", "minute", "queue", "task_path"], name="leasejobs_rollup_key"
            )
        ]
        # Reads of every backend at once (the dashboard, the metrics view) by minute.
        indexes = [models.Index(fields=["minute"], name="leasejobs_rollup_minute_idx")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.queue} {self.task_path}"


for _column in (*WAIT_COLUMNS, *RUN_COLUMNS):
    JobRollup.add_to_class(_column, models.BigIntegerField(default=0))


class AlertStatus(models.TextChoices):
    FIRING = "firing", _("Firing")
    RESOLVED = "resolved", _("Resolved")


class AlertState(models.Model):
    """The state of one rule of ``OPTIONS["ALERTS"]`` (the rule lives in settings).

    ``last_fired_at`` is the rule's fence: a worker delivers an alert only when its
    conditional UPDATE moved it (it was empty, or at least one ``interval`` old), so the
    workers deliver at most one alert per rule per interval between them
    (``alerts/state.py``). The other columns describe the last alert, for the admin's
    banner (shown while ``state`` is firing and ``firing_until`` has not passed).
    """

    backend = models.CharField(max_length=64, default="default")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=32)
    # NULL: every queue / every task of the queue, unlike "" (no such name)
    queue = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    task = models.CharField(max_length=512, null=True, blank=True)  # noqa: DJ001
    state = models.CharField(
        max_length=16, choices=AlertStatus.choices, default=AlertStatus.RESOLVED
    )
    value = models.FloatField(null=True, blank=True, help_text="The measure at the last change.")
    threshold = models.FloatField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    last_fired_at = models.DateTimeField(null=True, blank=True)
    firing_until = models.DateTimeField(
        null=True, blank=True, help_text="The last alert's time plus the rule's interval."
    )
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "leasejobs_alert_state"
        verbose_name = _("alert state")
        verbose_name_plural = _("alert states")
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["backend", "name"], name="leasejobs_alert_state_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"
