"""Follow docs/quickstart.md in a brand-new project, as a user would; exit 0 when its job ran.

    python tests/quickstart.py --python /path/to/venv/bin/python --workdir /tmp/site
    python tests/quickstart.py --python ... --workdir ... \
        --database postgres://postgres@127.0.0.1:5432/quickstart_private

The interpreter must have django-leasejobs installed (editable or from a wheel); the
script itself needs only the standard library. Every fenced block of the guide is
preceded by a directive comment that says what to do with it, so the guide cannot grow a
block this script does not run or knowingly skip:

    <!-- quickstart: run -->                    each command line of a bash block
    <!-- quickstart: start -->                  a long-running command (the worker), stopped
                                                with SIGTERM at the end; it must exit 0
    <!-- quickstart: append PATH [if CONDITION] -->
                                                CONDITION: django<6, django>=6 (the given
                                                interpreter's Django), database=sqlite,
                                                database=postgresql (the --database variant)
    <!-- quickstart: write PATH -->             the block becomes the file
    <!-- quickstart: python [until "TEXT"] -->  run in one shared `manage.py shell`
                                                namespace, in order; with `until`, run
                                                again (also after an exception) until
                                                it runs cleanly and its output holds TEXT
    <!-- quickstart: skip (why) -->             not run (installing, crontab lines)

`python` and `django-admin` in commands are the given interpreter. The project's
database is the SQLite file `startproject` configures, or with `--database URL`
(`postgres://USER[:PASSWORD]@HOST[:PORT]/NAME`; a Unix socket directory as `?host=/dir`)
the guide's PostgreSQL variant: the script creates the database NAME (which must not
exist), gives every command the guide's PG* variables for it (PGHOST, PGPORT, PGUSER,
PGPASSWORD, PGDATABASE) and drops the database at the end. It creates and drops it with
the given interpreter's psycopg (the `postgres` extra), connected to the server's
`postgres` database.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
GUIDE = REPO_ROOT / "docs" / "quickstart.md"
DIRECTIVE = re.compile(r"^<!-- quickstart: (?P<body>.*?) -->$")
# Any fence, also indented (in a list item) or of tildes: each must carry a directive.
FENCE = re.compile(r"^\s*(?P<fence>```|~~~)")
UNTIL_SECONDS = 90
STOP_SECONDS = 60
# What the parent environment may carry that a brand-new project must not inherit.
SCRUBBED = (
    "DJANGO_SETTINGS_MODULE",
    "DATABASE_URL",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    *("PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSERVICE"),
)
DATABASES = ("sqlite", "postgresql")
CONDITION = re.compile(r"(?:django(?P<django><6|>=6)|database=(?P<database>sqlite|postgresql))")

# Runs with the given interpreter: create (or drop) the --database database, connected to
# the server's `postgres` database with the PG* variables of the environment.
ADMIN_SQL = """
import sys
import psycopg
from psycopg import sql
action, name = sys.argv[1:]
with psycopg.connect(dbname="postgres", autocommit=True) as connection:
    if action == "create":
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    else:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
"""

# Runs inside `manage.py shell -c`: the guide's python blocks in one namespace.
DRIVER = """
import contextlib, io, json, sys, time, traceback
blocks = json.load(open(BLOCKS_FILE))
namespace = {"__name__": "__main__"}
for number, block in enumerate(blocks, 1):
    deadline = time.monotonic() + block["seconds"]
    while True:
        out = io.StringIO()
        problem = None
        try:
            with contextlib.redirect_stdout(out):
                name = f"<python block {number} (line {block['line']})>"
                exec(compile(block["code"], name, "exec"), namespace)
        except Exception:
            problem = traceback.format_exc()
        print(out.getvalue(), end="")
        if problem is None and (block["until"] is None or block["until"] in out.getvalue()):
            break
        if block["until"] is None or time.monotonic() > deadline:
            print(problem or f"python block {number} (line {block['line']}): no "
                  f"{block['until']!r} in its output after {block['seconds']} s")
            sys.exit(1)
        time.sleep(0.5)
