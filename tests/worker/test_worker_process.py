"""Worker faults with real processes: SIGKILL, SIGSTOP (lock loss), stolen leases and
late writes, a worker cut off from the database, per-job timeouts and cancellation.

Every test runs real ``manage.py runworker`` subprocesses (``workers`` fixture), sends
real signals and checks real process groups: the job's process and a grandchild it
started must both be gone. Jobs leave their pids in ``<marker_dir>/<name>.pids``
(tests/tasks_worker.py, tests/tasks_worker_faults.py); the tests wait on the worker's
events (its ``lease_lost`` signals among them: ``WorkerProcess.wait_for_event``).
Lease times are read from the database (its clock), never from Python's. The cut-off
test puts a small TCP proxy between the worker and PostgreSQL (TCP or Unix socket) and
turns it into a black hole.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from django_leasejobs import leases
from django_leasejobs.leases import CancelResult
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from testproject.embedded_db import settings_to_database_url
from tests import tasks_worker, tasks_worker_faults
from tests.freezing import freeze
from tests.waiting import wait_until
from tests.worker_harness import WorkerProcess, Workers, pid_alive

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_EXPIRED = "django_leasejobs.exceptions.LeaseExpired"
JOB_TIMEOUT = "django_leasejobs.exceptions.TaskTimeout"
JOB_CANCELLED = "django_leasejobs.exceptions.JobCancelled"

KILL_BOUND = 2.0
"""Seconds within which a job's process group must be gone once the worker must kill it."""


# --------------------------------------------------------------------------- helpers


def read_pids(marker_dir: str, name: str, attempt: int = 1) -> list[int]:
    """The pids a job recorded for ``attempt`` (job pid first, then a grandchild if any)."""
    path = Path(marker_dir) / f"{name}.pids"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    for line in text.split("\n")[:-1]:  # complete lines only
        fields = line.split()
        if fields and int(fields[0]) == attempt:
            return [int(pid) for pid in fields[1:]]
    return []


def next_renewal(worker: WorkerProcess, timeout: float) -> None:
    """Wait for the worker's next heartbeat that went through (a renewal of the leases
    it holds, committed: ``heartbeat_sent`` without an error) after those seen so far."""
    seen = len(worker.events("heartbeat_sent", error=None))
    worker.wait_for_event("heartbeat_sent", timeout, count=seen + 1, error=None)


def wait_for_pids(
    workers: Workers, marker_dir: str, name: str, attempt: int = 1, timeout: float = 15.0
) -> list[int]:
    pids: list[int] = wait_until(
        lambda: read_pids(marker_dir, name, attempt),
        timeout,
        what=f"job {name!r} attempt {attempt} to record its pids",
    )
    workers.track(pids)
    return pids


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if pid_alive(pid)]


def wait_gone(pids: list[int], within: float, what: str) -> float:
    """Wait until every pid is gone; fail unless it happens within ``within`` seconds.

    Returns the wall-clock time (``time.time()``) at which they were seen gone.
    """
    wait_until(
        lambda: not alive(pids),
        within,
        interval=0.01,
        what=lambda: (
            f"{what} to be gone; still alive: "
            + ", ".join(f"{pid} ({describe(pid)})" for pid in alive(pids))
        ),
    )
    return time.time()


def wait_for_new_slot(workers: Workers, worker: WorkerProcess, killed: list[int]) -> int:
    """Wait until the worker (concurrency 1) replaced its killed slot; track the new one.

    Besides checking that the worker carries on, this keeps teardown safe: a slot forked
    while the ``workers`` fixture lists the worker's children could escape it.
    """
    slots: list[int] = wait_until(
        lambda: [pid for pid in worker.slot_pids() if pid not in killed and pid_alive(pid)],
        10,
        what="the worker to replace its killed slot",
    )
    workers.track(slots)
    return slots[0]


