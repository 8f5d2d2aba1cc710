"""One database round of a worker: write the outcomes collected so far, then claim.

The worker's main loop never waits on the database. It plans a round (the queued
outcomes, how many jobs to claim) and hands it to the worker's database thread,
which runs :func:`run_round` while the main loop keeps feeding slots from the
prefetched jobs and collecting their outcomes for the next round. One round runs
at a time (during a drain the next one waits in the thread behind it: ``driver.py``),
so outcomes are written in batches: every success of a round in one
fenced UPDATE, every failure in one fenced UPDATE plus one INSERT of attempt rows.

Bulkheads: a batch the database refuses for a reason other than the connection (a
value it cannot store, say) is written again row by row, so one job's bad outcome
stays with that job; an outcome refused even alone is recorded as a failure of its
attempt that says why (``OutcomeNotStored``), and if even that is refused the
attempt is given up. Only connection-level errors end a round.

This module only calls the lease protocol; it knows nothing of slots or signals.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeVar

from django.db import InterfaceError, OperationalError, connections

from .. import leases
from ..exceptions import LeaseLost, RowLocked
from ..hot_values import hot_value
from ..leases import ClaimedJob, Completion, ErrorInfo, Failure, WriteResult, storable_text
from ..limits import FlowRules
from ..models import AttemptOutcome, JobAttempt, JobStatus
from .execution import Outcome
from .jobs import RunningJob

Lease = tuple[int, int]
Row = TypeVar("Row", Completion, Failure)

EndingKind = Literal[
    "killed", "timeout", "cancelled", "shutdown", "collateral", "unclaim", "unknown"
]


@hot_value
class Ending:
    """How an attempt ended that reported no outcome of its own, as the worker saw it:
    its process died (``killed``), the worker stopped it for its timeout, a cancel or a
    shutdown (``shutdown``: released back to pending), it died with its slot's event
    loop for another job's fault (``collateral``: released, its attempt given back, with
    ``description`` saying whose fault), or it never started and goes back
    unused (``unclaim``; ``unknown``: the worker does not know its task, and gives it
    back to wait for a worker that does). ``description`` says what happened to its
    process (for ``unknown``: why its task could not be loaded)."""

    kind: EndingKind
    description: str


Write = Outcome | Ending
"""What the worker records about one attempt: the slot's outcome, or an ending."""


@dataclass(eq=False)
class RoundPlan:
    """What one round writes and claims. Built and read by the main loop only."""

    successes: list[tuple[RunningJob, Outcome]] = field(default_factory=list)
    """(job, its Outcome)"""
    failures: list[tuple[RunningJob, Write, Failure, float]] = field(default_factory=list)
    """(job, what happened, the Failure to write, the attempt's duration)"""
    singles: list[tuple[RunningJob, Ending]] = field(default_factory=list)
    """Releases at shutdown, releases of collateral and cancels: one transition each, rare."""
    unclaims: list[tuple[RunningJob, Ending]] = field(default_factory=list)
    """Prefetched jobs that never started, given back."""
    deferrals: list[tuple[RunningJob, Ending]] = field(default_factory=list)
    """Jobs of tasks the worker does not know, given back to wait (``leases.defer``)."""
    claim_limit: int = 0
    skip_tasks: tuple[str, ...] = ()
    """Task paths the claim leaves alone: tasks this worker does not know, whose jobs it
    gave back for a worker that knows them (``Recorder._standing_aside``)."""
    alone: bool = False
    """One suspect outcome in a round of its own (``recorder.ISOLATE_AFTER``)."""
    look_first: bool = False
    """The safety poll of an idle listening worker: the worker first looks up when the
    next job of its queues comes due, and claims only if one is due already."""
    rollup_carry: leases.Tally | None = None
    """Rollup counts of earlier rounds not written yet (``RoundDriver``), merged with
    this round's."""
    rollup_due: bool = False
    """The oldest of those counts waited ``ROLLUP_WRITE_EVERY``: this round writes them."""
    history: bool = False
    """Fetch the attempt rows of jobs that finish in this round after an earlier attempt
    (``task_finished`` receivers get every attempt's error and worker)."""

    @property
    def writes(self) -> int:
        return (
            len(self.successes)
            + len(self.failures)
            + len(self.singles)
            + len(self.unclaims)
            + len(self.deferrals)
        )


