"""The round driver: one database round at a time, in the worker's database thread
(its claim on a second one beside its writes, where the database allows it).

The main loop never waits on the database. It plans a round (``Recorder.plan``) and the
driver runs it in the database thread (``rounds.run_round``), then hands the result
back. During a drain (the last claim came back full) the next round is handed over
while one runs: it waits in the thread and starts the moment the first ends, claiming
ahead of the slots by a second prefetch (``MAX_IN_FLIGHT``), so that the thread does
not idle while the main loop records one round's outcomes and hands its jobs over.

The driver also keeps the rhythm of claims: when the next claim is due (at once after a
NOTIFY, a full batch or a freed slot; after ``POLL_INTERVAL``, or for a listening idle
worker ``IDLE_POLL_INTERVAL`` or when its next delayed job comes due), and the pause
after a failed round. Everything it holds is the main loop's: the
database thread returns values, never writes here.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import DatabaseError, connections

from .. import leases
from ..conf import Options
from ..leases import storable_text
from .inbox import NextDue
from .lease_length import LeaseLength
from .rounds import RoundContext, RoundPlan, RoundResult, run_round
from .tallies import round_tally

logger = logging.getLogger("django_leasejobs")

ROLLUP_WRITE_EVERY = 1.0
"""Seconds a worker keeps its rollup counts in memory (merging round after round) before
it writes them in one upsert: under a steady drain, one statement a second, not one per
round. A round whose claim comes back empty (the queues ran dry) writes them at once,
and so does the worker as it stops; a worker killed meanwhile loses at most this long
of counts, never an outcome (docs/monitoring.md, "The loss window")."""

MAX_IN_FLIGHT = 2
"""Rounds handed to the database thread at once: while one runs, the next waits there,
so that the thread starts it the moment the first ends instead of idling while the main
loop takes the first one's result (``RoundDriver.may_start_ahead``)."""

DUE_MARGIN = 0.02
"""An idle worker waiting for a delayed job to come due claims this long after its
``run_after`` (seconds), so that the claim does not come a hair too early."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A round handed to the database thread, not taken back yet."""

    plan: RoundPlan
    future: Future[RoundResult]
    started: float
    """When (monotonic) the main loop handed it over."""


