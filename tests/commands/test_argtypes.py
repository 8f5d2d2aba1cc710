"""``management/argtypes.py``, the commands' argparse validators: importable before
Django is set up (a bench script parses its options with them first), and as before."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from django_leasejobs.management import argtypes
from tests.conftest import REPO_ROOT


def test_it_imports_nothing_of_django() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = (
        "import json, sys\n"
        "import django_leasejobs.management.argtypes\n"
        "print(json.dumps(sorted(name for name in sys.modules\n"
        "    if name.split('.')[0] in ('django', 'django_leasejobs'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(result.stdout) == [
        "django_leasejobs",
        "django_leasejobs.management",
        "django_leasejobs.management.argtypes",
    ]


@pytest.mark.parametrize(
    ("validator", "text", "value"),
    [
        (argtypes.positive_int, "3", 3),
        (argtypes.non_negative_int, "0", 0),
        (argtypes.positive_seconds, "0.5", 0.5),
        (argtypes.non_negative_seconds, "0", 0.0),
        (argtypes.parse_age, "90m", timedelta(minutes=90)),
        (argtypes.moment, "2w", timedelta(weeks=2)),
        (argtypes.moment, "2024-05-01", datetime(2024, 5, 1, tzinfo=UTC)),
    ],
)
def test_what_they_accept(validator: Callable[[str], object], text: str, value: object) -> None:
    assert validator(text) == value


@pytest.mark.parametrize(
    ("validator", "text", "message"),
    [
        (argtypes.positive_int, "0", "expected a whole number >= 1, got '0'"),
        (argtypes.positive_int, "x", "expected a whole number, got 'x'"),
        (argtypes.non_negative_int, "-1", "expected a whole number >= 0, got '-1'"),
        (argtypes.positive_seconds, "0", "expected seconds > 0, got '0'"),
        (argtypes.non_negative_seconds, "nan", "expected seconds >= 0, got 'nan'"),
        (argtypes.parse_age, "0d", "expected an age > 0, got '0d'"),
        (argtypes.parse_age, "7", "with a unit s, m, h, d or w"),
        (argtypes.moment, "yesterday", "expected an ISO date or time"),
    ],
)
def test_what_they_refuse(validator: Callable[[str], object], text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        validator(text)