from django.db import connection
print(f"quickstart: every python block ran (database: {connection.vendor})")
"""


class GuideError(Exception):
    """The guide has a block without a directive, or a directive this script cannot do."""


@dataclass(frozen=True)
class Step:
    kind: str  # run | start | append | write | python | skip
    code: str
    line: int  # the directive's line in the guide (1-based)
    path: str | None = None
    django: str | None = None  # "<6" or ">=6": the append applies on that Django line only
    until: str | None = None
    database: str | None = None  # "sqlite" or "postgresql": only in that variant


def parse(text: str) -> list[Step]:
    """The guide's steps, in order. Every fenced block must follow a directive line."""
    lines = text.splitlines()
    steps: list[Step] = []
    pending: tuple[str, int] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        directive = DIRECTIVE.match(line.strip())
        if directive:
            pending = (directive["body"].strip(), index + 1)
            index += 1
            continue
        fence = FENCE.match(line)
        if fence:
            end = index + 1
            while end < len(lines) and lines[end].strip() != fence["fence"]:
                end += 1
            if end == len(lines):
                raise GuideError(f"line {index + 1}: a code block is never closed")
            code = "\n".join(lines[index + 1 : end]) + "\n"
            if pending is None or pending[1] != index:
                raise GuideError(
                    f"line {index + 1}: a code block without a <!-- quickstart: ... --> "
                    "directive on the line before it"
                )
            steps.append(_step(pending[0], code, pending[1]))
            pending = None
            index = end + 1
            continue
        if pending is not None and line.strip():
            raise GuideError(f"line {pending[1]}: a directive not followed by a code block")
        index += 1
    if pending is not None:
        raise GuideError(f"line {pending[1]}: a directive not followed by a code block")
    return steps


def _step(body: str, code: str, line: int) -> Step:
    words = body.split(None, 1)
    kind, rest = words[0], (words[1] if len(words) > 1 else "")
    if kind in ("run", "start") and not rest:
        return Step(kind, code, line)
    if kind == "skip" and rest.startswith("("):
        return Step(kind, code, line)
    if kind in ("append", "write"):
        match = re.fullmatch(r"(?P<path>[\w./-]+)(?: if (?P<condition>.+))?", rest)
        condition = CONDITION.fullmatch(match["condition"] or "") if match else None
        if match and not (match["condition"] and (kind == "write" or condition is None)):
            return Step(
                kind,
                code,
                line,
                path=match["path"],
                django=condition["django"] if condition else None,
                database=condition["database"] if condition else None,
            )
    if kind == "python":
        match = re.fullmatch(r'(?:until "(?P<until>[^"]+)")?', rest)
        if match:
            return Step(kind, code, line, until=match["until"])
    raise GuideError(f"line {line}: cannot do the directive {body!r}")


def command(line: str, python: str) -> list[str]:
    argv = shlex.split(line, comments=True)
    if argv and argv[0] == "python":
        return [python, *argv[1:]]
    if argv and argv[0] == "django-admin":
        return [python, "-m", "django", *argv[1:]]
    return argv


@dataclass(frozen=True)
class Database:
    """The variant the guide is followed in: startproject's SQLite, or a PostgreSQL."""

    vendor: str  # sqlite | postgresql
    env: dict[str, str]  # the PG* variables of the guide's PostgreSQL settings
    name: str = ""


def database_from_url(url: str | None) -> Database:
    if not url or url == "sqlite":
        return Database("sqlite", {})
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise GuideError(f"--database {url!r}: not sqlite nor a postgres:// URL")
    name = unquote(parts.path.lstrip("/"))
    if not name or "/" in name:
        raise GuideError(f"--database {url!r}: name one database (postgres://.../NAME)")
    host = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    values = {
        "PGHOST": host,
        "PGPORT": str(parts.port or ""),
        "PGUSER": unquote(parts.username or ""),
        "PGPASSWORD": unquote(parts.password or ""),
        "PGDATABASE": name,
    }
    return Database("postgresql", {k: v for k, v in values.items() if v}, name)


def applies(step: Step, major: int, database: Database) -> bool:
    """Whether an ``append ... if CONDITION`` step is part of this run's variant."""
    if step.django and not (major < 6 if step.django == "<6" else major >= 6):
        return False
    return not step.database or step.database == database.vendor


