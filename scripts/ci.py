#!/usr/bin/env python3
"""CI's steps, each runnable alone (.ci/run runs them all on a clean clone).

    scripts/ci.py --list                      the steps and groups, with what each runs
    scripts/ci.py run STEP|GROUP... [-- PYTEST ARGUMENTS]
    scripts/ci.py run all                     the whole CI, as .ci/run runs it

A step is one command with a title: the provisioning of the machine (chromium, pgbouncer,
mariadb: .ci/provision), the static checks, the test suite on one Django line and one
database (through scripts/test, the README's test command), a benchmark at smoke size, or
a part of the packaging check. Groups name several steps. Arguments after `--` go to
pytest in every test-suite step of the run (`run tests-dj6-sqlite -- tests/leases -x`).

`run all` runs: provision, static, then the two interpreter pipelines side by side (the
Python 3.11 + Django 5.2 one in the foreground, the Python 3.13 + Django 6 one in the
background, its output printed whole once it ends; CI_PARALLEL=0 runs them one after the
other), each its core group, then its "-more" group within the time budget
(CI_BUDGET_MIN, below), then packaging. Any other selection runs its steps in the order
given.

Every step runs even when an earlier one failed; the summary at the end lists each with
PASS/FAIL and its duration, and the exit status is 1 when any failed.

Environment:
    CI_LOCAL_PG_URL   the PostgreSQL of the Django 6 steps
                      (default postgres://postgres@127.0.0.1:5432/test; the embedded
                      server when it does not answer)
    CI_MARIADB_URL    the MariaDB server (default mysql://root@127.0.0.1:3306/ci)
    CI_RUFF_FORMAT    0 leaves `ruff format --check .` out of `static` and `all`
    CI_PARALLEL       0 runs the two pipelines of `run all` one after the other
    CI_BUDGET_MIN     `run all`'s time budget in minutes (default 42; 0: every step runs):
                      a "-more" step runs only when predicted to end within it
    CI_WORK           a directory for the virtualenvs, databases and logs, kept and reused
                      (virtualenvs through their install stamps: scripts/_venv.sh); default:
                      a fresh temporary directory, removed at the end

Standard library only: it runs on the machine's python3 before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[1]

LOCAL_PG_URL = os.environ.get("CI_LOCAL_PG_URL", "postgres://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get("CI_MARIADB_URL", "mysql://root@127.0.0.1:3306/ci")
MARIADB_URL_DJ6 = urlunsplit(urlsplit(MARIADB_URL)._replace(path="/ci6"))
"""The same server for the Django 6 pipeline, whose steps run beside the Django 5.2 ones:
another database name, so that pytest-django's test databases differ (test_ci6)."""
MARIADB_STATUS_ENV = "LEASEJOBS_CI_MARIADB_STATUS"
"""The `mariadb` step's exit status, for the background pipeline of `run all`."""
# `ruff format --check .` covers the code and the Python blocks in README.md and docs/*.md.
RUFF_FORMAT = os.environ.get("CI_RUFF_FORMAT", "1") == "1"
PARALLEL = os.environ.get("CI_PARALLEL", "1") == "1"

RULE = "=" * 78


def header(title: str) -> None:
    print(f"\n{RULE}\n== {title}\n{RULE}", flush=True)


def run(
    argv: Sequence[str | Path], env: Mapping[str, str | None] | None = None, cwd: Path = REPO
) -> int:
    """Run a command (from the repository root unless told) and return its exit status; its
    output goes where ours goes. ``env`` adds to this process's environment; a ``None``
    value removes that variable."""
    merged = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=merged, check=False).returncode


def find_python(version: str) -> str | None:
    """A working interpreter for Python X.Y: pythonX.Y on PATH, else pyenv's newest X.Y.*."""
    want = tuple(int(part) for part in version.split("."))

    def works(candidate: str) -> bool:
        check = f"import sys; sys.exit(sys.version_info[:2] != {want!r})"
        try:
            done = subprocess.run([candidate, "-c", check], capture_output=True, check=False)
        except OSError:
            return False
        return done.returncode == 0

    on_path = shutil.which(f"python{version}")
    if on_path and works(on_path):
        return on_path
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        versions = Path(root.stdout.strip()) / "versions"
        found = sorted(
            versions.glob(f"{version}.*/bin/python{version}"),
            key=lambda p: [int(n) if n.isdigit() else -1 for n in re.split(r"[.]", p.parts[-3])],
            reverse=True,
        )
        for candidate in found:
            if os.access(candidate, os.X_OK) and works(str(candidate)):
                return str(candidate)
    return None


# -- the run's context --------------------------------------------------------------------


