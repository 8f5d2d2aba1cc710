"""The one way the tests wait for something: poll a condition with a deadline.

Tests never sleep a fixed time and hope (docs/development.md): they poll what they wait
for, and fail with what they waited for when it does not come in time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "",
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail with an
    ``AssertionError`` after ``timeout`` seconds.

    ``condition`` may raise to end the wait at once (a state that can no longer come).
    ``what`` names what is awaited in the failure's message: a string, or a function called
    at the time-out, to say what the state was then.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {described or condition}")
        time.sleep(interval)