def describe(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        return f"{process.status()}, {' '.join(process.cmdline())[:80]}"
    except psutil.Error:
        return "gone"


def job_row(job_id: Any) -> Job:
    return Job.objects.get(pk=job_id)


def attempts(job_id: Any) -> list[tuple[int, str, str, str]]:
    return list(
        JobAttempt.objects.filter(job_id=job_id)
        .order_by("attempt")
        .values_list("attempt", "outcome", "error_class", "worker")
    )


def wait_status(job_id: Any, status: str, timeout: float = 15.0) -> Job:
    return wait_until(
        lambda: Job.objects.filter(pk=job_id, status=status).first(),
        timeout,
        what=f"job {job_id} to become {status}",
    )


def db_now() -> datetime:
    return leases.database_now()


def wait_lease_expired(job_id: Any, timeout: float) -> None:
    """Wait until the running job's lease is in the past by the database's clock; on a
    time-out, say what the row and the clock said (a CI run once timed out here)."""
    try:
        wait_until(
            lambda: Job.objects.filter(
                pk=job_id, status=JobStatus.RUNNING, locked_until__lt=Now()
            ).exists(),
            timeout,
            interval=0.05,
            what=f"the lease of job {job_id} to expire (database clock)",
        )
    except AssertionError as exc:
        row = Job.objects.filter(pk=job_id).values("status", "attempt", "locked_by", "locked_until")
        raise AssertionError(f"{exc}; the row: {list(row)}; database now: {db_now()}") from None


def take_lease_away(job_id: Any, new_owner: str = "other") -> None:
    """Reap the job's expired lease from the test and claim it again as ``new_owner``."""
    reaped = leases.reap().jobs
    assert [(r.id, r.attempt, r.status) for r in reaped] == [(job_id, 1, JobStatus.PENDING)]
    claimed = leases.claim(new_owner, limit=1, lease_duration=60)
    assert [c.lease for c in claimed] == [(job_id, 2)]


def now_plus(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


# --------------------------------------------------------------------------- 1. SIGKILL


def test_sigkill_worker_mid_job_kills_the_job_and_another_worker_reruns_it(
    workers: Workers, marker_dir: str
) -> None:
    first = workers.start(args=["--concurrency", "1", "--worker-id", "first"])
    result = tasks_worker.spawn_and_wait.enqueue(marker_dir, "k", 3.0)
    job_pid, grandchild = wait_for_pids(workers, marker_dir, "k")
    assert job_pid in first.slot_pids()
    assert alive([job_pid, grandchild]) == [job_pid, grandchild]

    first.kill()
    # The slot's lifeline sees its parent die and SIGKILLs its whole process group.
    wait_gone([job_pid, grandchild], KILL_BOUND, "the job and its grandchild after SIGKILL")
    assert first.wait(timeout=10) == -signal.SIGKILL
    row = job_row(result.id)
    assert (row.status, row.attempt, row.locked_by) == (JobStatus.RUNNING, 1, "first")

    second = workers.start(args=["--concurrency", "1", "--worker-id", "second"])
    # Lease 2 s + reaper every 0.3 s, then the re-run itself (3 s).
    done = wait_status(result.id, JobStatus.SUCCEEDED, timeout=15)
    assert (done.attempt, done.stall_count, done.last_worker) == (2, 1, "second")
    second_pids = wait_for_pids(workers, marker_dir, "k", attempt=2)
    assert second_pids[0] in second.slot_pids()

    final = tasks_worker.spawn_and_wait.get_result(result.id)
    assert final.status == "SUCCESSFUL"
    assert final.return_value == 2
    assert len(final.worker_ids) == 2
    assert final.worker_ids == ["first", "second"]
    assert [e.exception_class_path for e in final.errors] == [LEASE_EXPIRED]
    assert attempts(result.id) == [(1, AttemptOutcome.LEASE_EXPIRED, LEASE_EXPIRED, "first")]
    # The second worker's background reaper recovered it (no cron, no test reap).
    assert "released stale running jobs count=1" in second.output
    assert f"reaped job {result.id} attempt 1 of worker first -> pending" in second.output
    runs = (Path(marker_dir) / "k.runs").read_text().split()
    assert runs[0] == "2", "only the second attempt ran to its end"


def test_sigkill_worker_takes_the_jobs_of_every_slot_down(
    workers: Workers, marker_dir: str
) -> None:
    worker = workers.start(args=["--concurrency", "3"])
    names = ["s0", "s1", "s2"]
    for name in names:
        tasks_worker.spawn_and_wait.enqueue(marker_dir, name, 60.0)
    pids = [pid for name in names for pid in wait_for_pids(workers, marker_dir, name)]
    assert len(alive(pids)) == 6

    worker.kill()
    wait_gone(pids, KILL_BOUND, "every slot's job and grandchild after SIGKILL of the worker")
    assert worker.wait(timeout=10) == -signal.SIGKILL


# --------------------------------------------------------------------------- 2. lock loss

LOCK_LOSS_CASES = {
    "sigkill": {
        "task": "spawn",
        "options": {},
        "env": {},
        "sigterm": False,
    },
    # The job runs in a thread on its slot's event loop: the lost lease kills the slot.
    "sigkill-sync-on-loop": {
        "task": "spawn",
        "options": {},
        "env": {},
        "sigterm": False,
        "args": ["--sync-on-loop"],
    },
    "sigterm-handler-exits": {
        "task": "handler-exits",
        "options": {"LOCK_LOST_BEHAVIOR": "sigterm", "LOCK_LOST_GRACE": 1.0},
        "env": {},
        "sigterm": True,
    },
    "sigterm-ignored": {
        "task": "handler-ignores",
        "options": {"LOCK_LOST_BEHAVIOR": "sigterm", "LOCK_LOST_GRACE": 1.0},
        "env": {},
        "sigterm": True,
    },
    "sigterm-from-environment": {
        "task": "handler-ignores",
        # The environment variable wins over the option.
        "options": {"LOCK_LOST_BEHAVIOR": "sigkill", "LOCK_LOST_GRACE": 1.0},
        "env": {"LEASEJOBS_LOCK_LOST_BEHAVIOR": "sigterm"},
        "sigterm": True,
    },
}


@pytest.mark.parametrize("case", list(LOCK_LOSS_CASES))
def test_lock_loss_while_frozen_kills_the_job_and_keeps_the_newer_attempt(
    workers: Workers, marker_dir: str, case: str
) -> None:
    spec = LOCK_LOSS_CASES[case]
    worker = workers.start(
        options=spec["options"],
        args=["--concurrency", "1", "--worker-id", "zombie", *spec.get("args", [])],
        env=spec["env"],
    )
    task: Any
    if spec["task"] == "spawn":
        task = tasks_worker.spawn_and_wait
        result = task.enqueue(marker_dir, "j", 60.0)
    else:
        task = tasks_worker.handle_sigterm
        result = task.enqueue(marker_dir, "j", spec["task"] == "handler-ignores")
    pids = wait_for_pids(workers, marker_dir, "j")
    job_pid = pids[0]
    sigterm_marker = Path(marker_dir) / "j.sigterm"

    freeze(worker, result.id)
    try:
        # The worker cannot renew any more; its slot (and the job) runs on.
        wait_lease_expired(result.id, timeout=15)
        assert alive(pids) == pids
        take_lease_away(int(result.id))  # the worker's own reaper is frozen too: reap from here
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    if not spec["sigterm"]:
        wait_gone(pids, KILL_BOUND, "the job's process group after the lease was lost")
        assert not sigterm_marker.exists(), "sigkill mode must not send SIGTERM first"
    elif spec["task"] == "handler-exits":
        wait_gone(pids, 1.0 + KILL_BOUND, "the job after SIGTERM")
        assert sigterm_marker.exists(), "the job's SIGTERM handler did not run"
    else:
        grace = 1.0
        gone = wait_gone(pids, grace + KILL_BOUND, "the job that ignores SIGTERM (grace 1s)")
        assert sigterm_marker.exists(), "the job's SIGTERM handler did not run before SIGKILL"
        handled_at = sigterm_marker.stat().st_mtime
        # SIGTERM first, SIGKILL only once the grace period ran out.
        assert gone - handled_at >= grace / 2, (
            f"the job died {gone - handled_at:.2f}s after its SIGTERM handler ran; "
            f"expected the {grace}s grace first"
        )
        assert sigterm_marker.read_text().split() == ["1", str(job_pid)]

    logged = worker.wait_for_event("lease_lost", timeout=5)
    assert [(s["job_id"], s["attempt"], s["worker_id"]) for s in logged] == [
        (int(result.id), 1, "zombie")
    ]
    assert logged[0]["pid"] == worker.pid
    # (The start-up line was read long ago: the worker logged it before its lease was lost.)
    expected_behavior = "sigterm" if spec["sigterm"] else "sigkill"
    assert f"lock_lost={expected_behavior}" in worker.output

    # The newer attempt ends; the zombie's attempt must not overwrite it.
    leases.complete(int(result.id), 2, "other", result="newer")
    # The zombie carries on with a fresh slot: it runs a new job (so it is done with the old).
    follow_up = tasks_worker.record.enqueue(marker_dir, "after")
    wait_status(follow_up.id, JobStatus.SUCCEEDED)
    assert job_row(follow_up.id).last_worker == "zombie"
    assert worker.popen.poll() is None

    row = job_row(result.id)
    assert (row.status, row.attempt, row.result, row.locked_by) == (
        JobStatus.SUCCEEDED,
        2,
        "newer",
        None,
    )
    assert attempts(result.id) == [(1, AttemptOutcome.LEASE_EXPIRED, LEASE_EXPIRED, "zombie")]
    final = task.get_result(result.id)
    assert final.status == "SUCCESSFUL"
    assert final.worker_ids == ["zombie", "other"]


def test_sigterm_mode_kills_the_group_after_the_grace_when_the_job_exits_alone(
    workers: Workers, marker_dir: str
) -> None:
    """SIGTERM goes to the job's process only; what the job started is left for the
    SIGKILL of the whole group after the grace, which must come even though the job
    itself exited at once on SIGTERM."""
    grace = 1.0
    worker = workers.start(
        options={"LOCK_LOST_BEHAVIOR": "sigterm", "LOCK_LOST_GRACE": grace},
        args=["--concurrency", "1", "--worker-id", "zombie"],
    )
    result = tasks_worker_faults.spawn_and_exit_on_sigterm.enqueue(marker_dir, "g")
    job_pid, grandchild = wait_for_pids(workers, marker_dir, "g")

    freeze(worker, result.id)
    try:
        wait_lease_expired(result.id, timeout=15)
        take_lease_away(int(result.id))
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    wait_gone([job_pid], KILL_BOUND, "the job, which exits on SIGTERM")
    assert (Path(marker_dir) / "g.sigterm").read_text().split() == ["1", str(job_pid)]
    wait_for_new_slot(workers, worker, [job_pid])
    worker.wait_for_event("lease_lost", timeout=5, job_id=int(result.id), attempt=1)
    wait_gone(
        [grandchild],
        grace + KILL_BOUND,
        "the job's grandchild (its process group must be SIGKILLed after the grace)",
    )


def test_renewal_that_finds_the_lease_gone_kills_the_job_process_group(
    workers: Workers, marker_dir: str
) -> None:
    """A live worker whose lease was taken away learns it from its next renewal."""
    heartbeat = 1.0
    worker = workers.start(
        # Local deadline 5 s: here the renewal, not the watchdog, must notice the loss.
        options={
            "LEASE_DURATION": 6.0,
            "HEARTBEAT_INTERVAL": heartbeat,
            "STALE_LOCK_INTERVAL": 0,
        },
        args=["--concurrency", "1", "--worker-id", "renewer"],
    )
    result = tasks_worker.spawn_and_wait.enqueue(marker_dir, "r", 60.0)
    pids = wait_for_pids(workers, marker_dir, "r")
    next_renewal(worker, 5)

    assert Job.objects.filter(pk=result.id).update(locked_until=now_plus(-1)) == 1
    take_lease_away(int(result.id))
    wait_gone(pids, heartbeat + KILL_BOUND, "the job's process group after a lost renewal")
    wait_for_new_slot(workers, worker, pids)

    logged = worker.wait_for_event("lease_lost", timeout=5)
    assert [(s["job_id"], s["attempt"], s["worker_id"]) for s in logged] == [
        (int(result.id), 1, "renewer")
    ]
    assert "the renewal matched no row" in logged[0]["reason"]
    assert "cut off from the database" not in logged[0]["reason"]
    row = job_row(result.id)
    assert (row.status, row.attempt, row.locked_by) == (JobStatus.RUNNING, 2, "other")
    assert attempts(result.id) == [(1, AttemptOutcome.LEASE_EXPIRED, LEASE_EXPIRED, "renewer")]


@pytest.mark.parametrize("how", ["return", "raise", "checkpoint"])
def test_late_write_of_a_stolen_lease_is_rejected(
    workers: Workers, marker_dir: str, how: str
) -> None:
    """The worker learns of the loss only from its own fenced write, not a renewal.

    A long heartbeat interval leaves a window in which the job's lease is taken
    away (expired in database time, reaped, re-claimed and completed by another
    owner) and the job then ends: the worker's complete/fail must match no row.
    """
    worker = workers.start(
        # No in-worker reaper: this test reaps itself, at a moment it chooses.
        options={"LEASE_DURATION": 9.0, "HEARTBEAT_INTERVAL": 3.0, "STALE_LOCK_INTERVAL": 0},
        args=["--concurrency", "1", "--worker-id", "late"],
    )
    result = tasks_worker_faults.finish_on_go.enqueue(marker_dir, "late", how)
    wait_for_pids(workers, marker_dir, "late")

    # Right after a renewal, the next one is a whole heartbeat interval (3 s) away.
    next_renewal(worker, 8)
    assert Job.objects.filter(pk=result.id).update(locked_until=now_plus(-1)) == 1
    take_lease_away(int(result.id))
    leases.complete(int(result.id), 2, "other", result="newer")
    (Path(marker_dir) / "late.go").touch()

    transition = "complete" if how == "return" else "fail"
    logged = worker.wait_for_event("lease_lost", timeout=5)
    assert [(s["job_id"], s["attempt"], s["worker_id"]) for s in logged] == [
        (int(result.id), 1, "late")
    ]
    assert f"{transition} of job {result.id} attempt 1" in logged[0]["reason"]
    if how == "checkpoint":
        rejected = (Path(marker_dir) / "late.rejected").read_text().split()
        assert rejected == ["1", "checkpoint"]

    row = job_row(result.id)
    assert (row.status, row.attempt, row.result, row.locked_by, row.checkpoint) == (
        JobStatus.SUCCEEDED,
        2,
        "newer",
        None,
        None,
    )
    # Only the reap recorded attempt 1; the worker's own record of it was rejected.
    assert attempts(result.id) == [(1, AttemptOutcome.LEASE_EXPIRED, LEASE_EXPIRED, "late")]
    assert "succeeded in" not in worker.output
    assert f"job {result.id} attempt 1 failed" not in worker.output


# --------------------------------------------------------------------------- 3. cut off


class DatabaseProxy:
    """A local TCP port forwarding to the PostgreSQL server, until :meth:`cut`.

    Cut, it turns into a black hole: it neither forwards nor closes anything, so the
    worker's queries go unanswered on open sockets, as in a network partition (not a
    refused connection, which a worker would notice at once). The server may listen on
    TCP or on a Unix socket (the embedded PostgreSQL): the proxy connects to either.
    """

    def __init__(self, family: int, address: Any) -> None:
        self._family = family
        self._address = address
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, socket.socket] = {}
        self._cut = threading.Event()
        self._halted = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._run, name="db-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._cut.is_set():
                for key, _ in self._selector.select(timeout=0.02):
                    if self._cut.is_set():
                        break
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._forward(key.fileobj)  # type: ignore[arg-type]
        finally:
            self._halted.set()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        upstream = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            upstream.connect(self._address)
        except OSError:
            client.close()
            upstream.close()
            return
        self.connections += 1
        self._peers[client] = upstream
        self._peers[upstream] = client
        self._selector.register(client, selectors.EVENT_READ)
        self._selector.register(upstream, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        peer = self._peers.get(sock)
        if data and peer is not None:
            try:
                peer.sendall(data)
                return
            except OSError:
                pass
        self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        for end in (sock, self._peers.pop(sock, None)):
            if end is None:
                continue
            self._peers.pop(end, None)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(end)
            end.close()

    def cut(self) -> None:
        """Stop forwarding, now: returns once nothing more goes through."""
        self._cut.set()
        assert self._halted.wait(5), "the proxy did not stop forwarding"

    def close(self) -> None:
        self._cut.set()
        self._thread.join(timeout=5)
        for sock in list(self._peers):
            sock.close()
        self._peers.clear()
        self._listener.close()
        self._selector.close()


@pytest.fixture
def db_proxy() -> Iterator[DatabaseProxy]:
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip(
            "needs a database server: a worker cannot be cut off from a file database "
            "(SQLite) while the test keeps using it"
        )
    settings = connection.settings_dict
    host = str(settings.get("HOST") or "")
    port = int(settings.get("PORT") or (5432 if connection.vendor == "postgresql" else 3306))
    if connection.vendor == "mysql":  # PyMySQL connects over TCP, even to "localhost"
        proxy = DatabaseProxy(socket.AF_INET, (host or "127.0.0.1", port))
    elif not host or host.startswith("/"):
        socket_dir = host or "/var/run/postgresql"
        proxy = DatabaseProxy(socket.AF_UNIX, f"{socket_dir}/.s.PGSQL.{port}")
    else:
        proxy = DatabaseProxy(socket.AF_INET, (host, port))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.mark.parametrize("on_loop", [[], ["--sync-on-loop"]], ids=["alone", "sync-on-loop"])
def test_worker_cut_off_from_the_database_kills_the_job_before_its_lease_expires(
    workers: Workers, marker_dir: str, db_proxy: DatabaseProxy, on_loop: list[str]
) -> None:
    lease, heartbeat = 4.5, 1.5  # local deadline: lease - heartbeat = 3 s
    url = settings_to_database_url(
        {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": db_proxy.port}
    )
    worker = workers.start(
        options={"LEASE_DURATION": lease, "HEARTBEAT_INTERVAL": heartbeat},
        args=["--concurrency", "1", "--worker-id", "cut", *on_loop],
        env={"DATABASE_URL": url},
    )
    result = tasks_worker.spawn_and_wait.enqueue(marker_dir, "cut", 60.0)
    pids = wait_for_pids(workers, marker_dir, "cut")
    assert db_proxy.connections >= 1, "the worker does not use the proxy"
    # Let at least one renewal go through the proxy first.
    next_renewal(worker, heartbeat + 5)

    db_proxy.cut()
    cut_at = time.monotonic()
    # The database-side lease as it stands once nothing more gets through. (A renewal
    # still in flight could only move it later: reading it now is the strict choice.)
    at_cut = job_row(result.id)
    locked_until, renewed = at_cut.locked_until, at_cut.heartbeat_at
    assert locked_until is not None
    assert renewed is not None
    # The lease the last renewal asked for: LEASE_DURATION, or longer if renewals came back
    # late on a loaded machine (worker/lease_length.py).
    held = (locked_until - renewed).total_seconds()
    assert held >= lease - 0.01, held

    wait_gone(pids, held + KILL_BOUND, "the job of a worker cut off from the database")
    gone_db_time = db_now()
    waited = time.monotonic() - cut_at
    wait_for_new_slot(workers, worker, pids)

    assert gone_db_time < locked_until, (
        f"the job was still running when its database-side lease expired "
        f"({gone_db_time} >= {locked_until})"
    )
    row = job_row(result.id)
    # Nothing reached the database: the row still shows the cut-off worker's lease.
    assert (row.status, row.attempt, row.locked_by) == (JobStatus.RUNNING, 1, "cut")
    assert waited < held
    [lost] = worker.wait_for_event("lease_lost", timeout=5)
    assert (lost["job_id"], lost["attempt"], lost["worker_id"]) == (int(result.id), 1, "cut")
    assert "cut off from the database" in lost["reason"], lost


# --------------------------------------------------------------------------- 6. timeout, cancel


def test_timeout_kills_the_job_process_group_and_fails_the_job(
    workers: Workers, marker_dir: str
) -> None:
    worker = workers.start(args=["--concurrency", "1"])
    result = tasks_worker.overrun.enqueue(marker_dir, "t")
    pids = wait_for_pids(workers, marker_dir, "t")
    started = (Path(marker_dir) / "t.pids").stat().st_mtime

    gone = wait_gone(pids, 1.0 + KILL_BOUND, "the job's process group past its 1s timeout")
    assert gone - started >= 0.5, "killed before its timeout"
    wait_for_new_slot(workers, worker, pids)

    row = wait_status(result.id, JobStatus.FAILED)
    assert row.attempt == 1
    assert attempts(result.id) == [(1, AttemptOutcome.TIMEOUT, JOB_TIMEOUT, row.last_worker)]
    final = tasks_worker.overrun.get_result(result.id)
    assert final.status == "FAILED"
    assert [e.exception_class_path for e in final.errors] == [JOB_TIMEOUT]
    assert f"stopping job {result.id} attempt 1: timeout" in worker.output
    assert worker.popen.poll() is None


def test_cancelling_a_running_job_kills_its_process_group(
    workers: Workers, marker_dir: str
) -> None:
    worker = workers.start(args=["--concurrency", "1"])
    result = tasks_worker.spawn_and_wait.enqueue(marker_dir, "c", 60.0)
    pids = wait_for_pids(workers, marker_dir, "c")

    assert leases.cancel(int(result.id)) == CancelResult.REQUESTED
    # The worker sees the flag with its next renewal (every 0.3 s).
    wait_gone(pids, KILL_BOUND, "the cancelled job's process group")
    wait_for_new_slot(workers, worker, pids)

    row = wait_status(result.id, JobStatus.CANCELLED)
    assert (row.attempt, row.locked_by, row.cancel_requested) == (1, None, False)
    assert attempts(result.id) == [(1, AttemptOutcome.CANCELLED, JOB_CANCELLED, row.last_worker)]
    final = tasks_worker.spawn_and_wait.get_result(result.id)
    assert final.status == "FAILED"
    assert [e.exception_class_path for e in final.errors] == [JOB_CANCELLED]
    assert f"stopping job {result.id} attempt 1: cancelled" in worker.output
    assert not (Path(marker_dir) / "c.runs").exists(), "the job ran to its end"
