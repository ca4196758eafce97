"""Test helpers for the engine: flows from YAML, and a counting capability host.

The engine's capabilities are its transport: these tests inject a host that records calls,
the same way the CLI injects the live or mock host.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import documents, times
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities, envelope, graph, run, state, store


def flow_spec(text: str) -> flow_api.FlowSpec:
    return flow_api.FlowSpec.model_validate(documents.safe_load_all(text)[0])


def agents(*names: str) -> dict[str, agent_api.AgentSpec]:
    return {
        n: agent_api.AgentSpec.model_validate({"model": {"name": "openai/test"}}) for n in names
    }


class CountingHost:
    """Answers agent, llm and tool calls deterministically and counts them per node key."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None) -> None:
        self.calls: Counter[str] = Counter()
        self.delay = delay
        self.fail_on = fail_on
        self.active = 0
        self.max_active = 0

    async def _record(self, ctx: capabilities.NodeContext) -> None:
        self.calls[ctx.node_key] += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        if self.fail_on == ctx.node_key:
            raise capabilities.CapabilityError(f"{ctx.node_key} exploded")

    async def run_agent(self, task: capabilities.AgentTask, ctx: capabilities.NodeContext) -> Any:
        await self._record(ctx)
        return capabilities.NodeResult(
            envelope.from_value({"agent": task.agent_name, "prompt": task.prompt})
        )

    async def complete(self, task: capabilities.LlmTask, ctx: capabilities.NodeContext) -> Any:
        await self._record(ctx)
        return capabilities.NodeResult(
            envelope.from_text('{"items": [1, 2, 3]}'),
            usage=__import__("agentflows.api.common", fromlist=["Usage"]).Usage(
                prompt_tokens=10, completion_tokens=5, llm_calls=1, cost_usd=0.01
            ),
        )

    async def call_tool(self, task: capabilities.ToolTask, ctx: capabilities.NodeContext) -> Any:
        await self._record(ctx)
        return capabilities.NodeResult(
            envelope.from_value({"tool": task.tool_name, "args": task.args})
        )


async def run_once(
    spec: flow_api.FlowSpec,
    st: store.CheckpointStore,
    host: Any,
    value: Any = None,
    resolver: graph.StaticResolver | None = None,
    observer: state.Observer | None = None,
    now: times.Clock = times.now,
) -> store.Outcome:
    resolver = resolver or graph.StaticResolver(agents("a", "b"))
    compiled = graph.compile_flow(spec, resolver)
    return await run.run_flow(
        compiled,
        run_name="r",
        input_value=value,
        store_=st,
        caps=host,
        resolver=resolver,
        observer=observer,
        now=now,
    )


def chain(n: int, kind: str = "tool") -> flow_api.FlowSpec:
    nodes = []
    for i in range(n):
        if kind == "tool":
            nodes.append({"id": f"n{i}", "tool": {"python": {"script": "x"}, "args": {"i": i}}})
        else:
            nodes.append({"id": f"n{i}", "transform": f"={i}"})
    return flow_api.FlowSpec.model_validate({"nodes": nodes})


class ManualClock:
    """A clock a test moves by hand (the engine's injectable clock)."""

    def __init__(self, start: str = "2026-01-01T00:00:00Z") -> None:
        self.now = times.parse_time(start)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
