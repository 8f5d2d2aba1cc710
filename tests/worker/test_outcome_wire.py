"""What a slot's child and the worker send each other goes through plain pickle
(``child.PICKLE_PROTOCOL``): the values come back equal, the default verdict as the
module's own ``RETRIED``."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

from django_leasejobs.leases import ClaimedJob, ErrorInfo
from django_leasejobs.retry import RETRIED, Decision, Verdict
from django_leasejobs.worker.child import MSG_OUTCOME, PICKLE_PROTOCOL
from django_leasejobs.worker.execution import JobSpec, Outcome


def wire(value: object) -> object:
    return pickle.loads(pickle.dumps(value, PICKLE_PROTOCOL))  # noqa: S301 - our own bytes


def test_a_success_comes_back_with_the_default_verdict_itself() -> None:
    outcome = Outcome((7, 2), ok=True, result={"n": [1, 2.5, None]}, duration=0.25)
    message = wire((MSG_OUTCOME, outcome))
    assert message == (MSG_OUTCOME, outcome)
    assert message[1].verdict is RETRIED  # type: ignore[index]


def test_a_failure_keeps_its_error_and_its_own_verdict() -> None:
    for verdict in (
        Verdict(Decision.SNOOZE, "asked to wait", 30.0),
        Verdict(Decision.FAIL, "not retried"),
        Verdict(),  # equal to RETRIED, not it: sent whole, and still equal
    ):
        outcome = Outcome(
            (7, 2),
            ok=False,
            error=ErrorInfo("myapp.errors.Boom", "no", "Traceback ..."),
            verdict=verdict,
            duration=1.5,
            cancelled=True,
        )
        again = wire(outcome)
        assert again == outcome
        assert isinstance(again, Outcome) and again.verdict.decision is verdict.decision


def test_a_hand_over_batch_comes_back_equal() -> None:
    now = datetime(2026, 11, 29, 16, 30, tzinfo=UTC)
    job = ClaimedJob(
        11, 1, "tests.tasks.add", "default", 0, [1, 2], {}, 3.0, 3, None,
        enqueued_at=now, started_at=now, last_attempted_at=now,
    )  # fmt: skip
    batch = [(5, JobSpec(job, "worker-1", "default", "default", start_by=12.5, on_loop=False))]
    assert wire(batch) == batch
