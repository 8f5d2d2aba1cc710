"""CI's time budget (scripts/ci.py, ``run_pipeline``): a pipeline runs its core steps,
then each of its "-more" steps only when it is predicted to end, with the packaging after
it, within ``CI_BUDGET_MIN``; the prediction scales the step's reference minutes by how
long the core took against its own reference."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ci.py"


@pytest.fixture
def ci() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("leasejobs_ci_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


class Clock:
    """The wall clock the pipeline reads; each fake step moves it on."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


def pipeline(
    ci: ModuleType, monkeypatch: pytest.MonkeyPatch, minutes: dict[str, float], budget: float
) -> tuple[list[str], list[str]]:
    """Run a fake pipeline: core ``a``, ``b``; more ``c``, ``d``, ``e``; packaging ``p``
    (reference: one minute each). ``minutes``: how long each step really takes. Returns
    the steps that ran and the summary's lines."""
    clock = Clock()
    ran: list[str] = []

    def fake(name: str) -> object:
        def action(ctx: object) -> int:
            ran.append(name)
            clock.now += 60 * minutes[name]
            return 0

        return action

    names = ["a", "b", "c", "d", "e", "p"]
    steps = {n: ci.Step(n, lambda ctx, n=n: f"step {n}", fake(n)) for n in names}
    monkeypatch.setattr(ci, "STEPS", steps)
    monkeypatch.setattr(ci, "REFERENCE_MINUTES", dict.fromkeys(names, 1.0))
    monkeypatch.setattr(
        ci, "GROUPS", {"lane": ["a", "b"], "lane-more": ["c", "d", "e"], "packaging": ["p"]}
    )
    monkeypatch.setattr(ci, "BUDGET_MINUTES", budget)
    monkeypatch.setattr(ci.time, "time", clock.time)
    monkeypatch.setattr(ci, "header", lambda title: None)
    results = ci.Results()
    ci.run_pipeline(ci.Context(work=Path("/nonexistent")), results, "lane", clock.now)
    return ran, results.lines


def test_at_the_reference_pace_every_step_that_fits_runs(
    ci: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = dict.fromkeys("abcde", 1.0)
    ran, lines = pipeline(ci, monkeypatch, minutes, budget=6)  # 5 steps + 1 of packaging
    assert ran == ["a", "b", "c", "d", "e"]
    assert not any(line.startswith("SKIP") for line in lines)


def test_a_slow_machine_runs_the_core_and_what_fits_at_its_pace(
    ci: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The core took 3x its reference: each more step is predicted at 3 minutes, packaging
    # at 3. After the core (6 min) a budget of 14 leaves room for one step (6 + 3 + 3 <= 14).
    minutes = {"a": 3.0, "b": 3.0, "c": 3.0, "d": 3.0, "e": 3.0}
    ran, lines = pipeline(ci, monkeypatch, minutes, budget=14)
    assert ran == ["a", "b", "c"]
    skipped = [line for line in lines if line.startswith("SKIP")]
    assert [line.split("  ")[2].split(" (")[0] for line in skipped] == ["step d", "step e"]
    assert "3.0x the reference time" in skipped[0]
    assert "CI_BUDGET_MIN=14" in skipped[0]


def test_a_step_that_fits_runs_after_one_that_did_not(
    ci: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = dict.fromkeys("abcde", 1.0)

    real_pipeline = ci.run_pipeline

    def with_a_long_d(*args: object, **kwargs: object) -> None:
        ci.REFERENCE_MINUTES["d"] = 10.0  # predicted past the budget; e still fits
        real_pipeline(*args, **kwargs)

    monkeypatch.setattr(ci, "run_pipeline", with_a_long_d)
    ran, lines = pipeline(ci, monkeypatch, minutes, budget=7)
    assert ran == ["a", "b", "c", "e"]
    assert [line[:4] for line in lines] == ["PASS", "PASS", "PASS", "SKIP", "PASS"]


def test_no_budget_runs_every_step(ci: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    minutes = dict.fromkeys("abcde", 5.0)
    ran, _ = pipeline(ci, monkeypatch, minutes, budget=0)
    assert ran == ["a", "b", "c", "d", "e"]
