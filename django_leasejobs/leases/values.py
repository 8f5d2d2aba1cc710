"""The values that flow in and out of the lease protocol's functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db import DatabaseError

from ..hot_values import hot_value
from ..models import AttemptOutcome
from .rules import (
    MAX_ERROR_CLASS_LENGTH,
    MAX_ERROR_LENGTH,
    MAX_TRACEBACK_LENGTH,
    last_error_text,
    storable_text,
)


@dataclass(frozen=True, slots=True)
class ParentOutcome:
    """One parent of a step, as the step sees it when it runs."""

    job_id: int
    task_path: str
    status: str
    """The parent job's status (``succeeded`` unless the step runs after a failure,
    ``on_parent_failure="run"``); ``missing`` when its row was deleted (pruned)."""
    result: Any
    """The parent's return value when it succeeded, else None."""
    error: str
    """The parent's last error (``Class: message``) when it did not succeed, else ''."""

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


@hot_value
class ClaimedJob:
    """What a worker needs to run one claimed attempt."""

    id: int
    attempt: int
    task_path: str
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None
    max_attempts: int
    checkpoint: Any
    retry_backoff: dict[str, float] | None = None
    """The job's own backoff policy (from ``.using(retry_backoff=...)``), if any."""
    problem: str | None = None
    """Why the row cannot run (its stored columns have the wrong JSON types), or None.
    Such an attempt fails at once, as its own attempt, and nothing is called."""
    key: str | None = None
    task_options: dict[str, Any] | None = None
    """``Job.task_options``: with the columns above, the Task exactly as enqueued."""
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    """When the job's first attempt started."""
    last_attempted_at: datetime | None = None
    """When this attempt started (the claim)."""
    snoozes: int = 0
    """``Job.snoozes``: the snoozes the job took before this attempt."""
    trace_context: Any = None
    """``Job.trace_context`` as stored (the enqueuer's W3C trace context, or None); read
    by ``tracing`` only, which never trusts its shape."""
    metadata: dict[str, Any] | None = None
    """``Job.metadata``: a JSON object, or None (a row holding anything else reads as
    None)."""
    workflow_id: int | None = None
    """The workflow the job is a step of, or None: the end of such an attempt settles its
    dependants in the same transaction (``leases.settle``)."""
    parents: tuple[ParentOutcome, ...] | None = None
    """A step's parents, read by the worker right after the claim (so that the task reads
    them without a query: ``context.parent_results``); None when not read (not a step, or
    the read failed: the task then reads them itself)."""
    flow_group: str | None = None
    """``Job.flow_group``: the job runs under a flow limit of its key or task (None: no
    such limit). Its end may make room for a claim (``worker.rounds``)."""
    lease: tuple[int, int] = field(init=False, compare=False, repr=False)
    """``(id, attempt)``: the key of the attempt everywhere in the worker (made once: it
    is read a dozen times per job)."""

    def __post_init__(self) -> None:
        self.lease = (self.id, self.attempt)  # type: ignore[misc]  # (hot_value: set once)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Sent to a slot's process for every job: a plain tuple pickles several times
        # faster than a slotted dataclass's default state.
        return (
            ClaimedJob,
            (
                self.id,
                self.attempt,
                self.task_path,
                self.queue,
                self.priority,
                self.args,
                self.kwargs,
                self.timeout,
                self.max_attempts,
                self.checkpoint,
                self.retry_backoff,
                self.problem,
                self.key,
                self.task_options,
                self.enqueued_at,
                self.started_at,
                self.last_attempted_at,
                self.snoozes,
                self.trace_context,
                self.metadata,
                self.workflow_id,
                self.parents,
                self.flow_group,
            ),
        )


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float | None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class RenewResult:
    held: frozenset[tuple[int, int]]
    """Leases this call renewed: (job id, attempt)."""
    lost: frozenset[tuple[int, int]]
    """Leases asked for and not renewed: the worker must stop those attempts now."""
    cancel_requested: frozenset[tuple[int, int]]
    """Held leases whose job an operator asked to cancel."""
    skipped: frozenset[tuple[int, int]] = frozenset()
    """Leases not renewed this time because another transaction holds their row locked
    (databases with row locks): still this worker's as far as the database showed; try
    again later."""


@dataclass(frozen=True, slots=True)
class ReapedJob:
    id: int
    attempt: int
    worker: str
    status: str
    queue: str
    task_path: str
    stall_count: int
    backend: str


