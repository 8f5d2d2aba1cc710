"""One evaluation pass in this process: what it delivers, logs and tolerates."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from django_leasejobs.alerts import Alert
from django_leasejobs.alerts.evaluation import run_pass
from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.models import Job, JobRollup, JobStatus
from django_leasejobs.signals import alert_fired, alert_resolved
from tests.alerts.helpers import jobs

pytestmark = pytest.mark.django_db

RULES = [
    {"name": "dead", "kind": "dead_letters", "queue": "default", "threshold": 2, "window": 600},
    {"name": "backlog", "kind": "backlog", "threshold": 3},
]


def backend(rules: list[dict[str, Any]]) -> LeaseJobsBackend:
    params = {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend", "OPTIONS": {"ALERTS": rules}}
    made = LeaseJobsBackend("default", params)
    assert made.problems == []
    return made


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def fired(sender: type, **kwargs: Any) -> None:
        seen.append(("fired", kwargs))

    def resolved(sender: type, **kwargs: Any) -> None:
        seen.append(("resolved", kwargs))

    alert_fired.connect(fired)
    alert_resolved.connect(resolved)
    yield seen
    alert_fired.disconnect(fired)
    alert_resolved.disconnect(resolved)


def test_a_pass_fires_once_and_resolves_once(
    received: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    lj = backend(RULES)
    assert run_pass(lj, worker_id="w1").delivered == ()
    assert received == []

    jobs(2, JobStatus.DEAD, finished_ago=5)
    with caplog.at_level(logging.INFO, logger="django_leasejobs"):
        [alert] = run_pass(lj, worker_id="w1").delivered
        assert run_pass(lj, worker_id="w2").delivered == ()  # the same interval

    assert (alert.rule, alert.kind, alert.state, alert.value, alert.threshold) == (
        "dead",
        "dead_letters",
        "firing",
        2,
        2,
    )
    assert (alert.queue, alert.task, alert.backend, alert.interval) == (
        "default",
        None,
        "default",
        3600,
    )
    assert alert.message == (
        "2 jobs of queue 'default' became dead letters in the last 10 min (threshold 2)"
    )
    [(kind, kwargs)] = received
    assert kind == "fired"
    assert kwargs["alert"] == alert
    assert (kwargs["backend"], kwargs["worker_id"]) == ("default", "w1")
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.name == "django_leasejobs"
    assert record.getMessage() == f"alert dead: {alert.message}"
    extra = {key: getattr(record, key) for key in ("alert", "alert_kind", "alert_state", "value")}
    assert extra == {
        "alert": "dead",
        "alert_kind": "dead_letters",
        "alert_state": "firing",
        "value": 2,
    }
    assert (record.queue, record.task, record.worker) == ("default", None, "w1")  # type: ignore[attr-defined]
    assert record.fired_at == alert.fired_at.isoformat()  # type: ignore[attr-defined]

    # The condition clears: the window moves past the dead letters (their jobs and the
    # rollup's counts of them gone).
    Job.objects.filter(status=JobStatus.DEAD).delete()
    JobRollup.objects.all().delete()
    [resolved] = run_pass(lj, worker_id="w2").delivered
    assert run_pass(lj, worker_id="w1").delivered == ()
    assert (resolved.state, resolved.value, resolved.fired_at) == ("resolved", 0, alert.fired_at)
    assert resolved.resolved_at is not None and resolved.resolved_at >= alert.fired_at
    assert [kind for kind, _ in received] == ["fired", "resolved"]


def test_a_receiver_that_raises_is_logged_and_stops_nothing(
    received: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: type, alert: Alert, **kwargs: Any) -> None:
        raise RuntimeError(f"mail server down for {alert.rule}")

    alert_fired.connect(broken)
    try:
        jobs(2, JobStatus.DEAD, finished_ago=5)
        jobs(3, JobStatus.PENDING, ready_ago=1)
        with caplog.at_level(logging.ERROR, logger="django_leasejobs"):
            delivered = run_pass(backend(RULES), worker_id="w1").delivered
    finally:
        alert_fired.disconnect(broken)
    assert [a.rule for a in delivered] == ["dead", "backlog"]  # the second rule still ran
    assert [kwargs["alert"].rule for _, kwargs in received] == ["dead", "backlog"]
    failures = [r for r in caplog.records if getattr(r, "receiver", None)]
    assert [r.alert for r in failures] == ["dead", "backlog"]  # type: ignore[attr-defined]
    assert "broken" in failures[0].receiver  # type: ignore[attr-defined]
    assert failures[0].exc_info is not None
    assert "mail server down for dead" in str(failures[0].exc_info[1])


def test_without_a_verdict_nothing_changes(received: list[tuple[str, dict[str, Any]]]) -> None:
    rules = [{"name": "rate", "kind": "failure_rate", "threshold": 0.5, "min_jobs": 4}]
    jobs(3, JobStatus.FAILED, finished_ago=5)
    assert run_pass(backend(rules), worker_id="w1").delivered == ()  # 3 < min_jobs
    jobs(1, JobStatus.SUCCEEDED, finished_ago=5)
    [alert] = run_pass(backend(rules), worker_id="w1").delivered
    assert alert.value == pytest.approx(0.75)
    assert alert.message == (
        "failure rate 75%: 3 of 4 jobs of every queue that finished in the last "
        "10 min failed (threshold 50%)"
    )
