"""OpenTelemetry tracing, with the optional ``opentelemetry`` extra (docs/monitoring.md).

The trace context of the code that enqueues a job is stored on its row
(``Job.trace_context``); the slot that runs an attempt continues it with one span.
Only ``opentelemetry-api`` is used: the project configures the SDK. Without the
package nothing is imported and each call costs one cached check (:func:`_api`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .retry import Decision, Verdict

if TYPE_CHECKING:
    from .leases import ClaimedJob, ErrorInfo

TRACER_NAME = "django_leasejobs"


class Ended(Protocol):
    """What a span records of how an attempt ended (the worker's ``Outcome``)."""

    @property
    def ok(self) -> bool: ...
    @property
    def error(self) -> ErrorInfo | None: ...
    @property
    def verdict(self) -> Verdict: ...


EndedT = TypeVar("EndedT", bound=Ended)


@functools.cache
def _api() -> tuple[ModuleType, ModuleType] | None:
    """``(opentelemetry.trace, opentelemetry.propagate)``, or None without the extra."""
    global _NOT_RECORDING
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    _NOT_RECORDING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    return trace, propagate


_NOT_RECORDING: tuple[type, ...] = ()
"""The API's tracer providers that record nothing: the proxy that stands in until an SDK
is set up, and the no-op one (filled in by :func:`_api`)."""


def preload() -> None:
    """Import OpenTelemetry now, if it is installed (the worker calls this before it forks
    its slots): a slot forked later, to replace one that died, while the worker's threads
    run, then imports nothing on its first job. An import in a child forked from a
    process with threads can wait for ever on a module lock another thread held at the
    fork."""
    _api()


def current_context() -> dict[str, str] | None:
    """The W3C trace context of the active span (the propagator's carrier), or None
    when tracing is absent or no span is active."""
    api = _api()
    if api is None:
        return None
    trace, propagate = api
    carrier: dict[str, str] = {}
    try:  # a broken propagator setup costs the link, never the enqueue
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        propagate.inject(carrier)
    except Exception:
        return None
    return carrier or None


def _parent(stored: Any, propagate: ModuleType) -> Any:
    """The context a job's row carries, or None (a root span). A hand-written or garbage
    value never fails the job: only string items of a JSON object are read."""
    if not isinstance(stored, Mapping):
        return None
    carrier = {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)}
    try:
        return propagate.extract(carrier)
    except Exception:
        return None


def outcome_label(outcome: Ended) -> str:
    """``leasejobs.outcome``: succeeded, snoozed (the task raised ``Retry``) or failed."""
    if outcome.ok:
        return "succeeded"
    return "snoozed" if outcome.verdict.decision == Decision.SNOOZE else "failed"


def traced(job: ClaimedJob, backend: str, run: Callable[[], EndedT]) -> EndedT:
    """``run()`` (one attempt) inside the span ``leasejobs.job {task_path}`` (kind
    CONSUMER), a child of the job's stored trace context. Without the extra, ``run()``.

    Tracing never decides a job's fate: a tracer or span processor that raises (a broken
    SDK setup) costs the span, never the attempt."""
    span = _JobSpan.start(job, backend)
    if span is None:
        return run()
    outcome: EndedT | None = None
    try:
        outcome = run()
        return outcome
    finally:
        span.end(outcome)


async def atraced(job: ClaimedJob, backend: str, run: Callable[[], Awaitable[EndedT]]) -> EndedT:
    """:func:`traced` for an attempt that runs on an event loop (the span is current in
    the job's own asyncio task, as its context is that task's)."""
    span = _JobSpan.start(job, backend)
    if span is None:
        return await run()
    outcome: EndedT | None = None
    try:
        outcome = await run()
        return outcome
    finally:
        span.end(outcome)


@dataclass(frozen=True, slots=True)
class _JobSpan:
    """One attempt's span, entered: ended with the attempt's outcome."""

    manager: Any
    span: Any
    trace: Any

    @classmethod
    def start(cls, job: ClaimedJob, backend: str) -> _JobSpan | None:
        """The attempt's span, current from now; None without the extra, without a
        tracer provider set up (the API's proxy or no-op one: asked at each attempt, so
        one set up later is used from then on), or when the SDK refuses it."""
        api = _api()
        if api is None:
            return None
        trace, propagate = api
        try:
            provider = trace.get_tracer_provider()
            if isinstance(provider, _NOT_RECORDING):
                return None  # no SDK set up (yet): a span would record nothing
            manager = provider.get_tracer(TRACER_NAME).start_as_current_span(
                f"leasejobs.job {job.task_path}",
                context=_parent(job.trace_context, propagate),
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "leasejobs.job_id": job.id,
                    "leasejobs.attempt": job.attempt,
                    "leasejobs.task": job.task_path,
                    "leasejobs.queue": job.queue,
                    "leasejobs.backend": backend,
                },
                record_exception=False,
                set_status_on_exception=False,
            )
            span = manager.__enter__()
        except Exception:
            return None
        return cls(manager, span, trace)

    def end(self, outcome: Ended | None) -> None:
        with contextlib.suppress(Exception):
            if outcome is not None:
                label = outcome_label(outcome)
                self.span.set_attribute("leasejobs.outcome", label)
                if outcome.error is not None and label == "failed":
                    _record(self.span, outcome.error, self.trace)
        with contextlib.suppress(Exception):
            self.manager.__exit__(None, None, None)


def _record(span: Any, error: ErrorInfo, trace: ModuleType) -> None:
    """The failure as OpenTelemetry's ``exception`` event (what ``record_exception``
    writes; the slot keeps the error as text, so it is written from that)."""
    span.add_event(
        "exception",
        {
            "exception.type": error.exception_class_path,
            "exception.message": error.message,
            "exception.stacktrace": error.traceback,
        },
    )
    span.set_status(trace.Status(trace.StatusCode.ERROR, error.last_error))


FLUSH_MILLIS = 2000


def flush_spans() -> None:
    """Export the spans this process still buffers, for at most ``FLUSH_MILLIS``, when
    the SDK's provider can (a process-pool child leaves with ``os._exit``, which skips
    the SDK's exit hook)."""
    api = _api()
    if api is None:
        return
    force_flush = getattr(api[0].get_tracer_provider(), "force_flush", None)
    if callable(force_flush):
        with contextlib.suppress(Exception):
            force_flush(FLUSH_MILLIS)