@dataclass
class Context:
    work: Path
    pytest_args: list[str] = field(default_factory=list)
    listing: bool = False
    """--list: describe the steps without probing the local PostgreSQL."""
    mariadb_status: int | None = None
    """The exit status of this run's `mariadb` step, when it ran."""
    _pythons: dict[str, str | None] = field(default_factory=dict)
    _venvs: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _pg_url: str | None = None

    # interpreters

    @property
    def py311(self) -> str | None:
        if "3.11" not in self._pythons:
            self._pythons["3.11"] = find_python("3.11")
        return self._pythons["3.11"]

    @property
    def py3new(self) -> str | None:
        """Python 3.13, or 3.12 when 3.13 is missing (the Django 6 steps)."""
        if "new" not in self._pythons:
            self._pythons["new"] = find_python("3.13") or find_python("3.12")
        return self._pythons["new"]

    @property
    def new_version(self) -> str:
        found = re.search(r"python(3\.\d+)$", self.py3new or "")
        if found:
            return found.group(1)
        if self.py3new:
            done = subprocess.run(
                [self.py3new, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=False,
            )
            return done.stdout.strip()
        return "3.13"

    # paths of this run

    @property
    def venv311(self) -> Path:
        return self.work / "venv-py311"

    @property
    def venv3new(self) -> Path:
        return self.work / "venv-py3new"

    @property
    def lint_db(self) -> str:
        return f"sqlite:///{self.work}/lint.sqlite3"

    @property
    def dist(self) -> Path:
        return self.work / "dist"

    def pg_url(self) -> str:
        """CI_LOCAL_PG_URL when it answers, else "" (the embedded PostgreSQL)."""
        if self.listing:
            return LOCAL_PG_URL
        if self._pg_url is None:
            url = urlsplit(LOCAL_PG_URL)
            try:
                socket.create_connection(
                    (url.hostname or "127.0.0.1", url.port or 5432), timeout=3
                ).close()
                self._pg_url = LOCAL_PG_URL
            except OSError as exc:
                print(f"local PostgreSQL at {url.hostname}:{url.port} unreachable: {exc}")
                print(
                    "!! WARNING: local PostgreSQL unreachable; Django 6 runs on the embedded "
                    "server instead",
                    flush=True,
                )
                self._pg_url = ""
        return self._pg_url

    def ensure_venv(self, venv: Path, python: str, group: str, extra_pip: str = "") -> int:
        """scripts/_venv.sh's leasejobs_ensure_venv GROUP, once per run and virtualenv (no
        pip at all when its install stamp matches)."""
        key = (str(venv), group, extra_pip)
        if key not in self._venvs:
            env = {"VENV": str(venv), "PYTHON": python, "EXTRA_PIP": extra_pip}
            script = ". scripts/_venv.sh && leasejobs_ensure_venv " + group
            self._venvs[key] = run(["bash", "-c", script], env=env)
        return self._venvs[key]


class NotRun(Exception):
    """A step that cannot run here (say why); it counts as failed."""


# -- the steps ----------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    title: Callable[[Context], str]
    action: Callable[[Context], int]
    tests: bool = False
    """Runs the test suite through scripts/test (takes the pytest arguments after --)."""


STEPS: dict[str, Step] = {}


Action = Callable[[Context], int]


def step(
    name: str, title: str | Callable[[Context], str], tests: bool = False
) -> Callable[[Action], Action]:
    """Register a step: ``title`` is a string, or a function of the run's context."""

    def register(action: Action) -> Action:
        titled = title if callable(title) else (lambda ctx: title)
        STEPS[name] = Step(name, titled, action, tests)
        return action

    return register


def needs(python: str | None, version: str) -> str:
    if not python:
        raise NotRun(f"Python {version} not found")
    return python


def provision(*args: str) -> Action:
    def action(ctx: Context) -> int:
        provision = REPO / ".ci" / "provision"
        return run(["bash", provision, *args], env={"CI_WORK_DIR": str(ctx.work)})

    return action


step("chromium", "Chromium for the browser tests (apt-get install chromium if missing)")(
    provision("chromium")
)
step("pgbouncer", "PgBouncer for the pooler tests (apt-get install pgbouncer if missing)")(
    provision("pgbouncer")
)


@step(
    "mariadb",
    "MariaDB server for the MariaDB tests (apt-get install mariadb-server and start it if missing)",
)
def mariadb(ctx: Context) -> int:
    ctx.mariadb_status = provision("mariadb", MARIADB_URL)(ctx)
    return ctx.mariadb_status


# The static checks: Python 3.11 with the project (editable) and the dev group.


@step("venv-dev", "py3.11: virtualenv with django-leasejobs (editable) and the dev group")
def venv_dev(ctx: Context) -> int:
    return ctx.ensure_venv(ctx.venv311, needs(ctx.py311, "3.11"), "dev")


def in_dev_venv(ctx: Context, argv: list[str], database: bool = False) -> int:
    status = venv_dev(ctx)
    if status:
        raise NotRun(f"no dev virtualenv (its install exited {status})")
    env = {"PATH": f"{ctx.venv311}/bin{os.pathsep}{os.environ.get('PATH', '')}"}
    if database:
        env["DATABASE_URL"] = ctx.lint_db
    return run(argv, env=env)


@step("check", "py3.11: manage.py check --fail-level WARNING")
def check(ctx: Context) -> int:
    return in_dev_venv(
        ctx,
        [f"{ctx.venv311}/bin/python", "testproject/manage.py", "check", "--fail-level", "WARNING"],
        True,
    )


@step("makemigrations", "py3.11: manage.py makemigrations --check --dry-run")
def makemigrations(ctx: Context) -> int:
    return in_dev_venv(
        ctx,
        [
            f"{ctx.venv311}/bin/python",
            "testproject/manage.py",
            "makemigrations",
            "--check",
            "--dry-run",
        ],
        True,
    )


@step("ruff", "ruff check .")
def ruff(ctx: Context) -> int:
    return in_dev_venv(ctx, ["ruff", "check", "."])


@step("ruff-format", "ruff format --check .")
def ruff_format(ctx: Context) -> int:
    return in_dev_venv(ctx, ["ruff", "format", "--check", "."])


@step("mypy", "mypy")
def mypy(ctx: Context) -> int:
    return in_dev_venv(ctx, ["mypy"], True)


# The test suite: scripts/test in a virtualenv of the run, on one database.


def scripts_test(
    ctx: Context,
    venv: Path,
    python: str,
    url: str,
    extra_pip: str = "",
    pytest_args: Sequence[str] | None = None,
) -> int:
    """scripts/test with ``pytest_args`` (default: the run's); url "" = the embedded
    PostgreSQL (DATABASE_URL unset)."""
    env = {"VENV": str(venv), "PYTHON": python, "DATABASE_URL": url or None}
    if extra_pip:
        env["EXTRA_PIP"] = extra_pip
    args = ctx.pytest_args if pytest_args is None else pytest_args
    return run(["scripts/test", *args], env=env)


def sqlite_url(ctx: Context, name: str) -> str:
    (ctx.work / name).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{ctx.work}/{name}/db.sqlite3"


# Which suites run where. The whole suite runs once per database path and Django line
# the machine can afford: on PostgreSQL with Django 5.2 (the README's command: the
# embedded server), on SQLite with Django 6; MariaDB, each Django line's other database
# and Django 6.0 get the suites where they can fail differently (CI_BUDGET below).

# The suites where this package meets Django's own API (django.tasks, the admin,
# management commands, system checks, migrations, the ORM's queries of the backend). The
# worker, lease-protocol, chaos and benchmark suites drive code of ours that calls the
# same Django functions those suites do.
DJANGO_FACING_SUITES = [
    "tests/backend",
    "tests/admin",
    "tests/commands",
    "tests/bulk",
    "tests/schedules",
    "tests/testing_kit",
    "tests/workflows",
    "tests/observability",
    "tests/alerts",
    "tests/test_import_graph.py",
]

# A Django line's other database: the suites above and the lease protocol (the contract
# suite every database path passes).
DJANGO_FACING_AND_LEASES = [*DJANGO_FACING_SUITES, "tests/leases"]

# MariaDB's core: the lease protocol, the backend (enqueue, results) and a worker's life
# on the portable path (its smoke test and MySQL's error handling), on both Django lines;
# the rest of the suite on MariaDB is `tests-dj52-mariadb`.
MARIADB_CORE = [
    "tests/leases",
    "tests/backend",
    "tests/worker/test_worker_smoke.py",
    "tests/worker/test_mysql_errors.py",
]


@step(
    "tests-dj52-postgres",
    "py3.11 + Django 5.2: the whole suite on embedded PostgreSQL (the README's scripts/test)",
    tests=True,
)
def tests_dj52_postgres(ctx: Context) -> int:
    return scripts_test(ctx, ctx.venv311, needs(ctx.py311, "3.11"), "")


@step(
    "tests-dj52-sqlite",
    "py3.11 + Django 5.2: the Django-facing and lease suites on SQLite",
    tests=True,
)
def tests_dj52_sqlite(ctx: Context) -> int:
    python = needs(ctx.py311, "3.11")
    selection = ctx.pytest_args or DJANGO_FACING_AND_LEASES
    return scripts_test(
        ctx, ctx.venv311, python, sqlite_url(ctx, "sqlite311"), pytest_args=selection
    )


@step(
    "tests-dj52-mariadb-core",
    f"py3.11 + Django 5.2: MariaDB's core on MariaDB ({MARIADB_URL})",
    tests=True,
)
def tests_dj52_mariadb_core(ctx: Context) -> int:
    return mariadb_tests(ctx, MARIADB_CORE)


def mariadb_tests(ctx: Context, selection: list[str]) -> int:
    """scripts/test on MariaDB with Python 3.11 and Django 5.2: the run's pytest
    arguments, else ``selection``. Not run when this run's `mariadb` step could not
    provide a server."""
    if ctx.mariadb_status:
        raise NotRun("no MariaDB server")
    return scripts_test(
        ctx,
        ctx.venv311,
        needs(ctx.py311, "3.11"),
        MARIADB_URL,
        pytest_args=ctx.pytest_args or selection,
    )


@step(
    "tests-dj52-mariadb",
    f"py3.11 + Django 5.2: the suite but MariaDB's core on MariaDB ({MARIADB_URL})",
    tests=True,
)
def tests_dj52_mariadb(ctx: Context) -> int:
    return mariadb_tests(ctx, [f"--ignore={path}" for path in MARIADB_CORE])


@step(
    "tests-dj6-sqlite",
    lambda ctx: f"py{ctx.new_version} + Django 6: the whole suite on SQLite",
    tests=True,
)
def tests_dj6_sqlite(ctx: Context) -> int:
    python = needs(ctx.py3new, "3.13 or 3.12")
    return scripts_test(ctx, ctx.venv3new, python, sqlite_url(ctx, "sqlite3new"))


@step(
    "tests-dj6-postgres",
    lambda ctx: (
        f"py{ctx.new_version} + Django 6: the Django-facing and lease suites on PostgreSQL "
        f"({ctx.pg_url() or 'embedded'})"
    ),
    tests=True,
)
def tests_dj6_postgres(ctx: Context) -> int:
    python = needs(ctx.py3new, "3.13 or 3.12")
    selection = ctx.pytest_args or DJANGO_FACING_AND_LEASES
    return scripts_test(ctx, ctx.venv3new, python, ctx.pg_url(), pytest_args=selection)


@step(
    "tests-dj6-mariadb-core",
    lambda ctx: f"py{ctx.new_version} + Django 6: MariaDB's core on MariaDB ({MARIADB_URL_DJ6})",
    tests=True,
)
def tests_dj6_mariadb_core(ctx: Context) -> int:
    if ctx.mariadb_status:
        raise NotRun("no MariaDB server")
    python = needs(ctx.py3new, "3.13 or 3.12")
    selection = ctx.pytest_args or MARIADB_CORE
    return scripts_test(ctx, ctx.venv3new, python, MARIADB_URL_DJ6, pytest_args=selection)


# Django 6.0 is a supported line until its end of life: the Django-facing suites on
# PostgreSQL with the newest 6.0 release.
@step(
    "tests-dj60-postgres",
    lambda ctx: (
        f"py{ctx.new_version} + Django 6.0: the Django-facing suites on PostgreSQL "
        f"({ctx.pg_url() or 'embedded'})"
    ),
    tests=True,
)
def tests_dj60_postgres(ctx: Context) -> int:
    python = needs(ctx.py3new, "3.13 or 3.12")
    selection = ctx.pytest_args or DJANGO_FACING_SUITES
    return scripts_test(
        ctx, ctx.work / "venv-dj60", python, ctx.pg_url(), "django>=6.0,<6.1", selection
    )


# The benchmarks at smoke size, so that they cannot rot. Each fails on what it guards
# (a lost, re-run or overlapping job...); none judges speed here.


def bench_python(ctx: Context, venv: Path, python: str | None, version: str) -> str:
    """The python of a pipeline's virtualenv (its test steps created it: made here when a
    smoke step runs alone)."""
    status = ctx.ensure_venv(venv, needs(python, version), "test")
    if status:
        raise NotRun(f"no virtualenv {venv} (its install exited {status})")
    return str(venv / "bin" / "python")


# The overload test (issue 27): many burst workers with 4-second leases drain 10,000 jobs
# beside CPU hogs and a busy database server; fails when a job ran twice, did not succeed
# at attempt 1, or a worker failed (bench/README.md, docs/benchmarks.md "Overload").
@step(
    "overload-smoke-postgres",
    "overload smoke: bench/overload.py --smoke --async-share 0.5 --sync-on-loop-workers 0.5 "
    "(a private PostgreSQL, production settings; half of the jobs async def, half of the "
    "workers with --sync-on-loop)",
)
def overload_smoke_postgres(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv3new, ctx.py3new, "3.13 or 3.12")
    output = ctx.work / "overload-smoke-postgres.json"
    argv = [python, "bench/overload.py", "--smoke", "--async-share", "0.5"]
    argv += ["--sync-on-loop-workers", "0.5", "--output", output]
    return run(argv)


@step(
    "overload-smoke-mariadb",
    f"overload smoke: bench/overload.py --smoke on MariaDB ({MARIADB_URL})",
)
def overload_smoke_mariadb(ctx: Context) -> int:
    if ctx.mariadb_status:
        raise NotRun("no MariaDB server")
    python = bench_python(ctx, ctx.venv311, ctx.py311, "3.11")
    output = ctx.work / "overload-smoke-mariadb.json"
    return run(
        [
            python,
            "bench/overload.py",
            "--smoke",
            "--database",
            "mariadb",
            "--mariadb-url",
            MARIADB_URL,
            "--output",
            output,
        ]
    )


# The chaos soak (about 500 jobs, 2 workers of each pool, 2 faults of every kind including
# PostgreSQL restarts, on an embedded PostgreSQL of its own): fails on a lost job, an
# unexplained re-run, an overlap, a success by a non-last attempt or a poison job in the
# wrong state. Its work directory is kept under /tmp when it fails.
@step("chaos-smoke", "chaos soak smoke: bench/chaos.py --smoke (embedded PostgreSQL)")
def chaos_smoke(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv311, ctx.py311, "3.11")
    return run([python, "bench/chaos.py", "--smoke", "--output", ctx.work / "chaos-smoke.json"])


# The sustained-load soak (45 s at 30 jobs/s, prune_jobs every 4 s): fails on a lost or
# re-run job, no sample or no pruning; its goals are printed, not judged.
@step("soak-smoke", "soak smoke: bench/soak.py --smoke (a private PostgreSQL, production settings)")
def soak_smoke(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv311, ctx.py311, "3.11")
    return run([python, "bench/soak.py", "--smoke", "--output", ctx.work / "soak-smoke.json"])


# The side-by-side benchmark (every measurement, every system, tiny counts); its figures
# are not judged here (docs/benchmarks.md).
@step(
    "bench-smoke",
    lambda ctx: f"benchmark smoke: scripts/bench --smoke ({ctx.pg_url() or 'embedded PostgreSQL'})",
)
def bench_smoke(ctx: Context) -> int:
    env = {
        "VENV": str(ctx.work / "venv-bench"),
        "PYTHON": needs(ctx.py3new, "3.13 or 3.12"),
        "DATABASE_URL": ctx.pg_url(),
    }
    return run(["scripts/bench", "--smoke", "--output", ctx.work / "bench-smoke.json"], env=env)


def bench_venv_smoke(ctx: Context, script: str, name: str, *more: str) -> int:
    """``bench/<script> --smoke`` (and ``more`` arguments) in the bench virtualenv (the
    peers, py-spy), its JSON report in ``<name>.json`` of the run's work directory."""
    venv = ctx.work / "venv-bench"
    status = ctx.ensure_venv(venv, needs(ctx.py3new, "3.13 or 3.12"), "bench")
    if status:
        return status
    output = ctx.work / f"{name}.json"
    python = str(venv / "bin" / "python")
    return run([python, f"bench/{script}", "--smoke", *more, "--output", output])


# Async jobs (300 async def jobs on two slots' event loops, 6 sync ones, and procrastinate's
# async worker on the same private PostgreSQL; the bench virtualenv has procrastinate):
# fails when a job was lost or ran twice, never on speed (docs/benchmarks.md#async-jobs).
@step(
    "async-bench-smoke",
    "async jobs bench smoke: bench/async_jobs.py --smoke (a private PostgreSQL, procrastinate)",
)
def async_bench_smoke(ctx: Context) -> int:
    return bench_venv_smoke(ctx, "async_jobs.py", "async-bench-smoke")


# PgQueuer side by side (300 no-op jobs, each system once: PgQueuer's queue managers and
# this project's runworker rows, on one private PostgreSQL; the bench virtualenv has
# PgQueuer): fails when a job was lost or ran twice, never on speed
# (docs/benchmarks.md#pgqueuer-side-by-side). About 30 s.
@step(
    "pgqueuer-smoke",
    "PgQueuer bench smoke: bench/pgqueuer_drain.py --smoke (a private PostgreSQL, PgQueuer)",
)
def pgqueuer_smoke(ctx: Context) -> int:
    return bench_venv_smoke(ctx, "pgqueuer_drain.py", "pgqueuer-smoke")


# Many workers (2,000 no-op jobs, 1 and 2 burst workers, thread pool) on a private
# PostgreSQL: fails when a job ran twice, failed or was lost.
@step("workers-smoke", "many-worker bench smoke: bench/workers.py --smoke (a private PostgreSQL)")
def workers_smoke(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv3new, ctx.py3new, "3.13 or 3.12")
    return run([python, "bench/workers.py", "--smoke", "--output", ctx.work / "workers-smoke.json"])


# The cost model (1,000 no-op jobs, one process-pool burst worker, a private PostgreSQL,
# py-spy from the bench virtualenv, the Python floor): fails when a job failed or ran twice;
# its figures are judged by the full run only (docs/benchmarks.md#cost-model-where-a-jobs-cpu-goes).
@step(
    "cost-model-smoke",
    "cost model smoke: bench/cost_model.py --smoke (a private PostgreSQL, py-spy)",
)
def cost_model_smoke(ctx: Context) -> int:
    return bench_venv_smoke(ctx, "cost_model.py", "cost-model-smoke", "--private-server")


# Rollups' cost (1,000 no-op jobs, one burst worker, ROLLUPS on then off, a private
# PostgreSQL): fails when a job failed or ran twice, or the rollup table miscounted; the
# 5 % goal is judged by the full run only (docs/benchmarks.md).
@step("rollups-smoke", "rollups bench smoke: bench/rollups.py --smoke (a private PostgreSQL)")
def rollups_smoke(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv3new, ctx.py3new, "3.13 or 3.12")
    return run([python, "bench/rollups.py", "--smoke", "--output", ctx.work / "rollups-smoke.json"])


# Flow control (a 5,000-job backlog on one full key, and on 1,000 keys, against the claim
# of other jobs; a private PostgreSQL, production settings): fails when a held-back job
# was claimed, a key ran over its limit or a job was lost; the 2x goal is judged by the
# full run only (docs/benchmarks.md#flow-control).
@step(
    "flow-smoke",
    "flow bench smoke: bench/flow.py --smoke (a private PostgreSQL, production settings)",
)
def flow_smoke(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv3new, ctx.py3new, "3.13 or 3.12")
    return run([python, "bench/flow.py", "--smoke", "--output", ctx.work / "flow-smoke.json"])


# The chaos soak again with jobs of 0.1-2 ms fed in bursts, so that workers hand them to
# their slots several at a time and the faults hit those batches (same verdict).
@step(
    "chaos-short-smoke",
    "chaos soak smoke, short jobs: bench/chaos.py --smoke --short-jobs (embedded PostgreSQL)",
)
def chaos_short_smoke(ctx: Context) -> int:
    python = bench_python(ctx, ctx.venv3new, ctx.py3new, "3.13 or 3.12")
    output = ctx.work / "chaos-short-smoke.json"
    return run(
        [python, "bench/chaos.py", "--smoke", "--short-jobs", "--jobs", "3000", "--output", output]
    )


# Packaging: the distribution as users get it.


@step("build", "packaging: python -m build (sdist + wheel), twine check --strict, their contents")
def build(ctx: Context) -> int:
    """Build the sdist and the wheel (the wheel from the sdist, as pip would build it) in a
    throwaway virtualenv holding build and twine, from a copy of the checkout's tracked
    files (a stale *.egg-info or build/ of an editable install cannot leak in); then
    `twine check --strict`, and a look inside both (.ci/check_dist.py)."""
    python = ctx.py3new or needs(ctx.py311, "3.13, 3.12 or 3.11")
    tools, src = ctx.work / "venv-build", ctx.work / "dist-src"
    shutil.rmtree(ctx.dist, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        source = REPO / name
        if name and os.path.lexists(source):  # a tracked file deleted in the checkout: left out
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, src / name, follow_symlinks=False)
    if run([python, "-m", "venv", tools]):
        return 1
    pip = [tools / "bin" / "python", "-m", "pip", "install", "--quiet", "--upgrade"]
    if run([*pip, "pip", "build", "twine", "trove-classifiers"]):
        return 1
    log = ctx.work / "build.log"
    with log.open("w") as out:
        built = subprocess.run(
            [tools / "bin" / "python", "-m", "build", "--outdir", ctx.dist, src],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if built.returncode:
        print("!! python -m build failed; the end of its log:", file=sys.stderr)
        print("\n".join(log.read_text().splitlines()[-40:]), file=sys.stderr, flush=True)
        return 1
    run(["ls", "-l", ctx.dist])
    if run([tools / "bin" / "twine", "check", "--strict", *sorted(ctx.dist.iterdir())]):
        return 1
    return run([tools / "bin" / "python", REPO / ".ci" / "check_dist.py", ctx.dist])


def side_by_side(
    commands: Mapping[str, Sequence[str | Path]], env: Mapping[str, str | None], cwd: Path
) -> int:
    """Run the commands at once, each one's output to a log of its own, printed whole once
    they all ended; the status is the first non-zero one (0 when all passed)."""
    merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    started: list[tuple[str, subprocess.Popen[bytes], Path, float]] = []
    for label, argv in commands.items():
        log = cwd / f"{label}.log"
        print(f"{label}: {' '.join(map(str, argv))}  (output: {log})", flush=True)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(a) for a in argv], cwd=cwd, env=merged, stdout=out, stderr=subprocess.STDOUT
            )
        started.append((label, process, log, time.monotonic()))
    statuses = []
    for label, process, log, began in started:
        status = process.wait()
        took = time.monotonic() - began
        header(f"{label}: exit {status} after {took:.0f}s (it ran beside the others)")
        print(log.read_text(errors="replace"), end="", flush=True)
        statuses.append(status)
    return next((status for status in statuses if status), 0)


