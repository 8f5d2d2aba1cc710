"""docs/quickstart.md is a tested document: tests/quickstart.py follows it in a brand-new
`startproject` site (its own SQLite database, or with --database the guide's PostgreSQL
variant in a database of its own), starts `runworker`, and waits for the guide's job to
succeed. CI runs this on every Django line it tests; its packaging step runs the same
script against the built wheel, with SQLite and with PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connections

from tests.quickstart import GUIDE, Database, GuideError, Step, applies, database_from_url, parse

QUICKSTART = Path(__file__).parents[1] / "quickstart.py"


def test_every_block_of_the_guide_carries_a_directive_the_script_can_do() -> None:
    steps = parse(GUIDE.read_text())
    kinds = [step.kind for step in steps]
    # The user's path: create, configure, migrate, declare, start a worker, enqueue, wait.
    for kind in ("run", "append", "write", "start", "python"):
        assert kind in kinds, f"the guide has no {kind} step: {kinds}"
    assert kinds.index("start") < kinds.index("python"), "the worker must start before enqueueing"
    waits = [step for step in steps if step.until]
    assert waits, "no python block waits for the job's result"
    assert "runworker" in next(step.code for step in steps if step.kind == "start")


def test_the_guide_has_a_sqlite_and_a_postgresql_variant() -> None:
    """Each variant configures its own database, and only its own engine's OPTIONS."""
    steps = parse(GUIDE.read_text())
    by_database = {
        vendor: [s for s in steps if s.database == vendor] for vendor in ("sqlite", "postgresql")
    }
    [sqlite] = by_database["sqlite"]
    [postgresql] = by_database["postgresql"]
    assert '"transaction_mode"' in sqlite.code
    assert '"django.db.backends.postgresql"' in postgresql.code
    for key in ("transaction_mode", "init_command", "timeout", "OPTIONS"):
        assert key not in postgresql.code, key
    # Every other settings block is common to both (or to one Django line).
    common = [s for s in steps if s.kind == "append" and s.database is None]
    assert all("DATABASES" not in s.code for s in common)
    for vendor in ("sqlite", "postgresql"):
        ran = [s for s in steps if applies(s, 6, Database(vendor, {}))]
        assert [s for s in ran if s.database] == by_database[vendor]


@pytest.mark.parametrize(
    ("guide", "problem"),
    [
        ("text\n\n```bash\nls\n```\n", "line 3: a code block without"),
        ("<!-- quickstart: run -->\n\n```bash\nls\n```\n", "line 3: a code block without"),
        ("<!-- quickstart: launch -->\n```bash\nls\n```\n", "cannot do the directive 'launch'"),
        ("<!-- quickstart: write a.py if django<6 -->\n```python\n```\n", "cannot do"),
        ("<!-- quickstart: append a.py if database=mysql -->\n```python\n```\n", "cannot do"),
        ("<!-- quickstart: append a.py if django<5 -->\n```python\n```\n", "cannot do"),
        ("<!-- quickstart: skip -->\n```bash\nls\n```\n", "cannot do the directive 'skip'"),
        ("<!-- quickstart: run -->\n```bash\nls\n", "never closed"),
        ("* a list item:\n\n  ```bash\n  ls\n  ```\n", "line 3: a code block without"),
        ("~~~python\nprint()\n~~~\n", "line 1: a code block without"),
        ("<!-- quickstart: run -->\ntext\n```bash\nls\n```\n", "line 1: a directive not followed"),
        ("text\n<!-- quickstart: run -->\n", "line 2: a directive not followed"),
    ],
)
def test_a_block_the_script_would_not_run_is_refused(guide: str, problem: str) -> None:
    with pytest.raises(GuideError, match=problem.replace("(", r"\(")):
        parse(guide)


def test_directives_are_read_with_their_arguments() -> None:
    guide = (
        "<!-- quickstart: append mysite/settings.py if django<6 -->\n```python\nX = 1\n```\n"
        '<!-- quickstart: python until "done 5" -->\n```python\nprint("done", 5)\n```\n'
        "<!-- quickstart: skip (a crontab line) -->\n```cron\n* * * * * true\n```\n"
        "<!-- quickstart: append mysite/settings.py if database=postgresql -->\n"
        "```python\nY = 2\n```\n"
    )
    assert parse(guide) == [
        Step("append", "X = 1\n", 1, path="mysite/settings.py", django="<6"),
        Step("python", 'print("done", 5)\n', 5, until="done 5"),
        Step("skip", "* * * * * true\n", 9),
        Step("append", "Y = 2\n", 13, path="mysite/settings.py", database="postgresql"),
    ]


def test_the_database_option() -> None:
    assert database_from_url(None) == database_from_url("sqlite") == Database("sqlite", {})
    assert database_from_url("postgres://ada:s%40cret@db.example:6543/qs_1") == Database(
        "postgresql",
        {
            "PGHOST": "db.example",
            "PGPORT": "6543",
            "PGUSER": "ada",
            "PGPASSWORD": "s@cret",
            "PGDATABASE": "qs_1",
        },
        "qs_1",
    )
    socket = database_from_url("postgresql://postgres@:5433/qs?host=/run/pg")
    assert socket.env == {
        "PGHOST": "/run/pg",
        "PGPORT": "5433",
        "PGUSER": "postgres",
        "PGDATABASE": "qs",
    }
    for bad in ("mysql://root@h/x", "postgres://h:5432/", "postgres://h/a/b"):
        with pytest.raises(GuideError):
            database_from_url(bad)


def _quickstart(site: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(QUICKSTART),
            "--python",
            sys.executable,
            "--workdir",
            str(site),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_quickstart_runs_as_written_in_a_new_project(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = _quickstart(site)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "quickstart: OK" in done.stdout
    # The project has no LOGGING: runworker still says what it is doing, by default.
    assert "started: backend=default queues=default,emails" in done.stdout, output
    assert "job 1 attempt 1 succeeded" in done.stdout, output
    assert "stopped after" in done.stdout, output
    assert (site / "myapp" / "tasks.py").exists()


@pytest.mark.slow
def test_the_postgresql_variant_runs_as_written(tmp_path: Path) -> None:
    """The same guide with its PostgreSQL settings, on the test run's PostgreSQL server, in
    a database created and dropped for it."""
    server = connections["default"].settings_dict
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs the test run's PostgreSQL server")
    name = f"leasejobs_quickstart_{os.getpid()}"
    host = str(server.get("HOST") or "")
    user, port = quote(str(server.get("USER") or ""), safe=""), server.get("PORT") or ""
    password = f":{quote(str(server['PASSWORD']), safe='')}" if server.get("PASSWORD") else ""
    if host.startswith("/"):  # the embedded server: a Unix socket
        url = f"postgres://{user}{password}@:{port}/{name}?host={host}"
    else:
        url = f"postgres://{user}{password}@{host}:{port}/{name}"
    done = _quickstart(tmp_path / "site", "--database", url)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "every python block ran (database: postgresql)" in done.stdout, output
    assert "listening for new jobs" in done.stdout, output  # LISTEN: PostgreSQL only
    assert "job 1 attempt 1 succeeded" in done.stdout, output
    assert f"drop database {name!r}" in done.stdout, output
    settings = (tmp_path / "site" / "mysite" / "settings.py").read_text()
    assert "transaction_mode" not in settings
