"""Live capabilities: the engine's agent, llm and tool nodes against real models and tools.

The runner pod and ``agentflows run`` construct one :class:`LiveCapabilities` per run and pass
it to the engine, which calls it through :class:`agentflows.engine.capabilities.Capabilities`::

    caps = host.LiveCapabilities(resolver)              # env defaults to os.environ
    caps = host.LiveCapabilities({"researcher": spec})  # or a plain name -> AgentSpec mapping

``llm`` nodes with an ``outputSchema`` ask the model for JSON matching the schema, parse the
reply (a fenced block is accepted) and validate it; a reply that is not JSON or does not match
fails the node with a retryable error naming the problem, since another sample may succeed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from agentflows.agents import approval, secrets, spec_tools, tools, turn
from agentflows.agents import model as model_client
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities, envelope

#: How much of a reply a schema error quotes.
_MAX_QUOTED_REPLY_CHARS = 300


class MappingResolver:
    """A :class:`~agentflows.engine.capabilities.Resolver` over plain dictionaries."""

    def __init__(
        self,
        agents: Mapping[str, agent_api.AgentSpec],
        flows: Mapping[str, flow_api.FlowSpec] | None = None,
    ) -> None:
        self._agents = dict(agents)
        self._flows = dict(flows or {})

    def agent(self, name: str) -> agent_api.AgentSpec | None:
        """Return the Agent called ``name``, or None."""
        return self._agents.get(name)

    def flow(self, name: str) -> flow_api.FlowSpec | None:
        """Return the Flow called ``name``, or None."""
        return self._flows.get(name)


class LiveCapabilities:
    """Runs agent turns, completions and tool calls for real (models via litellm)."""

    def __init__(
        self,
        resolver: capabilities.Resolver | Mapping[str, agent_api.AgentSpec] | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        if resolver is None or isinstance(resolver, Mapping):
            resolver = MappingResolver(resolver or {})
        #: Looks up Agents and Flows named by sub-agent and sub-flow tools.
        self.resolver: capabilities.Resolver = resolver
        self.env = env
        self.redactor = secrets.Redactor()

    async def run_agent(
        self, task: capabilities.AgentTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult | capabilities.Pause:
        """Run one agent turn with the Agent's tools and skills, or resume a paused one."""
        providers: list[tools.ToolProvider] = [
            spec_tools.SpecToolProvider(task.agent.tools, self.env, self.redactor),
            spec_tools.SkillToolProvider(task.agent.skills, self.env),
        ]
        registry = await tools.ToolRegistry.build(providers, ctx.autonomy)
        return await turn.run_turn(task, ctx, registry, env=self.env, redactor=self.redactor)

    async def complete(
        self, task: capabilities.LlmTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult:
        """Make one completion; with an output schema the reply must be JSON matching it."""
        system = task.system
        if task.output_schema is not None:
            system = "\n\n".join(part for part in [system, _schema_instruction(task)] if part)
        turns = [("system", system)] if system else []
        messages = turn.merge_turns([*turns, ("user", task.prompt)])
        reply = await model_client.complete(
            task.model, messages, env=self.env, redactor=self.redactor
        )
        output = envelope.from_text(reply.content, raw=reply.raw)
        if task.output_schema is not None:
            _check_schema(output, task.output_schema, reply.content)
        return capabilities.NodeResult(
            output=output,
            usage=reply.usage,
            detail={"llmCalls": 1, "costKnown": reply.cost_known},
        )

    async def call_tool(
        self, task: capabilities.ToolTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult | capabilities.Pause:
        """Call one http or python tool; a failed call fails the node.

        Under autonomy ``supervised`` a tool that is not read-only first waits for a human
        (:mod:`agentflows.agents.approval`); under ``readonly`` it fails.
        """
        name = task.tool.name
        provider = spec_tools.SpecToolProvider([task.tool], self.env, self.redactor)
        registry = await tools.ToolRegistry.build([provider], flow_api.Autonomy.FULL)
        definition = registry.get(name)
        if definition is None:
            raise capabilities.CapabilityError(
                f"tool {task.tool_name}: {task.tool.kind} tools cannot be called from a tool "
                "node yet; use an http or python tool"
            )
        if ctx.autonomy == flow_api.Autonomy.READONLY and not definition.read_only:
            raise capabilities.CapabilityError(
                f"tool {task.tool_name} is not readOnly and the Flow's autonomy is readonly"
            )
        args = task.args
        if approval.needs_approval(registry, name, ctx.autonomy):
            if ctx.resume is None:
                request = approval.request_for_tool(ctx.node_key, task.tool_name, args)
                return capabilities.Pause(request=request, state={"args": args})
            ruling = approval.rulings(ctx.resume.request, [task.tool_name])[task.tool_name]
            if ruling.outcome is not None:
                return self._tool_result(task, ruling.outcome)
            if ruling.arguments is not None:
                args = json.loads(ruling.arguments)
        _, refusal = registry.parse_arguments(name, json.dumps(args))
        outcome = refusal or await registry.call(name, args, ctx)
        return self._tool_result(task, outcome)

    def _tool_result(
        self, task: capabilities.ToolTask, outcome: tools.ToolOutcome
    ) -> capabilities.NodeResult:
        if outcome.status != "success":
            raise capabilities.CapabilityError(
                self.redactor(f"tool {task.tool_name} failed: {outcome.error}"),
                retryable=outcome.status == "timeout",
            )
        return capabilities.NodeResult(
            output=envelope.from_value(outcome.value),
            usage=common.Usage(tool_calls=1),
            detail={"tool": task.tool_name, "status": outcome.status},
        )


def _schema_instruction(task: capabilities.LlmTask) -> str:
    schema = json.dumps(task.output_schema, ensure_ascii=False)
    return f"Reply with only a JSON value, no prose, that matches this JSON Schema:\n{schema}"


def _check_schema(output: dict[str, Any], schema: Any, text: str) -> None:
    """Raise CapabilityError unless the parsed reply matches ``schema``."""
    quoted = text[:_MAX_QUOTED_REPLY_CHARS] + ("..." if len(text) > _MAX_QUOTED_REPLY_CHARS else "")
    if output["json"] is None and text.strip() != "null":
        raise capabilities.CapabilityError(
            f"the model's reply is not JSON, but the node's outputSchema needs JSON: {quoted!r}",
            retryable=True,
        )
    import jsonschema  # loaded only for llm nodes with an output schema

    try:
        jsonschema.validate(output["json"], schema)
    except jsonschema.SchemaError as exc:
        raise capabilities.CapabilityError(
            f"outputSchema is not a valid JSON Schema: {exc.message}"
        ) from None
    except jsonschema.ValidationError as exc:
        where = "/".join(str(part) for part in exc.absolute_path) or "(root)"
        raise capabilities.CapabilityError(
            f"the model's reply does not match outputSchema at {where}: {exc.message}",
            retryable=True,
        ) from None
