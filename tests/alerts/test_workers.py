"""Three real ``runworker`` processes evaluating the same rules: each alert delivered once.

The workers serve the queues ``default`` and ``high``; the rules watch those and the
queue ``low``, which none of them serves (its jobs stay ready, and no worker is online
for it). Deliveries are seen through each worker's events file (``tests/worker_events.py``:
``alert_fired``, ``alert_resolved``, and ``alerts_evaluated`` after every pass), so the
tests wait for passes that came after an alert, never for time.
"""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Any

import pytest

from django_leasejobs.models import AlertState, AlertStatus, Job, JobRollup, JobStatus
from tests import waiting
from tests.alert_receivers import RAISES_ENV
from tests.alerts.helpers import jobs
from tests.worker_harness import WorkerProcess, Workers

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = ["--queues", "default,high", "--pool", "thread", "--concurrency", "1"]
EVERY_KIND = [
    {"name": "failures", "kind": "failure_rate", "queue": "default", "threshold": 0.5,
     "min_jobs": 4, "window": 600},
    {"name": "dead", "kind": "dead_letters", "queue": "high", "threshold": 1, "window": 600},
    {"name": "backlog", "kind": "backlog", "queue": "low", "threshold": 3},
    {"name": "waits", "kind": "oldest_ready", "queue": "low", "threshold": 60},
    {"name": "nobody-on-low", "kind": "no_worker", "queue": "low"},
]  # fmt: skip


def start_three(workers: Workers, rules: list[dict[str, Any]], **env: str) -> list[WorkerProcess]:
    options = {"ALERTS": rules, "ALERT_CHECK_INTERVAL": 0.1}
    return [workers.start(options=options, args=ARGS, env=env) for _ in range(3)]


def alerts(started: list[WorkerProcess], event: str) -> list[dict[str, Any]]:
    """The alerts of every worker's ``event`` events, by fired_at."""
    found = [e["alert"] for w in started for e in w.events(event)]
    return sorted(found, key=lambda a: str(a["fired_at"]))


def more_passes(started: list[WorkerProcess], count: int = 3) -> None:
    """Wait until each worker ended ``count`` more alert passes than it has so far."""
    for worker in started:
        seen = len(worker.events("alerts_evaluated"))
        worker.wait_for_event("alerts_evaluated", count=seen + count)


def test_each_rule_kind_fires_once_across_three_workers(workers: Workers) -> None:
    jobs(3, JobStatus.FAILED, finished_ago=5)
    jobs(1, JobStatus.SUCCEEDED, finished_ago=5)
    jobs(1, JobStatus.DEAD, queue="high", finished_ago=5)
    jobs(2, JobStatus.PENDING, queue="low", ready_ago=1)
    jobs(1, JobStatus.PENDING, queue="low", ready_ago=600)
    # Every worker's receiver of alert_fired raises (a webhook down): logged, nothing stops.
    started = start_three(workers, EVERY_KIND, **{RAISES_ENV: "1"})

    names = {rule["name"] for rule in EVERY_KIND}
    waiting.wait_until(
        lambda: {a["rule"] for a in alerts(started, "alert_fired")} == names,
        what=lambda: f"one alert per rule; fired so far: {alerts(started, 'alert_fired')}",
    )
    more_passes(started)  # every worker evaluated every rule again, three times

    fired = alerts(started, "alert_fired")
    assert sorted(a["rule"] for a in fired) == sorted(names)  # once each, across the three
    by_rule = {a["rule"]: a for a in fired}
    assert by_rule["failures"]["value"] == pytest.approx(0.75)
    assert by_rule["dead"]["value"] == 1
    assert by_rule["backlog"]["value"] == 3
    assert 600 <= by_rule["waits"]["value"] < 700
    assert by_rule["nobody-on-low"]["value"] == 0
    assert all(a["state"] == "firing" and a["backend"] == "default" for a in fired)
    assert by_rule["nobody-on-low"]["message"] == "no worker online serves queue 'low'"
    rows = AlertState.objects.filter(state=AlertStatus.FIRING)
    assert sorted(rows.values_list("name", flat=True)) == sorted(names)
    assert all(w.popen.poll() is None for w in started)  # the raising receivers stopped none
    output = "\n".join(w.output for w in started)
    for name in names:
        assert f"alert {name}: receiver broken_webhook raised RuntimeError" in output
    assert alerts(started, "alert_resolved") == []


def test_one_alert_per_interval_then_one_resolve(workers: Workers) -> None:
    jobs(1, JobStatus.DEAD, queue="high", finished_ago=1)
    interval = 1.5
    rules = [{"name": "dead", "kind": "dead_letters", "threshold": 1, "interval": interval}]
    started = start_three(workers, rules)

    def three_fired() -> list[dict[str, Any]] | None:
        found = alerts(started, "alert_fired")
        return found if len(found) >= 3 else None

    fired = waiting.wait_until(
        three_fired,
        what=lambda: f"three alerts; fired so far: {alerts(started, 'alert_fired')}",
    )
    times = [datetime.fromisoformat(a["fired_at"]) for a in fired]
    gaps = [(later - earlier).total_seconds() for earlier, later in pairwise(times)]
    assert all(gap >= interval for gap in gaps), gaps  # never two within one interval

    # The condition clears: the window moves past the dead letters (their jobs and the
    # rollup's counts of them gone).
    Job.objects.filter(status=JobStatus.DEAD).delete()
    JobRollup.objects.all().delete()
    waiting.wait_until(lambda: alerts(started, "alert_resolved"), what="a resolve")
    more_passes(started)
    [resolved] = alerts(started, "alert_resolved")
    assert resolved["state"] == "resolved" and resolved["value"] == 0
    assert AlertState.objects.get(name="dead").state == AlertStatus.RESOLVED
