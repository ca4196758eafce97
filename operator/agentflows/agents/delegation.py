"""Delegation tools: ``call_sub_agent`` (``subAgents``) and ``call_sub_flow`` (``subFlows``).

Built by :mod:`agentflows.agents.host` for each agent turn whose Agent names sub-agents or
sub-flows. The tool's schema lists the names as an ``enum``, so the model can only pick one the
Agent declared.

``call_sub_agent {agent, prompt}`` runs a whole turn of the named Agent, one nesting level
deeper, and returns its answer (parsed JSON when the answer is JSON, else the text). Calls in one
model reply run concurrently (the turn gathers them), so four sub-agents that take a second each
answer in about a second. Their tokens, cost and calls are added to the calling node's usage.
A sub-agent runs with the Flow's autonomy; it cannot pause for a human (a supervised call or a
review request inside it is an error result for the caller), because only the node's own turn
can be saved and resumed.

``call_sub_flow {flow, input}`` runs the named Flow inside the same run through
:attr:`agentflows.engine.capabilities.NodeContext.run_flow`: its nodes are recorded in the
FlowRun status under ``<node>/<call id>/`` and their usage is counted by the engine. A sub-flow
called this way cannot pause for a human either (the engine raises a clear error). A failed
sub-flow node is an error result for the model; a run limit hit inside it stops the run.

Nesting deeper than :data:`agentflows.engine.capabilities.MAX_DEPTH` (sub-agents and sub-flows
together) is an error result naming the limit, returned to the calling agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentflows.agents import tools
from agentflows.api import common
from agentflows.engine import capabilities, state

#: Reasons of a stopped run that stop the calling run too (limits), not just the call.
RUN_LIMIT_REASONS = frozenset(
    {
        state.Reason.TOKEN_LIMIT_EXCEEDED,
        state.Reason.COST_LIMIT_EXCEEDED,
        state.Reason.NODE_EXECUTION_LIMIT_EXCEEDED,
    }
)
SUB_AGENT_TOOL = "call_sub_agent"
SUB_FLOW_TOOL = "call_sub_flow"

#: Runs one agent turn (the host's ``run_agent``).
AgentRunner = Callable[
    [capabilities.AgentTask, capabilities.NodeContext],
    Awaitable[capabilities.NodeResult | capabilities.Pause],
]


def _too_deep(kind: str, name: str, depth: int) -> tools.ToolOutcome:
    return tools.ToolOutcome.failure(
        f"{kind} {name!r} not run: it would nest {depth} levels deep, deeper than the limit of "
        f"{capabilities.MAX_DEPTH} sub-agent and sub-flow levels; answer without delegating"
    )


class SubAgentProvider:
    """The ``call_sub_agent`` tool over the Agent's ``subAgents``."""

    def __init__(
        self, names: Sequence[str], resolver: capabilities.Resolver, run_agent: AgentRunner
    ) -> None:
        self._names = list(dict.fromkeys(names))
        self._resolver = resolver
        self._run_agent = run_agent

    async def list_tools(self) -> list[tools.ToolDef]:
        """One tool, with the sub-agent names as an enum (none when there are no sub-agents)."""
        if not self._names:
            return []
        return [
            tools.ToolDef(
                name=SUB_AGENT_TOOL,
                description=(
                    "Ask another agent to do a task and get its answer. Several calls in one "
                    "reply run at the same time. Agents: " + ", ".join(self._names) + "."
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "agent": {"type": "string", "enum": self._names},
                        "prompt": {"type": "string", "description": "The task, self-contained."},
                    },
                    "required": ["agent", "prompt"],
                    "additionalProperties": False,
                },
                # Delegating changes nothing by itself; what the sub-agent's tools may do is
                # governed by the autonomy its own turn runs under.
                read_only=True,
            )
        ]

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Run the sub-agent's turn one level deeper and return its answer."""
        agent_name = str(args["agent"])
        depth = ctx.depth + 1
        if depth > capabilities.MAX_DEPTH:
            return _too_deep("sub-agent", agent_name, depth)
        spec = self._resolver.agent(agent_name)
        if spec is None:
            return tools.ToolOutcome.failure(f"no Agent named {agent_name!r}")
        task = capabilities.AgentTask(agent_name, spec, str(args["prompt"]))
        sub_ctx = dataclasses.replace(ctx, depth=depth, resume=None)
        result = await self._run_agent(task, sub_ctx)
        if isinstance(result, capabilities.Pause):
            return tools.ToolOutcome(
                "error",
                error=f"sub-agent {agent_name!r} asked for a human ({result.request.kind}), "
                "which a sub-agent cannot do; do that step yourself",
                usage=result.usage,
            )
        output = result.output
        value = output.get("json") if output.get("json") is not None else output.get("text")
        return tools.ToolOutcome("success", value=value, usage=result.usage)


class SubFlowProvider:
    """The ``call_sub_flow`` tool over the Agent's ``subFlows``."""

    def __init__(self, names: Sequence[str], resolver: capabilities.Resolver) -> None:
        self._names = list(dict.fromkeys(names))
        self._resolver = resolver

    async def list_tools(self) -> list[tools.ToolDef]:
        """One tool, with the Flow names as an enum (none when there are no sub-flows)."""
        if not self._names:
            return []
        return [
            tools.ToolDef(
                name=SUB_FLOW_TOOL,
                description=(
                    "Run a workflow inside this run and get its output. Flows: "
                    + "; ".join(self._describe(name) for name in self._names)
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "flow": {"type": "string", "enum": self._names},
                        "input": {"type": "object", "description": "The flow's input."},
                    },
                    "required": ["flow"],
                    "additionalProperties": False,
                },
            )
        ]

    def _describe(self, name: str) -> str:
        spec = self._resolver.flow(name)
        schema = spec.input if spec is not None else None
        if isinstance(schema, dict) and schema.get("properties"):
            return f"{name} (input properties: {', '.join(schema['properties'])})"
        return name

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Run the Flow inside this run, under the node's status key and this call's id."""
        flow_name = str(args["flow"])
        if ctx.depth + 1 > capabilities.MAX_DEPTH:
            return _too_deep("sub-flow", flow_name, ctx.depth + 1)
        if ctx.run_flow is None:
            return tools.ToolOutcome.failure("sub-flows cannot run here (no engine run)")
        try:
            value = await ctx.run_flow(flow_name, args.get("input"), ctx)
        except state.RunStopped as exc:
            if exc.reason in RUN_LIMIT_REASONS:
                raise
            return tools.ToolOutcome.failure(f"sub-flow {flow_name!r} failed: {exc.message}")
        # The engine counts the sub-flow's nodes' usage itself: none is returned here.
        return tools.ToolOutcome("success", value=value, usage=common.Usage())