@dataclass(frozen=True, slots=True)
class ReapPass:
    """What one reap pass (:func:`leases.reap`) did."""

    jobs: list[ReapedJob]
    """The jobs it reaped, in id order."""
    repair_error: DatabaseError | None = None
    """Why its repair of waiting workflow steps failed, else None. Only on PostgreSQL and
    SQLite, where the repair runs in a savepoint of the reap's transaction and a failed
    repair leaves the reap standing; on MySQL/MariaDB the repair is a transaction of its
    own, and its failure raises."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why an attempt did not succeed, as stored on its JobAttempt row.

    Always storable: each part is passed through :func:`storable_text` with its
    column's limit when the value is made, so no error a job raises can make the
    write of its own attempt fail.
    """

    exception_class_path: str
    message: str = ""
    traceback: str = ""

    def __post_init__(self) -> None:
        for name, limit in (
            ("exception_class_path", MAX_ERROR_CLASS_LENGTH),
            ("message", MAX_ERROR_LENGTH),
            ("traceback", MAX_TRACEBACK_LENGTH),
        ):
            value = getattr(self, name)
            clean = storable_text(value, limit)
            if clean is not value:
                object.__setattr__(self, name, clean)

    @property
    def last_error(self) -> str:
        """The job row's ``last_error`` for this error."""
        return last_error_text(self.exception_class_path, self.message)


class CancelResult(StrEnum):
    CANCELLED = "cancelled"
    """The job was pending and is now cancelled."""
    REQUESTED = "requested"
    """The job is running; its worker will stop it at its next heartbeat."""
    NOT_CANCELLABLE = "not_cancellable"
    """The job had already finished (or a cancel was already requested)."""
    NOT_FOUND = "not_found"


class RetryResult(StrEnum):
    RETRIED = "retried"
    WRONG_STATE = "wrong_state"
    """The job is not failed or dead (it is pending, running, succeeded or cancelled)."""
    KEY_TAKEN = "key_taken"
    """Another pending or running job holds the job's dedup key."""
    NOT_FOUND = "not_found"


@dataclass(frozen=True, slots=True)
class ClaimRound:
    """What one claim took, and whether flow limits held due jobs back."""

    jobs: list[ClaimedJob]
    flow_held: bool = False
    """The flow claim left due jobs pending because a limit was full or a rate used up:
    claiming again before a slot frees or a window moves on would find the same."""


@hot_value
class NewJob:
    """The producer's columns of a job row about to be inserted."""

    backend: str
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    max_attempts: int
    max_stalls: int
    timeout: float | None
    key: str | None
    retry_backoff: dict[str, float] | None
    run_after: datetime | None
    """None: runnable at once (the database's now)."""
    task_options: dict[str, Any] | None = None
    """The options the enqueued Task had set that no other column keeps exactly (its own
    ``run_after``, ``max_attempts``, ``max_stalls``), so that ``get_result`` rebuilds the
    same Task; None when it set none of them."""
    trace_context: dict[str, str] | None = None
    """The enqueuer's W3C trace context (``tracing.current_context``), or None."""
    flow_group: str | None = None
    """``"key:" + concurrency key`` or ``"task:" + task path`` when the job obeys a
    concurrency or rate limit of its own (``limits``); None otherwise."""
    concurrency_limit: int | None = None
    rate_limit: str | None = None
    metadata: dict[str, Any] | None = None
    """The job's metadata (``using(metadata=...)``), or None."""
    result_ttl: timedelta | None = None
    """How long the job is kept once finished (``prune_jobs``); None: its queue's, else the
    command's."""
    workflow_id: int | None = None
    """The workflow the job is a step of; None: a plain job."""
    waiting_on: int | None = None
    """A step's parents: it is inserted ``waiting`` when it has any; None: none."""
    on_parent_failure: str | None = None
    """``"run"``: the step runs even when a parent failed; None: it fails unrun."""


@hot_value
class Completion:
    """One successful attempt, for :func:`complete_many`."""

    job_id: int
    attempt: int
    result: Any = None
    in_workflow: bool = False
    """The job is a workflow step (``ClaimedJob.workflow_id``): its success releases its
    dependants in the same transaction."""

    @property
    def lease(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)


@hot_value
class Failure:
    """One attempt that did not succeed, for :func:`fail_many`.

    ``retry_delay=None`` fails the job for good; otherwise it is retried after that
    many seconds unless its attempts are used up. A ``snooze`` (the task raised
    ``Retry``, within its ``max_snoozes``) is retried after ``retry_delay`` whatever
    attempts are left, and gives its attempt back (``rules.snoozing``).
    """

    job_id: int
    attempt: int
    error: ErrorInfo
    retry_delay: float | None
    outcome: str = AttemptOutcome.ERROR
    snooze: bool = False
    decision: str = ""
    """Why the job was retried, snoozed or not, for the attempt row (``rules.decide``)."""
    give_back: bool = False
    """The attempt is not counted (``max_attempts`` + 1): it ended for another job's
    fault (``finish.release_collateral``)."""

    @property
    def lease(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a batched write (:func:`complete_many`, :func:`fail_many`) did."""

    written: dict[tuple[int, int], str]
    """Each written lease and the job's new status."""
    skipped: frozenset[tuple[int, int]] = frozenset()
    """Leases not written because another transaction holds their row locked
    (databases with row locks): still held; write them again later. Every other lease
    asked for and missing from ``written`` was lost."""
    finished_at: dict[tuple[int, int], datetime | None] = field(default_factory=dict)
    """The job's ``finished_at`` as written (None: not finished, a retry is pending)."""
