"""docs/quickstart.md is a tested document: tests/quickstart.py follows it in a brand-new
`startproject` site (its own SQLite database), starts `runworker`, and waits for the
guide's job to succeed. CI runs this on every Django line it tests; its packaging step
runs the same script against the built wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.quickstart import GUIDE, GuideError, Step, parse


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


@pytest.mark.parametrize(
    ("guide", "problem"),
    [
        ("text\n\n```bash\nls\n```\n", "line 3: a code block without"),
        ("<!-- quickstart: run -->\n\n```bash\nls\n```\n", "line 3: a code block without"),
        ("<!-- quickstart: launch -->\n```bash\nls\n```\n", "cannot do the directive 'launch'"),
        ("<!-- quickstart: write a.py if django<6 -->\n```python\n```\n", "cannot do"),
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
    )
    assert parse(guide) == [
        Step("append", "X = 1\n", 1, path="mysite/settings.py", django="<6"),
        Step("python", 'print("done", 5)\n', 5, until="done 5"),
        Step("skip", "* * * * * true\n", 9),
    ]


@pytest.mark.slow
def test_the_quickstart_runs_as_written_in_a_new_project(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "quickstart.py"),
            "--python",
            sys.executable,
            "--workdir",
            str(site),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "quickstart: OK" in done.stdout
    # The project has no LOGGING: runworker still says what it is doing, by default.
    assert "started: backend=default queues=default,emails" in done.stdout, output
    assert "job 1 attempt 1 succeeded" in done.stdout, output
    assert "stopped after" in done.stdout, output
    assert (site / "myapp" / "tasks.py").exists()