def wheel_smoke(ctx: Context, python: str, name: str) -> int:
    """Install the wheel of the `build` step (not editable, with the postgres extra) into a
    fresh virtualenv, then run the quickstart of docs/quickstart.md in brand-new projects
    with that interpreter and a worker until its job succeeds (tests/quickstart.py): with
    SQLite, and beside it with PostgreSQL (CI_LOCAL_PG_URL's server, in a database of this
    run that the script creates and drops). Run from the work directory with no
    PYTHONPATH, so nothing of the checkout but that script is in reach: the project
    imports the installed wheel."""
    venv = ctx.work / f"venv-wheel-{name}"
    wheels = sorted(ctx.dist.glob("*.whl"))
    if not wheels:
        print(f"!! no wheel in {ctx.dist} (the build step failed)", file=sys.stderr, flush=True)
        return 1
    shutil.rmtree(venv, ignore_errors=True)
    if run([python, "-m", "venv", venv]):
        return 1
    if run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"{wheels[0]}[postgres]"]):
        return 1
    bare: dict[str, str | None] = {
        "PYTHONPATH": None,
        "DJANGO_SETTINGS_MODULE": None,
        "DATABASE_URL": None,
    }
    show = (
        "import django, django_leasejobs, sys; print('installed: django-leasejobs', "
        "django_leasejobs.__version__, 'from', django_leasejobs.__file__, '| Django', "
        "django.get_version(), '| Python', sys.version.split()[0])"
    )
    if run([venv / "bin" / "python", "-I", "-c", show], env=bare, cwd=ctx.work):
        return 1
    quickstart = [python, REPO / "tests" / "quickstart.py", "--python", venv / "bin" / "python"]
    server = ctx.pg_url()
    runs: dict[str, list[str | Path]] = {}
    for variant in ("sqlite", "postgresql") if server else ("sqlite",):
        site = ctx.work / f"quickstart-{name}-{variant}"
        shutil.rmtree(site, ignore_errors=True)
        runs[f"quickstart-{name}-{variant}"] = [*quickstart, "--workdir", site]
    if server:
        database = f"leasejobs_quickstart_{name}_{os.getpid()}"  # this run's, created and dropped
        url = urlsplit(server)._replace(path=f"/{database}").geturl()
        runs[f"quickstart-{name}-postgresql"] += ["--database", url]
    status = side_by_side(runs, env=bare, cwd=ctx.work)
    if not server:
        raise NotRun(f"no PostgreSQL at {LOCAL_PG_URL}: the quickstart ran with SQLite only")
    return status


