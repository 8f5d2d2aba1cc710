"""OpenTelemetry tracing (issue 13, point 2): the enqueuing code's trace context is stored
on the job row (every enqueue path) and a real ``runworker`` continues it with one span per
attempt, in both pools; without the package nothing is stored and jobs run as before; a
garbage ``trace_context`` never stops a job or the worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_leasejobs import leases, tracing
from django_leasejobs.compat import task_backends
from django_leasejobs.leases import ClaimedJob, ErrorInfo
from django_leasejobs.models import FINISHED_STATUSES, Job, JobStatus
from django_leasejobs.retry import Decision, Verdict
from django_leasejobs.worker.execution import Outcome
from tests import tasks_tracing
from tests.helpers_leases import claimed_job
from tests.tasks_tracing import BATCH, HIDE_OTEL, SPANS_DIR, read_spans, span_record
from tests.waiting import wait_until
from tests.worker_harness import Workers

IMPORTS = {"IMPORTS": ["tests.tasks_tracing"]}
GARBAGE = [
    [1, 2],
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    7,
    {"traceparent": "00-not-a-trace-01"},
    {"traceparent": 5, "tracestate": None},
    {"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]},
]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    """The test's own SDK provider (not the global one: it can be set once)."""
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made


@pytest.fixture
def tracer(provider: TracerProvider) -> trace.Tracer:
    return provider.get_tracer("tests")


