"""Live capabilities: the engine's agent, llm and tool nodes against real models and tools.

The runner pod and ``agentflows run`` construct one :class:`LiveCapabilities` per run and pass
it to the engine, which calls it through :class:`agentflows.engine.capabilities.Capabilities`::

    caps = host.LiveCapabilities(resolver)              # env defaults to os.environ
    caps = host.LiveCapabilities({"researcher": spec})  # or a plain name -> AgentSpec mapping

An agent turn's tools come from providers (:mod:`agentflows.agents.tools`): the Agent's ``http``
and ``python`` tools and skill scripts, one :class:`~agentflows.agents.mcp.McpToolProvider` per
``mcp`` tool (connected for the turn and closed after it), ``call_sub_agent`` and
``call_sub_flow`` (:mod:`agentflows.agents.delegation`) and ``request_human_review``
(:mod:`agentflows.agents.review`). A ``tool`` node may call one server tool of an ``mcp`` tool.
A host may add tools of its own for the Agents it names (``builtin_tools``: the tool belt of
``agentflows draft``'s builder, :mod:`agentflows.cli.builder_tools`); no spec can ask for them.

``llm`` nodes with an ``outputSchema`` ask the model for JSON matching the schema, parse the
reply (a fenced block is accepted) and validate it; a reply that is not JSON or does not match
fails the node with a retryable error naming the problem, since another sample may succeed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentflows.agents import files, secrets, streaming
from agentflows.api import agent as agent_api
from agentflows.api import common, schemas
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities, envelope

if TYPE_CHECKING:
    # Imported by the methods that use them: a local run builds its capabilities before its
    # first node, which may need neither agent turns nor a model
    # (tests/unit/test_cli_start_path.py).
    from agentflows.agents import sessions, tools, turn, turn_state

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
    """Runs agent turns, completions and tool calls for real (see module docstring)."""

    def __init__(
        self,
        resolver: capabilities.Resolver | Mapping[str, agent_api.AgentSpec] | None = None,
        env: Mapping[str, str] = os.environ,
        session_store: sessions.Store | None = None,
        file_access: files.FileAccess = files.NO_FILE_ACCESS,
        builtin_tools: Mapping[str, Sequence[tools.ToolProvider]] | None = None,
        listener: streaming.Listener | None = None,
    ) -> None:
        if resolver is None or isinstance(resolver, Mapping):
            resolver = MappingResolver(resolver or {})
        #: Looks up Agents and Flows named by sub-agent and sub-flow tools.
        self.resolver: capabilities.Resolver = resolver
        self.env = env
        #: Where conversations with a ``session`` persist (None: nowhere, every turn is new).
        self.session_store = session_store
        #: Where reference files may come from (local paths, ConfigMaps).
        self.file_access = file_access
        #: Tools the host itself offers to the Agents it names (``agentflows draft``'s belt),
        #: besides what their specs declare; no spec can ask for them.
        self.builtin_tools = dict(builtin_tools or {})
        #: Shown the answers of agent and llm nodes as they are written (None: not streamed).
        self.listener = listener

    @functools.cached_property
    def redactor(self) -> secrets.Redactor:
        """Masks this environment's secrets (provider keys included) in what nodes return."""
        from agentflows.agents import model as model_client

        return secrets.Redactor(
            secrets.env_secrets(self.env, model_client.PROVIDER_KEY_ENV.values())
        )

    def _writer(self, ctx: capabilities.NodeContext) -> streaming.Writer | None:
        """The stream of the node ``ctx`` runs, if the host listens to answers as they come."""
        if self.listener is None:
            return None
        return streaming.Writer(self.listener, ctx.node_key, self.redactor)

    async def run_agent(
        self, task: capabilities.AgentTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult | capabilities.Pause:
        """Run one agent turn with the Agent's tools and skills, or resume a paused one.

        A handoff (:mod:`agentflows.agents.handoff`) goes on with its recipient; a resumed
        turn goes on with the Agent its saved state says was answering.
        """
        from agentflows.agents import handoff, turn, turn_state

        saved = ctx.resume.state if ctx.resume is not None else ctx.progress
        if isinstance(saved, dict) and saved.get("agent"):
            task = self._task_of(str(saved["agent"]), task)
        handed_over = turn_state.TurnState.from_json(ctx.progress) if ctx.progress else None
        for _ in range(handoff.MAX_HANDOFFS + 1):
            result = await self._turn(
                task, ctx, handed_over, handoffs=True, stream=self._writer(ctx)
            )
            if not isinstance(result, turn.Handoff):
                return result
            task = self._task_of(result.agent, task)
            messages = handoff.carried_messages(task.agent, result.messages)
            handed_over = (turn_state.TurnState(messages, agent=result.agent), result.log)
            ctx = dataclasses.replace(ctx, resume=None, progress=None)
            if ctx.save_progress is not None:
                await ctx.save_progress(handed_over[0].to_json(result.log))
        raise capabilities.CapabilityError(
            f"the agents handed the conversation over more than {handoff.MAX_HANDOFFS} times "
            "in one turn without answering"
        )

    def _task_of(self, name: str, task: capabilities.AgentTask) -> capabilities.AgentTask:
        """The node's turn ``task`` given to Agent ``name`` (a handoff's recipient)."""
        spec = self.resolver.agent(name)
        if spec is None:
            raise capabilities.CapabilityError(f'no Agent "{name}" to hand the conversation to')
        return dataclasses.replace(task, agent_name=name, agent=spec)

    async def _run_sub_agent(
        self, task: capabilities.AgentTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult | capabilities.Pause:
        """A sub-agent's turn: it answers its caller, so it cannot hand the conversation over."""
        from agentflows.agents import turn

        result = await self._turn(task, ctx, None, handoffs=False)
        assert not isinstance(result, turn.Handoff)
        return result

    async def _turn(
        self,
        task: capabilities.AgentTask,
        ctx: capabilities.NodeContext,
        handed_over: tuple[turn_state.TurnState, turn_state.TurnLog] | None,
        *,
        handoffs: bool,
        stream: streaming.Writer | None = None,
    ) -> capabilities.NodeResult | capabilities.Pause | turn.Handoff:
        """One Agent's part of a turn, with its tools (MCP servers closed when it ends)."""
        from agentflows.agents import (
            answer,
            delegation,
            flow_nodes,
            handoff,
            review,
            sessions,
            spec_tools,
            tools,
            turn,
        )

        spec = task.agent
        memory = sessions.bind(self.session_store, task, self.env, self.redactor)
        async with contextlib.AsyncExitStack() as stack:
            providers: list[tools.ToolProvider] = (
                []
                if task.skip_tools
                else [
                    spec_tools.SpecToolProvider(spec.tools, self.env, self.redactor),
                    spec_tools.SkillToolProvider(spec.skills, self.env, self.redactor),
                    *self._mcp_providers(spec.tools, stack),
                    delegation.SubAgentProvider(
                        spec.sub_agents, self.resolver, self._run_sub_agent
                    ),
                    delegation.SubFlowProvider(spec.sub_flows, self.resolver),
                    review.ReviewProvider(spec.human_review),
                    handoff.HandoffProvider(spec.handoffs if handoffs else []),
                    *self.builtin_tools.get(task.agent_name, ()),
                ]
            )
            providers.append(answer.SubmitProvider(task.answer))
            registry = await tools.ToolRegistry.build(providers, ctx.autonomy)
            if task.node_tools and not task.skip_tools:
                offered = flow_nodes.NodeToolProvider(task.node_tools, registry.names())
                await registry.add(offered, ctx.autonomy)
            return await turn.run_turn(
                task,
                ctx,
                registry,
                env=self.env,
                redactor=self.redactor,
                memory=memory,
                access=self.file_access,
                handed_over=handed_over,
                stream=stream,
            )

    def _mcp_providers(
        self, declared: list[agent_api.Tool], stack: contextlib.AsyncExitStack
    ) -> list[tools.ToolProvider]:
        """One provider per mcp tool, each closed when ``stack`` unwinds (the turn's end)."""
        if not any(tool.mcp is not None for tool in declared):
            return []
        from agentflows.agents import mcp  # the SDK loads only for agents with MCP tools

        providers: list[tools.ToolProvider] = []
        for tool in declared:
            if tool.mcp is not None:
                provider = mcp.McpToolProvider(tool, self.env, self.redactor)
                stack.push_async_callback(provider.aclose)
                providers.append(provider)
        return providers

    async def complete(
        self, task: capabilities.LlmTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult:
        """Make one completion; with an output schema the reply must be JSON matching it."""
        from agentflows.agents import model as model_client

        system = task.system
        if task.output_schema is not None:
            system = "\n\n".join(part for part in [system, _schema_instruction(task)] if part)
        # A system turn and a user turn: turn.merge_turns would join nothing (and its module,
        # the agent loop, is not needed before a runner's first model request).
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": task.prompt})
        reply = await model_client.complete(
            task.model, messages, env=self.env, redactor=self.redactor, stream=self._writer(ctx)
        )
        output = envelope.from_text(reply.content, raw=reply.raw)
        if task.output_schema is not None:
            _check_schema(output, task.output_schema, reply.content)
        detail: dict[str, Any] = {"llmCalls": 1, "costKnown": reply.cost_known}
        if not reply.cost_known:
            detail["costNote"] = f"not in litellm's cost table, counted as $0: {task.model.name}"
        return capabilities.NodeResult(output=output, usage=reply.usage, detail=detail)

    async def call_tool(
        self, task: capabilities.ToolTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult | capabilities.Pause:
        """Call one http or python tool; a failed call fails the node.

        Under autonomy ``supervised`` a tool that is not read-only first waits for a human
        (:mod:`agentflows.agents.approval`); under ``readonly`` it fails.
        """
        from agentflows.agents import spec_tools, tools

        async with contextlib.AsyncExitStack() as stack:
            if task.tool.mcp is not None:
                return await self._call_mcp_tool(task, ctx, stack)
            provider = spec_tools.SpecToolProvider([task.tool], self.env, self.redactor)
            registry = await tools.ToolRegistry.build([provider], flow_api.Autonomy.FULL)
            return await self._call_registered(task, ctx, registry, task.tool.name)

    async def _call_mcp_tool(
        self,
        task: capabilities.ToolTask,
        ctx: capabilities.NodeContext,
        stack: contextlib.AsyncExitStack,
    ) -> capabilities.NodeResult | capabilities.Pause:
        """A tool node calling one server tool (by its server name or its model name)."""
        from agentflows.agents import mcp, tools

        provider = mcp.McpToolProvider(task.tool, self.env, self.redactor)
        stack.push_async_callback(provider.aclose)
        registry = await tools.ToolRegistry.build([provider], flow_api.Autonomy.FULL)
        server_tool = provider.server_name(task.tool_name)
        if server_tool is None:
            raise capabilities.CapabilityError(
                f"tool {task.tool_name}: the MCP server of tool {task.tool.name} offers no such "
                "tool (or include/exclude filter it out)"
            )
        return await self._call_registered(
            task,
            ctx,
            registry,
            provider.model_name(server_tool),
        )

    async def _call_registered(
        self,
        task: capabilities.ToolTask,
        ctx: capabilities.NodeContext,
        registry: tools.ToolRegistry,
        name: str,
    ) -> capabilities.NodeResult | capabilities.Pause:
        """Call tool ``name`` of ``registry`` for a tool node, with autonomy applied."""
        from agentflows.agents import approval, tools

        definition = registry.get(name)
        if definition is None:
            raise capabilities.CapabilityError(f"tool {task.tool_name} is not defined")
        if ctx.autonomy == flow_api.Autonomy.READONLY and not definition.read_only:
            raise capabilities.CapabilityError(
                f"tool {task.tool_name} is not readOnly and the Flow's autonomy is readonly"
            )
        args = task.args
        if approval.needs_approval(registry, name, ctx.autonomy):
            if ctx.resume is None:
                request = approval.request_for_tool(
                    ctx.node_key, task.tool_name, args, client=definition.client
                )
                return capabilities.Pause(request=request, state={"args": args})
            ruling = approval.rulings(ctx.resume.request, [task.tool_name])[task.tool_name]
            if ruling.outcome is not None:
                return self._tool_result(task, ruling.outcome)
            if ruling.arguments is not None:
                args = json.loads(ruling.arguments)
        arguments = json.dumps(args)
        with tools.tool_span(task.tool_name) as span:
            _, refusal = registry.parse_arguments(name, arguments)
            outcome = refusal or await registry.call(name, args, ctx)
            tools.record_on_span(span, outcome, arguments, self.redactor)
        return self._tool_result(task, outcome)

    def _tool_result(
        self, task: capabilities.ToolTask, outcome: tools.ToolOutcome
    ) -> capabilities.NodeResult:
        if outcome.status != "success":
            raise capabilities.CapabilityError(
                self.redactor(f"tool {task.tool_name} failed: {outcome.error}"),
                retryable=outcome.retryable,
                source=flow_api.RetryOn.HTTP if task.tool.http else flow_api.RetryOn.TOOL,
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
            source=flow_api.RetryOn.MODEL,
        )
    found = schemas.mismatch(schema, output["json"])
    if found is not None:
        if found.bad_schema:  # permanent: no reply can match it
            raise capabilities.CapabilityError(
                f"outputSchema is not a valid JSON Schema: {found.message}"
            )
        raise capabilities.CapabilityError(
            f"the model's reply does not match outputSchema at {found.where}: {found.message}",
            retryable=True,
            source=flow_api.RetryOn.MODEL,
        )