@step(
    "wheel-dj6",
    lambda ctx: (
        f"packaging: the wheel in a fresh py{ctx.new_version} venv (Django 6): "
        "tests/quickstart.py job, SQLite and PostgreSQL side by side"
    ),
)
def wheel_dj6(ctx: Context) -> int:
    return wheel_smoke(ctx, needs(ctx.py3new, "3.13 or 3.12"), "py3new")


@step(
    "wheel-dj52",
    "packaging: the wheel in a fresh py3.11 venv (Django 5.2 + backport): tests/quickstart.py "
    "job, SQLite and PostgreSQL side by side",
)
def wheel_dj52(ctx: Context) -> int:
    return wheel_smoke(ctx, needs(ctx.py311, "3.11"), "py311")


GROUPS: dict[str, list[str]] = {
    "provision": ["chromium", "pgbouncer", "mariadb"],
    "static": ["venv-dev", "check", "makemigrations", "ruff"]
    + (["ruff-format"] if RUFF_FORMAT else [])
    + ["mypy"],
    # The Python 3.11 + Django 5.2 pipeline: its core, then more while CI's time allows.
    "py311": ["tests-dj52-postgres", "tests-dj52-mariadb-core"],
    "py311-more": ["overload-smoke-mariadb", "tests-dj52-sqlite", "tests-dj52-mariadb"],
    # The Python 3.13 (or 3.12) + Django 6 pipeline: the same.
    # (Its chaos and soak smokes use the Python 3.11 virtualenv, which the static steps
    # made before the pipelines started.)
    "py313": ["tests-dj6-sqlite", "overload-smoke-postgres", "chaos-smoke", "soak-smoke"],
    "py313-more": [
        "chaos-short-smoke",
        "tests-dj6-postgres",
        "tests-dj6-mariadb-core",
        "tests-dj60-postgres",
        "bench-smoke",
        "async-bench-smoke",
        "pgqueuer-smoke",
        "workers-smoke",
        "rollups-smoke",
        "cost-model-smoke",
        "flow-smoke",
    ],
    "packaging": ["build", "wheel-dj6", "wheel-dj52"],
}
ALL = ["provision", "static", "py311 (+ py311-more) | py313 (+ py313-more)", "packaging"]