@dataclass(eq=False)
class RoundResult:
    """What the database said about one round.

    A write step that did not run (a connection-level error came first) leaves its
    ``wrote_*`` flag False: its outcomes are queued again. Within a step that ran, a
    lease is in exactly one of ``statuses`` (written: the job's new status),
    ``skipped`` (its row was locked elsewhere: write it again later),
    ``unwritable`` (the database refused even the fallback record: give it up) or
    none of them (the lease was lost).
    """

    wrote_successes: bool = False
    wrote_failures: bool = False
    statuses: dict[Lease, str] = field(default_factory=dict)
    replaced: dict[Lease, ErrorInfo] = field(default_factory=dict)
    """Outcomes the database refused as they were, recorded as this failure instead."""
    skipped: set[Lease] = field(default_factory=set)
    unwritable: dict[Lease, str] = field(default_factory=dict)
    finished_at: dict[Lease, datetime | None] = field(default_factory=dict)
    history: dict[int, list[JobAttempt]] = field(default_factory=dict)
    """Attempt rows per job id, when the plan asked for them."""
    singles_done: list[bool] = field(default_factory=list)
    """Per single transition, in order: True = written, False = the lease was lost."""
    unclaimed: frozenset[Lease] | None = None
    deferred: leases.Deferred | None = None
    claimed: list[ClaimedJob] | None = None
    claim_sent: float = 0.0
    """When (monotonic) the claim was sent: the claimed leases count from no earlier."""
    claim_lease: float = 0.0
    """The lease the claim asked for (seconds)."""
    flow_held: bool = False
    """Flow limits held due jobs back in this round's claim."""
    next_due: float | None = None
    """After an empty claim of a listening worker: seconds until its next pending job
    comes due (None: none pending, or not looked up)."""
    passed_over: bool = False
    """After an empty claim of a ``--burst`` worker that no limit explains: a due job is
    pending all the same (``leases.due_now``), its row locked by another transaction
    while the claim read past it (``SKIP LOCKED``)."""
    error: Exception | None = None
    began: float = 0.0
    """When (monotonic) the database thread began the round."""
    rollup_unsent: leases.Tally | None = None
    """Rollup counts not written by this round (kept, or a failed write): a later round
    writes them."""


@dataclass(frozen=True, slots=True)
class RoundContext:
    worker_id: str
    database: str
    backend: str
    queues: Sequence[str] | None
    lease_duration: float
    """The lease the round's claim asks for (``LeaseLength.claim_seconds``)."""
    unknown_task_grace: float = 3600.0
    flow: FlowRules = field(default_factory=FlowRules)
    main_lane_first: bool = False
    """Claim jobs that obey no limit first (``leases.claim_round``)."""


MYSQL_CLIENT_ERRORS = range(2000, 3000)
"""CR_* codes: raised by the client library itself (PyMySQL, mysqlclient) when it cannot
reach the server or loses it: 2002/2003 cannot connect, 2006 server has gone away, 2013
lost connection during query (PyMySQL also reports an error the server sent as it closed
the connection this way), 2014 commands out of sync, 2055 lost connection (extended)."""

