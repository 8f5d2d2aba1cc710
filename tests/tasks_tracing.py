"""Tasks for tests/observability/test_tracing.py, and the worker's test-only OpenTelemetry set-up.

Loaded by the worker through OPTIONS["IMPORTS"] (tests/observability/test_tracing.py passes it), so
it runs in the worker's main process before the slots fork, where a project would
configure the SDK (its settings or an AppConfig.ready). With
``LEASEJOBS_TEST_SPANS_DIR`` set, finished spans are written as JSON lines, one file per
process (slot children included), by a ``SimpleSpanProcessor`` or, with
``LEASEJOBS_TEST_SPANS_BATCH`` set, a ``BatchSpanProcessor`` that only exports when
flushed; with ``LEASEJOBS_TEST_HIDE_OTEL`` set, opentelemetry
cannot be imported, as if the extra were not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django_leasejobs import task

SPANS_DIR = "LEASEJOBS_TEST_SPANS_DIR"
BATCH = "LEASEJOBS_TEST_SPANS_BATCH"
HIDE_OTEL = "LEASEJOBS_TEST_HIDE_OTEL"


@task()
def succeed() -> str:
    return "ok"


@task(max_attempts=1)
def fail() -> None:
    raise ValueError("fails for good")


@task()
async def succeed_async() -> str:
    """Runs on a slot's event loop (process pool): its span is current in its own task."""
    await asyncio.sleep(0)
    return "ok"


def span_record(span: Any) -> dict[str, Any]:
    """What the tests compare of a finished SDK span."""
    return {
        "name": span.name,
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "parent_span_id": None if span.parent is None else span.parent.span_id,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


def read_spans(directory: str | Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(Path(directory).glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def _configure(directory: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonLinesExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            path = Path(directory) / f"{os.getpid()}.jsonl"
            with path.open("a") as file:
                for span in spans:
                    file.write(json.dumps(span_record(span)) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    exporter = JsonLinesExporter()
    if os.environ.get(BATCH):  # made before the slots fork, as in a project's settings
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


if os.environ.get(HIDE_OTEL):
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]
elif os.environ.get(SPANS_DIR):
    _configure(os.environ[SPANS_DIR])