# CI's time budget. `run all` runs each pipeline's core steps, then its "-more" steps in
# order, each only when it is predicted to end (with the packaging steps after it) within
# CI_BUDGET_MIN minutes of the start; the others are listed as SKIP in the summary. The
# prediction scales the step's REFERENCE_MINUTES by how long the pipeline's core took
# against its own: a machine twice as slow as the reference runs the core and the steps
# that fit. CI_BUDGET_MIN=0 runs every step.
BUDGET_MINUTES = float(os.environ.get("CI_BUDGET_MIN", "42"))

REFERENCE_MINUTES: dict[str, float] = {
    "tests-dj52-postgres": 17.8,
    "tests-dj52-mariadb-core": 3.0,
    "overload-smoke-mariadb": 3.1,
    "tests-dj52-sqlite": 5.3,
    "tests-dj52-mariadb": 12.0,
    "tests-dj6-sqlite": 10.6,
    "overload-smoke-postgres": 1.0,
    "chaos-smoke": 0.7,
    "soak-smoke": 0.6,
    "chaos-short-smoke": 0.7,
    "tests-dj6-postgres": 11.0,
    "tests-dj6-mariadb-core": 3.0,
    "tests-dj60-postgres": 5.0,
    "bench-smoke": 1.5,
    "async-bench-smoke": 0.7,
    "pgqueuer-smoke": 0.7,
    "workers-smoke": 0.7,
    "rollups-smoke": 0.5,
    "cost-model-smoke": 0.7,
    "flow-smoke": 0.7,
    "build": 0.5,
    "wheel-dj6": 0.7,
    "wheel-dj52": 0.7,
}
"""Each step's minutes on a machine of this project's kind (2 cores) at full speed, the
two pipelines side by side: the rehearsal of 2026-11-29 09:46 UTC (a machine 2.1 times
slower than the one of the rehearsals before) divided by that pace; the whole suites' from
those earlier rehearsals; the bench smokes not run then, estimated."""

