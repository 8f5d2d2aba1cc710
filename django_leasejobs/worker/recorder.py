"""Recording how attempts ended: the queue of outcomes, each round's writes, and what
the main loop does with the database's answer (log, signal, forget, or write again).

Every outcome is written, however late: the write is fenced, so one whose lease was
lost meanwhile matches no row (the loss is reported then), and one that was merely slow
to write is recorded instead of run again. Only an outcome the database refuses is
given up (the bulkhead of ``rounds.py``, and ``ISOLATE_AFTER``): the worker stops
renewing it, and the reaper takes the job back when its lease expires.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..compat import has_other_receivers, task_finished
from ..leases import ErrorInfo, Failure, storable_text
from ..leases.defer import UNKNOWN_TASK_ERROR_CLASS
from ..leases.rules import TIMEOUT_ERROR_CLASS
from ..models import AttemptOutcome, JobStatus
from ..retry import RETRIED, Backoff, Verdict
from .execution import Outcome, attempt_failure
from .jobs import JobBook, RunningJob
from .reporter import Reporter
from .rounds import Ending, RoundPlan, RoundResult, Write

MAX_ROUND_WRITES = 500
"""Outcomes one round writes at most (the rest wait for the next round): keeps every
statement well inside the databases' bound-parameter limits."""

ISOLATE_AFTER = 3
"""An outcome whose round failed this many times as a whole (a connection-level error)
is a suspect: once the database renewed its lease after that (it answers, but maybe not
to that write: a value that breaks the connection, such as a packet over MySQL's
``max_allowed_packet``), it is written only with other suspects, in rounds of their own
(``Recorder.plan``: groups that halve while they fail), each time after a renewal;
failing alone ``GIVE_UP_ALONE`` times, it is given up.
An outcome whose lease the database no longer holds for this worker is not written again
(the fence would refuse it): its loss is reported."""

GIVE_UP_ALONE = 2
"""Failed rounds of its own (each after a renewal) that give an outcome up: one could be
a moment's error (a deadlock, a statement timeout) that had nothing to do with it."""

PROBLEM_MEMORY = 600.0
"""How long a worker reports an attempt it gave up recording (on its registry row)."""