def admin(action: str, database: Database, python: str, env: dict[str, str]) -> None:
    """Create or drop the --database database (a PostgreSQL variant only)."""
    if database.vendor != "postgresql":
        return
    print(f"quickstart: {action} database {database.name!r}", flush=True)
    done = subprocess.run(
        [python, "-c", ADMIN_SQL, action, database.name],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        _fail(f"could not {action} the database {database.name!r}", done.stdout + done.stderr)


def follow(steps: list[Step], python: str, workdir: Path, database: Database | None = None) -> None:
    """Do the steps in ``workdir``; raise SystemExit(1) on the first that fails."""
    database = database or Database("sqlite", {})
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(database.env)
    major = int(
        subprocess.run(
            [python, "-c", "import django; print(django.VERSION[0])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    print(
        f"quickstart: Django {major} ({python}) in {workdir}, database: {database.vendor}",
        flush=True,
    )
    started: list[tuple[subprocess.Popen[bytes], Path, str]] = []
    python_blocks: list[dict[str, object]] = []
    admin("create", database, python, env)
    try:
        for step in steps:
            if python_blocks and step.kind not in ("python", "skip"):
                raise GuideError(
                    f"line {step.line}: a {step.kind} step after a python block (they run in "
                    "one shell session at the end)"
                )
            if step.kind == "run":
                for line in step.code.splitlines():
                    argv = command(line, python)
                    if not argv:
                        continue
                    print(f"quickstart: $ {line.strip()}", flush=True)
                    done = subprocess.run(
                        argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=300
                    )
                    if done.returncode != 0:
                        output = done.stdout + done.stderr
                        _fail(f"{line.strip()!r} exited {done.returncode}", output)
            elif step.kind == "start":
                line = step.code.strip()
                log = workdir / f"started-{len(started)}.log"
                print(f"quickstart: $ {line} &  (output: {log})", flush=True)
                with log.open("wb") as out:
                    process = subprocess.Popen(
                        command(line, python),
                        cwd=workdir,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                started.append((process, log, line))
            elif step.kind in ("append", "write"):
                if not applies(step, major, database):
                    continue
                assert step.path is not None
                target = workdir / step.path
                print(f"quickstart: {step.kind} {step.path}", flush=True)
                if step.kind == "write":
                    target.write_text(step.code)
                else:
                    with target.open("a") as file:
                        file.write("\n" + step.code)
            elif step.kind == "python":
                seconds = UNTIL_SECONDS if step.until else 0
                python_blocks.append(
                    {"code": step.code, "line": step.line, "until": step.until, "seconds": seconds}
                )
        if python_blocks:
            _shell(python_blocks, python, workdir, env, database.vendor)
        for process, log, line in started:
            if process.poll() is not None:
                _fail(f"{line!r} exited early ({process.returncode})", log.read_text())
    finally:
        try:
            for process, log, line in started:
                _stop(process, log, line)
        finally:
            admin("drop", database, python, env)


def _shell(
    blocks: list[dict[str, object]], python: str, workdir: Path, env: dict[str, str], vendor: str
) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=workdir, delete=False) as file:
        json.dump(blocks, file)
    driver = f"BLOCKS_FILE = {file.name!r}\n{DRIVER}"
    print(f"quickstart: $ python manage.py shell  ({len(blocks)} python blocks)", flush=True)
    timeout = 120 + sum(int(str(b["seconds"])) for b in blocks)
    done = subprocess.run(
        [python, "manage.py", "shell", "-c", driver],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        _fail(f"the python blocks failed (exit {done.returncode})", done.stdout + done.stderr)
    if f"(database: {vendor})" not in done.stdout:
        _fail(f"the project did not use the {vendor} database of this run", done.stdout)


def _stop(process: subprocess.Popen[bytes], log: Path, line: str) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            _fail(f"{line!r} did not stop within {STOP_SECONDS} s of SIGTERM", log.read_text())
    output = log.read_text(errors="replace")
    print(f"quickstart: {line!r} exited {process.returncode}; its output:\n{output}", flush=True)
    if process.returncode != 0:
        _fail(f"{line!r} exited {process.returncode} after SIGTERM", output)


def _fail(what: str, output: str) -> None:
    print(f"quickstart: FAILED: {what}\n{output}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--python", required=True, help="interpreter with django-leasejobs")
    parser.add_argument("--workdir", required=True, type=Path, help="a new or empty directory")
    parser.add_argument("--guide", type=Path, default=GUIDE, help="default: docs/quickstart.md")
    parser.add_argument(
        "--database",
        default="sqlite",
        help="sqlite (default: startproject's file) or postgres://USER@HOST:PORT/NAME: the "
        "guide's PostgreSQL variant in a database NAME created and dropped for the run",
    )
    args = parser.parse_args(argv)
    try:
        database = database_from_url(args.database)
    except GuideError as exc:
        parser.error(str(exc))
    args.workdir.mkdir(parents=True, exist_ok=True)
    if any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty")
    try:
        # A relative interpreter path would not survive the commands' working directory.
        python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
        follow(parse(args.guide.read_text()), python, args.workdir.resolve(), database)
    except GuideError as exc:
        print(f"quickstart: {args.guide}: {exc}", file=sys.stderr)
        return 1
    print("quickstart: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