STARTED_AT_ENV = "LEASEJOBS_CI_STARTED_AT"
"""The wall-clock start of `run all`, for the background pipeline's budget."""


# -- running steps ------------------------------------------------------------------------


@dataclass
class Results:
    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def record(self, status: int, took: float, title: str, note: str = "") -> None:
        if status == 0:
            self.lines.append(f"PASS  {took:.0f}s  {title}")
        else:
            self.lines.append(f"FAIL  {took:.0f}s  {title} ({note or f'exit {status}'})")
            self.failed = True

    def skip(self, title: str, why: str) -> None:
        self.lines.append(f"SKIP  0s  {title} ({why})")


def run_step(ctx: Context, results: Results, name: str) -> None:
    step_ = STEPS[name]
    started = time.monotonic()
    title = step_.title(ctx)
    header(title)
    try:
        status = step_.action(ctx)
        note = ""
    except NotRun as exc:
        status, note = 1, f"not run: {exc}"
        print(f"!! not run: {exc}", flush=True)
    took = time.monotonic() - started
    results.record(status, took, title, note)
    if status:
        print(f"!! FAILED ({note or f'exit {status}'}): {title}", flush=True)


def expand(names: Sequence[str]) -> list[str]:
    steps: list[str] = []
    for name in names:
        if name in GROUPS:
            steps += GROUPS[name]
        elif name in STEPS:
            steps.append(name)
        else:
            raise SystemExit(f"scripts/ci.py: no step or group {name!r} (see --list)")
    return steps


