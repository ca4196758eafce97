"""Mock capabilities: deterministic stand-ins for models and tools, for ``run --dry-run``.

The first command of the README runs a Flow with no model key; the CLI passes
:class:`MockCapabilities` to the engine, which then walks the whole Flow — branches, maps,
approvals — with plausible, repeatable outputs:

- ``llm`` nodes with an ``outputSchema`` get a value synthesized from the schema
  (:func:`synthesize`); without one, a short sentence quoting the start of the prompt.
- ``agent`` nodes answer JSON ``{"agent", "answer", "findings": [two findings]}``; one with an
  ``answer`` (values to submit) submits a value synthesized from its schema.
- ``tool`` nodes answer ``{"tool", "args", "mock": true}`` without running anything.

Outputs depend only on the inputs, so two dry runs of one Flow print the same thing. Usage counts
the calls, estimates tokens as characters / 4 and costs nothing.

:func:`needs_mock` is the rule the CLI uses to fall back to the mock when a model cannot be
reached: a model needs the mock when it has no ``apiBase``, its ``apiKey`` secret is not in the
environment, and its provider's usual key variable
(:data:`agentflows.agents.model.PROVIDER_KEY_ENV`; a bare model name is OpenAI's) is not set.
A provider missing from that table has no known variable, so without apiBase or apiKey it needs
the mock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from agentflows.agents import model as model_client
from agentflows.agents import secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities, envelope

#: How much of the prompt a mock reply quotes.
QUOTED_PROMPT_CHARS = 60
#: Items in a synthesized array.
ARRAY_ITEMS = 2
#: Depth after which synthesized values stop nesting (recursive schemas).
_MAX_DEPTH = 8


def needs_mock(model: agent_api.ModelSpec, env: Mapping[str, str]) -> bool:
    """Tell whether ``model`` has nothing to reach a real model with (see module docstring)."""
    if model.api_base:
        return False
    if model.api_key is not None and env.get(secrets.secret_env_name(model.api_key)):
        return False
    variable = model_client.PROVIDER_KEY_ENV.get(model_client.provider_of(model.name))
    return not (variable and env.get(variable))


def synthesize(schema: Any, name: str = "value", index: int = 1, depth: int = 0) -> Any:
    """Return a deterministic value matching a JSON Schema (objects, arrays, scalars, enums).

    Objects get their required properties, or all of them when none is required; arrays get
    two items; strings read ``mock <field> <n>``; numbers are 1, booleans true, enums their first
    value. ``anyOf``/``oneOf`` use the first branch, ``allOf`` merges object branches.
    """
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return f"mock {name} {index}"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return synthesize(schema[key][0], name, index, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = synthesize(part, name, index, depth + 1)
            if not isinstance(value, dict):
                return value
            merged.update(value)
        return merged
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _synthesize_type(schema, str(kind), name, index, depth)


def _synthesize_type(
    schema: Mapping[str, Any], kind: str, name: str, index: int, depth: int
) -> Any:
    if kind == "object":
        properties: Mapping[str, Any] = schema.get("properties") or {}
        keys = schema.get("required") or list(properties)
        return {key: synthesize(properties.get(key, {}), key, index, depth + 1) for key in keys}
    if kind == "array":
        count = max(ARRAY_ITEMS, int(schema.get("minItems", 0)))
        items = schema.get("items", {})
        return [synthesize(items, name, i, depth + 1) for i in range(1, count + 1)]
    if kind in ("integer", "number"):
        return _number(schema)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return f"mock {name} {index}"


def _number(schema: Mapping[str, Any]) -> int:
    """Return 1, or the smallest integer the schema's minimum allows when that is more."""
    minimum = schema.get("minimum")
    exclusive = schema.get("exclusiveMinimum")
    if isinstance(minimum, int | float) and minimum > 1:
        return math.ceil(minimum)
    if isinstance(exclusive, int | float) and exclusive >= 1:
        return math.floor(exclusive) + 1
    return 1


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class MockCapabilities:
    """Capabilities answering without models or tools (see module docstring).

    Constructed like :class:`agentflows.agents.host.LiveCapabilities`, so a host picks one or the
    other with the same arguments; the mock needs no resolver, as it calls no sub-agents.
    """

    def __init__(
        self,
        resolver: capabilities.Resolver | Mapping[str, agent_api.AgentSpec] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        del resolver, env  # accepted for a host's convenience; nothing here depends on them

    async def run_agent(
        self, task: capabilities.AgentTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult:
        """Answer as the named agent would, in a fixed JSON shape (its answer's, if it has one)."""
        if task.answer is not None:
            values = synthesize(task.answer.schema_)
            text = json.dumps(values, ensure_ascii=False)
            return capabilities.NodeResult(
                output=envelope.from_value(values),
                usage=_usage("\n\n".join([task.agent.system_prompt, task.prompt]), text),
                detail={"toolCalls": [], "llmCalls": 1, "mock": True},
            )
        answer = {
            "agent": task.agent_name,
            "answer": f"Mock answer of {task.agent_name} to: {_quote(task.prompt)}",
            "findings": [f"mock finding {i}" for i in range(1, ARRAY_ITEMS + 1)],
        }
        text = json.dumps(answer, ensure_ascii=False)
        prompt = "\n\n".join([task.agent.system_prompt, task.prompt])
        return capabilities.NodeResult(
            output=envelope.from_text(text),
            usage=_usage(prompt, text),
            detail={"toolCalls": [], "llmCalls": 1, "mock": True},
        )

    async def complete(
        self, task: capabilities.LlmTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult:
        """Answer with a value synthesized from the output schema, or a short sentence."""
        if task.output_schema is not None:
            output = envelope.from_value(synthesize(task.output_schema))
        else:
            output = envelope.from_text(f"Mock reply to: {_quote(task.prompt)}")
        return capabilities.NodeResult(
            output=output,
            usage=_usage("\n\n".join([task.system, task.prompt]), output["text"]),
            detail={"llmCalls": 1, "mock": True},
        )

    async def call_tool(
        self, task: capabilities.ToolTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult:
        """Echo the call instead of making it."""
        return capabilities.NodeResult(
            output=envelope.from_value({"tool": task.tool_name, "args": task.args, "mock": True}),
            usage=common.Usage(tool_calls=1),
            detail={"tool": task.tool_name, "status": "success", "mock": True},
        )


def _quote(prompt: str) -> str:
    text = " ".join(prompt.split())
    return text[:QUOTED_PROMPT_CHARS] + ("..." if len(text) > QUOTED_PROMPT_CHARS else "")


def _usage(prompt: str, completion: str) -> common.Usage:
    return common.Usage(
        prompt_tokens=_estimate_tokens(prompt),
        completion_tokens=_estimate_tokens(completion),
        llm_calls=1,
    )