class RoundDriver:
    def __init__(
        self,
        *,
        worker_id: str,
        backend: str,
        database: str,
        queues: tuple[str, ...] | None,
        options: Options,
        lease_length: LeaseLength,
        wake: Callable[[], None],
    ) -> None:
        self.worker_id = worker_id
        self.backend = backend
        self.database = database
        self.queues = queues
        self.options = options
        self.lease_length = lease_length
        """The lease each claim asks for (the heartbeat stretches it while renewals lag)."""
        self._wake = wake
        self._executor: ThreadPoolExecutor | None = None
        self._beside: ThreadPoolExecutor | None = None
        """The second database thread: a round's claim beside its writes (PostgreSQL,
        ``rounds.run_round``). Its thread and connection start with the first such round."""
        self._beside_started = threading.Event()
        self._rounds: deque[InFlight] = deque()
        """Rounds in flight, oldest first (at most ``MAX_IN_FLIGHT``)."""
        self.failures = 0
        """Rounds failed in a row (connection-level errors)."""
        self._retry_at = 0.0
        self.next_poll = 0.0
        self.claim_wanted = True
        self.last_claimed: int | None = None
        self.passed_over_since: float | None = None
        """Since when (monotonic) the claims of a ``--burst`` worker came back empty while
        a due job was pending (``RoundResult.passed_over``); None after any other claim."""
        self._last_full = False
        """The last claim taken brought as many jobs as it asked for."""
        self._flow_held_until = 0.0
        """Until then (monotonic), claims take jobs that obey no limit first, and make a
        flow claim only for the slots those leave: the last flow claim found due jobs
        held back by full limits (``leases.claim_round``)."""
        self._next_due: float | None = None
        """Seconds from the last empty claim to the earliest pending ``run_after`` of this
        worker's queues (None: none pending); only looked up while listening."""
        self.problem = ""
        """'' or what keeps rounds failing (for the worker's registry row)."""
        self._unsent: leases.Tally | None = None
        """Rollup counts not written yet, handed to the next round."""
        self._unsent_since: float | None = None
        """When (monotonic) the oldest of them was counted."""

    # -- the database thread -------------------------------------------------------------

    def open(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leasejobs-db")
        if leases.claims_beside_writes(self.database):
            self._beside = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="leasejobs-db-claim",
                initializer=self._beside_started.set,
            )

    def close(self) -> None:
        while self._rounds:
            with contextlib.suppress(Exception):
                self.take()  # (their rollup counts are the last ones)
        if self._executor is not None:
            unsent, self._unsent = self._unsent, None
            if unsent is not None:
                self._executor.submit(self._write_rollup, unsent)
            self._executor.submit(connections.close_all)
            self._executor.shutdown(wait=True)
        if self._beside is not None:
            if self._beside_started.is_set():  # (else it has no thread, nor a connection)
                self._beside.submit(connections.close_all)
            self._beside.shutdown(wait=True)

    @property
    def in_flight(self) -> int:
        """Rounds handed to the database thread and not taken back."""
        return len(self._rounds)

    @property
    def claiming(self) -> int:
        """Jobs the rounds in flight may still bring (their claim limits)."""
        return sum(r.plan.claim_limit for r in self._rounds)

    def may_start(self, now: float) -> bool:
        """No round is running and no failed round's pause is on."""
        return not self._rounds and not (self.failures and now < self._retry_at)

    def may_start_ahead(self) -> bool:
        """A round is running whose claim the worker expects to come back full (the last
        one did: a drain), and no failure is on: the next round may wait in the database
        thread behind it, claiming ahead (``MAX_IN_FLIGHT``)."""
        if not 0 < len(self._rounds) < MAX_IN_FLIGHT or self.failures:
            return False
        return bool(self._rounds[-1].plan.claim_limit) and self._last_full

    def claim_due(self, now: float) -> bool:
        return self.claim_wanted or now >= self.next_poll

    def start(self, plan: RoundPlan, *, listening: bool, burst: bool) -> None:
        """Run ``plan`` in the database thread (the loop is woken when it is done)."""
        assert self._executor is not None  # noqa: S101 - opened by the loop
        now = time.monotonic()
        if plan.claim_limit:
            # No NOTIFY, no full batch, no drain: only the timer brought this claim.
            plan.look_first = listening and not (
                plan.writes or self.claim_wanted or burst or self._rounds
            )
            self.claim_wanted = False
        plan.rollup_carry, self._unsent = self._unsent, None
        since = self._unsent_since
        plan.rollup_due = since is not None and now - since >= ROLLUP_WRITE_EVERY
        ctx = RoundContext(
            worker_id=self.worker_id,
            database=self.database,
            backend=self.backend,
            queues=self.queues,
            lease_duration=self.lease_length.claim_seconds,
            unknown_task_grace=self.options.unknown_task_grace,
            flow=self.options.flow,
            main_lane_first=now < self._flow_held_until,
        )
        future = self._executor.submit(self._run, plan, ctx, listening, burst)
        future.add_done_callback(lambda _: self._wake())  # runs once done() is true
        self._rounds.append(InFlight(plan, future, now))

    def done(self) -> bool:
        """The oldest round in flight has ended."""
        return bool(self._rounds) and self._rounds[0].future.done()

    def take(self) -> tuple[RoundPlan, RoundResult, float]:
        """The oldest round, ended: its plan, its result and how long it took (from when
        the database thread began it until now)."""
        round_ = self._rounds.popleft()
        plan, started = round_.plan, round_.started
        result = round_.future.result(timeout=self.options.lease_duration)
        unsent = result.rollup_unsent
        if unsent is not None:
            # (A round that waited behind another started without the counts that one
            # kept: they meet here.)
            if self._unsent is None:
                self._unsent = unsent
            else:
                self._unsent.merge(unsent)
            if self._unsent_since is None:
                self._unsent_since = started
        elif self._unsent is None:
            self._unsent_since = None
        if result.flow_held:
            self._flow_held_until = time.monotonic() + self.options.poll_interval
        self._next_due = result.next_due
        if result.error is None:
            self.failures = 0
            self.problem = ""
        else:
            self.failures += 1
            delay = min(5.0, 0.2 * 2**self.failures) * random.uniform(0.8, 1.2)  # noqa: S311
            self._retry_at = time.monotonic() + delay
            error = storable_text(result.error, 500)
            self.problem = f"database rounds failing ({self.failures} in a row): {error}"
            logger.warning(
                "database error in the worker (attempt %d), reconnecting: %s",
                self.failures,
                error,
                extra={"worker": self.worker_id, "error": error},
            )
        return plan, result, time.monotonic() - max(started, result.began)

    def _run(self, plan: RoundPlan, ctx: RoundContext, listening: bool, burst: bool) -> RoundResult:
        """One round, in the database thread, noting when it began there (it may have
        waited behind another)."""
        began = time.monotonic()
        result = self._run_and_look(plan, ctx, listening, burst)
        result.began = began
        return result

    def _run_and_look(
        self, plan: RoundPlan, ctx: RoundContext, listening: bool, burst: bool
    ) -> RoundResult:
        """One round; then what the idle wait needs.

        Jobs this round gave back (prefetched jobs, or released at shutdown) get a
        NOTIFY, so idle workers that wait on one take them at once. After an empty
        claim by a listening worker, one more query finds when its next delayed job
        comes due: a NOTIFY is sent at enqueue, not when ``run_after`` passes. A safety
        poll (``plan.look_first``) asks that first, and claims only when a job is due:
        an idle worker's poll is then one query, not two. After an empty claim of a
        ``--burst`` worker that no limit explains, one query without locks asks whether
        a job is due all the same (``leases.due_now``): the claim passed over its locked
        row, and the worker looks again rather than exit.
        """
        known_due: float | None = None
        if plan.look_first:
            with contextlib.suppress(Exception):  # (claim as usual, and look after it)
                known_due = self.seconds_to_next_due(plan.skip_tasks)
                if known_due is None or known_due > 0:
                    logger.debug(
                        "safety poll: no job due (%s), no claim",
                        "none pending" if known_due is None else f"next in {known_due:.3f}s",
                        extra={"worker": self.worker_id},
                    )
                    return RoundResult(
                        claimed=[], next_due=known_due, rollup_unsent=plan.rollup_carry
                    )
        result = run_round(plan, ctx, self._beside)
        if self.options.rollups:
            result.rollup_unsent = self._add_rollup(plan, result)
        if result.error is None:
            try:
                self._notify_given_back(plan, result)
                if listening and plan.claim_limit and result.claimed == []:
                    result.next_due = (
                        known_due
                        if known_due is not None
                        else self.seconds_to_next_due(plan.skip_tasks)
                    )
                if burst and plan.claim_limit and result.claimed == [] and not result.flow_held:
                    # (True until the lookup says not: after a failed lookup it looks again;
                    # a listening worker's next-due lookup above answered it already)
                    result.passed_over = True
                    result.passed_over = (
                        result.next_due is not None and result.next_due <= 0
                        if listening
                        else leases.due_now(
                            self.backend,
                            self.queues,
                            skip_tasks=plan.skip_tasks,
                            using=self.database,
                        )
                    )
            except Exception as exc:  # the idle wait falls back to POLL_INTERVAL
                result.next_due = 0.0
                logger.warning(
                    "after a round (NOTIFY of given-back jobs, due or next-due lookup): %s; "
                    "polling",
                    storable_text(exc, 500),
                    extra={"worker": self.worker_id, "error": storable_text(exc, 500)},
                )
                with contextlib.suppress(DatabaseError):
                    connections[self.database].close()
        return result

    def _add_rollup(self, plan: RoundPlan, result: RoundResult) -> leases.Tally | None:
        """The round's counts merged with those kept from earlier rounds; written in one
        upsert (``leases.add_tally``) when they are due (``ROLLUP_WRITE_EVERY``) or the
        round's claim came back empty, else kept. Returns the counts not written.

        A separate statement: the outcomes are committed by then, so a worker killed in
        between loses the counts it kept (never an outcome).
        """
        tally = round_tally(plan, result, self.backend)
        if plan.rollup_carry is not None:
            tally.merge(plan.rollup_carry)
        if not tally:
            return None
        ran_dry = bool(plan.claim_limit) and result.error is None and not result.claimed
        if not (plan.rollup_due or ran_dry):
            return tally
        return self._write_rollup(tally)

    def _write_rollup(self, tally: leases.Tally) -> leases.Tally | None:
        """Write ``tally`` (in the database thread); it, if the write failed."""
        try:
            leases.add_tally(tally, using=self.database)
        except Exception as exc:
            error = storable_text(exc, 500)
            logger.warning(
                "rollup counts not written, kept for the next round: %s",
                error,
                extra={"worker": self.worker_id, "error": error, "rows": len(tally.rows)},
            )
            with contextlib.suppress(DatabaseError):
                connections[self.database].close()
            return tally
        return None

    def _notify_given_back(self, plan: RoundPlan, result: RoundResult) -> None:
        queues: set[str] = set()
        if result.unclaimed:
            queues.update(r.job.queue for r, _ in plan.unclaims if r.job.lease in result.unclaimed)
        for done, (running, what) in zip(result.singles_done, plan.singles, strict=False):
            if done and what.kind == "shutdown":
                queues.add(running.job.queue)
        if queues:
            leases.notify(leases.NOTIFY_CHANNEL, sorted(queues), using=self.database)

    def seconds_to_next_due(self, skip_tasks: tuple[str, ...]) -> float | None:
        """Seconds until the next pending job of this worker's queues comes due
        (``leases.seconds_to_next_due``; PostgreSQL: only a listening worker asks), the
        jobs of the tasks it stands aside from left out: it would not claim them, so a
        due one must not bring its next look forward to ``POLL_INTERVAL``."""
        return leases.seconds_to_next_due(
            self.backend, self.queues, skip_tasks=skip_tasks, using=self.database
        )

    # -- the rhythm of claims ------------------------------------------------------------

    def claimed(
        self, count: int, limit: int, *, listening: bool, passed_over: bool
    ) -> float | None:
        """Note a claim's size (and, for an empty one, whether it ``passed_over`` a due
        job); after an empty one, return how long the worker now waits before it looks
        for work again (unless woken), else None."""
        self.last_claimed = count
        if not passed_over:
            self.passed_over_since = None
        elif self.passed_over_since is None:
            self.passed_over_since = time.monotonic()
        self._last_full = count >= limit
        if count >= limit:
            self.claim_wanted = True  # a full batch: there may be more ready jobs now
        elif not count:
            wait = self._until_next_look(listening)
            self.next_poll = time.monotonic() + wait
            return wait
        return None

    def _until_next_look(self, listening: bool) -> float:
        """How long an idle worker waits before it looks for work again (unless woken).

        Not listening: ``POLL_INTERVAL``. Listening: ``IDLE_POLL_INTERVAL`` (the safety
        poll), but never past the moment its next delayed job comes due; a job due
        already that the claim did not get (another worker's claim held it) is looked
        for again after ``POLL_INTERVAL``.
        """
        poll = wait = self.options.poll_interval
        if listening:
            wait = self.options.idle_poll_interval
            due = self._next_due
            if due is not None:
                wait = min(wait, due + DUE_MARGIN if due > 0 else poll)
        return wait

    def heard(self, due: NextDue, *, listening: bool, idle: bool) -> None:
        """Act on the heartbeat's next-due lookup: claim now if a job is due, else wait
        for the next one to come due, or ``IDLE_POLL_INTERVAL`` from now. Only while idle
        and listening: a busy loop claims (and looks) for itself."""
        if not listening or not idle or self._rounds:
            return
        if self.claim_wanted or self.failures:
            return
        if due.seconds is not None and due.seconds <= 0:
            self.claim_wanted = True
        else:
            self._next_due = due.seconds
            self.next_poll = time.monotonic() + self._until_next_look(listening)

    def wait_timeout(self, now: float) -> float:
        """How long the loop may sleep as far as rounds go."""
        if self._rounds:
            return self.options.poll_interval  # the database thread wakes us when done
        if self.failures:
            return max(0.0, self._retry_at - now)
        return max(0.0, self.next_poll - now)