MYSQL_CONNECTION_ERRORS = frozenset(
    {
        # The server refuses the connection (raised when a round connects again).
        1040,  # ER_CON_COUNT_ERROR: too many connections
        1042,  # ER_BAD_HOST_ERROR: cannot get a host name for the client's address
        1043,  # ER_HANDSHAKE_ERROR: bad handshake
        1044,  # ER_DBACCESS_DENIED_ERROR: access denied to the database
        1045,  # ER_ACCESS_DENIED_ERROR: access denied (wrong user or password)
        1049,  # ER_BAD_DB_ERROR: unknown database
        1129,  # ER_HOST_IS_BLOCKED: too many connection errors from this host
        1130,  # ER_HOST_NOT_PRIVILEGED: host not allowed to connect
        1203,  # ER_TOO_MANY_USER_CONNECTIONS: max_user_connections reached
        1226,  # ER_USER_LIMIT_REACHED: a per-account resource limit reached
        3032,  # ER_SERVER_OFFLINE_MODE: the server is in offline mode
        3118,  # ER_ACCOUNT_HAS_BEEN_LOCKED (MySQL)
        4150,  # ER_USER_IS_BLOCKED: too many credential errors (MariaDB; MySQL: LOAD BULK)
        4151,  # ER_ACCOUNT_HAS_BEEN_LOCKED (MariaDB; MySQL: LOAD BULK)
        # The server ends the connection.
        1053,  # ER_SERVER_SHUTDOWN: server shutdown in progress
        1152,  # ER_ABORTING_CONNECTION: aborted connection
        1153,  # ER_NET_PACKET_TOO_LARGE: packet bigger than max_allowed_packet (disconnects)
        1154,  # ER_NET_READ_ERROR_FROM_PIPE
        1155,  # ER_NET_FCNTL_ERROR
        1156,  # ER_NET_PACKETS_OUT_OF_ORDER
        1157,  # ER_NET_UNCOMPRESS_ERROR
        1158,  # ER_NET_READ_ERROR: error reading communication packets
        1159,  # ER_NET_READ_INTERRUPTED: timeout reading communication packets
        1160,  # ER_NET_ERROR_ON_WRITE: error writing communication packets
        1161,  # ER_NET_WRITE_INTERRUPTED: timeout writing communication packets
        1184,  # ER_NEW_ABORTING_CONNECTION: aborted connection
        1835,  # ER_MALFORMED_PACKET: malformed communication packet
        1927,  # ER_CONNECTION_KILLED: KILL CONNECTION (MariaDB)
        3169,  # ER_SESSION_WAS_KILLED: KILL CONNECTION (MySQL)
        4031,  # ER_CLIENT_INTERACTION_TIMEOUT: idle past wait_timeout (MySQL 8.0.24+). On
        #        MariaDB 4031 means a trigger named in FOLLOWS/PRECEDES does not exist:
        #        only CREATE TRIGGER raises it, never a worker's statement.
        # Not the row but the moment: PostgreSQL's equivalents are OperationalErrors
        # too (deadlock_detected, lock_not_available, query_canceled), so the round is
        # retried whole there as well rather than recording (or giving up) each row.
        1205,  # ER_LOCK_WAIT_TIMEOUT
        1213,  # ER_LOCK_DEADLOCK (after leases' own retries)
        1317,  # ER_QUERY_INTERRUPTED: KILL QUERY
        1969,  # ER_STATEMENT_TIMEOUT: max_statement_time (MariaDB)
        3024,  # ER_QUERY_TIMEOUT: max_execution_time (MySQL)
        3572,  # ER_LOCK_NOWAIT: a NOWAIT lock request (MySQL)
    }
)
"""Server error codes of MySQL 8 and MariaDB 10.6+ that are about the connection (or the
moment), not the data. The two number their newer errors differently (MySQL from 3000,
MariaDB from 1900 and 4000). Where a code here means something else on the other server
(4031, 4150, 4151), that other error comes from statements a worker never runs
(CREATE TRIGGER, LOAD BULK DATA), so one set serves both without asking the server which
it is. Every other server error (a SIGNAL's 1644, a CHECK's 3819 or 4025, a duplicate
key's 1062, a value too long, ...) is about a row, whichever DB-API class the driver
gives it."""

_MYSQL_DRIVERS = frozenset({"pymysql", "MySQLdb"})


