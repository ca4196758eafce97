"""The tool registry: what an agent may call, from several providers, behind one interface.

A :class:`ToolProvider` offers tools (:meth:`~ToolProvider.list_tools`) and runs them
(:meth:`~ToolProvider.call`). The :class:`ToolRegistry` merges the providers of one agent turn,
refuses duplicate names, builds the function schemas litellm sends to the model, checks the
model's arguments against each tool's JSON Schema, and dispatches. The providers: the Agent's
``http`` and ``python`` tools and its skills' scripts (:mod:`agentflows.agents.spec_tools`), its
MCP servers (:mod:`agentflows.agents.mcp`), sub-agents and sub-flows
(:mod:`agentflows.agents.delegation`) and ``request_human_review``
(:mod:`agentflows.agents.review`). A provider holding a connection (MCP) also has ``aclose``.

A tool that fails returns an error :class:`ToolOutcome`; the turn sends it to the model as the
tool's result and goes on. The one exception that passes through is the engine's
:class:`~agentflows.engine.state.RunStopped` (a sub-flow hit the run's token or cost limit): the
whole run stops. Only a bad tool *definition* (a template that does not compile) is a
:class:`~agentflows.engine.capabilities.CapabilityError`, raised before the model is called.

Every call, an agent's or a tool node's, is an ``execute_tool`` span (:func:`tool_span`,
:func:`record_on_span`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from agentflows.api import common, schemas
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities, spans, state

#: What the model is told a tool accepts when its definition gives no schema.
ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
#: Longest tool result sent back to the model, in characters.
MAX_RESULT_CHARS = 64_000

#: How a call ended: ``cancelled`` was not run (a human rejected it, or the turn ended first);
#: ``pending`` waits for a human's decision.
Status = Literal["success", "error", "timeout", "cancelled", "pending"]


@dataclasses.dataclass(frozen=True)
class ToolDef:
    """A tool as the model sees it."""

    name: str
    description: str
    #: JSON Schema of the arguments; None accepts anything (the model is told: an object).
    parameters: Mapping[str, Any] | None = None
    #: Changes nothing; allowed under autonomy readonly, never needs approval.
    read_only: bool = False
    #: Run by the caller: every call waits for the caller's result, whatever the autonomy.
    client: bool = False
    #: A client tool whose calls a human confirms before the caller is asked to run them.
    confirm: bool = False
    #: Hands the conversation over to the Agent its ``agent`` argument names
    #: (:mod:`agentflows.agents.handoff`).
    handoff: bool = False
    #: Submits the turn's answer: a successful call ends the turn (:mod:`agentflows.agents.answer`).
    submit: bool = False
    #: Where the tool comes from (an MCP server), to tell two tools of one name apart.
    source: str = ""


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    """What a tool call produced: a JSON-able value, or an error message for the model."""

    status: Status
    value: Any = None
    error: str | None = None
    #: Model usage spent by the tool itself (a sub-agent's turn), added to the node's.
    usage: common.Usage | None = None
    #: The failure is temporary (a timeout, a 5xx): calling again later may succeed.
    retryable: bool = False

    @classmethod
    def success(cls, value: Any) -> ToolOutcome:
        """Return a successful outcome with ``value``."""
        return cls("success", value=value)

    @classmethod
    def failure(cls, error: str, *, timeout: bool = False, retryable: bool = False) -> ToolOutcome:
        """Return a failed outcome; the model sees ``error``. A timeout is always retryable."""
        return cls("timeout" if timeout else "error", error=error, retryable=retryable or timeout)

    def content(self) -> str:
        """Return the tool message content sent to the model (bounded)."""
        if self.status == "success":
            text = self.value if isinstance(self.value, str) else _dumps(self.value)
        else:
            text = _dumps({"error": self.error, "status": self.status})
        if len(text) > MAX_RESULT_CHARS:
            dropped = len(text) - MAX_RESULT_CHARS
            text = f"{text[:MAX_RESULT_CHARS]}\n[... {dropped} more characters not shown]"
        return text


class ToolProvider(Protocol):
    """A source of tools: an Agent's http/python tools, an MCP server, sub-agents, skills."""

    async def list_tools(self) -> list[ToolDef]:
        """Return the tools this provider offers."""
        ...

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> ToolOutcome:
        """Run tool ``name`` with parsed, schema-checked ``args``."""
        ...


