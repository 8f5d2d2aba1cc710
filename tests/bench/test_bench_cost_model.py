"""bench/cost_model.py: its attribution rules on a canned py-spy sample, its CPU window,
its options and tables; and a tiny end-to-end run on SQLite (no server, no py-spy).

No timing is asserted: the figures live in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench.scripts import load_bench, run_bench
from tests.waiting import wait_until

cost = load_bench("cost_model")

WORKER = '1234:"python manage.py runworker --burst"'
SLOT = '1240:"python manage.py runworker --burst"'
PKG = "/repo/django_leasejobs/worker"
CANNED = "\n".join(
    [
        # the main loop hands a batch to a slot: pickling shows as its caller
        f"process {WORKER};thread (1234): MainThread;<module> (/repo/manage.py:9);"
        f"Worker._main_loop ({PKG}/loop.py:250);Handover.dispatch ({PKG}/handover.py:100);"
        f"ProcessPool.submit ({PKG}/pools/process.py:260);"
        "Connection._send (/py/multiprocessing/connection.py:373) 30",
        # the database thread claims: psycopg frames count for the claim
        f"process {WORKER};thread (1300): leasejobs-db_0;_worker (/py/concurrent/futures/"
        f"thread.py:83);run_round ({PKG}/rounds.py:255);claim_round (/repo/django_leasejobs/"
        "leases/claim.py:120);Connection.wait (/site-packages/psycopg/connection.py:900) 20",
        # the write half of a round, then a log line inside the recorder
        f"process {WORKER};thread (1300): leasejobs-db_0;run_round ({PKG}/rounds.py:255);"
        f"_write_successes ({PKG}/rounds.py:340);complete_many (/repo/django_leasejobs/leases/"
        "finish.py:80) 10",
        f"process {WORKER};thread (1234): MainThread;Recorder.finish ({PKG}/recorder.py:180);"
        "Logger.info (/py/logging/__init__.py:1489) 5",
        # our signal, sent from the reporter
        f"process {WORKER};thread (1234): MainThread;Reporter.started ({PKG}/reporter.py:75);"
        "Signal.send (/site-packages/django/dispatch/dispatcher.py:170) 4",
        # waiting in select: not per-job CPU
        f"process {WORKER};thread (1234): MainThread;Inbox.wait ({PKG}/inbox.py:150);"
        "DefaultSelector.select (/py/selectors.py:468) 50",
        # an import at start-up (a module's own code runs inside <module>)
        f"process {WORKER};thread (1234): MainThread;<module> (/repo/django_leasejobs/worker/"
        "handover.py:1);_create_fn (/py/dataclasses.py:433) 40",
        # no Python frame: the interpreter starting
        f"process {WORKER} 7",
        # a slot runs the task
        f"process {WORKER};process {SLOT};thread (1240): MainThread;child_main ({PKG}/"
        f"child.py:300);execute ({PKG}/execution.py:295);noop (/tmp/cost_bench_tasks.py:8) 12",
        # a slot sends its outcome back
        f"process {WORKER};process {SLOT};thread (1240): MainThread;child_main ({PKG}/"
        f"child.py:300);child_main.<locals>.send ({PKG}/child.py:280) 3",
        "",
    ]
)


def test_raw_lines_parse_into_processes_threads_and_frames() -> None:
    samples = cost.parse_raw(CANNED)
    assert len(samples) == 10
    first = samples[0]
    assert first.pids == (1234,) and first.thread == "MainThread" and first.count == 30
    assert first.frames[-1] == cost.Frame("Connection._send", "/py/multiprocessing/connection.py")
    assert samples[7].frames == () and samples[7].count == 7
    assert samples[8].pids == (1234, 1240)
    assert [cost.kind_of(s) for s in samples[7:]] == ["parent", "slot", "slot"]


def test_each_canned_stack_gets_its_category() -> None:
    categories = [cost.categorize(s.frames) for s in cost.parse_raw(CANNED)]
    assert categories == [
        "hand-over",
        "claim",
        "write",
        "logs",
        "signals",
        "idle/wait",
        "start/stop",
        "start/stop",
        "run",
        "outcome",
    ]


def test_a_stack_no_rule_knows_is_other() -> None:
    assert cost.categorize([cost.Frame("main", "/somewhere/else.py")]) == "other"


def test_attribution_scales_busy_samples_to_the_measured_cpu() -> None:
    attribution = cost.attribute(cost.parse_raw(CANNED))
    assert attribution.busy("parent") == 30 + 20 + 10 + 5 + 4
    per_job = attribution.per_job("parent", 138.0)
    assert per_job["hand-over"] == pytest.approx(30 / 69 * 138)
    assert per_job["claim"] == pytest.approx(20 / 69 * 138)
    assert per_job["idle/wait"] is None and per_job["start/stop"] is None
    assert sum(v for v in per_job.values() if v is not None) == pytest.approx(138.0)
    assert attribution.per_job("slot", None)["run"] is None
    assert attribution.leaves.most_common(1)[0][0].startswith("Connection._send (")


def test_the_profile_figures_give_the_top_frames_with_shares() -> None:
    figures = cost.profile_figures(cost.parse_raw(CANNED), {"parent": 69.0, "slots": 15.0})
    assert figures["kinds"]["slot"]["us_per_job"]["run"] == pytest.approx(12.0)
    assert figures["kinds"]["slot"]["us_per_job"]["outcome"] == pytest.approx(3.0)
    top = figures["top_parent"]
    assert top[0]["samples"] == 30 and top[0]["share"] == pytest.approx(30 / 69)
    assert figures["threads"] == {"MainThread": 39, "leasejobs-db_0": 30}


def test_the_cpu_window_interpolates_between_readings() -> None:
    points = [
        cost.Point(10.0, {"parent": 1.0, "slots": 0.0, "backends": None, "server": 5.0}),
        cost.Point(12.0, {"parent": 2.0, "slots": 1.0, "backends": None, "server": 6.0}),
        cost.Point(14.0, {"parent": 4.0, "slots": 1.0, "backends": None, "server": 6.0}),
    ]
    assert cost.window(points, 11.0, 13.0) == {
        "parent": pytest.approx(1.5),
        "slots": pytest.approx(0.5),
        "backends": None,
        "server": pytest.approx(0.5),
    }
    assert cost.window(points, 0.0, 99.0)["parent"] == pytest.approx(3.0)  # clamped


def test_the_run_queue_window_reads_the_waits_of_each_kind() -> None:
    points = [
        cost.Point(10.0, {"parent": 1.0}, {"parent": 0.0, "slots": 2.0, "backends": None}),
        cost.Point(12.0, {"parent": 2.0}, {"parent": 1.0, "slots": 2.0, "backends": None}),
    ]
    assert cost.window(points, 10.0, 11.0, waits=True) == {
        "parent": pytest.approx(0.5),
        "slots": pytest.approx(0.0),
        "backends": None,
    }


def test_options_smoke_defaults_and_configs_per_database() -> None:
    args = cost.parse_args(["--smoke"])
    assert (args.jobs, args.databases, args.configs) == (1000, ["postgres"], ["process-4"])
    full = cost.parse_args([])
    assert full.jobs == 20000 and full.configs == list(cost.CONFIGS)
    assert cost.configs_for(full, "postgres") == list(cost.CONFIGS)
    assert cost.configs_for(full, "sqlite") == ["process-4", "thread-4"]
    with pytest.raises(SystemExit):
        cost.parse_args(["--configs", "process-3"])
    assert cost.parse_args(["--peer", "pgqueuer=/x.json"]).peer[0] == ("pgqueuer", Path("/x.json"))


def test_a_peer_json_gives_a_row_and_missing_figures_stay_empty(tmp_path: Path) -> None:
    path = tmp_path / "pgq.json"
    path.write_text(json.dumps({"cost": {"jobs": 1000, "jobs_per_s": 900.0, "worker_cpu_s": 0.2}}))
    peer = cost.read_peer("pgqueuer", path)
    assert peer["cpu_us_per_job"] == {
        "worker": pytest.approx(200.0),
        "backends": None,
        "server": None,
    }
    table = cost.cpu_table([], None, [peer])
    assert "| postgres | pgqueuer | 900 | - | - | 200 | - | - | - | - |" in table
    # With its backends' CPU (bench/pgqueuer_drain.py writes it): a total and a ratio.
    path.write_text(
        json.dumps(
            {
                "cost": {
                    "jobs": 1000,
                    "jobs_per_s": 900.0,
                    "worker_cpu_s": 0.03,
                    "backends_cpu_s": 0.05,
                }
            }
        )
    )
    floor = {"jobs_per_s": 20000.0, "cpu_us_per_job": {"parent": 8.0, "backends": 32.0}}
    table = cost.cpu_table([], floor, [cost.read_peer("pgqueuer", path)])
    assert "| postgres | pgqueuer | 900 | - | - | 30 | 50 | - | 80 | 2.0x |" in table
    assert "error" in cost.read_peer("pgqueuer", tmp_path / "missing.json")


@pytest.mark.slow
def test_a_tiny_run_on_sqlite_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    output = tmp_path / "cost.json"
    result = run_bench(
        "cost_model",
        [
            *("--jobs", "200", "--databases", "sqlite", "--configs", "thread-4"),
            *("--no-profile", "--output", str(output)),
        ],
        env,
    )
    report = json.loads(output.read_text())
    [run] = report["runs"]
    assert run["clean"] and run["database"] == "sqlite" and run["config"] == "thread-4"
    assert run["rate"] and run["cpu_us_per_job"]["parent"] is not None
    assert "| sqlite | thread-4 |" in result.stdout


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_a_process_trees_cpu_counts_its_grandchildren() -> None:
    """``runworker --processes``' slots are grandchildren of the command: the tree's CPU
    (and the part under the command, ``slots_cpu``) holds theirs."""
    import subprocess
    import sys

    # A command whose child starts a grandchild that burns CPU, says so, and waits.
    grandchild = (
        "import sys, time\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "print('burnt', flush=True); sys.stdin.read()"
    )
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    command = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    proc = subprocess.Popen(
        [sys.executable, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "burnt\n"
        [middle] = cost.live_children(proc.pid)
        [leaf] = cost.live_children(middle)
        burnt = cost.proc_times(leaf)[0]
        assert burnt >= 0.25
        assert cost.tree_cpu(proc.pid) >= burnt
        assert cost.slots_cpu(proc.pid) >= burnt
        assert cost.slots_cpu(leaf) == 0.0  # nothing under it
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def sleeping(pid: int) -> bool:
    """Whether process ``pid`` is blocked (state S in ``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "S"


def test_processes_that_outnumber_the_cores_wait_in_the_run_queue() -> None:
    """More CPU-bound children than cores: together they wait for a core, and their
    parent's ``tree_wait`` is the sum of their own waits."""
    import subprocess
    import sys

    burn = (
        "import os, sys, time\n"
        "end = time.process_time() + 0.4\n"
        "while time.process_time() < end: pass\n"
        "os.write(1, b'burnt\\n'); sys.stdin.read()"  # one write: lines never interleave
    )
    count = (os.cpu_count() or 1) + 2
    command = (
        "import subprocess, sys\n"
        f"procs = [subprocess.Popen([sys.executable, '-c', {burn!r}]) for _ in range({count})]\n"
        "[p.wait() for p in procs]"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline() for _ in range(count)] == ["burnt\n"] * count
        children = cost.live_children(proc.pid)
        assert len(children) == count
        # Each burner blocks in its stdin read once it printed; until then it may still
        # wait for a core (a busy machine), and its wait would grow between two readings.
        wait_until(
            lambda: all(sleeping(child) for child in children),
            what="every burner to block reading stdin",
        )
        waited = cost.tree_wait(proc.pid)
        assert waited == pytest.approx(sum(cost.run_queue_wait(c) or 0.0 for c in children))
        assert waited > 0.05, waited  # (two more burners than cores: some of them waited)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