def _from_mysql_driver(exc: BaseException) -> bool:
    """Whether Django raised ``exc`` from a MySQL driver's exception (it raises its own
    class ``from`` the driver's, with the driver's args: the error code first)."""
    cause = exc.__cause__
    return cause is not None and type(cause).__module__.partition(".")[0] in _MYSQL_DRIVERS


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` says the database (or the path to it) failed, not the data.

    Such errors end the round and are retried as a whole after a pause. Any other
    error raised while writing a batch is about a row: the batch is then written row
    by row, so the offending row is isolated and everything else is recorded.

    On PostgreSQL and SQLite that is every ``OperationalError`` and ``InterfaceError``.
    MySQL drivers raise ``OperationalError`` for most server errors, ordinary ones
    about a row included (a trigger's SIGNAL, say), so there the error code decides:
    see :data:`MYSQL_CLIENT_ERRORS` and :data:`MYSQL_CONNECTION_ERRORS`.
    """
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    if not _from_mysql_driver(exc) or isinstance(exc, InterfaceError):
        return True  # a MySQL driver's InterfaceError is (0, ''): not connected
    code = exc.args[0] if exc.args else None
    if not isinstance(code, int):
        return True  # raised by the driver itself, without a code, while connecting
    return code in MYSQL_CLIENT_ERRORS or code in MYSQL_CONNECTION_ERRORS


def run_round(plan: RoundPlan, ctx: RoundContext, beside: Executor | None = None) -> RoundResult:
    """Run one round in the worker's database thread. Never raises.

    ``beside``: the worker's second database thread, where the database allows it
    (``leases.claims_beside_writes``). A round that writes successes and claims runs its
    claim there, on that thread's connection, while this thread writes: the round takes
    as long as the longer of the two, not both (unless a write could make room for the
    claim: :func:`claims_beside`).
    """
    result = RoundResult()
    claim: Future[leases.ClaimRound] | None = None
    if beside is not None and claims_beside(plan, ctx):
        result.claim_sent, result.claim_lease = time.monotonic(), ctx.lease_duration
        claim = beside.submit(_claim_beside, plan.claim_limit, plan.skip_tasks, ctx)
    try:
        _write(plan, ctx, result)
        if plan.claim_limit > 0 and claim is None:
            result.claim_sent, result.claim_lease = time.monotonic(), ctx.lease_duration
            _take_claim(result, _claim(plan.claim_limit, plan.skip_tasks, ctx))
    except Exception as exc:  # connection-level (or a bug): the round is retried whole
        result.error = exc
        with contextlib.suppress(Exception):
            connections[ctx.database].close()  # this thread's connection: reconnect next time
    if claim is not None:
        try:
            # Taken even when the writes failed: the rows are this worker's now.
            _take_claim(result, claim.result())
        except Exception as exc:
            if result.error is None:
                result.error = exc
    return result


def claims_beside(plan: RoundPlan, ctx: RoundContext) -> bool:
    """Whether the round's claim may run beside its writes: it claims, it writes
    successes and nothing else, and none of them could make room for the claim.

    Writes that could make room make the claim follow them, so that it sees what they
    freed (and an empty claim still means no job is ready: ``--burst`` exits on one): a
    failure (its job may be due again at once, for a retry), a job given back or released
    (pending again), and the success of a job that ran under a flow limit (its group's or
    its queue's: a place frees) or of a workflow step (its dependants may be released).
    """
    if not plan.claim_limit or not plan.successes or plan.writes != len(plan.successes):
        return False
    limited = ctx.flow.limited_queues
    for running, _ in plan.successes:
        job = running.job
        if job.flow_group is not None or job.workflow_id is not None or job.queue in limited:
            return False
    return True


def _claim_beside(limit: int, skip_tasks: tuple[str, ...], ctx: RoundContext) -> leases.ClaimRound:
    """The claim, in the second database thread; a failure closes that thread's
    connection (it reconnects next time) and is the round's error."""
    try:
        return _claim(limit, skip_tasks, ctx)
    except Exception:
        with contextlib.suppress(Exception):
            connections[ctx.database].close()
        raise


def _claim(limit: int, skip_tasks: tuple[str, ...], ctx: RoundContext) -> leases.ClaimRound:
    return leases.claim_round(
        ctx.worker_id,
        limit=limit,
        lease_duration=ctx.lease_duration,
        backend=ctx.backend,
        queues=ctx.queues,
        flow=ctx.flow,
        main_lane_first=ctx.main_lane_first,
        skip_tasks=skip_tasks,
        using=ctx.database,
    )


def _take_claim(result: RoundResult, claimed: leases.ClaimRound) -> None:
    result.claimed, result.flow_held = claimed.jobs, claimed.flow_held


def _write(plan: RoundPlan, ctx: RoundContext, result: RoundResult) -> None:
    """The round's writes: outcomes, releases and cancels, give-backs."""
    worker, using = ctx.worker_id, ctx.database
    if plan.successes:
        completions = [
            Completion(r.job.id, r.job.attempt, o.result, r.job.workflow_id is not None)
            for r, o in plan.successes
        ]
        _write_successes(completions, ctx, result)
        result.wrote_successes = True
    if plan.failures:
        _write_failures([failure for _, _, failure, _ in plan.failures], ctx, result)
        result.wrote_failures = True
    for running, ending in plan.singles:
        job = running.job
        try:
            if ending.kind == "shutdown":
                leases.release(job.id, job.attempt, worker, using=using)
            elif ending.kind == "collateral":
                leases.release_collateral(
                    job.id, job.attempt, worker, ending.description, using=using
                )
            else:
                leases.mark_cancelled(job.id, job.attempt, worker, using=using)
        except LeaseLost:
            result.singles_done.append(False)
        except RowLocked:
            result.skipped.add(job.lease)
            result.singles_done.append(False)
        except Exception as exc:
            if is_connection_error(exc):
                raise
            result.unwritable[job.lease] = _describe(exc)
            result.singles_done.append(False)
        else:
            result.singles_done.append(True)
    if plan.history:
        _fetch_history(plan, ctx, result)
    if plan.unclaims:
        given_back = [r.job.lease for r, _ in plan.unclaims]
        result.unclaimed = leases.unclaim(worker, given_back, using=using)
    if plan.deferrals:
        unknown = {r.job.lease: e.description for r, e in plan.deferrals}
        result.deferred = leases.defer_unknown(
            worker, unknown, grace=ctx.unknown_task_grace, using=using
        )


def _note(result: RoundResult, written: WriteResult) -> None:
    result.statuses.update(written.written)
    result.skipped.update(written.skipped)
    result.finished_at.update(written.finished_at)


def _fetch_history(plan: RoundPlan, ctx: RoundContext, result: RoundResult) -> None:
    """The attempt rows of the jobs this round finished that had earlier attempts."""
    finished = {str(s) for s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)}
    jobs = [r.job for r, _ in plan.successes] + [r.job for r, *_ in plan.failures]
    wanted = {
        job.id for job in jobs if job.attempt > 1 and result.statuses.get(job.lease, "") in finished
    }
    if wanted:
        for row in JobAttempt.objects.using(ctx.database).filter(job_id__in=wanted):
            result.history.setdefault(row.job_id, []).append(row)


def _write_successes(
    completions: Sequence[Completion], ctx: RoundContext, result: RoundResult
) -> None:
    """All successes in one statement; a result the database refuses becomes a failure
    of that attempt saying why."""

    def refused(completion: Completion, exc: Exception) -> Failure:
        error = ErrorInfo(
            "django_leasejobs.exceptions.OutcomeNotStored",
            f"the task returned, but the database refused its result: {_describe(exc)}",
        )
        return Failure(completion.job_id, completion.attempt, error, None)

    def write(batch: Sequence[Completion]) -> WriteResult:
        return leases.complete_many(ctx.worker_id, batch, using=ctx.database)

    _write_batch(completions, write, refused, ctx, result)


def _write_failures(failures: Sequence[Failure], ctx: RoundContext, result: RoundResult) -> None:
    """All failures in one transaction; an error the database refuses is replaced by one
    saying why (not retried: what the database refused once it would refuse again)."""

    def refused(failure: Failure, exc: Exception) -> Failure:
        error = ErrorInfo(
            "django_leasejobs.exceptions.OutcomeNotStored",
            f"the attempt failed ({failure.error.exception_class_path}), but the database "
            f"refused its error: {_describe(exc)}",
        )
        # Not retried, so not snoozed either: a refused snooze is an ordinary error.
        outcome = AttemptOutcome.ERROR if failure.snooze else failure.outcome
        return Failure(failure.job_id, failure.attempt, error, None, outcome)

    def write(batch: Sequence[Failure]) -> WriteResult:
        return leases.fail_many(ctx.worker_id, batch, using=ctx.database)

    _write_batch(failures, write, refused, ctx, result)


def _write_batch(
    items: Sequence[Row],
    write: Callable[[Sequence[Row]], WriteResult],
    refused: Callable[[Row, Exception], Failure],
    ctx: RoundContext,
    result: RoundResult,
) -> None:
    """The bulkhead: the whole batch in one write; if the database refuses it for a reason
    other than the connection, row by row, and a row it refuses alone gets the failure
    ``refused`` makes of it instead."""
    try:
        _note(result, write(items))
        return
    except Exception as exc:
        if is_connection_error(exc):
            raise
    for item in items:
        try:
            _note(result, write([item]))
        except Exception as exc:
            if is_connection_error(exc):
                raise
            _write_fallback(refused(item, exc), ctx, result)


def _write_fallback(failure: Failure, ctx: RoundContext, result: RoundResult) -> None:
    """The last resort for one attempt: a failure whose text is our own. If even that is
    refused, the attempt is given up (the worker stops renewing it; the reaper takes it
    back when its lease expires)."""
    try:
        written = leases.fail_many(ctx.worker_id, [failure], using=ctx.database)
    except Exception as exc:
        if is_connection_error(exc):
            raise
        result.unwritable[failure.lease] = _describe(exc)
        return
    _note(result, written)
    if failure.lease in written.written:
        result.replaced[failure.lease] = failure.error


def _describe(exc: BaseException) -> str:
    return storable_text(f"{type(exc).__name__}: {storable_text(exc)}", 500)