def run_pipeline(ctx: Context, results: Results, pipeline: str, started_at: float) -> None:
    """A pipeline of `run all`: its core steps, then its "-more" steps within the budget
    (``BUDGET_MINUTES`` from ``started_at``, wall clock)."""
    core, more = GROUPS[pipeline], GROUPS[f"{pipeline}-more"]
    began = time.time()
    for name in core:
        run_step(ctx, results, name)
    # How fast this machine runs this pipeline, against the reference (never assumed
    # faster than it).
    pace = max(1.0, (time.time() - began) / (60 * sum(REFERENCE_MINUTES[n] for n in core)))
    packaging = 60 * pace * sum(REFERENCE_MINUTES[n] for n in GROUPS["packaging"])
    for name in more:
        predicted = 60 * pace * REFERENCE_MINUTES[name]
        left = BUDGET_MINUTES * 60 - (time.time() - started_at) - packaging
        if BUDGET_MINUTES and predicted > left:
            why = (
                f"time budget: about {predicted / 60:.0f} min predicted at {pace:.1f}x the "
                f"reference time, {max(0.0, left) / 60:.0f} min left of "
                f"CI_BUDGET_MIN={BUDGET_MINUTES:g}"
            )
            print(f"!! skipped, {why}: {STEPS[name].title(ctx)}", flush=True)
            results.skip(STEPS[name].title(ctx), why)
            continue
        run_step(ctx, results, name)


def run_pipelines_side_by_side(ctx: Context, results: Results, started_at: float) -> None:
    """The py313 pipeline in a background process of this script, its output to a log that
    is printed whole once it ended; the py311 one meanwhile in the foreground."""
    log, report = ctx.work / "py313.log", ctx.work / "py313.results"
    report.unlink(missing_ok=True)
    started = time.monotonic()
    argv = [sys.executable, __file__, "--work", str(ctx.work), "--results", str(report)]
    argv += ["--pipeline", "py313", "run", "all", "--", *ctx.pytest_args]
    env = {**os.environ, STARTED_AT_ENV: repr(started_at)}
    if ctx.mariadb_status is not None:
        env[MARIADB_STATUS_ENV] = str(ctx.mariadb_status)
    with log.open("w") as out:
        background = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    print(
        f"the Python {ctx.new_version} pipeline runs in the background "
        "(its output follows the Python 3.11 one's)",
        flush=True,
    )
    run_pipeline(ctx, results, "py311", started_at)
    status = background.wait()
    header("the py313 pipeline's output (it ran in the background)")
    print(log.read_text(errors="replace"), end="", flush=True)
    try:
        theirs = json.loads(report.read_text())
    except (OSError, ValueError):
        results.lines.append(
            f"FAIL  0s  the py313 pipeline ended without its results (exit {status})"
        )
        results.failed = True
    else:
        results.lines += theirs["lines"]
        results.failed = results.failed or theirs["failed"]
    results.lines.append(f"----  {time.monotonic() - started:.0f}s  both pipelines, side by side")