class ToolRegistry:
    """The tools of one agent turn, merged from providers; build with :meth:`build`."""

    def __init__(self, entries: Mapping[str, tuple[ToolDef, ToolProvider]]) -> None:
        self._entries = dict(entries)

    @classmethod
    async def build(
        cls, providers: Sequence[ToolProvider], autonomy: flow_api.Autonomy
    ) -> ToolRegistry:
        """Merge the providers' tools; under autonomy readonly only read-only tools are offered.

        Two providers offering the same name is a permanent error: the model could not tell
        them apart.
        """
        registry = cls({})
        for provider in providers:
            await registry.add(provider, autonomy)
        return registry

    async def add(self, provider: ToolProvider, autonomy: flow_api.Autonomy) -> None:
        """Add one provider's tools, by the rules of :meth:`build`."""
        for tool in await provider.list_tools():
            if tool.name in self._entries:
                sources = [d.source for d in (self._entries[tool.name][0], tool) if d.source]
                where = f" ({' and '.join(sources)})" if sources else ""
                raise capabilities.CapabilityError(
                    f"two tools are named {tool.name!r}{where}; tool names must be unique"
                )
            if autonomy == flow_api.Autonomy.READONLY and not tool.read_only:
                continue
            self._entries[tool.name] = (tool, provider)

    def names(self) -> list[str]:
        """The names of the tools offered."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> ToolDef | None:
        """Return the definition of tool ``name``, or None."""
        entry = self._entries.get(name)
        return entry[0] if entry else None

    def schemas(self) -> list[dict[str, Any]]:
        """Return the tools in the OpenAI function-calling format litellm expects."""
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": dict(tool.parameters or ANY_OBJECT),
                },
            }
            for tool, _ in self._entries.values()
        ]

    def parse_arguments(self, name: str, arguments: str) -> tuple[Any, ToolOutcome | None]:
        """Parse and check the model's arguments; the outcome is set when they are unusable."""
        entry = self._entries.get(name)
        if entry is None:
            offered = ", ".join(sorted(self._entries)) or "none"
            return None, ToolOutcome.failure(f"no tool named {name!r} (tools: {offered})")
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return None, ToolOutcome.failure(f"arguments of {name} are not valid JSON: {exc}")
        if args is None:  # models send null for a tool without inputs: it takes an empty object
            args = {}
        if entry[0].parameters is None:
            return args, None
        found = schemas.mismatch(dict(entry[0].parameters), args)
        if found is not None:
            return None, ToolOutcome.failure(
                f"arguments of {name} do not match its schema at {found.where}: {found.message}"
            )
        return args, None

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> ToolOutcome:
        """Run tool ``name`` with parsed ``args``; a provider's exception becomes an error."""
        entry = self._entries.get(name)
        if entry is None:
            return ToolOutcome.failure(f"no tool named {name!r}")
        try:
            return await entry[1].call(name, args, ctx)
        except state.RunStopped:
            raise
        except capabilities.CapabilityError as exc:
            return ToolOutcome.failure(str(exc))
        except Exception as exc:
            return ToolOutcome.failure(f"{type(exc).__name__}: {exc}")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def tool_span(name: str, call_id: str = "") -> contextlib.AbstractContextManager[spans.Span]:
    """The ``execute_tool`` span of one call (GenAI semantic conventions)."""
    attributes: dict[str, spans.AttributeValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name[:128],
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id[:128]
    return spans.span(f"execute_tool {name[:128]}", attributes)


def record_on_span(
    span: spans.Span, outcome: ToolOutcome, arguments: str, redact: Callable[[str], str]
) -> None:
    """Put a call's outcome on its span; arguments and result only when content is captured."""
    span.set({"agentflows.tool.status": outcome.status})
    if spans.capture_content():
        span.set(
            {
                "gen_ai.tool.call.arguments": redact(arguments),
                "gen_ai.tool.call.result": redact(outcome.content()),
            }
        )
    if outcome.error is not None:
        span.fail(redact(outcome.error)[:1024])
