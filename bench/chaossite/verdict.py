"""The chaos soak's verdict: pure functions of the ledger, the fault log and the job rows.

bench/chaos.py collects those three and calls :func:`analyse`; nothing here touches a
process or the database (stdlib only), so the rules can be read, and checked, alone.
The rules are described in bench/README.md ("What the verdict counts").
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

KILL_WORKER = "kill_worker"
KILL_SLOT = "kill_slot"
STOP_WORKER = "stop_worker"
TERMINATE = "terminate_backends"
RESTART = "restart_postgres"
FAULT_KINDS = (KILL_WORKER, KILL_SLOT, STOP_WORKER, TERMINATE, RESTART)
DB_FAULTS = frozenset({TERMINATE, RESTART})
# Relative frequency of each kind after the first covering rounds (every kind appears).
FAULT_WEIGHTS = {KILL_WORKER: 20, KILL_SLOT: 25, STOP_WORKER: 15, TERMINATE: 30, RESTART: 10}

# When several faults explain one re-run, the one it is put down to (for the recovery time):
# first those that began while the attempt ran (not before it started: it survived those);
# then a kill (it certainly ended the attempt), a stop (it certainly cost the lease), a
# restart (it cut every connection), a terminated connection (often harmless); the earliest.
CAUSE_RANK = {KILL_SLOT: 0, KILL_WORKER: 0, STOP_WORKER: 1, RESTART: 2, TERMINATE: 3}
RESTART_BACK = "restart_postgres, from the server's return"  # recovery measured from t1

HEALTHY_TASK = "chaossite.tasks.healthy"


@dataclass(frozen=True)
class PoisonKind:
    key: str
    task: str
    expected: str  # the job's final status once the worker handles it
    what: str


POISON = (
    PoisonKind("a", "chaossite.tasks.poison_nul_result", "failed", 'returns "bad \\x00 result"'),
    PoisonKind("b", "chaossite.tasks.poison_nul_error", "failed", 'raises ValueError("bad \\x00")'),
    PoisonKind("c", "chaossite.tasks.poison_long_class", "failed", "class path of 699+ characters"),
    PoisonKind("d", "chaossite.tasks.poison_surrogate", "failed", 'raises ValueError("\\ud800")'),
    PoisonKind("e", "chaossite.tasks.poison_keyboard_interrupt", "failed", "KeyboardInterrupt"),
    PoisonKind("f", "chaossite.tasks.poison_bad_str", "failed", "its __str__ raises"),
    PoisonKind(
        "g", "chaossite.tasks.poison_nul_progress", "succeeded", "progress with \\x00, 2 leases"
    ),
    PoisonKind("h", "chaossite.tasks.poison_kwargs_array", "failed", "row kwargs is a JSON array"),
)
POISON_BY_TASK = {kind.task: kind for kind in POISON}

SCAN_SLACK = 1.0  # seconds: a job process may be listed by the soak after its first job began
EXAMPLES = 50  # at most this many examples of each finding in the JSON and the report


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest value with ``fraction`` of them at or below it."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def summary(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "p50": percentile(values, 0.50),
        "p90": percentile(values, 0.90),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


@dataclass
class Fault:
    """One injected fault (or, with ``injected=False``, something the soak observed)."""

    seq: int
    kind: str
    t0: float
    """time.monotonic() when the fault began: the signal was sent, the statement issued,
    the server's stop began."""
    t1: float
    """When it ended: the SIGCONT, the server accepting connections again, the statement
    returned; t0 for a kill."""
    wall: float
    worker: str | None = None
    """The target worker's id (kills and stops; for kill_slot the slot's worker)."""
    pid: int | None = None
    """The target pid: the worker's, or the job process's for kill_slot."""
    pool: str | None = None
    workers_hit: list[str] | None = None
    """DB faults: the workers whose connections were cut (None: every worker)."""
    slots_gone: float | None = None
    """kill_worker of a process-pool worker: when all its job processes were gone."""
    injected: bool = True
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Execution:
    """One execution of one attempt, from the ledger."""

    job: int
    attempt: int
    worker: str
    pid: int
    start: float
    end: float | None = None
    task: str = ""
    planned: float | None = None


