"""OpenTelemetry traces of runs: the tracer the runner, the operator and the webhook install.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and
``OTEL_SDK_DISABLED`` is not ``true``; off, nothing of OpenTelemetry is imported (a runner pod's
cold start does not pay for it). On, :func:`configure` builds the SDK's tracer provider with a
batch processor and the OTLP exporter over HTTP/protobuf (every standard ``OTEL_*`` variable
applies: endpoint, headers, timeout, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), and
installs it behind the engine's seam (:mod:`agentflows.engine.spans`). HTTP, not gRPC: the
protobuf-over-HTTP exporter needs no grpcio (a large native wheel that costs the cold start
more), and every collector, Jaeger included, takes both on 4318 and 4317.

One trace per FlowRun, whatever pods and days it spans, with nothing stored: the trace id is
the run's uid (a UUID is 128 bits, a trace id too) and the run's own span id is the first 64
bits of the SHA-256 of the uid. Every pod's ``run`` span (one attempt) is a child of that span,
which the operator exports once the run has ended (:func:`record_run`), from its creation to
its completion. A run started by a webhook call that carried a W3C ``traceparent`` continues
the caller's trace instead: the receiver stores the header in the FlowRun's
:data:`agentflows.api.wellknown.TRACEPARENT_ANNOTATION`, and the run's span id (still
derived from the uid) is a child of the caller's span, with the caller's trace id.

Prompt and completion content go on spans only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (redacted as everything else).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from agentflows.engine import spans

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: The (trace id, span id) the next span takes instead of random ones (the run's own span).
_fixed_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "agentflows_fixed_ids", default=None
)
_provider: Any = None


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in _ENDPOINT_ENVS)


def configure(
    service_name: str,
    environ: Mapping[str, str] = os.environ,
    exporter: Any = None,
    resource: spans.Attributes | None = None,
) -> bool:
    """Install the tracer when :func:`enabled` (or given ``exporter``); return whether it did.

    ``service_name`` is the default of ``OTEL_SERVICE_NAME`` (agentflows-runner, ...);
    ``exporter`` is an SDK span exporter (default: OTLP over HTTP, set up by the environment);
    ``resource`` adds attributes of this process (a runner's attempt).
    """
    global _provider
    if _provider is not None:
        return True
    if exporter is None and not enabled(environ):
        return False
    from opentelemetry.sdk import resources
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    name = environ.get("OTEL_SERVICE_NAME") or service_name
    attributes = {**(resource or {}), resources.SERVICE_NAME: name}
    provider = TracerProvider(
        resource=resources.Resource.create(attributes), id_generator=_id_generator()
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider = provider
    capture = environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    spans.install(_OtelTracer(provider.get_tracer("agentflows"), capture))
    return True


def shutdown() -> None:
    """Export what is buffered and stop (the runner calls it before the pod exits)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None
        spans.install(None)


def _id_generator() -> Any:
    from opentelemetry.sdk.trace import id_generator

    class RunIds(id_generator.RandomIdGenerator):
        """Random ids, except those a run's own span is given."""

        def generate_span_id(self) -> int:
            fixed = _fixed_ids.get()
            return fixed[1] if fixed is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            fixed = _fixed_ids.get()
            return fixed[0] if fixed is not None else super().generate_trace_id()

    return RunIds()


class _OtelSpan:
    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, attributes: spans.Attributes) -> None:
        self._span.set_attributes(dict(attributes))

    def fail(self, message: str) -> None:
        from opentelemetry import trace

        self._span.set_status(trace.Status(trace.StatusCode.ERROR, message[:1024]))


class _OtelTracer:
    def __init__(self, tracer: Any, capture: bool) -> None:
        self._tracer = tracer
        self._capture = capture

    @contextlib.contextmanager
    def span(self, name: str, attributes: spans.Attributes) -> Iterator[spans.Span]:
        # An exception leaving the block fails the span with its type and message only (no
        # traceback event: a traceback's locals are not ours to export).
        with self._tracer.start_as_current_span(
            name, attributes=dict(attributes), record_exception=False
        ) as span:
            yield _OtelSpan(span)

    def capture_content(self) -> bool:
        return self._capture


