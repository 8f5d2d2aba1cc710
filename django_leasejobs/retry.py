"""Retry backoff policy: exponential with a cap and symmetric jitter."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BACKOFF_KEYS = frozenset({"base", "factor", "cap", "jitter"})


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``n`` (1-based) is ``min(cap, base * factor ** (n - 1))`` ± jitter."""

    base: float = 2.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        problems = backoff_problems(
            {"base": self.base, "factor": self.factor, "cap": self.cap, "jitter": self.jitter}
        )
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_value(cls, value: Backoff | Mapping[str, Any] | None) -> Backoff:
        if value is None:
            return cls()
        if isinstance(value, Backoff):
            return value
        return cls(**{str(k): float(v) for k, v in value.items()})

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * self.factor**exponent
        except OverflowError:
            raw = self.cap
        raw = min(raw, self.cap)
        if self.jitter:
            spread = raw * self.jitter
            raw += (rng or random).uniform(-spread, spread)
        return max(raw, 0.0)


def backoff_problems(value: Any) -> list[str]:
    """Human-readable problems with a RETRY_BACKOFF value (empty when valid)."""
    if isinstance(value, Backoff):
        return []
    if not isinstance(value, Mapping):
        return [f"must be a dict with keys {sorted(BACKOFF_KEYS)}, got {type(value).__name__}"]
    problems = []
    unknown = set(value) - BACKOFF_KEYS
    if unknown:
        problems.append(f"unknown keys {sorted(map(str, unknown))}")
    for key in sorted(BACKOFF_KEYS & set(value)):
        v = value[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            problems.append(f"{key} must be a finite number, got {v!r}")
        elif key == "jitter" and not 0 <= v < 1:
            problems.append(f"jitter must be in [0, 1), got {v!r}")
        elif key == "factor" and v < 1:
            problems.append(f"factor must be >= 1, got {v!r}")
        elif key in ("base", "cap") and v < 0:
            problems.append(f"{key} must be >= 0, got {v!r}")
    return problems