@pytest.fixture
def otel_absent(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if the extra were not installed: the one cached import check says so."""
    monkeypatch.setattr(tracing, "_api", lambda: None)
    yield


def enqueue_every_path() -> list[int]:
    """One job per enqueue path this database has: single and bulk, keyed (ORM) and not
    (PostgreSQL: insert_job and COPY); and an ``async def`` job."""
    backend = task_backends["default"]
    succeed = tasks_tracing.succeed
    ids = [
        int(succeed.enqueue().id),
        int(succeed.using(key="traced-key").enqueue().id),
        int(tasks_tracing.fail.enqueue().id),
        int(tasks_tracing.succeed_async.enqueue().id),
    ]
    bulk = backend.bulk_enqueue([(succeed, [], {}), (succeed, [], {})])
    keyed = backend.bulk_enqueue([(succeed, [], {}), (succeed.using(key="bulk-key"), [], {})])
    return ids + [int(result.id) for result in [*bulk, *keyed]]


def job_spans(directory: Path, count: int) -> list[dict[str, Any]]:
    def spans() -> list[dict[str, Any]]:
        found = [s for s in read_spans(directory) if s["name"].startswith("leasejobs.job ")]
        return found if len(found) >= count else []

    return list(wait_until(spans, 20, what=f"{count} job spans"))


def wait_finished(ids: list[int]) -> None:
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, status__in=FINISHED_STATUSES).count() == len(ids),
        60,
        what="every job finished",
    )


@pytest.mark.django_db
def test_enqueue_stores_the_active_span_context_on_every_path(
    tracer: trace.Tracer,
) -> None:
    with tracer.start_as_current_span("request") as span:
        ids = enqueue_every_path()
    context = span.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    for job in Job.objects.filter(pk__in=ids):
        assert job.trace_context is not None
        assert job.trace_context["traceparent"].startswith(expected)


@pytest.mark.django_db
def test_enqueue_without_an_active_span_stores_null() -> None:
    ids = enqueue_every_path()
    assert list(Job.objects.filter(pk__in=ids).values_list("trace_context", flat=True)) == [
        None
    ] * len(ids)


@pytest.mark.django_db
def test_without_opentelemetry_enqueue_stores_null(tracer: trace.Tracer, otel_absent: None) -> None:
    with tracer.start_as_current_span("request"):
        ids = enqueue_every_path()
    assert set(Job.objects.filter(pk__in=ids).values_list("trace_context", flat=True)) == {None}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_the_job_span_is_a_child_of_the_enqueueing_span(
    workers: Workers,
    tmp_path: Path,
    tracer: trace.Tracer,
    exporter: InMemorySpanExporter,
    pool: str,
) -> None:
    with tracer.start_as_current_span("request"):
        ids = enqueue_every_path()
    (request,) = [span_record(span) for span in exporter.get_finished_spans()]
    worker = workers.start(
        options=IMPORTS, args=["--pool", pool, "--concurrency", "2"], env={SPANS_DIR: str(tmp_path)}
    )
    wait_finished(ids)
    spans = {span["attributes"]["leasejobs.job_id"]: span for span in job_spans(tmp_path, len(ids))}
    assert sorted(spans) == sorted(ids)
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=ids)}
    for job_id, span in spans.items():
        job = jobs[job_id]
        assert span["name"] == f"leasejobs.job {job.task_path}"
        assert span["kind"] == "CONSUMER"
        assert span["trace_id"] == request["trace_id"]
        assert span["parent_span_id"] == request["span_id"]
        failed = job.status == JobStatus.FAILED
        assert span["attributes"] == {
            "leasejobs.job_id": job_id,
            "leasejobs.attempt": 1,
            "leasejobs.task": job.task_path,
            "leasejobs.queue": "default",
            "leasejobs.backend": "default",
            "leasejobs.outcome": "failed" if failed else "succeeded",
        }
        assert span["status"] == ("ERROR" if failed else "UNSET")
        assert span["events"] == (["exception"] if failed else [])
    assert sum(job.status == JobStatus.FAILED for job in jobs.values()) == 1
    if pool == "process":  # the spans came from the slots' own (forked) processes
        assert {span["pid"] for span in spans.values()} - {worker.pid}
    worker.terminate()
    assert worker.wait(timeout=30) == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_batch_processor_made_before_the_fork_exports_from_the_children_at_stop(
    workers: Workers, tmp_path: Path, tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    """The SDK's at-fork hook restarts the processor's thread in each slot child; the
    child flushes it before its ``os._exit`` when the worker stops."""
    with tracer.start_as_current_span("request"):
        ids = [int(tasks_tracing.succeed.enqueue().id) for _ in range(4)]
    (request,) = exporter.get_finished_spans()
    worker = workers.start(
        options=IMPORTS,
        args=["--pool", "process", "--concurrency", "2"],
        env={SPANS_DIR: str(tmp_path), BATCH: "1"},
    )
    wait_finished(ids)
    # The processor exports every 600 s: spans arrive now only through the children's
    # flush when the worker stops them.
    worker.terminate()
    assert worker.wait(timeout=30) == 0
    spans = read_spans(tmp_path)
    assert sorted(span["attributes"]["leasejobs.job_id"] for span in spans) == sorted(ids)
    assert {span["trace_id"] for span in spans} == {request.context.trace_id}
    assert worker.pid not in {span["pid"] for span in spans}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_garbage_trace_context_never_stops_a_job_or_the_worker(
    workers: Workers, tmp_path: Path, pool: str
) -> None:
    ids = [int(tasks_tracing.succeed.enqueue().id) for _ in GARBAGE]
    for job_id, garbage in zip(ids, GARBAGE, strict=True):
        Job.objects.filter(pk=job_id).update(trace_context=garbage)
    worker = workers.start(
        options=IMPORTS, args=["--pool", pool, "--concurrency", "2"], env={SPANS_DIR: str(tmp_path)}
    )
    wait_finished(ids)
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    spans = job_spans(tmp_path, len(ids))
    assert {span["parent_span_id"] for span in spans} == {None}  # new traces
    after = int(tasks_tracing.succeed.enqueue().id)
    wait_finished([after])
    assert Job.objects.get(pk=after).status == JobStatus.SUCCEEDED
    worker.terminate()
    assert worker.wait(timeout=30) == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_without_opentelemetry_the_worker_runs_jobs(
    workers: Workers, tmp_path: Path, tracer: trace.Tracer, pool: str
) -> None:
    with tracer.start_as_current_span("request"):
        ids = enqueue_every_path()
    worker = workers.start(
        options=IMPORTS,
        args=["--pool", pool, "--concurrency", "2"],
        env={HIDE_OTEL: "1", SPANS_DIR: str(tmp_path)},
    )
    wait_finished(ids)
    statuses = sorted(Job.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == sorted([JobStatus.FAILED] + [JobStatus.SUCCEEDED] * (len(ids) - 1))
    assert read_spans(tmp_path) == []
    worker.terminate()
    assert worker.wait(timeout=30) == 0


def claimed(trace_context: Any) -> ClaimedJob:
    return claimed_job(
        task_path="tests.tasks_tracing.succeed", max_attempts=1, trace_context=trace_context
    )


@pytest.mark.parametrize("garbage", GARBAGE, ids=repr)
def test_traced_starts_a_new_trace_for_a_garbage_context(
    monkeypatch: pytest.MonkeyPatch,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    garbage: Any,
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    outcome = Outcome((1, 1), ok=True)
    assert tracing.traced(claimed(garbage), "default", lambda: outcome) is outcome
    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert span.attributes is not None
    assert span.attributes["leasejobs.outcome"] == "succeeded"


def test_a_snoozed_attempt_is_not_an_error(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    snoozed = Outcome(
        (1, 1), ok=False, error=ErrorInfo("x.Retry"), verdict=Verdict(Decision.SNOOZE)
    )
    tracing.traced(claimed(None), "default", lambda: snoozed)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["leasejobs.outcome"] == "snoozed"
    assert span.status.status_code.name == "UNSET"
    assert not span.events


def test_the_claim_returns_the_stored_context(db: None) -> None:
    job = tasks_tracing.succeed.enqueue()
    Job.objects.filter(pk=job.id).update(trace_context={"traceparent": "x"})
    (found,) = leases.claim("w", limit=1, lease_duration=30)
    assert found.trace_context == {"traceparent": "x"}


class BrokenProcessor(SimpleSpanProcessor):
    """A span processor of a broken SDK setup: it raises when a span starts or ends."""

    def __init__(self, when: str) -> None:
        super().__init__(InMemorySpanExporter())
        self.when = when

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.when == "start":
            raise RuntimeError("broken on_start")

    def on_end(self, span: Any) -> None:
        if self.when == "end":
            raise RuntimeError("broken on_end")


@pytest.mark.parametrize("when", ["start", "end"])
def test_a_broken_tracer_setup_never_costs_the_attempt(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(BrokenProcessor(when))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    ran: list[bool] = []
    outcome = Outcome((1, 1), ok=True)

    def run() -> Outcome:
        ran.append(True)
        return outcome

    assert tracing.traced(claimed(None), "default", run) is outcome
    assert ran == [True]  # run once, span or not


def test_a_broken_propagator_never_costs_the_enqueue(
    monkeypatch: pytest.MonkeyPatch, tracer: trace.Tracer
) -> None:
    def broken_inject(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("broken propagator")

    monkeypatch.setattr(propagate, "inject", broken_inject)
    with tracer.start_as_current_span("request"):
        assert tracing.current_context() is None


def test_no_span_without_a_tracer_provider_set_up(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """With the API installed but no SDK set up (the API's proxy provider, or its no-op
    one), an attempt gets no span: nothing would record it, and its making would cost
    every job. A provider set up later is used from the next attempt on."""
    outcome = Outcome((1, 1), ok=True)
    for nothing in (trace.ProxyTracerProvider(), trace.NoOpTracerProvider()):
        monkeypatch.setattr(trace, "get_tracer_provider", lambda nothing=nothing: nothing)
        assert tracing._JobSpan.start(claimed(None), "default") is None
        assert tracing.traced(claimed(None), "default", lambda: outcome) is outcome
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    assert tracing.traced(claimed(None), "default", lambda: outcome) is outcome
    assert len(exporter.get_finished_spans()) == 1