def summary(results: Results, started: float, screenshots: bool) -> None:
    header(f"summary ({time.monotonic() - started:.0f}s)")
    print("\n".join(results.lines))
    passed = sum(line.startswith("PASS") for line in results.lines)
    failed = sum(line.startswith("FAIL") for line in results.lines)
    skipped = sum(line.startswith("SKIP") for line in results.lines)
    print(f"steps: {passed} passed, {failed} failed, {skipped} skipped (time budget)")
    if screenshots:
        shots = REPO / "artifacts" / "screenshots"
        if shots.is_dir():
            print("\nbrowser test screenshots:")
            for path in sorted(shots.rglob("*.png")):
                print(f"  {path}")
        else:
            print("browser test screenshots: none (artifacts/screenshots/ was not written)")
    sys.stdout.flush()


def list_steps(ctx: Context) -> None:
    print("steps (scripts/ci.py run STEP...), in the order of `run all`, with their group:")
    grouped = {name: group for group, names in GROUPS.items() for name in names}
    ordered = [*grouped, *(name for name in STEPS if name not in grouped)]
    for name in ordered:
        group = f"[{grouped.get(name, '')}]"
        print(f"  {name:<20} {group:<12} {STEPS[name].title(ctx)}")
    print("\ngroups:")
    for group, names in GROUPS.items():
        print(f"  {group:<12} {' '.join(names)}")
    print(f"  {'all':<12} {', '.join(ALL)}   (| : side by side unless CI_PARALLEL=0)")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/ci.py",
        description="CI's steps, each runnable alone.",
        epilog="Arguments after -- go to pytest in every test-suite step.",
    )
    parser.add_argument("--list", action="store_true", help="list the steps and groups")
    parser.add_argument("--work", help="work directory to keep and reuse (default: CI_WORK)")
    parser.add_argument("--results", help=argparse.SUPPRESS)  # the background pipeline's
    parser.add_argument("--pipeline", help=argparse.SUPPRESS)  # run all: only this pipeline
    sub = parser.add_subparsers(dest="command")
    run_parser = sub.add_parser("run", help="run steps or groups (all: the whole CI)")
    run_parser.add_argument("names", nargs="+", metavar="STEP|GROUP")
    pytest_args: list[str] = []
    if "--" in argv:
        at = list(argv).index("--")
        argv, pytest_args = list(argv[:at]), list(argv[at + 1 :])
    options = parser.parse_args(argv)

    os.environ["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    work = options.work or os.environ.get("CI_WORK")
    if options.list:
        list_steps(Context(work=Path(work or tempfile.gettempdir()) / "leasejobs-ci", listing=True))
        return 0
    if options.command is None:
        parser.print_help()
        return 2

    names = options.names
    whole = names == ["all"]
    if "all" in names and not whole:
        raise SystemExit("scripts/ci.py: `run all` takes no other steps")
    steps = [] if whole else expand(names)
    child = options.results is not None
    keep = bool(work)
    if work:
        Path(work).mkdir(parents=True, exist_ok=True)
        work_dir = Path(work).resolve()
    else:
        work_dir = Path(tempfile.mkdtemp(prefix="leasejobs-ci.", dir=os.environ.get("TMPDIR")))
    ctx = Context(work=work_dir, pytest_args=pytest_args)
    results = Results()
    started = time.monotonic()
    with_tests = whole or any(STEPS[name].tests for name in steps)
    try:
        if not child:
            header("environment")
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
            )
            print(f"repository: {REPO} ({commit.stdout.strip() or 'not a git checkout'})")
            print(f"work dir:   {work_dir}{' (kept)' if keep else ''}")
            run(["uname", "-a"])
            print(f"Python 3.11: {ctx.py311 or 'not found'}")
            print(f"Python {ctx.new_version}: {ctx.py3new or 'neither 3.13 nor 3.12 found'}")
            if with_tests:
                # Screenshots of this run only (tests/e2e/test_browser.py writes them).
                shutil.rmtree(REPO / "artifacts" / "screenshots", ignore_errors=True)
        if whole and options.pipeline:  # the background pipeline of `run all`
            started_at = float(os.environ.get(STARTED_AT_ENV, time.time()))
            if MARIADB_STATUS_ENV in os.environ:
                ctx.mariadb_status = int(os.environ[MARIADB_STATUS_ENV])
            run_pipeline(ctx, results, options.pipeline, started_at)
        elif whole:
            started_at = time.time()
            for name in expand(["provision", "static"]):
                run_step(ctx, results, name)
            if PARALLEL:
                run_pipelines_side_by_side(ctx, results, started_at)
            else:
                run_pipeline(ctx, results, "py311", started_at)
                run_pipeline(ctx, results, "py313", started_at)
            for name in expand(["packaging"]):
                run_step(ctx, results, name)
        else:
            for name in steps:
                run_step(ctx, results, name)
        if child:
            Path(options.results).write_text(
                json.dumps({"lines": results.lines, "failed": results.failed})
            )
        else:
            summary(results, started, with_tests)
    finally:
        if not keep and not child:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
