"""The lease protocol: one function per state transition of a job.

Every transition is a single conditional UPDATE whose WHERE re-checks what the
transition assumes (status, and for the lease holder's writes ``locked_by`` AND
``attempt``), and whose effect is checked. A write by a caller that no longer holds
the lease matches no row and raises :class:`LeaseLost` (or leaves the lease out of
the result of a batched call); it never changes anything. All times are the
database's clock.

The SQL of a job's life lives in this package and only here (the schema's lives in
the migrations, a worker's ``LISTEN`` in ``worker/listener.py``, and ``DatabaseNow``, an
ORM expression the models' defaults need, in ``functions.py``), split by concern:

* ``values``: the values that flow in and out (claimed jobs, results, errors);
* ``rules``: each decision once (retry or fail or dead, a requested cancel wins, the
  ``last_error`` text, the lengths stored text is cut to);
* ``dialect``: what differs between databases (the clock, intervals, casts, row
  locks) and which path each takes: the batched statements (PostgreSQL, SQLite) or
  the portable ones (MySQL 8, MariaDB 10.6+);
* ``fenced``: the lease holder's fenced writes to many rows, on both paths;
* ``claim``, ``renew``, ``finish``, ``reap``, ``operator``, ``enqueue``: the
  statements, built from the above;
* ``rollups``: the rollup table's upsert (per-minute counts the workers add);
* ``keys``: the job an enqueue with a dedup key returns (unique while active, and within
  a ``unique_for`` window), and debounce's replacement of a pending job;
* ``flow``: the claim of jobs under flow control (paused queues, concurrency and rate
  limits) and the next-due lookup that skips paused queues;
* ``dependants``, ``fanin``, ``workflow_ops``: workflow steps released or ended after
  their parents end, the fan-in counters of steps with many parents, and a workflow's
  operator writes.

It knows nothing of processes, threads or signals.
"""

from __future__ import annotations

from ..exceptions import LeaseLost, RowLocked
from .claim import claim, claim_round, claims_beside_writes, unclaim
from .defer import Deferred, defer_unknown
from .dependants import (
    PARENT_FAILED_CLASS,
    EndedStep,
    Settled,
    repair_waiting,
    settle_and_notify,
    settle_new_steps,
)
from .dialect import portable_path, retry_deadlocks
from .enqueue import (
    NOTIFY_CHANNEL,
    can_copy,
    can_insert_notify,
    copy_jobs,
    database_now,
    insert_edges,
    insert_job,
    notify,
)
from .fanin import waits_for
from .finish import (
    complete,
    complete_many,
    dead_letter_many,
    fail,
    fail_many,
    mark_cancelled,
    release,
    release_collateral,
)
from .flow import due_now, seconds_to_next_due
from .keys import debounce, key_holder, runnable_after
from .operator import backend_database, cancel, retry
from .reap import find_stale, reap
from .renew import renew, save_checkpoint, save_metadata, set_progress
from .rollups import (
    COUNTER_AT,
    ENDING_COUNTERS,
    RollupKey,
    Tally,
    add_tally,
    minute_of,
    run_at,
    wait_at,
)
from .rules import (
    MAX_ERROR_CLASS_LENGTH,
    MAX_ERROR_LENGTH,
    MAX_PROGRESS_MESSAGE_LENGTH,
    MAX_TRACEBACK_LENGTH,
    AttemptDecision,
    decide,
    storable_text,
)
from .values import (
    CancelResult,
    ClaimedJob,
    ClaimRound,
    Completion,
    ErrorInfo,
    Failure,
    NewJob,
    ParentOutcome,
    Progress,
    ReapedJob,
    ReapPass,
    RenewResult,
    RetryResult,
    WriteResult,
)
from .workflow_ops import (
    WorkflowCancel,
    cancel_workflow,
    parent_outcomes,
    retry_failed_steps,
)

__all__ = [
    "COUNTER_AT",
    "ENDING_COUNTERS",
    "MAX_ERROR_CLASS_LENGTH",
    "MAX_ERROR_LENGTH",
    "MAX_PROGRESS_MESSAGE_LENGTH",
    "MAX_TRACEBACK_LENGTH",
    "NOTIFY_CHANNEL",
    "PARENT_FAILED_CLASS",
    "AttemptDecision",
    "CancelResult",
    "ClaimRound",
    "ClaimedJob",
    "Completion",
    "Deferred",
    "EndedStep",
    "ErrorInfo",
    "Failure",
    "LeaseLost",
    "NewJob",
    "ParentOutcome",
    "Progress",
    "ReapPass",
    "ReapedJob",
    "RenewResult",
    "RetryResult",
    "RollupKey",
    "RowLocked",
    "Settled",
    "Tally",
    "WorkflowCancel",
    "WriteResult",
    "add_tally",
    "backend_database",
    "can_copy",
    "can_insert_notify",
    "cancel",
    "cancel_workflow",
    "claim",
    "claim_round",
    "claims_beside_writes",
    "complete",
    "complete_many",
    "copy_jobs",
    "database_now",
    "dead_letter_many",
    "debounce",
    "decide",
    "defer_unknown",
    "due_now",
    "fail",
    "fail_many",
    "find_stale",
    "insert_edges",
    "insert_job",
    "key_holder",
    "mark_cancelled",
    "minute_of",
    "notify",
    "parent_outcomes",
    "portable_path",
    "reap",
    "release",
    "release_collateral",
    "renew",
    "repair_waiting",
    "retry",
    "retry_deadlocks",
    "retry_failed_steps",
    "run_at",
    "runnable_after",
    "save_checkpoint",
    "save_metadata",
    "seconds_to_next_due",
    "set_progress",
    "settle_and_notify",
    "settle_new_steps",
    "storable_text",
    "unclaim",
    "wait_at",
    "waits_for",
]