def pod_env(environ: Mapping[str, str] = os.environ) -> list[dict[str, str]]:
    """The ``OTEL_*`` variables a runner pod gets from the operator (none when tracing is off).

    The operator's own ``OTEL_SERVICE_NAME`` is not passed: runners are ``agentflows-runner``.
    """
    if not enabled(environ):
        return []
    return [
        {"name": name, "value": value}
        for name, value in sorted(environ.items())
        if name.startswith("OTEL_") and name != "OTEL_SERVICE_NAME"
    ]


def trace_id_of(uid: str) -> int:
    """The trace id of a run started with no ``traceparent``: its uid's 128 bits."""
    return uuid.UUID(uid).int


def local_run_uid(state_file: Path) -> str:
    """The uid of a local run: a UUID of its state file's path (its resumes continue its trace)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, state_file.resolve().as_uri()))


def run_span_id(uid: str) -> int:
    """The span id of a run's own span: the first 64 bits of the SHA-256 of its uid."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") or 1


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C ``traceparent``; None when absent or malformed."""
    match = _TRACEPARENT.match((value or "").strip().lower())
    if match is None:
        return None
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(match.group(3), 16)


def traceparent_of(trace_id: int, span_id: int) -> str:
    """The W3C ``traceparent`` naming a sampled span."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


@contextlib.contextmanager
def request_span(
    name: str, traceparent: str | None, attributes: spans.Attributes
) -> Iterator[str | None]:
    """A server span for a request that carried ``traceparent`` (the webhook receiver's).

    Yields the ``traceparent`` a run the request starts should store: this span's when tracing
    is on, else the caller's own when it is well-formed (so the run still joins the caller's
    trace when only the runners trace), else None.
    """
    parsed = parse_traceparent(traceparent)
    if _provider is None:
        yield traceparent_of(parsed[0], parsed[1]) if parsed else None
        return
    from opentelemetry import trace

    context = None
    if parsed is not None:
        caller = trace.SpanContext(
            parsed[0], parsed[1], is_remote=True, trace_flags=trace.TraceFlags(parsed[2])
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(caller))
    with _provider.get_tracer("agentflows").start_as_current_span(
        name,
        context=context,
        kind=trace.SpanKind.SERVER,
        attributes=dict(attributes),
        record_exception=False,
    ) as span:
        own = span.get_span_context()
        yield traceparent_of(own.trace_id, own.span_id)


def run_trace_id(uid: str, traceparent: str | None) -> int:
    """The trace id of a run: the caller's when it carried a valid ``traceparent``."""
    parent = parse_traceparent(traceparent)
    return parent[0] if parent else trace_id_of(uid)


@contextlib.contextmanager
def run_context(uid: str, traceparent: str | None) -> Iterator[None]:
    """Make the run's own span the parent of the spans opened inside (one attempt's)."""
    if _provider is None or not uid:
        yield
        return
    from opentelemetry import context, trace

    parent = trace.NonRecordingSpan(
        trace.SpanContext(
            run_trace_id(uid, traceparent),
            run_span_id(uid),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    token = context.attach(trace.set_span_in_context(parent))
    try:
        yield
    finally:
        context.detach(token)


def record_run(
    uid: str,
    traceparent: str | None,
    name: str,
    attributes: spans.Attributes,
    start_ns: int,
    end_ns: int,
) -> None:
    """Export a run's own span (the parent of its attempts), once the run has ended."""
    if _provider is None or not uid:
        return
    from opentelemetry import trace

    parent = parse_traceparent(traceparent)
    context = None
    if parent is not None:
        caller = trace.SpanContext(
            parent[0], parent[1], is_remote=True, trace_flags=trace.TraceFlags(parent[2])
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(caller))
    # The SDK asks its id generator for the span id, and for the trace id of a root span.
    token = _fixed_ids.set((run_trace_id(uid, traceparent), run_span_id(uid)))
    try:
        span = _provider.get_tracer("agentflows").start_span(
            name, context=context, attributes=dict(attributes), start_time=start_ns
        )
    finally:
        _fixed_ids.reset(token)
    span.end(end_time=end_ns)
