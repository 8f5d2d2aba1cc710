"""The chaos soak's verdict follows the worker's rules (bench/chaossite/verdict.py)."""

from __future__ import annotations

from django_leasejobs.worker import lease_length
from tests.bench.scripts import BENCH_DIR, load_file


def test_an_outcome_counts_in_flight_for_the_longest_lease_a_worker_may_ask_for() -> None:
    verdict = load_file(BENCH_DIR / "chaossite" / "verdict.py", "bench_chaos_verdict")
    assert verdict.MAX_STRETCH == lease_length.MAX_STRETCH
    ended = verdict.Execution(job=1, attempt=1, worker="w", pid=1, start=10.0, end=12.0)
    assert verdict.in_flight_until(ended, 3.0) == 12.0 + lease_length.MAX_STRETCH * 3.0
