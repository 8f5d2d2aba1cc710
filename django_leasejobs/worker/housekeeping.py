"""The housekeeping thread: the registry row, the reap passes and the idle next-due lookup.

Every ``HEARTBEAT_INTERVAL`` it touches the worker's registry row (every beat while the
worker holds a lease or its state changed, every ``IDLE_TOUCH_BEATS`` beats otherwise)
and, while the worker holds no lease and listens for ``NOTIFY``, looks up when the next
job of its queues comes due (posted as ``NextDue``, the loop's safety poll), leaving out
the tasks the worker stands aside from (``WorkerStatus.skip_tasks``). Every
``STALE_LOCK_INTERVAL`` seconds (``0``: never) it runs the reap pass of ``manage.py
reap_stale_locks``: jobs whose lease expired go back to ``pending`` (or end, after too
many stalls), so crashed workers' jobs come back without a cron job. What falls on one
tick shares one transaction, so an idle worker makes one commit per tick.

It is apart from the heartbeat, which renews the leases on a connection of its own and
does nothing else: on an overloaded server a reap pass can take seconds, and a renewal
that waited behind it could cost the worker its leases (CI's overload smoke lost a
worker's 197 leases so).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import nullcontext

from django.db import DatabaseError, transaction

from .. import leases
from ..reaper import announce_reaped, announce_repair_failed
from .heartbeat import send_heartbeat_sent
from .inbox import NextDue
from .shared import WorkerStatus
from .threads import ThreadContext, WorkerThread, next_tick

logger = logging.getLogger("django_leasejobs")

IDLE_TOUCH_BEATS = 2
"""A worker that holds no lease touches its registry row every this many beats (the
admin and ``leasejobs_status`` call a worker gone after ``3 * HEARTBEAT_INTERVAL + 5`` s)."""


class Housekeeping(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "housekeeping")
        self._beats_since_touch = 0
        self._touched: tuple[str, str] | None = None
        self._reap_took = 0.0

    def loop(self) -> None:
        options = self.ctx.options
        beat_every = options.heartbeat_interval
        reap_every = options.stale_lock_interval
        started = time.monotonic()
        next_beat = started + beat_every
        next_reap = started + reap_every if reap_every > 0 else math.inf
        while not self.stop_event.wait(max(0.0, min(next_beat, next_reap) - time.monotonic())):
            now = time.monotonic()
            beat, reap = now >= next_beat, now >= next_reap
            if beat:
                next_beat = next_tick(next_beat, beat_every, now)
            if reap:
                next_reap = next_tick(next_reap, reap_every, now)
            self.tick(beat=beat, reap=reap)

    def tick(self, *, beat: bool, reap: bool) -> None:
        """One tick: the beat's registry row and lookup, and/or the reap pass."""
        ctx = self.ctx
        started = time.monotonic()
        status = ctx.status.read()
        holds = len(ctx.table) > 0
        touch = look = False
        reaped: list[leases.ReapedJob] = []
        due: NextDue | None = None
        try:
            if beat:
                touch = self._touch_due(holds, status)
                # An idle listening worker's safety poll rides on its tick (see module doc).
                look = not holds and status.listening
            together = touch + reap + look > 1
            with transaction.atomic(using=ctx.database) if together else nullcontext():
                if touch:
                    ctx.registration.touch(status.state, status.problem)
                    self._beats_since_touch = 0
                    self._touched = (status.state, status.problem)
                if reap:
                    reaped = self._reap()
                if look:
                    due = NextDue(
                        leases.seconds_to_next_due(
                            ctx.backend.alias,
                            ctx.queues,
                            skip_tasks=status.skip_tasks,
                            using=ctx.database,
                        )
                    )
        except DatabaseError as exc:
            due_now = [("registry row", touch), ("background reap", reap), ("next-due", look)]
            logger.warning(
                "%s failed: %s",
                " + ".join(what for what, due_then in due_now if due_then),
                exc,
                extra={"worker": ctx.worker_id, "error": str(exc)},
            )
            self._reset_connection()
            if touch and not holds:
                send_heartbeat_sent(ctx, started, exc)
            return
        if touch and not holds:  # (a worker that holds leases: the heartbeat's renewals)
            send_heartbeat_sent(ctx, started, None)
        if due is not None:
            ctx.inbox.post(due)
        if logger.isEnabledFor(logging.DEBUG):
            done = ["registry row"] if touch else []
            done += [f"reap pass ({len(reaped)} reaped)"] if reap else []
            done += ["next-due lookup"] if look else []
            logger.debug(
                "housekeeping tick: %s%s",
                ", ".join(done) or "nothing due",
                " in one transaction" if together else "",
                extra={"worker": ctx.worker_id, "duration": round(time.monotonic() - started, 6)},
            )
        if reaped:
            announce_reaped(
                reaped,
                backend=ctx.backend.alias,
                using=ctx.database,
                reaper=ctx.worker_id,
                duration=self._reap_took,
            )

    def _touch_due(self, holds: bool, status: WorkerStatus) -> bool:
        self._beats_since_touch += 1
        return (
            holds
            or self._touched != (status.state, status.problem)
            or self._beats_since_touch >= IDLE_TOUCH_BEATS
        )

    def _reap(self) -> list[leases.ReapedJob]:
        ctx = self.ctx
        started = time.monotonic()
        done = leases.reap(
            stale_lock_age=ctx.options.stale_lock_age,
            backend=ctx.backend.alias,
            using=ctx.database,
            rollups=ctx.options.rollups,
        )
        self._reap_took = time.monotonic() - started
        if done.repair_error is not None:
            announce_repair_failed(
                done.repair_error, backend=ctx.backend.alias, reaper=ctx.worker_id
            )
        return done.jobs
