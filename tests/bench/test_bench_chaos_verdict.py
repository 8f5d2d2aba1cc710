"""The chaos soak's verdict follows the worker's rules (bench/chaossite/verdict.py)."""

from __future__ import annotations

import importlib.util
import sys

from django_leasejobs.worker import lease_length
from tests.bench.scripts import BENCH_DIR


def test_an_outcome_counts_in_flight_for_the_longest_lease_a_worker_may_ask_for() -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_chaos_verdict", BENCH_DIR / "chaossite" / "verdict.py"
    )
    assert spec is not None and spec.loader is not None
    verdict = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = verdict  # dataclasses look their module up while decorating
    spec.loader.exec_module(verdict)
    assert verdict.MAX_STRETCH == lease_length.MAX_STRETCH
    ended = verdict.Execution(job=1, attempt=1, worker="w", pid=1, start=10.0, end=12.0)
    assert verdict.in_flight_until(ended, 3.0) == 12.0 + lease_length.MAX_STRETCH * 3.0
