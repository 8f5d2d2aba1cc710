"""Queue health numbers for the admin dashboard and ``manage.py leasejobs_status``.

Every query stays cheap on a big table: active rows (pending, running) and waiting
workflow steps are read through the partial indexes (on MySQL/MariaDB their
``status``-first stand-ins, migration 0007), finished rows only for the last hour through the
``(status, finished_at)`` index. All-time totals of finished jobs are not counted
(that would scan the table); the dashboard shows the last hour instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, F, Min, Q
from django.db.models.functions import TruncMinute

from .leases import database_now
from .models import ACTIVE_ROWS, FINISHED_STATUSES, Job, JobStatus, Worker, WorkerState

WINDOW = timedelta(hours=1)


def online_window(heartbeat_interval: float) -> float:
    """Seconds without a heartbeat after which a worker is shown as gone."""
    return 3 * heartbeat_interval + 5


RUNNING_LIST_LIMIT = 50


@dataclass
class QueueHealth:
    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    expired: int = 0
    """Running jobs whose lease has expired and that no reaper has taken back yet."""
    dead: int = 0
    succeeded_last_hour: int = 0
    failed_last_hour: int = 0
    oldest_ready_wait: float | None = None
    """Seconds the oldest ready job has been waiting (None when nothing is ready)."""
    waiting: int = 0
    """Workflow steps waiting for their parents (status ``waiting``: not claimable yet)."""

    @property
    def failure_rate(self) -> float | None:
        finished = self.succeeded_last_hour + self.failed_last_hour
        return self.failed_last_hour / finished if finished else None


@dataclass
class RunningJobInfo:
    id: int
    task_path: str
    queue: str
    attempt: int
    worker: str
    lease_left: float
    since_heartbeat: float | None
    progress: float | None
    progress_message: str


@dataclass
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: list[str]
    pool: str
    concurrency: int
    last_seen_ago: float
    online: bool
    problem: str = ""
    """What the worker reported at its last heartbeat as keeping it from working
    normally (outcomes it could not record, failing database rounds); '' when none."""


@dataclass
class MinuteCount:
    minute: datetime
    succeeded: int = 0
    failed: int = 0


@dataclass
class Health:
    now: datetime
    queues: list[QueueHealth] = field(default_factory=list)
    running: list[RunningJobInfo] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)
    per_minute: list[MinuteCount] = field(default_factory=list)

    @property
    def totals(self) -> QueueHealth:
        total = QueueHealth(queue="all")
        waits = [q.oldest_ready_wait for q in self.queues if q.oldest_ready_wait is not None]
        for q in self.queues:
            for name in (
                "ready",
                "scheduled",
                "running",
                "expired",
                "dead",
                "waiting",
                "succeeded_last_hour",
                "failed_last_hour",
            ):
                setattr(total, name, getattr(total, name) + getattr(q, name))
        total.oldest_ready_wait = max(waits) if waits else None
        return total

    @property
    def workers_online(self) -> int:
        return sum(1 for w in self.workers if w.online)

    @property
    def troubled_workers(self) -> list[WorkerInfo]:
        """Online workers that report a problem."""
        return [w for w in self.workers if w.online and w.problem]

    def as_dict(self) -> dict[str, Any]:
        totals = self.totals
        return {
            "now": self.now.isoformat(),
            "totals": {**asdict(totals), "failure_rate": totals.failure_rate},
            "queues": [{**asdict(q), "failure_rate": q.failure_rate} for q in self.queues],
            "running": [asdict(r) for r in self.running],
            "workers": [asdict(w) for w in self.workers],
            "workers_online": self.workers_online,
            "per_minute": [
                {"minute": m.minute.isoformat(), "succeeded": m.succeeded, "failed": m.failed}
                for m in self.per_minute
            ],
        }


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else max(delta.total_seconds(), 0.0)


def collect(*, using: str = "default", online_after: float = 60.0) -> Health:
    """Read the queue health in a handful of small queries.

    ``online_after``: a worker not seen for longer is shown as gone.
    """
    jobs = Job.objects.using(using)
    db_now = database_now(using)
    health = Health(now=db_now)
    by_queue: dict[str, QueueHealth] = {}

    def queue(name: str) -> QueueHealth:
        if name not in by_queue:
            by_queue[name] = QueueHealth(queue=name)
        return by_queue[name]

    pending = Q(status=JobStatus.PENDING)
    ready = pending & Q(run_after__lte=db_now)
    active = jobs.filter(ACTIVE_ROWS)
    for row in active.values("queue").annotate(
        ready=Count("id", filter=ready),
        scheduled=Count("id", filter=pending & Q(run_after__gt=db_now)),
        running=Count("id", filter=Q(status=JobStatus.RUNNING)),
        expired=Count("id", filter=Q(status=JobStatus.RUNNING, locked_until__lt=db_now)),
        oldest_ready=Min("run_after", filter=ready),
    ):
        q = queue(row["queue"])
        q.ready, q.scheduled = row["ready"], row["scheduled"]
        q.running, q.expired = row["running"], row["expired"]
        if row["oldest_ready"] is not None:
            q.oldest_ready_wait = _seconds(db_now - row["oldest_ready"])

    for dead in jobs.filter(status=JobStatus.DEAD).values("queue").annotate(n=Count("*")):
        queue(dead["queue"]).dead = dead["n"]

    # Through the partial index leasejobs_job_waiting_idx (status = 'waiting').
    for waiting in jobs.filter(status=JobStatus.WAITING).values("queue").annotate(n=Count("*")):
        queue(waiting["queue"]).waiting = waiting["n"]

    since = db_now - WINDOW
    recent = jobs.filter(status__in=FINISHED_STATUSES, finished_at__gte=since)
    minutes: dict[datetime, MinuteCount] = {}
    for done in (
        # Minutes in UTC, like db_now: MySQL/MariaDB would otherwise convert to TIME_ZONE
        # with CONVERT_TZ, which is NULL without the server's time zone tables (and Django
        # raises). Today's UTC offsets are all whole minutes: the minutes are the same.
        recent.annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .values("queue", "status", "minute")
        .annotate(n=Count("id"))
    ):
        q = queue(done["queue"])
        bucket = minutes.setdefault(done["minute"], MinuteCount(minute=done["minute"]))
        if done["status"] == JobStatus.SUCCEEDED:
            q.succeeded_last_hour += done["n"]
            bucket.succeeded += done["n"]
        elif done["status"] != JobStatus.CANCELLED:
            q.failed_last_hour += done["n"]
            bucket.failed += done["n"]
    start = (db_now - WINDOW).replace(second=0, microsecond=0)
    health.per_minute = [
        minutes.get(start + timedelta(minutes=i), MinuteCount(minute=start + timedelta(minutes=i)))
        for i in range(61)
    ]
    health.queues = sorted(by_queue.values(), key=lambda q: q.queue)

    for job in (
        jobs.filter(status=JobStatus.RUNNING)
        .order_by("locked_until")
        .values(
            "id",
            "task_path",
            "queue",
            "attempt",
            "locked_by",
            "locked_until",
            "heartbeat_at",
            "progress",
            "progress_message",
        )[:RUNNING_LIST_LIMIT]
    ):
        health.running.append(
            RunningJobInfo(
                id=job["id"],
                task_path=job["task_path"],
                queue=job["queue"],
                attempt=job["attempt"],
                worker=job["locked_by"] or "",
                lease_left=(job["locked_until"] - db_now).total_seconds()
                if job["locked_until"]
                else 0.0,
                since_heartbeat=_seconds(db_now - job["heartbeat_at"])
                if job["heartbeat_at"]
                else None,
                progress=job["progress"],
                progress_message=job["progress_message"],
            )
        )

    cutoff = db_now - timedelta(seconds=online_after)
    for worker in (
        Worker.objects.using(using)
        .filter(
            Q(state__in=[WorkerState.RUNNING, WorkerState.STOPPING]) | Q(last_seen_at__gte=since)
        )
        .order_by(F("last_seen_at").desc())[:100]
    ):
        health.workers.append(
            WorkerInfo(
                id=worker.id,
                host=worker.host,
                pid=worker.pid,
                queues=list(worker.queues),
                pool=worker.pool,
                concurrency=worker.concurrency,
                last_seen_ago=_seconds(db_now - worker.last_seen_at) or 0.0,
                online=worker.state != WorkerState.STOPPED and worker.last_seen_at >= cutoff,
                problem=worker.problem,
            )
        )
    return health