class Recorder:
    def __init__(self, book: JobBook, reporter: Reporter, retry_backoff: Backoff) -> None:
        self.book = book
        self.reporter = reporter
        self.retry_backoff = retry_backoff
        self.writes: list[tuple[RunningJob, Write]] = []
        """Outcomes to record, written in batches by the next database round."""
        self.given_up = 0
        """Attempts whose outcome could not be recorded at all (left to the reaper)."""
        self._last_give_up: tuple[float, str] | None = None
        self._probe = 0
        """Suspects the next group may hold (0: all that are ready)."""
        self._probing = 0
        """Suspects the round in flight writes (0: a round of other writes)."""
        self._standing_aside: dict[str, float] = {}
        """Task paths this worker does not know, each until when (monotonic) its claims
        leave their jobs alone (``leases.Deferred.stand_aside``)."""
        self._skipped: tuple[str, ...] = ()
        """``_standing_aside``'s tasks, sorted, as the main loop and each round read them
        (built again only once one of them ends, or one is added)."""
        self._skipped_until = math.inf
        """When the first of them ends (monotonic)."""

    def record(self, running: RunningJob, what: Write) -> None:
        """Queue how an attempt ended; the next database round writes it (fenced)."""
        running.recording = True
        self.book.table.recording(running.job.lease)
        self.writes.append((running, what))

    # -- planning a round ---------------------------------------------------------------

    def skipped_tasks(self) -> tuple[str, ...]:
        """The tasks whose jobs this worker stands aside from now (a rolling deploy's
        jobs of tasks it does not know): its claims and next-due lookups skip them."""
        # (No clock read while the worker stands aside from nothing: the usual case, on
        # every main-loop pass and round.)
        if self._skipped and (now := time.monotonic()) >= self._skipped_until:
            self._stand_aside({t: end for t, end in self._standing_aside.items() if end > now})
        return self._skipped

    def _stand_aside(self, until: dict[str, float]) -> None:
        self._standing_aside = until
        self._skipped = tuple(sorted(until))
        self._skipped_until = min(until.values(), default=math.inf)

    def plan(self, claim_limit: int, *, ahead: bool = False) -> RoundPlan:
        """The next round: up to ``MAX_ROUND_WRITES`` queued outcomes and the claim; or,
        while suspects wait (``ISOLATE_AFTER``), a group of them without a claim.
        ``ahead``: a round that waits behind another (``driver.MAX_IN_FLIGHT``) takes no
        suspects (what their group's round says is read when the round in flight ends)."""
        # Earlier attempts' rows are only for receivers of the site's: Django's own log
        # receiver reads none of them.
        plan = RoundPlan(claim_limit=claim_limit, history=has_other_receivers(task_finished))
        plan.skip_tasks = self.skipped_tasks()
        ready: list[tuple[RunningJob, Write]] = []
        for item in [item for item in self.writes if item[0].write_failures and not ahead]:
            running = item[0]
            if running.lease_gone:  # a renewal matched no row: the fence refuses it now
                self.writes.remove(item)
                self._lost(running, "record")
            elif running.failed_alone >= GIVE_UP_ALONE:
                self.writes.remove(item)
                self.give_up(
                    running,
                    f"the database refused its outcome {running.write_failures} times while "
                    f"it renewed the lease, {running.failed_alone} of them alone: "
                    f"{running.write_error}",
                )
            elif self._suspect(running):
                ready.append(item)
        if ready:
            # Suspects are written in groups of ``probe``: all of them at first (after
            # an outage they are all innocent), half as many after a failed group, twice
            # as many after a written one. One outcome the database refuses among many
            # is found in a few rounds, and alone it is counted against itself.
            group = ready[: min(len(ready), self._probe or len(ready), MAX_ROUND_WRITES)]
            taken = {id(item) for item in group}
            self.writes = [item for item in self.writes if id(item) not in taken]
            plan.claim_limit = 0  # this round tells whether the database takes them
            plan.alone = len(group) == 1
            self._probing = len(group)
            self._sort_into(plan, group)
            return plan
        # Suspects wait for a renewal: they never fail a batch of others again.
        batch = [item for item in self.writes if item[0].write_failures < ISOLATE_AFTER]
        if len(batch) == len(self.writes):
            self._probe = 0  # no suspect left: the next ones start with a whole group
        batch = batch[:MAX_ROUND_WRITES]
        taken = {id(item) for item in batch}
        self.writes = [item for item in self.writes if id(item) not in taken]
        self._sort_into(plan, batch)
        return plan

    def _suspect(self, running: RunningJob) -> bool:
        """Its rounds failed ``ISOLATE_AFTER`` times, and its lease was renewed after the
        last failure (the database answers, but maybe not to that write)."""
        return running.write_failures >= ISOLATE_AFTER and (
            self.book.table.renewed_at(running.job.lease) > running.write_failed_at
        )

    def _sort_into(self, plan: RoundPlan, writes: list[tuple[RunningJob, Write]]) -> None:
        for running, what in writes:
            if isinstance(what, Outcome) and what.ok:
                plan.successes.append((running, what))
            elif isinstance(what, Ending) and what.kind == "unclaim":
                plan.unclaims.append((running, what))
            elif isinstance(what, Ending) and what.kind == "unknown":
                plan.deferrals.append((running, what))
            elif isinstance(what, Ending) and what.kind in ("shutdown", "collateral", "cancelled"):
                plan.singles.append((running, what))
            else:  # a failed outcome, a killed process, a timeout
                failure, duration = self._failure(running, what)
                plan.failures.append((running, what, failure, duration))

    def _failure(self, running: RunningJob, what: Write) -> tuple[Failure, float]:
        """The Failure to write for an outcome that is not a success, and its duration."""
        job = running.job
        if isinstance(what, Outcome):
            error = what.error or ErrorInfo("django_leasejobs.exceptions.JobFailure")
            return self._decided(running, error, AttemptOutcome.ERROR, what.verdict), what.duration
        if what.kind == "timeout":
            error = ErrorInfo(
                TIMEOUT_ERROR_CLASS,
                f"attempt ran past its timeout of {job.timeout:g}s and {what.description}",
            )
            outcome = AttemptOutcome.TIMEOUT
        else:
            error = ErrorInfo(
                "django_leasejobs.exceptions.JobKilled", f"the job's process {what.description}"
            )
            outcome = AttemptOutcome.KILLED
        failure = self._decided(running, error, outcome, RETRIED)
        return failure, time.monotonic() - running.started

    def _decided(
        self, running: RunningJob, error: ErrorInfo, outcome: str, verdict: Verdict
    ) -> Failure:
        """The Failure of an attempt that ended with ``outcome`` (``attempt_failure``)."""
        return attempt_failure(
            running.job,
            running.task,
            error,
            outcome,
            verdict,
            self.retry_backoff,
        )

    # -- after a round ------------------------------------------------------------------

    def finish(self, plan: RoundPlan, result: RoundResult) -> None:
        """Act on what the database said about the round's writes; queue again what was
        not written (first in line); count the failed round against those outcomes."""
        requeue: list[tuple[RunningJob, Write]] = []
        for running in [r for r, _ in plan.successes] + [r for r, *_ in plan.failures]:
            running.finished_at = result.finished_at.get(running.job.lease)
            running.history = result.history.get(running.job.id)
        for running, outcome in plan.successes:
            if self._unwritten(running, result.wrote_successes, result):
                requeue.append((running, outcome))
            else:
                self._guarded(running, self._after_success, running, outcome, result)
        for running, what, failure, duration in plan.failures:
            if self._unwritten(running, result.wrote_failures, result):
                requeue.append((running, what))
            else:
                self._guarded(running, self._after_failure, running, failure, duration, result)
        for index, (running, ending) in enumerate(plan.singles):
            if index >= len(result.singles_done) or running.job.lease in result.skipped:
                requeue.append((running, ending))
            elif result.singles_done[index]:
                self._guarded(running, self._after_single, running, ending.kind)
            elif running.job.lease in result.unwritable:
                self.give_up(running, result.unwritable[running.job.lease])
            else:
                self._lost(running, "cancel" if ending.kind == "cancelled" else "release")
        if result.unclaimed is None:
            requeue += plan.unclaims
        else:
            self.reporter.gave_back(len(result.unclaimed))
            for running, _ in plan.unclaims:
                self.book.forget(running, ran=False)
        if plan.deferrals:
            requeue += self._after_deferrals(plan.deferrals, result)
        self.writes[:0] = requeue
        if self._probing:
            failed = result.error is not None
            self._probe = max(1, self._probing // 2) if failed else self._probing * 2
            self._probing = 0
        if result.error is not None:
            failed_at = time.monotonic()
            error = storable_text(result.error, 500)
            for running, _ in requeue:
                if running.job.lease not in result.skipped:
                    running.write_failures += 1
                    running.write_failed_at = failed_at
                    running.write_error = error
                    running.failed_alone += plan.alone

    def _after_deferrals(
        self, deferrals: list[tuple[RunningJob, Ending]], result: RoundResult
    ) -> list[tuple[RunningJob, Write]]:
        """Report the jobs given back to wait for a worker that knows their task, and the
        dead letters; return those to write again."""
        deferred = result.deferred
        if deferred is None:
            return list(deferrals)
        again: list[tuple[RunningJob, Write]] = []
        for running, ending in deferrals:
            lease = running.job.lease
            if lease in deferred.delays:
                aside = deferred.stand_aside[lease]
                self.reporter.deferred_unknown(
                    running,
                    ending.description,
                    deferred.delays[lease],
                    deferred.waited[lease],
                    aside,
                )
                task_path = running.job.task_path
                end = max(self._standing_aside.get(task_path, 0), time.monotonic() + aside)
                self._stand_aside({**self._standing_aside, task_path: end})
                self.book.forget(running, ran=False)
            elif lease in deferred.dead.written:
                error = ErrorInfo(UNKNOWN_TASK_ERROR_CLASS, ending.description)
                self.reporter.failed(running, deferred.dead.written[lease], error, 0.0, None)
                self.book.forget(running)
            elif lease in deferred.dead.skipped:
                again.append((running, ending))
            else:
                self._lost(running, "defer")
        return again

    @staticmethod
    def _unwritten(running: RunningJob, step_done: bool, result: RoundResult) -> bool:
        """To be written again: its row was locked elsewhere, or its step ended early (a
        connection-level error) before the database said anything of it. (A row written
        one by one before the error was committed: it is written.)"""
        lease = running.job.lease
        if lease in result.skipped:
            return True
        return not step_done and lease not in result.statuses and lease not in result.unwritable

    def _after_success(self, running: RunningJob, outcome: Outcome, result: RoundResult) -> None:
        lease = running.job.lease
        if lease in result.unwritable:
            self.give_up(running, result.unwritable[lease])
        elif lease in result.replaced:
            status, error = result.statuses[lease], result.replaced[lease]
            self.reporter.failed(running, status, error, outcome.duration, None)
            self.book.forget(running)
        elif lease in result.statuses:
            self.reporter.succeeded(running, outcome.duration, outcome.result)
            self.book.forget(running)
        else:
            self._lost(running, "complete")

    def _after_failure(
        self, running: RunningJob, failure: Failure, duration: float, result: RoundResult
    ) -> None:
        lease = running.job.lease
        status = result.statuses.get(lease)
        if lease in result.unwritable:
            self.give_up(running, result.unwritable[lease])
        elif status is None:
            self._lost(running, "fail")
        else:
            error = result.replaced.get(lease, failure.error)
            self.reporter.failed(running, status, error, duration, failure.retry_delay)
            self.book.forget(running)

    def _after_single(self, running: RunningJob, kind: str) -> None:
        duration = time.monotonic() - running.started
        if kind in ("shutdown", "collateral"):
            self.reporter.released(running, duration, collateral=kind == "collateral")
        else:
            error = ErrorInfo("django_leasejobs.exceptions.JobCancelled", "cancelled while running")
            self.reporter.failed(running, JobStatus.CANCELLED, error, duration, None)
        self.book.forget(running)

    def _lost(self, running: RunningJob, transition: str) -> None:
        self.reporter.lost_on_write(running, transition)
        self.book.forget(running)

    def _guarded(self, running: RunningJob, step: Callable[..., None], *args: object) -> None:
        """Run one job's bookkeeping step; whatever it raises stays with that job."""
        try:
            step(*args)
        except Exception as exc:
            self.reporter.bookkeeping_failed(running, exc)
            self.book.forget(running)

    def give_up(self, running: RunningJob, why: str) -> None:
        """Stop renewing an attempt whose outcome cannot be recorded at all.

        The heartbeat no longer renews it, so its lease expires and the reaper takes
        the job back (a stall), exactly as if this worker had died with it.
        """
        job = running.job
        self.given_up += 1
        self._last_give_up = (time.monotonic(), f"job {job.id} attempt {job.attempt}: {why}")
        self.reporter.given_up(running, why)
        self.book.forget(running)

    def abandon(self) -> None:
        """Shutdown time is up and the database keeps failing: leave without writing.

        The unwritten attempts keep their leases until those expire; the reaper then
        re-runs them (at-least-once), so nothing is lost, only done again.
        """
        for running, _ in self.writes:
            self.reporter.not_recorded_at_shutdown(running)
            self.book.forget(running)
        self.writes = []

    def problem(self) -> str:
        """Attempts this worker gave up recording in the last ``PROBLEM_MEMORY`` s."""
        if self._last_give_up is None:
            return ""
        when, what = self._last_give_up
        if time.monotonic() - when >= PROBLEM_MEMORY:
            return ""
        return (
            f"gave up recording {self.given_up} attempt(s) since it started "
            f"(the reaper takes them back); last: {what}"
        )