def parse_ledger(lines: Iterable[str]) -> tuple[list[Execution], list[dict[str, Any]], int]:
    """Executions from ledger lines; also the duplicate starts of one attempt and the
    number of lines that could not be read (a torn last line, say)."""
    starts: dict[tuple[int, int], Execution] = {}
    ends: dict[tuple[int, int, int], float] = {}
    duplicates: list[dict[str, Any]] = []
    bad = 0
    for line in lines:
        try:
            record = json.loads(line)
            key = (int(record["job"]), int(record["attempt"]))
            event, pid, mono = record["e"], int(record["pid"]), float(record["mono"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if event == "start":
            if key in starts:
                duplicates.append({"job": key[0], "attempt": key[1], "pid": pid, "at": mono})
                continue
            starts[key] = Execution(
                job=key[0],
                attempt=key[1],
                worker=str(record.get("worker", "")),
                pid=pid,
                start=mono,
                planned=record.get("planned"),
            )
        elif event == "end":
            ends[(*key, pid)] = mono
    for key, execution in starts.items():
        execution.end = ends.get((*key, execution.pid))
    return sorted(starts.values(), key=lambda e: (e.job, e.attempt)), duplicates, bad


MAX_STRETCH = 4.0
"""The most ``LEASE_DURATION``s a worker's lease is stretched to while its renewals come
back late: ``django_leasejobs.worker.lease_length.MAX_STRETCH`` (this module stays stdlib
only; tests/bench/test_bench_chaos_verdict.py checks the two agree)."""


def in_flight_until(execution: Execution, lease: float) -> float:
    """The last moment a fault can still cost this execution its outcome.

    An execution is in flight from its "start" record until its outcome is recorded. The
    ledger does not see that write, but a worker never writes an outcome later than the
    lease its last renewal asked for after the job returned (it drops outcomes whose lease
    may have run out): ``LEASE_DURATION``, or up to ``MAX_STRETCH`` times it while its
    renewals came back late. So the window ends that long after the "end" record;
    without one, it never ends.
    """
    return math.inf if execution.end is None else execution.end + MAX_STRETCH * lease


def hits(fault: Fault, execution: Execution, lease: float) -> bool:
    """Whether ``fault`` explains that ``execution`` did not finish its job.

    * kill_worker: the execution ran under that worker and was in flight at the kill;
    * kill_slot: the execution ran in that process and was in flight at the kill;
    * stop_worker: the execution ran under that worker and was in flight at some moment
      between the SIGSTOP and the SIGCONT;
    * terminate_backends, restart_postgres: the execution's worker lost a connection (a
      restart cuts every worker) and the execution was in flight at some moment from the
      fault's start until one lease after its end (the worker reconnects meanwhile).
    """
    if not fault.injected:
        return False
    start, until = execution.start, in_flight_until(execution, lease)
    if fault.kind == KILL_WORKER:
        return fault.worker == execution.worker and start <= fault.t0 <= until
    if fault.kind == KILL_SLOT:
        return fault.pid == execution.pid and start <= fault.t0 <= until
    if fault.kind == STOP_WORKER:
        return fault.worker == execution.worker and fault.t0 <= until and start <= fault.t1
    if fault.kind in DB_FAULTS:
        cut = fault.workers_hit is None or execution.worker in fault.workers_hit
        return cut and fault.t0 <= until and start <= fault.t1 + lease
    return False


def running_until(
    execution: Execution,
    faults: Sequence[Fault],
    alive_spans: dict[int, list[tuple[float, float]]],
    pools: dict[str, str],
) -> tuple[float | None, str]:
    """The latest moment at which ``execution`` is known to have been still running.

    * its "end" record;
    * else, in the process pool, the last moment the soak saw its job process alive (it
      samples every worker's job processes every 50 ms) or sent it a SIGKILL: a job
      process runs one job at a time and writes the "end" record before it takes another,
      so a process without that record that is still alive is still running that job
      (``alive_spans``: per pid, when each process of that pid was first and last seen;
      a pid can come back after the kernel's pid counter wrapped);
    * else, in the thread pool (a thread can only stop with its process), the moment its
      worker died: the soak's SIGKILL, or the last time the soak saw an exited worker alive;
    * else unknown.
    """
    if execution.end is not None:
        return execution.end, "end record"
    known: list[tuple[float, str]] = []
    if pools.get(execution.worker) == "process":
        spans = alive_spans.get(execution.pid, [])
        # The process that ran it: the last one of that pid first seen before it started
        # (the soak lists job processes every 0.25 s, hence the slack).
        span = max((s for s in spans if s[0] <= execution.start + SCAN_SLACK), default=None)
        if span is not None and span[1] >= execution.start:
            known.append((span[1], "its job process was last seen alive"))
        for fault in faults:
            if (
                fault.kind == KILL_SLOT
                and fault.pid == execution.pid
                and fault.t0 >= execution.start
            ):
                known.append((fault.t0, f"kill_slot #{fault.seq}"))
    else:
        for fault in faults:
            if fault.worker != execution.worker:
                continue
            if fault.kind == KILL_WORKER and fault.t0 >= execution.start:
                known.append((fault.t0, f"kill_worker #{fault.seq}"))
            elif fault.kind == "worker_exit":
                seen = fault.detail.get("last_seen_alive")
                if seen is not None and seen >= execution.start:
                    known.append((seen, f"worker_exit #{fault.seq}"))
    if not known:
        return None, "unknown"
    return max(known)


def overlap_excuse(
    first: Execution,
    second: Execution,
    first_until: float,
    faults: Sequence[Fault],
    lease: float,
    pools: dict[str, str],
) -> str:
    """Why ``second`` may start while ``first`` still runs ('' when nothing excuses it).

    * "frozen worker": first's worker was SIGSTOPped while first ran, before second
      started. Its lease expired while the worker could not act; a process-pool job
      process is not stopped with its worker and keeps running, a thread resumes with its
      worker: the documented at-least-once window of a frozen worker.
    * "thread pool, lease lost": first ran in the thread pool and a database fault cut
      its worker while first ran, before second started. The worker cannot renew, so the
      lease expires; a thread cannot be killed, so it runs on, fenced (documented for the
      thread pool). The process pool has no such excuse: its watchdog kills the job
      process before the lease can expire in the database.
    """
    for fault in faults:
        if fault.t0 > second.start or not fault.injected:
            continue
        if (
            fault.kind == STOP_WORKER
            and fault.worker == first.worker
            and first.start <= fault.t1
            and fault.t0 < first_until
        ):
            return "frozen worker"
    if pools.get(first.worker) == "thread":
        for fault in faults:
            if fault.kind in DB_FAULTS and fault.t0 <= second.start and hits(fault, first, lease):
                return "thread pool, lease lost"
    return ""


@dataclass
class JobRow:
    id: int
    task: str
    status: str
    attempt: int
    result: Any
    attempt_rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Verdict:
    counts: dict[str, int]
    failing: list[str]
    details: dict[str, list[dict[str, Any]]]
    recovery: dict[str, dict[str, Any]]
    info: dict[str, Any]

    @property
    def passed(self) -> bool:
        return not any(self.counts[name] for name in self.failing)


FAILING_COUNTS = (
    "lost",
    "unexplained_reruns",
    "overlaps",
    "non_last_successes",
    "poison_mismatches",
    "stale_starts",
    "duplicate_attempt_starts",
    "unplanned_worker_exits",
    "orphaned_job_processes",
)


def analyse(
    *,
    executions: Sequence[Execution],
    duplicates: Sequence[dict[str, Any]],
    faults: Sequence[Fault],
    jobs: dict[int, JobRow],
    enqueued_healthy: set[int],
    lease: float,
    worker_pools: dict[str, str],
    alive_spans: dict[int, list[tuple[float, float]]],
) -> Verdict:
    """The soak's verdict from the ledger, the fault log and the final database rows."""
    injected = [f for f in faults if f.injected]
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for execution in executions:
        execution.task = jobs[execution.job].task if execution.job in jobs else ""
        by_job[execution.job].append(execution)
    by_worker_faults: dict[str, list[Fault]] = defaultdict(list)
    by_pid_faults: dict[int, list[Fault]] = defaultdict(list)
    db_faults = [f for f in injected if f.kind in DB_FAULTS]
    for fault in injected:
        if fault.worker:
            by_worker_faults[fault.worker].append(fault)
        if fault.kind == KILL_SLOT and fault.pid is not None:
            by_pid_faults[fault.pid].append(fault)

    exits: dict[str, list[Fault]] = defaultdict(list)  # observed, not injected: no excuse
    for fault in faults:
        if fault.kind == "worker_exit" and fault.worker:
            exits[fault.worker].append(fault)

    def faults_for(execution: Execution) -> list[Fault]:
        return [
            *by_worker_faults.get(execution.worker, []),
            *by_pid_faults.get(execution.pid, []),
            *db_faults,
        ]

    details: dict[str, list[dict[str, Any]]] = defaultdict(list)
    counts: Counter[str] = Counter({name: 0 for name in FAILING_COUNTS})

    # Lost: healthy jobs not succeeded at the end (or whose committed row is gone).
    healthy_rows = {i: j for i, j in jobs.items() if j.task == HEALTHY_TASK}
    statuses = Counter(j.status for j in healthy_rows.values())
    for job_id in sorted(enqueued_healthy):
        row = healthy_rows.get(job_id)
        if row is None or row.status != "succeeded":
            counts["lost"] += 1
            details["lost"].append(
                {
                    "job": job_id,
                    "status": row.status if row else "missing",
                    "attempt": row.attempt if row else None,
                    "starts": len(by_job.get(job_id, [])),
                }
            )
    unknown_rows = sorted(set(healthy_rows) - enqueued_healthy)

    # Re-runs of healthy jobs: each start after the first needs the previous started
    # attempt to have been hit by a fault.
    recovery: dict[str, list[float]] = defaultdict(list)
    explained = 0
    by_fault_kind: Counter[str] = Counter()
    finished_before: Counter[str] = Counter()
    for job_id, runs in by_job.items():
        if job_id not in healthy_rows:
            continue
        for previous, current in itertools.pairwise(runs):
            causes = [
                f
                for f in faults_for(previous)
                if f.t0 <= current.start and hits(f, previous, lease)
            ]
            if not causes:
                counts["unexplained_reruns"] += 1
                details["unexplained_reruns"].append(
                    {
                        "job": job_id,
                        "attempt": current.attempt,
                        "previous": asdict(previous),
                        "started": current.start,
                        "previous_worker_faults": [
                            f"{f.kind} #{f.seq} at {f.t0:.3f}"
                            for f in faults
                            if f.worker == previous.worker
                        ],
                    }
                )
                continue
            explained += 1
            cause = min(causes, key=lambda f: (f.t0 < previous.start, CAUSE_RANK[f.kind], f.t0))
            by_fault_kind[cause.kind] += 1
            if previous.end is not None:  # it had finished: its outcome was not recorded
                finished_before[cause.kind] += 1
            recovery[cause.kind].append(current.start - cause.t0)
            if cause.kind == RESTART:
                recovery[RESTART_BACK].append(current.start - cause.t1)

    # Overlaps: a later execution starting while an earlier one of the same job still ran.
    excused: Counter[str] = Counter()
    unknown_end = 0
    for job_id, runs in by_job.items():
        ordered = sorted(runs, key=lambda e: e.start)
        for i, first in enumerate(ordered):
            known = [*faults_for(first), *exits.get(first.worker, [])]
            end, how = running_until(first, known, alive_spans, worker_pools)
            if end is None:
                unknown_end += 1
                details["executions_without_known_end"].append(asdict(first))
                continue
            for second in ordered[i + 1 :]:
                if second.start >= end:
                    break
                reason = overlap_excuse(first, second, end, faults_for(first), lease, worker_pools)
                if reason:
                    excused[reason] += 1
                    continue
                counts["overlaps"] += 1
                details["overlaps"].append(
                    {
                        "job": job_id,
                        "task": first.task,
                        "first": asdict(first),
                        "first_ran_until": end,
                        "known_from": how,
                        "second": asdict(second),
                    }
                )

    # The fence: a job's success must come from its last started attempt, which ran to its
    # end record; a healthy job's result names the attempt that produced it.
    for job_id, row in jobs.items():
        if row.status != "succeeded":
            continue
        runs = by_job.get(job_id, [])
        last = max(runs, key=lambda e: e.attempt) if runs else None
        problems = []
        if last is None:
            problems.append("no start record at all")
        else:
            if row.attempt != last.attempt:
                problems.append(f"row attempt {row.attempt} != last started {last.attempt}")
            if isinstance(row.result, dict) and row.result.get("attempt") != last.attempt:
                problems.append(
                    f"result from attempt {row.result.get('attempt')} != last {last.attempt}"
                )
            if last.end is None:
                problems.append(f"attempt {last.attempt} has no end record")
        if problems:
            counts["non_last_successes"] += 1
            details["non_last_successes"].append(
                {"job": job_id, "task": row.task, "problems": problems}
            )

    # Stale starts: an attempt may only start before every newer attempt of its job. A worker
    # that starts attempt k after attempt k+1 began elsewhere runs a job it no longer holds.
    for job_id, runs in by_job.items():
        newest_start = math.inf
        for execution in sorted(runs, key=lambda e: e.attempt, reverse=True):
            if execution.start > newest_start:
                counts["stale_starts"] += 1
                details["stale_starts"].append(
                    {
                        "job": job_id,
                        "task": execution.task,
                        "stale": asdict(execution),
                        "newer_attempt_started": newest_start,
                        "late_by": execution.start - newest_start,
                    }
                )
            newest_start = min(newest_start, execution.start)

    counts["duplicate_attempt_starts"] = len(duplicates)
    details["duplicate_attempt_starts"] = list(duplicates)

    # Poison: each in its expected final state, with an attempt row when it failed.
    poison_table: dict[str, dict[str, Any]] = {}
    for kind in POISON:
        rows = [j for j in jobs.values() if j.task == kind.task]
        entry = {
            "what": kind.what,
            "expected": kind.expected,
            "jobs": len(rows),
            "statuses": dict(Counter(j.status for j in rows)),
            "attempt_rows": sum(len(j.attempt_rows) for j in rows),
            "starts": sum(len(by_job.get(j.id, [])) for j in rows),
            "errors": dict(
                Counter(
                    f"{a['outcome']}: {a['error_class'][-60:]}"
                    for j in rows
                    for a in j.attempt_rows
                ).most_common(4)
            ),
            "mismatches": 0,
        }
        for row in rows:
            wrong = row.status != kind.expected or (
                kind.expected == "failed" and not row.attempt_rows
            )
            if wrong:
                entry["mismatches"] += 1
                counts["poison_mismatches"] += 1
                details["poison_mismatches"].append(
                    {
                        "job": row.id,
                        "kind": kind.key,
                        "task": kind.task,
                        "expected": kind.expected,
                        "status": row.status,
                        "attempt": row.attempt,
                        "attempt_rows": row.attempt_rows[:5],
                        "starts": len(by_job.get(row.id, [])),
                    }
                )
        poison_table[kind.key] = entry

    for fault in faults:
        if fault.kind == "worker_exit":
            counts["unplanned_worker_exits"] += 1
            details["unplanned_worker_exits"].append(asdict(fault))
        elif fault.kind == KILL_WORKER and fault.detail.get("orphans"):
            counts["orphaned_job_processes"] += len(fault.detail["orphans"])
            details["orphaned_job_processes"].append(asdict(fault))

    recovery_stats = {kind: summary(values) for kind, values in sorted(recovery.items())}
    recovery_stats["all"] = summary(
        [v for kind, values in recovery.items() if kind != RESTART_BACK for v in values]
    )
    healthy_runs = [e for e in executions if e.job in healthy_rows]
    info = {
        "healthy_jobs": len(enqueued_healthy),
        "healthy_statuses": dict(statuses),
        "healthy_rows_not_recorded_as_enqueued": len(unknown_rows),
        "healthy_executions": len(healthy_runs),
        "healthy_jobs_started_more_than_once": sum(
            1 for j, runs in by_job.items() if j in healthy_rows and len(runs) > 1
        ),
        "explained_reruns": explained,
        "explained_reruns_by_fault": dict(by_fault_kind),
        "explained_reruns_of_finished_attempts": dict(finished_before),
        "overlaps_excused": dict(excused),
        "executions_without_known_end": unknown_end,
        "poison": poison_table,
        "faults": dict(Counter(f.kind for f in injected)),
        "faults_skipped": sum(1 for f in faults if f.kind == "skipped"),
        "observed_events": dict(Counter(f.kind for f in faults if not f.injected)),
        "worker_pools": dict(Counter(worker_pools.values())),
    }
    return Verdict(
        counts=dict(counts),
        failing=list(FAILING_COUNTS),
        details={k: v[:EXAMPLES] for k, v in details.items()},
        recovery=recovery_stats,
        info=info,
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join(
        [line(headers), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, rows)]
    )


def fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"
