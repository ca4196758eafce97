"""The tracing seam: where the engine and the agent layer say what they are doing, for a tracer.

Neither the engine nor the agents import a tracing library. They open spans with :func:`span`
(a context manager), naming attributes after the OpenTelemetry GenAI semantic conventions
(``gen_ai.operation.name``, ``gen_ai.request.model``, ...) or ``agentflows.*``. A host that traces
(:mod:`agentflows.tracing`, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set) calls :func:`install`
once before it runs anything; until then every span is a shared no-op, so a host that does not
trace pays one function call per span and imports nothing.

Parents are the installed tracer's business: it keeps the current span in a context variable,
which asyncio tasks inherit, so a node's span is the parent of the agent turn inside it, and a
turn's span the parent of its model and tool calls, with no span passed around.

Contract for a :class:`Tracer`: an exception that leaves a span's ``with`` block marks the span
failed; one the caller catches inside the block does not (a pause is not a failure), so callers
that handle an error call :meth:`Span.fail` themselves. Attribute values never hold a secret:
callers pass redacted text, and message content only when :func:`capture_content` says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Protocol

#: The attribute values a span takes (OpenTelemetry's primitive types, and lists of strings).
AttributeValue = str | bool | int | float | tuple[str, ...]
Attributes = Mapping[str, AttributeValue]


class Span(Protocol):
    """An open span: more attributes, or a failure, may be added until it ends."""

    def set(self, attributes: Attributes) -> None:
        """Add (or overwrite) attributes."""
        ...

    def fail(self, message: str) -> None:
        """Mark the span failed with ``message`` (already free of secrets)."""
        ...


class Tracer(Protocol):
    """What a tracing host installs."""

    def span(self, name: str, attributes: Attributes) -> contextlib.AbstractContextManager[Span]:
        """Open a span, child of the current one, current inside the ``with`` block."""
        ...

    def capture_content(self) -> bool:
        """Whether prompt and completion content may go on spans."""
        ...


class _NoSpan:
    def set(self, attributes: Attributes) -> None:
        del attributes

    def fail(self, message: str) -> None:
        del message


_NO_SPAN = _NoSpan()


class _NoTracer:
    def span(self, name: str, attributes: Attributes) -> contextlib.AbstractContextManager[Span]:
        del name, attributes
        return contextlib.nullcontext(_NO_SPAN)

    def capture_content(self) -> bool:
        return False


_tracer: Tracer = _NoTracer()


def install(tracer: Tracer | None) -> None:
    """Make ``tracer`` the one every span goes to (None: back to no tracing)."""
    global _tracer
    _tracer = _NoTracer() if tracer is None else tracer


def span(
    name: str, attributes: Attributes | None = None
) -> contextlib.AbstractContextManager[Span]:
    """Open a span on the installed tracer (a no-op when none is installed)."""
    return _tracer.span(name, attributes or {})


def capture_content() -> bool:
    """Whether prompts, completions, tool arguments and results may go on spans."""
    return _tracer.capture_content()
