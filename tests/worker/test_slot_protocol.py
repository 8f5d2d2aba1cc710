"""A Hypothesis state machine over the slot protocol of the real pools (issue 27, point 4).

The machine plays the worker's main loop against a real ``ProcessPool`` (forked children,
their pipes and shared ``SlotState``) or a real ``ThreadPool`` with two slots. It hands
batches of jobs to the slots ``rooms()`` offers (``submit()``), lets jobs start and end,
takes queued jobs back (``retract_stalled``, ``stop_job`` on a queued job), stops running
ones (``stop_job``: SIGKILL, SIGTERM under the "sigterm" behaviour, or a flag for a
thread), hands over jobs whose ``start_by`` passed already or passes while they wait
(a lease the worker would call lost), and lets a slot stall (a job that holds it until
the test opens its gate) or die (a job that calls ``os._exit``, or a SIGKILL from
outside). It follows the worker's rules: it hands jobs only to slots ``rooms()`` offers,
hands taken-back jobs over again first (the same lease), and retries a failed or died
attempt as the next attempt; submitting to a slot whose child has not passed the jobs
taken back from it must raise ``ValueError``, and the machine checks that it does.

Events are read with ``collect()``, after waiting on the pool's ``waitables()`` (the
thread pool's ``wake`` callback rings a pipe) with a short timeout: a step that waits
for something polls ``collect()`` until it came or a bounded deadline passed.

Whether a job started is what the job itself says: every test task appends its hand-over
token, lease, pid and start time to a marker file as its first statement
(tests/tasks_slot_protocol.py). Invariants, for every hand-over of a job to a slot:

(a) it never starts once it was taken back, nor once its ``start_by`` passed: one handed
    over with ``start_by`` in the past, or whose ``start_by`` passed while it certainly
    waited (queued behind a job held on its gate), must come back ``Retracted`` unstarted;
    so must every job a stop, a slot's death or ``retract_stalled`` certainly took back;
(b) it ends exactly once: one ``Outcome``, ``SlotDied`` (its slot died while it ran it),
    or ``Retracted`` (never started), or, in the thread pool, a ``stop_job`` that
    answered "flagged" (its outcome is void), never two; none is lost (teardown drains
    the pool until every hand-over is accounted for, then checks that every slot is
    offered again); an event never names a job that is not in the pool, and a job
    started at most once per hand-over;
(c) a hand-over reported ``Retracted`` never started (its marker never appears, checked
    at each step and once the pool is shut down), and one with an ``Outcome`` did start;
    no ``Retracted`` comes without a cause (a stop, ``retract_stalled``, a slot's death,
    or a passed ``start_by``), and no slot dies without one (a stop, a kill, a job that
    exits);
(d) ``Started`` only names jobs in the pool that really started (or whose slot died
    while starting them), never the first job handed to an idle slot (the worker
    announces that one), at most once, and before the job's end.

Every example starts with a batch handed to a slot. Rules draw the same shape of data
whatever the pool did, so Hypothesis's generation does not depend on timing; what a step
finds still does, so a failure may not replay: every failure carries the machine's own
trace of its last steps and events. Runs are derandomized (the same programs every run,
like tests/test_lease_model.py); ``LEASEJOBS_SLOT_EXAMPLES=300 LEASEJOBS_SLOT_RANDOM=1``
explores further, and ``LEASEJOBS_SLOT_STATS=1`` (with ``pytest -s``) prints how often
each path was taken. The paths a random run reaches only now and then are also pinned as
fixed programs of the same steps (``test_pinned_program``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import select
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_leasejobs.leases import ClaimedJob
from django_leasejobs.worker.execution import JobSpec, Outcome
from django_leasejobs.worker.pools import (
    Event,
    ProcessPool,
    ProgressEvent,
    Retracted,
    Room,
    SlotDied,
    Started,
    ThreadPool,
)
from tests import tasks_slot_protocol as tasks

Lease = tuple[int, int]

SLOTS = 2
MAX_DEPTH = 4
"""Pipeline depths the machine asks ``rooms()`` for (the worker's goes up to 8)."""
MAX_IN_POOL = 8
"""At most this many hand-overs in the pool at once (keeps teardown short)."""
SOON = 0.03
"""A ``start_by`` this many seconds ahead: it passes while the job waits behind others."""
STEP_WAIT = 0.1
"""How long a "let the slots run" step waits for a job to end."""
TRACE_LINES = 80
START_TIMEOUT = 20.0
"""How long a job handed to an idle slot may take to start (a loaded CI machine)."""
DRAIN_TIMEOUT = 20.0
LOCK_LOST_GRACE = 0.2
KINDS = {"quick": tasks.quick, "fail": tasks.fail, "hold": tasks.hold, "exit": tasks.exit_slot}
ENDS = (Outcome, SlotDied, Retracted)

REACHED: Counter[str] = Counter()
"""How often each path was taken (printed with ``LEASEJOBS_SLOT_STATS=1 pytest -s``)."""


def _reached(what: str) -> None:
    REACHED[what] += 1


# Every rule draws the same shape of data whatever the pools did (they run real processes
# and threads, so what is in a slot at a step depends on timing): a rule picks among what
# it finds by index (``pick`` modulo how many), and does nothing when it finds nothing.
PICK = st.integers(0, 15)
JOB = st.tuples(
    st.integers(0, 3),  # kind: hold, quick, fail, exit (the thread pool has no exit)
    st.sampled_from(["any time", "soon", "past"]),  # start_by
    st.booleans(),  # a ready job (taken back, or to retry) first, if there is one
)
Batch = tuple[int, int, int, list[tuple[int, str, bool]]]
BATCH = st.tuples(
    st.integers(1, MAX_DEPTH),  # the pipeline depth asked of rooms()
    PICK,  # which room
    st.integers(1, MAX_DEPTH),  # how many jobs (at most what the room takes)
    st.lists(JOB, min_size=MAX_DEPTH, max_size=MAX_DEPTH),
)


def _step(method: Callable[..., None]) -> Callable[..., None]:
    """Note the step in the machine's trace, and add the trace to what it raises."""

    @functools.wraps(method)
    def step(self: SlotProtocol, *args: Any, **kwargs: Any) -> None:
        _reached(f"step {method.__name__}")
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        self.trace.append(f"{method.__name__}({shown})")
        try:
            method(self, *args, **kwargs)
        except BaseException as exc:
            if not getattr(exc, "_slot_trace", False):
                exc._slot_trace = True  # type: ignore[attr-defined]
                exc.add_note("the machine's last steps and events:\n" + "\n".join(self.trace))
            raise

    return step


@dataclass(eq=False)
class HandOver:
    """One job handed to one slot, and what the machine knows of it."""

    token: int
    lease: Lease
    kind: str
    slot: int
    start_by: float
    at: int
    """Index in the machine's event log when it was handed over."""
    announced: bool = False
    """The first job of a batch handed to an idle slot (the worker announces its start)."""
    end: str | None = None
    """"outcome", "died", "retracted" or "flagged" (thread pool: stopped, outcome void)."""
    end_at: int | None = None
    ended_by: Event | None = None
    started_at: int | None = None
    """Index of the ``Started`` event that named it."""
    stop: str | None = None
    """What the last ``stop_job`` on it answered."""
    killed: bool = False
    """Its slot's process group was SIGKILLed from outside while it ran."""
    gate_open: bool = False
    must_retract: str | None = None
    """Why it must come back unstarted (``Retracted``), when that is certain."""
    must_die: str | None = None
    """Why its end must be ``SlotDied``."""

    def __repr__(self) -> str:
        return (
            f"<hand-over {self.token}: job {self.lease[0]} attempt {self.lease[1]} "
            f"({self.kind}) to slot {self.slot}>"
        )


class SlotProtocol(RuleBasedStateMachine):
    """The worker's side of the slot protocol, with the model that checks the pool."""

    kind: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.pool: Any = None
        self.marker_dir = tempfile.mkdtemp(prefix="slot-protocol-")
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.wake_lock = threading.Lock()
        self.handovers: list[HandOver] = []
        self.current: dict[Lease, HandOver] = {}
        """The hand-over of each lease in the pool (not ended yet)."""
        self.flagged: dict[Lease, HandOver] = {}
        """Thread pool: stopped jobs whose thread still runs (it may report progress)."""
        self.ready: list[Lease] = []
        """Leases to hand over first: taken back (the same attempt) or retried (the next)."""
        self.log: list[Event] = []
        self.next_job = 0
        self.next_token = 0
        self.probes = 0
        self.retract_stalled_at: list[int] = []
        """Log indexes at which ``retract_stalled`` ran."""
        self.trace: deque[str] = deque(maxlen=TRACE_LINES)
        """The last steps and events, added to a failure (a run of real processes and
        threads does not replay exactly: Hypothesis's own report may show other steps)."""

    # -- the pool ----------------------------------------------------------------------

    @initialize(behavior=st.sampled_from(["sigkill", "sigterm"]), first=BATCH)
    @_step
    def start_pool(self, behavior: str, first: Batch) -> None:
        """A pool of ``SLOTS`` slots (``behavior``: what a graceful stop sends a process),
        and a first batch for a slot."""
        if self.kind == "process":
            self.pool = ProcessPool(
                SLOTS, lock_lost_behavior=behavior, lock_lost_grace=LOCK_LOST_GRACE
            )
        else:
            self.pool = ThreadPool(SLOTS, wake=self._wake)
        self.pool.start()
        self.hand_over(first)

    def _wake(self) -> None:
        with self.wake_lock:  # a pool thread may ring after teardown closed the pipe
            if self.wake_w >= 0:
                with contextlib.suppress(BlockingIOError):  # full: it rings already
                    os.write(self.wake_w, b"!")

    def _wait(self, timeout: float) -> None:
        """Wait until a slot reports something (or ``timeout``), as the main loop does."""
        waitables = [*self.pool.waitables(), self.wake_r]
        select.select(waitables, [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 4096):
                pass

    def _collect(self, timeout: float = 0.0) -> list[Event]:
        if timeout > 0:
            self._wait(timeout)
        self.pool.escalate()
        events = self.pool.collect()
        for event in events:
            self._apply(event)
        self._doom_waiting()
        return events

    def _collect_until(self, condition: Callable[[list[Event]], bool], seconds: float) -> bool:
        """Collect (waiting on the pool's waitables, 10 ms at most each time: jobs note
        their start in a file, which rings nothing) until ``condition(events collected)``
        holds; False if ``seconds`` passed first."""
        events: list[Event] = []
        deadline = time.monotonic() + seconds
        while not condition(events):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            events += self._collect(min(left, 0.01))
        return True

    # -- what the jobs say -------------------------------------------------------------

    def _starts(self) -> dict[int, list[tuple[Lease, int, int]]]:
        """Marker lines by hand-over token: (lease, pid, monotonic ns) per start."""
        starts: dict[int, list[tuple[Lease, int, int]]] = {}
        path = os.path.join(self.marker_dir, tasks.STARTS)
        if not os.path.exists(path):
            return starts
        with open(path) as file:
            for line in file:
                if not line.endswith("\n"):
                    continue  # (never: one write() per line; a torn read would end here)
                token, job, attempt, pid, ns = (int(part) for part in line.split())
                starts.setdefault(token, []).append(((job, attempt), pid, ns))
        return starts

    def _held(self, slot: int) -> list[HandOver]:
        """The slot's hand-overs in the pool, in the order it runs them."""
        return sorted((h for h in self.current.values() if h.slot == slot), key=lambda h: h.token)

    def _behind(self, handover: HandOver, *, including: bool = False) -> list[HandOver]:
        return [
            h
            for h in self._held(handover.slot)
            if h.token > handover.token or (including and h is handover)
        ]

    def _holds_its_slot(self, handover: HandOver, starts: dict[int, Any]) -> bool:
        """A held job that keeps everything behind it from starting: its gate is closed,
        no stop or kill hit it, and it will not be skipped (it started, or has no
        ``start_by``)."""
        return (
            handover.end is None
            and handover.kind == "hold"
            and not handover.gate_open
            and handover.stop is None
            and not handover.killed
            and (handover.token in starts or handover.start_by == math.inf)
        )

    def _blocker(self, handover: HandOver, starts: dict[int, Any]) -> HandOver | None:
        """A job ahead of ``handover`` in its slot that certainly keeps it from starting."""
        return next(
            (
                h
                for h in self._held(handover.slot)
                if h.token < handover.token and self._holds_its_slot(h, starts)
            ),
            None,
        )

    def _running_held(self, handover: HandOver, starts: dict[int, Any]) -> bool:
        return self._holds_its_slot(handover, starts) and handover.token in starts

    def _doom_waiting(self) -> None:
        """A job whose ``start_by`` passed while it certainly waited must never start."""
        now = time.monotonic()
        starts = self._starts()
        for h in list(self.current.values()):
            if h.must_retract is None and h.start_by < now:
                blocker = self._blocker(h, starts)
                if blocker is not None:
                    h.must_retract = f"its start_by passed while it waited behind {blocker}"

    def _must_retract(self, handovers: list[HandOver], why: str) -> None:
        for h in handovers:
            if h.must_retract is None:
                h.must_retract = why

    # -- events ------------------------------------------------------------------------

    def _apply(self, event: Event) -> None:
        self.log.append(event)
        self.trace.append(f"  event {event!r:.200}")
        at = len(self.log) - 1
        if isinstance(event, Started):
            for lease in event.leases:
                # (A thread pool's job may start just before a stop flags it: its Started
                # comes with the next collect.)
                h = self.current.get(lease) or self.flagged.get(lease)
                assert h is not None, f"Started names {lease}, which is not in the pool"
                assert not h.announced, (
                    f"Started names {h}, the first job handed to an idle slot (announced "
                    "by the worker)"
                )
                assert h.started_at is None, f"{h} reported Started twice"
                assert h.must_retract is None, (
                    f"{h} reported Started, but it must never start: {h.must_retract}"
                )
                h.started_at = at
                _reached("Started")
        elif isinstance(event, ProgressEvent):
            h = self.current.get(event.lease) or self.flagged.get(event.lease)
            assert h is not None and h.kind == "hold", f"{event} for no running held job"
            assert h.token in self._starts(), f"{event} before {h} noted its start"
        elif isinstance(event, Outcome):
            self._end(event.lease, "outcome", at, event)
        elif isinstance(event, SlotDied):
            self._end(event.lease, "died", at, event)
        elif isinstance(event, Retracted):
            assert len(set(event.leases)) == len(event.leases), f"{event} names a job twice"
            for lease in event.leases:
                self._end(lease, "retracted", at, event)
            self.ready[0:0] = event.leases  # first in line again, in order, as the worker has it
        else:  # pragma: no cover
            raise AssertionError(f"unknown event {event!r}")

    def _end(self, lease: Lease, how: str, at: int, event: Event) -> None:
        h = self.current.pop(lease, None)
        if h is not None:
            _reached(f"end: {h.kind} {how}" + (" (certain)" if h.must_retract else ""))
        assert h is not None, (
            f"{event} for {lease}, which is not in the pool (it ended already, or was "
            "never handed over): a job ends once"
        )
        h.end, h.end_at, h.ended_by = how, at, event
        starts = self._starts().get(h.token, [])
        if how == "retracted":
            assert not starts, f"{h} came back (Retracted), but it started: {starts}"
            assert h.started_at is None, f"{h} came back (Retracted) after Started"
            cause = self._retract_cause(h)
            assert cause, f"{h} came back (Retracted) without a cause"
            return
        assert h.must_retract is None, f"{h} must come back unstarted ({h.must_retract}): {event}"
        if how == "outcome":
            assert isinstance(event, Outcome)
            assert starts, f"an outcome for {h}, which never started: {event}"
            assert h.must_die is None, f"{h} must die ({h.must_die}), not end with {event}"
            assert h.kind != "exit", f"{h} calls os._exit: it has no outcome, got {event}"
            if h.kind == "quick":
                assert event.ok and event.result == h.token, event
            elif h.kind == "hold":
                assert event.ok and event.result == "opened", event
            else:
                assert not event.ok and event.error is not None, event
                assert event.error.exception_class_path == "builtins.RuntimeError", event
                self.ready.append((lease[0], lease[1] + 1))
        else:
            assert isinstance(event, SlotDied)
            assert self.kind == "process", f"a thread pool reported {event}"
            assert h.stop != "none", f"stop_job said {h} had ended, then its slot died"
            if h.killed:
                assert event.exit_description == "was killed by SIGKILL", event
            elif h.stop != "killing":
                assert h.kind == "exit", f"{h}'s slot died, though nothing stopped it: {event}"
                assert event.exit_description == "exited with status 3", event
                assert starts, f"{h}'s slot died before the job noted its start: {event}"
            # Nothing queued behind it in the dead child starts (they come back next).
            self._must_retract(self._behind(h), f"queued behind {h}, whose slot died")
            self.ready.append((lease[0], lease[1] + 1))

    def _retract_cause(self, h: HandOver) -> str | None:
        if time.monotonic() > h.start_by:
            return "its start_by passed"
        if h.stop == "retracted":
            return "a stop took it back"
        if any(at >= h.at for at in self.retract_stalled_at):
            return "retract_stalled took it back"
        for e in self.handovers:
            if (
                e.slot == h.slot
                and e.token < h.token
                and (e.end_at is None or e.end_at >= h.at)
                and (e.kind == "exit" or e.stop in ("retracted", "killing", "flagged") or e.killed)
            ):
                return f"{e} ahead of it was stopped or died"
        return None

    # -- rules -------------------------------------------------------------------------

    @rule(batch=BATCH)
    @_step
    def hand_over(self, batch: Batch) -> None:
        """Hand a batch to a slot ``rooms()`` offers, as ``_dispatch_ready`` does."""
        depth, room_pick, count, jobs = batch
        self._collect()
        if len(self.current) >= MAX_IN_POOL:
            _reached("hand_over: the pool holds enough")
            return
        rooms = self.pool.rooms(depth)
        self._check_rooms(rooms, depth)
        if self.kind == "process":
            for slot in self._slots_with_jobs_taken_back_not_passed():
                self._submit_is_refused(slot)
        if not rooms:
            _reached("hand_over: no room")
            return
        room = rooms[room_pick % len(rooms)]
        specs, handovers = [], []
        for job in jobs[: min(count, room.jobs)]:
            spec, handover = self._new_spec(room.slot, *job)
            specs.append(spec)
            handovers.append(handover)
        now = time.monotonic()
        idle = self.pool.submit(room.slot, specs)
        if self.kind == "process" or room.idle:
            assert idle == room.idle, f"submit said idle={idle}, rooms() said {room}"
        handovers[0].announced = idle
        first = handovers[0]
        _reached(f"hand_over: {len(specs)} job(s) to {'an idle' if idle else 'a busy'} slot")
        for h in handovers:
            self.handovers.append(h)
            self.current[h.lease] = h
            if h.start_by < now:
                h.must_retract = "its start_by had passed when it was handed over"
        if idle:
            # The first job handed to an idle slot starts at once (or, its start_by
            # passed, comes back at once).
            assert self._collect_until(
                lambda _: first.token in self._starts() or first.end is not None,
                START_TIMEOUT,
            ), f"{first}, handed to an idle slot, neither started nor came back"

    def _new_spec(
        self, slot: int, kind_pick: int, when: str, ready_first: bool, *, probe: bool = False
    ) -> tuple[JobSpec, HandOver]:
        """A job for a slot, and its hand-over (``probe``: one never handed over, with a
        negative token, which must never start)."""
        if ready_first and self.ready:
            lease = self.ready.pop(0)
        else:
            self.next_job += 1
            lease = (self.next_job, 1)
        kinds = ["hold", "quick", "fail"] + (["exit"] if self.kind == "process" else [])
        kind = kinds[kind_pick % len(kinds)]
        start_by = {
            "any time": math.inf,
            "soon": time.monotonic() + SOON,
            "past": time.monotonic() - 1.0,
        }[when]
        if probe:
            self.probes += 1
            token = -self.probes
        else:
            self.next_token += 1
            token = self.next_token
        job = ClaimedJob(
            id=lease[0],
            attempt=lease[1],
            task_path=KINDS[kind].module_path,
            queue="default",
            priority=0,
            args=[self.marker_dir, token],
            kwargs={},
            timeout=None,
            max_attempts=100,
            checkpoint=None,
        )
        spec = JobSpec(
            job=job,
            worker_id="slot-protocol",
            backend="default",
            database="default",
            start_by=start_by,
        )
        return spec, HandOver(token, lease, kind, slot, start_by, at=len(self.log))

    def _check_rooms(self, rooms: list[Room], depth: int) -> None:
        assert len({room.slot for room in rooms}) == len(rooms), rooms
        starts = self._starts()
        for room in rooms:
            assert 0 <= room.slot < SLOTS and 1 <= room.jobs <= depth, (room, depth)
            assert room.idle == (room.jobs == depth), room
            held = self._held(room.slot)
            if self.kind == "process":
                # collect() just ran: the slot's queue is what the machine holds there.
                assert room.jobs == depth - len(held), (room, held)
            else:
                assert room.jobs >= depth - len(held), (room, held)
            running = [h for h in held if self._running_held(h, starts)]
            assert not (room.idle and running), f"{room} is idle while {running} runs"
        if self.kind == "thread":
            offered = {room.slot for room in rooms}
            for h in self.flagged.values():
                if h.kind != "hold" or h.gate_open:
                    continue  # its thread may have returned
                assert h.slot not in offered, f"slot {h.slot} still runs {h}, stopped: {rooms}"

    @rule(pick=PICK)
    @_step
    def open_gate(self, pick: int) -> None:
        """Let a held job that runs end (its gate opens; it ends at its next look, within
        ms). Held jobs still queued keep their gates closed until they run."""
        self._collect()
        starts = self._starts()
        gated = [
            h
            for h in self.handovers
            if h.kind == "hold" and not h.gate_open and h.token in starts and h.end != "died"
        ]
        if not gated:
            return
        h = gated[pick % len(gated)]
        tasks.gate_path(self.marker_dir, h.token).touch()
        h.gate_open = True

    @rule(until=st.sampled_from(["a job ends", "start_by passes"]))
    @_step
    def let_time_pass(self, until: str) -> None:
        """Let the slots run until a job ends (at most ``STEP_WAIT``), or until the
        ``start_by`` of the jobs waiting behind a held job passed (the worker froze, or the
        jobs ahead ran long)."""
        if until == "a job ends":
            self._let_slots_run()
        else:
            self._let_start_by_pass()

    def _let_slots_run(self) -> None:
        """Wait for a job to start or end, at most ``STEP_WAIT``; at once when none can
        (every job in the pool runs held on its gate, or is queued behind one)."""
        self._collect()
        starts = self._starts()
        if any(
            (h.token not in starts or not self._holds_its_slot(h, starts))
            and self._blocker(h, starts) is None
            for h in self.current.values()
        ):
            known = len(starts)
            self._collect_until(
                lambda events: (
                    any(isinstance(e, ENDS) for e in events) or len(self._starts()) > known
                ),
                STEP_WAIT,
            )

    def _let_start_by_pass(self) -> None:
        """The jobs whose ``start_by`` passes while they wait must never start."""
        self._collect()
        starts = self._starts()
        waiting = [
            h
            for h in self.current.values()
            if h.start_by != math.inf
            and h.must_retract is None
            and self._blocker(h, starts) is not None
        ]
        if waiting:
            _reached("let_time_pass: start_by passed behind a held job")
            # A wait for the clock itself (start_by is at most SOON ahead), not for a slot.
            time.sleep(max(0.0, max(h.start_by for h in waiting) - time.monotonic()) + 0.001)
        self._collect()
        for h in waiting:
            assert h.must_retract is not None, f"{h} still waits behind a held job"

    @rule(after=st.sampled_from([0.0, 0.02, 30.0]))
    @_step
    def retract_stalled(self, after: float) -> None:
        """Take back jobs queued behind one that runs long, as the main loop does."""
        self._collect()
        starts = self._starts()
        now = time.monotonic_ns()
        certain = []
        for h in self.current.values():
            if (
                self._running_held(h, starts)
                and now - starts[h.token][0][2] > after * 1e9
                and (self._behind(h))
            ):
                certain.append(h)
        self.retract_stalled_at.append(len(self.log))
        self.pool.retract_stalled(after)
        _reached(f"retract_stalled: {'takes back' if certain else 'may take back'}")
        for h in certain:
            self._must_retract(self._behind(h), f"queued behind {h}, which ran over {after}s")

    @rule(stop=st.tuples(PICK, st.integers(0, 3), st.booleans()))
    @_step
    def stop_job(self, stop: tuple[int, int, bool]) -> None:
        """``stop_job`` a job in the pool (or, one time in four, one that ended: "none"),
        as ``stop`` does."""
        pick, which, graceful = stop
        ended = which == 3
        self._collect()
        choices = [h for h in self.handovers if (h.end is not None) == ended]
        if not choices:
            return
        h = choices[pick % len(choices)]
        starts = self._starts()
        if self.current.get(h.lease) is not h:
            allowed = {"none"}  # (its lease may be in the pool again: another hand-over)
            if h.lease in self.current:
                return
        elif self._blocker(h, starts) is not None:
            allowed = {"retracted"}
        elif self._running_held(h, starts):
            allowed = {"killing"} if self.kind == "process" else {"flagged"}
        elif h.stop == "killing" and self.kind == "process":
            allowed = {"killing"}
        elif self.kind == "process":
            allowed = {"retracted", "killing", "none"}
        else:
            allowed = {"retracted", "flagged", "none"}
        running_held = self._running_held(h, starts)
        action = self.pool.stop_job(h.lease, graceful=graceful)
        assert action in allowed, f"stop_job({h}) answered {action!r}, expected {allowed}"
        _reached(f"stop_job: {action} (expected {'/'.join(sorted(allowed))})")
        if action == "none":
            if h.end is None:
                h.stop = h.stop or "none"  # it ended: its outcome (or Retracted) is on its way
            return
        h.stop = action
        if action == "retracted":
            self._must_retract(self._behind(h, including=True), f"stop_job took back {h}")
            return
        self._must_retract(self._behind(h), f"queued behind {h}, which was stopped")
        if action == "flagged":
            del self.current[h.lease]
            h.end, h.end_at = "flagged", len(self.log)
            self.flagged[h.lease] = h
        elif running_held:
            h.must_die = "it was held on its gate when it was killed"

    @precondition(lambda self: self.kind == "process")
    @rule(pick=PICK)
    @_step
    def kill_slot_from_outside(self, pick: int) -> None:
        """SIGKILL a slot's process group while it runs a held job (the OOM killer)."""
        self._collect()
        starts = self._starts()
        running = [h for h in self.current.values() if self._running_held(h, starts)]
        if not running:
            return
        h = running[pick % len(running)]
        pid = starts[h.token][0][1]
        os.killpg(pid, signal.SIGKILL)
        _reached("kill_slot_from_outside")
        h.killed = True
        h.must_die = "its slot's process group was SIGKILLed"
        self._must_retract(self._behind(h), f"queued behind {h}, whose slot was killed")

    def _slots_with_jobs_taken_back_not_passed(self) -> list[int]:
        starts = self._starts()
        found = []
        for slot in range(SLOTS):
            holding = [h for h in self._held(slot) if self._holds_its_slot(h, starts)]
            if holding and any(
                r.slot == slot and r.end == "retracted" and r.token > holding[0].token
                for r in self.handovers
            ):
                found.append(slot)
        return found

    @precondition(lambda self: self.kind == "process")
    @rule(pick=PICK)
    @_step
    def submit_to_a_slot_that_has_not_passed_its_jobs_taken_back(self, pick: int) -> None:
        """Jobs were taken back from a slot whose child has not reached them yet (a held
        job runs before them): ``rooms()`` must not offer it, and ``submit()`` refuses."""
        self._collect()
        slots = self._slots_with_jobs_taken_back_not_passed()
        if not slots:
            return
        self._submit_is_refused(slots[pick % len(slots)])

    def _submit_is_refused(self, slot: int) -> None:
        for depth in range(1, MAX_DEPTH + 1):
            assert slot not in [room.slot for room in self.pool.rooms(depth)], slot
        spec, _ = self._new_spec(slot, 0, "any time", False, probe=True)
        before = sorted(self.pool.running())
        with pytest.raises(ValueError, match="taken back"):
            self.pool.submit(slot, [spec])
        _reached("submit refused: jobs taken back not passed")
        assert sorted(self.pool.running()) == before

    # -- invariants --------------------------------------------------------------------

    @invariant()
    @_step
    def pool_agrees_with_the_machine(self) -> None:
        if self.pool is None:
            return
        self._collect()
        if self.kind == "process":
            assert sorted(self.pool.running()) == sorted(self.current), (
                f"the pool holds {sorted(self.pool.running())}, handed over and not ended: "
                f"{sorted(self.current)}"
            )

    @invariant()
    @_step
    def no_job_started_that_must_not(self) -> None:
        starts = self._starts()
        known = {h.token: h for h in self.handovers}
        for token, lines in starts.items():
            h = known.get(token)
            assert h is not None, f"hand-over {token} started but was never handed over"
            assert len(lines) == 1, f"{h} started {len(lines)} times: {lines}"
            assert lines[0][0] == h.lease, f"{h} ran as {lines[0][0]}"
            assert h.end != "retracted", f"{h} came back (Retracted), but it started"
            assert h.must_retract is None, f"{h} started, but must not: {h.must_retract}"

    # -- the end -----------------------------------------------------------------------

    @_step
    def teardown(self) -> None:
        drained = False
        try:
            if self.pool is not None:
                self._drain()
                drained = True
        finally:
            try:
                if self.pool is not None:
                    self.pool.shutdown()
                # Nothing runs any more: what the jobs say of themselves is final.
                final_starts = self._starts()
            finally:
                with self.wake_lock:
                    os.close(self.wake_r)
                    os.close(self.wake_w)
                    self.wake_w = -1
                shutil.rmtree(self.marker_dir, ignore_errors=True)
        if drained:
            self._final_checks(final_starts)

    def _drain(self) -> None:
        """Open every gate and collect until every hand-over is accounted for; then every
        slot must be offered again, idle (it passed what was taken back from it)."""
        for h in self.handovers:
            if h.kind == "hold" and not h.gate_open:
                tasks.gate_path(self.marker_dir, h.token).touch()
                h.gate_open = True
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while self.current and time.monotonic() < deadline:
            self._collect(0.01)
        assert not self.current, f"never accounted for: {sorted(self.current.values(), key=str)}"
        offered: list[Room] = []
        while time.monotonic() < deadline:
            self._collect(0.01)
            offered = self.pool.rooms(1)
            if len(offered) == SLOTS and all(room.idle for room in offered):
                break
        else:
            raise AssertionError(f"the slots are not all free again: {offered}")
        assert not self.current

    def _final_checks(self, starts: dict[int, list[tuple[Lease, int, int]]]) -> None:
        """Once nothing runs any more: what every hand-over's job says of itself."""
        known = {h.token for h in self.handovers}
        assert set(starts) <= known, f"never handed over, yet started: {set(starts) - known}"
        for h in self.handovers:
            lines = starts.get(h.token, [])
            assert len(lines) <= 1, f"{h} started {len(lines)} times"
            if h.end == "retracted" or h.must_retract is not None:
                assert h.end == "retracted" and not lines, (h, h.end, h.must_retract, lines)
            if h.end in ("outcome", "flagged"):
                assert lines, f"{h} ended ({h.end}) but never started"
            if h.started_at is not None:
                assert lines or h.end == "died", f"Started named {h}, which never started"
                if h.end != "flagged":  # (flagged as the stop answered: its Started may follow)
                    assert h.end_at is not None and h.end_at > h.started_at, h


class ProcessSlotProtocol(SlotProtocol):
    kind = "process"


class ThreadSlotProtocol(SlotProtocol):
    kind = "thread"


def _settings() -> settings:
    return settings(
        max_examples=int(os.environ.get("LEASEJOBS_SLOT_EXAMPLES", "50")),
        stateful_step_count=20,
        deadline=None,
        derandomize=os.environ.get("LEASEJOBS_SLOT_RANDOM") != "1",
        database=None,  # nothing saved between runs: CI runs the same examples every time
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        report_multiple_bugs=False,
    )


def _run(machine: type[SlotProtocol]) -> None:
    REACHED.clear()
    run_state_machine_as_test(machine, settings=_settings())
    if os.environ.get("LEASEJOBS_SLOT_STATS") == "1":  # with pytest -s
        print(f"\n{machine.__name__}:")
        print("\n".join(f"{count:6d}  {what}" for what, count in sorted(REACHED.items())))


def test_process_pool_keeps_the_slot_protocol() -> None:
    _run(ProcessSlotProtocol)


def test_thread_pool_keeps_the_slot_protocol() -> None:
    _run(ThreadSlotProtocol)


# -- pinned programs ----------------------------------------------------------------------
#
# What a random run reaches only now and then, as fixed programs of the machine's own
# steps: the same model, invariants and teardown check every step, and each program then
# checks that it took the path it is about.

HOLD, QUICK, FAIL, EXIT = 0, 1, 2, 3
"""``kind`` picks of a batch's jobs (the thread pool has no EXIT)."""
LAST_ROOM = 1
"""A ``room_pick`` for the last room offered when one or two are (slot 1 when both are)."""


def _batch(*jobs: int | tuple[int, str, bool], room: int = 0) -> Batch:
    """A batch for ``hand_over``: each job a kind, or (kind, start_by, a ready job first)."""
    spec = [job if isinstance(job, tuple) else (job, "any time", False) for job in jobs]
    padding = [(QUICK, "any time", False)] * (MAX_DEPTH - len(spec))
    return (MAX_DEPTH, room, len(spec), spec + padding)


class Steps:
    """Runs the machine's steps by hand, checking its invariants after each one."""

    def __init__(self, machine: type[SlotProtocol]) -> None:
        self.machine = machine()

    def start(self, first: Batch, behavior: str) -> None:
        self.machine.start_pool(behavior, first)
        self.check()

    def check(self) -> None:
        self.machine.pool_agrees_with_the_machine()
        self.machine.no_job_started_that_must_not()

    def __getattr__(self, name: str) -> Callable[..., None]:
        step = getattr(self.machine, name)

        def run(*args: Any, **kwargs: Any) -> None:
            step(*args, **kwargs)
            self.check()

        return run

    def __call__(self, token: int) -> HandOver:
        return next(h for h in self.machine.handovers if h.token == token)

    def wait(self, condition: Callable[[], bool], what: str) -> None:
        assert self.machine._collect_until(lambda _: condition(), DRAIN_TIMEOUT), what
        self.check()

    def wait_ended(self, *tokens: int) -> None:
        self.wait(lambda: all(self(t).end is not None for t in tokens), f"{tokens} to end")

    def wait_replaced(self, slot: int) -> None:
        """A dead slot's replacement takes jobs once its child said it is ready."""
        if self.machine.kind == "process":
            self.wait(
                lambda: any(room.slot == slot for room in self.machine.pool.rooms(1)),
                f"slot {slot}'s new child to be ready",
            )

    def stop(self, token: int, *, graceful: bool = False) -> None:
        h = self(token)
        ended = [x for x in self.machine.handovers if (x.end is not None) == (h.end is not None)]
        self.stop_job((ended.index(h), 3 if h.end is not None else 0, graceful))

    def open(self, token: int) -> None:
        starts = self.machine._starts()
        gated = [
            h
            for h in self.machine.handovers
            if h.kind == "hold" and not h.gate_open and h.token in starts and h.end != "died"
        ]
        self.open_gate(gated.index(self(token)))

    def end(self) -> None:
        self.machine.teardown()


def a_stop_takes_back_a_queued_job_which_runs_again_in_the_other_slot(s: Steps) -> None:
    s.stop(2)  # queued behind the held job 1: taken back, with job 3 behind it
    s.wait_ended(2, 3)
    assert (s(2).end, s(3).end) == ("retracted", "retracted")
    assert s(2).stop == "retracted" and s(2).must_retract and s(3).must_retract
    s.hand_over(_batch((QUICK, "any time", True), room=LAST_ROOM))  # job 2's lease again
    assert (s(4).lease, s(4).slot) == (s(2).lease, 1)
    s.wait_ended(4)
    assert s(4).end == "outcome"
    s.open(1)
    s.wait_ended(1)
    assert s(1).end == "outcome"


def a_running_job_stopped_takes_the_jobs_behind_it_with_it(s: Steps) -> None:
    s.stop(1)  # the held job: killed (process), or flagged (thread: it runs on)
    s.wait_ended(1, 2, 3)
    assert (s(2).end, s(3).end) == ("retracted", "retracted")
    if s.machine.kind == "process":
        assert s(1).end == "died" and s(1).must_die
        assert s(1).ended_by == SlotDied((1, 1), "was killed by SIGKILL")
    else:
        assert s(1).end == "flagged" and s(1).stop == "flagged"
    s.wait_replaced(0)
    s.hand_over(_batch(QUICK))  # the thread pool's slot 0 still runs job 1: slot 1 gets it
    assert s(4).slot == (0 if s.machine.kind == "process" else 1)
    s.wait_ended(4)
    if s.machine.kind == "thread":
        s.open(1)  # its thread returns; its outcome is void (teardown sees none)


def a_graceful_stop_sends_sigterm_first(s: Steps) -> None:
    s.stop(1, graceful=True)
    s.wait_ended(1, 2)
    assert s(1).ended_by == SlotDied((1, 1), "was killed by SIGTERM")
    assert s(2).end == "retracted"


def a_slot_killed_from_outside_is_replaced(s: Steps) -> None:
    s.kill_slot_from_outside(0)
    s.wait_ended(1, 2)
    assert s(1).ended_by == SlotDied((1, 1), "was killed by SIGKILL")
    assert s(2).end == "retracted"
    s.wait_replaced(0)
    s.hand_over(_batch(QUICK))  # the new child of slot 0
    assert s(3).slot == 0
    s.wait_ended(3)
    assert s(3).end == "outcome"


def jobs_behind_a_stalled_one_are_taken_back_and_the_slot_refuses_more(s: Steps) -> None:
    s.retract_stalled(0.0)
    assert s(2).must_retract and s(3).must_retract
    s.wait_ended(2, 3)
    if s.machine.kind == "process":
        before = REACHED["submit refused: jobs taken back not passed"]
        s.submit_to_a_slot_that_has_not_passed_its_jobs_taken_back(0)
        assert REACHED["submit refused: jobs taken back not passed"] == before + 1
    s.hand_over(_batch(QUICK))  # not to slot 0: it still runs job 1
    last = s.machine.handovers[-1]
    assert last.slot == 1
    s.open(1)
    s.wait_ended(1, last.token)
    assert (s(1).end, last.end) == ("outcome", "outcome")


def a_start_by_passing_behind_a_held_job_keeps_the_job_from_starting(s: Steps) -> None:
    s.let_time_pass("start_by passes")
    assert s(2).must_retract and not s(3).must_retract
    s.open(1)
    s.wait_ended(1, 2, 3)
    assert [s(t).end for t in (1, 2, 3)] == ["outcome", "retracted", "outcome"]
    if s.machine.kind == "thread":  # (a child may start and end it between two looks)
        assert s(3).started_at is not None  # it waited behind the others: Started named it


def a_start_by_passed_before_the_hand_over_keeps_the_first_job_from_starting(
    s: Steps,
) -> None:
    assert s(1).announced and s(1).must_retract
    s.wait_ended(1, 2)
    assert (s(1).end, s(2).end) == ("retracted", "outcome")
    assert s.machine.ready == [s(1).lease]
    s.hand_over(_batch((QUICK, "any time", True)))  # the same lease, in time now
    assert s(3).lease == s(1).lease
    s.wait_ended(3)
    assert s(3).end == "outcome"


def a_job_that_ends_its_process_takes_the_jobs_behind_it_back(s: Steps) -> None:
    s.wait_ended(1, 2, 3)
    assert s(1).ended_by == SlotDied((1, 1), "exited with status 3")
    assert (s(2).end, s(3).end) == ("retracted", "retracted")
    assert (1, 2) in s.machine.ready  # retried: the next attempt
    s.wait_replaced(0)
    s.hand_over(_batch(QUICK))
    assert s(4).slot == 0
    s.wait_ended(4)


def a_failed_job_runs_again_as_its_next_attempt(s: Steps) -> None:
    s.wait_ended(1)
    assert s(1).end == "outcome" and s.machine.ready == [(1, 2)]
    s.hand_over(_batch((QUICK, "any time", True)))
    assert s(2).lease == (1, 2)
    s.wait_ended(2)
    assert s(2).end == "outcome"


PINNED: dict[str, tuple[Callable[[Steps], None], Batch, str, tuple[str, ...]]] = {
    program.__name__: (program, first, behavior, kinds)
    for program, first, behavior, kinds in [
        (
            a_stop_takes_back_a_queued_job_which_runs_again_in_the_other_slot,
            _batch(HOLD, QUICK, QUICK),
            "sigkill",
            ("process", "thread"),
        ),
        (
            a_running_job_stopped_takes_the_jobs_behind_it_with_it,
            _batch(HOLD, QUICK, FAIL),
            "sigkill",
            ("process", "thread"),
        ),
        (a_graceful_stop_sends_sigterm_first, _batch(HOLD, QUICK), "sigterm", ("process",)),
        (a_slot_killed_from_outside_is_replaced, _batch(HOLD, QUICK), "sigkill", ("process",)),
        (
            jobs_behind_a_stalled_one_are_taken_back_and_the_slot_refuses_more,
            _batch(HOLD, QUICK, FAIL),
            "sigkill",
            ("process", "thread"),
        ),
        (
            a_start_by_passing_behind_a_held_job_keeps_the_job_from_starting,
            _batch(HOLD, (QUICK, "soon", False), QUICK),
            "sigkill",
            ("process", "thread"),
        ),
        (
            a_start_by_passed_before_the_hand_over_keeps_the_first_job_from_starting,
            _batch((QUICK, "past", False), QUICK),
            "sigkill",
            ("process", "thread"),
        ),
        (
            a_job_that_ends_its_process_takes_the_jobs_behind_it_back,
            _batch(EXIT, QUICK, HOLD),
            "sigkill",
            ("process",),
        ),
        (
            a_failed_job_runs_again_as_its_next_attempt,
            _batch(FAIL),
            "sigkill",
            ("process", "thread"),
        ),
    ]
}


@pytest.mark.parametrize(
    ("name", "kind"),
    [(name, kind) for name, (_, _, _, kinds) in PINNED.items() for kind in kinds],
)
def test_pinned_program(name: str, kind: str) -> None:
    program, first, behavior, _ = PINNED[name]
    machine = ProcessSlotProtocol if kind == "process" else ThreadSlotProtocol
    steps = Steps(machine)
    try:
        steps.start(first, behavior)
        program(steps)
    finally:
        steps.end()


# -- regressions found by the machine -----------------------------------------------------


def _pinned_spec(marker_dir: str, job_id: int, kind: str, start_by: float = math.inf) -> JobSpec:
    job = ClaimedJob(
        id=job_id,
        attempt=1,
        task_path=KINDS[kind].module_path,
        queue="default",
        priority=0,
        args=[marker_dir, job_id],  # the job id is its hand-over token
        kwargs={},
        timeout=None,
        max_attempts=100,
        checkpoint=None,
    )
    return JobSpec(
        job=job, worker_id="slot-protocol", backend="default", database="default", start_by=start_by
    )


def _started_tokens(marker_dir: str) -> set[int]:
    path = os.path.join(marker_dir, tasks.STARTS)
    if not os.path.exists(path):
        return set()
    with open(path) as file:
        return {int(line.split()[0]) for line in file if line.endswith("\n")}


def test_started_never_names_a_job_its_child_passed_over_too_late(tmp_path: Any) -> None:
    """Found by the machine: ``collect()`` polled the slots'
    pipes, then read how far each child got (``STARTED``). A child passes over a job whose
    ``start_by`` passed (it sends MSG_EXPIRED) and starts the next one in between: the
    MSG_EXPIRED was not read in that pass, so ``Started`` named the job passed over, which
    then came back ``Retracted`` (the worker announced a start that never happened, and
    held the attempt as used).

    The race is made certain here: the pool's poll returns (nothing to read: the first job
    holds its slot), and only then does the first job end, the second get passed over
    and the third start."""
    from tests.waiting import wait_until

    marker_dir = str(tmp_path)
    pool = ProcessPool(1, lock_lost_behavior="sigkill", lock_lost_grace=LOCK_LOST_GRACE)
    pool.start()
    events: list[Event] = []
    try:
        pool.submit(
            0,
            [
                _pinned_spec(marker_dir, 1, "hold"),
                _pinned_spec(marker_dir, 2, "quick", start_by=time.monotonic() - 1.0),
                _pinned_spec(marker_dir, 3, "hold"),
            ],
        )

        def first_one_reported_progress() -> bool:
            events.extend(pool.collect())
            return any(isinstance(e, ProgressEvent) for e in events)

        wait_until(first_one_reported_progress, what="the first job's progress (pipe read)")
        real_poller = pool._poller

        class PollThenRace:
            def poll(self, timeout: float) -> Any:
                ready = real_poller.poll(timeout)
                tasks.gate_path(marker_dir, 1).touch()
                wait_until(lambda: 3 in _started_tokens(marker_dir), what="the third job")
                return ready

            def __getattr__(self, name: str) -> Any:
                return getattr(real_poller, name)

        pool._poller = PollThenRace()  # type: ignore[assignment]
        try:
            events.extend(pool.collect())
        finally:
            pool._poller = real_poller

        # The third job's start, read while it still holds its slot (once its outcome is
        # in the pipe, the same pass reads the outcome and no separate start).
        def third_reported_started() -> bool:
            events.extend(pool.collect())
            return any(isinstance(e, Started) and (3, 1) in e.leases for e in events)

        wait_until(third_reported_started, what="the third job's start")
        tasks.gate_path(marker_dir, 3).touch()

        def ended() -> bool:
            events.extend(pool.collect())
            return sum(isinstance(e, ENDS) for e in events) == 3

        wait_until(ended, what="every job's end")
    finally:
        pool.shutdown()
    assert 2 not in _started_tokens(marker_dir)
    assert [lease for e in events if isinstance(e, Retracted) for lease in e.leases] == [(2, 1)]
    started = [lease for e in events if isinstance(e, Started) for lease in e.leases]
    assert started == [(3, 1)], events
