"""Accounting: tokens, cost and calls per node and per run; limits; bounded tool call records."""

from __future__ import annotations

from typing import Any

import pytest

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, graph, run, store
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall

#: gpt-4o-mini in litellm's table: $0.15 per million prompt tokens, $0.60 per million completion.
MINI_COST = 11 * 0.15e-6 + 7 * 0.6e-6


async def test_known_model_is_priced_from_litellms_table(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("hi"))
    caps = host.LiveCapabilities(env=model_server.env)
    model = model_server.model_spec(name="openai/gpt-4o-mini")
    result = await caps.complete(capabilities.LlmTask(model=model, system="", prompt="hi"), ctx)
    assert result.usage.cost_usd == pytest.approx(MINI_COST)
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 7)
    assert result.detail["costKnown"] is True
    assert model_server.requests[0].body["model"] == "gpt-4o-mini"


async def test_unknown_model_costs_nothing_and_the_node_says_so(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("hi"))
    caps = host.LiveCapabilities(env=model_server.env)
    spec = agent_api.AgentSpec(model=model_server.model_spec())
    result = await caps.run_agent(capabilities.AgentTask("a", spec, "hi"), ctx)
    assert isinstance(result, capabilities.NodeResult)
    assert result.usage.cost_usd == 0
    assert result.detail["costKnown"] is False
    assert "openai/scripted-model" in result.detail["costNote"]


async def run_flow(
    server: ScriptedModelServer, limits: dict[str, Any], model_name: str = "openai/gpt-4o-mini"
) -> store.Outcome:
    resolver = graph.StaticResolver(
        {"a": agent_api.AgentSpec(model=server.model_spec(name=model_name))}
    )
    spec = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "one", "agent": {"name": "a", "prompt": "1"}},
                {"id": "two", "agent": {"name": "a", "prompt": "2"}},
            ],
            "limits": limits,
        }
    )
    return await run.run_flow(
        graph.compile_flow(spec, resolver),
        run_name="r",
        input_value=None,
        store_=store.MemoryStore(),
        caps=host.LiveCapabilities(resolver, env=server.env),
        resolver=resolver,
    )


async def test_run_usage_sums_its_nodes(model_server: ScriptedModelServer) -> None:
    model_server.script(Reply.text("a"), Reply.text("b"))
    outcome = await run_flow(model_server, {})
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED
    assert outcome.usage.llm_calls == 2
    assert outcome.usage.prompt_tokens == 22
    assert outcome.usage.cost_usd == pytest.approx(2 * MINI_COST)


async def test_max_cost_stops_the_run_with_a_clear_reason(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(Reply.text("a"), Reply.text("b"))
    outcome = await run_flow(model_server, {"maxCostUSD": MINI_COST * 1.5})
    assert outcome.phase == flowrun_api.RunPhase.FAILED
    assert outcome.reason == "CostLimitExceeded"
    assert "limits.maxCostUSD" in (outcome.message or "")
    assert len(model_server.requests) == 2


async def test_max_tokens_stops_the_run_with_a_clear_reason(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(Reply.text("a"), Reply.text("b"))
    outcome = await run_flow(model_server, {"maxTokens": 10})
    assert outcome.phase == flowrun_api.RunPhase.FAILED
    assert outcome.reason == "TokenLimitExceeded"
    assert "limits.maxTokens=10" in (outcome.message or "")
    assert len(model_server.requests) == 1


async def test_tool_call_records_are_bounded_and_never_hold_a_secret(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    leaky = agent_api.Tool(
        name="leaky",
        python=agent_api.PythonTool(script=f"raise SystemExit('{API_KEY} ' + 'x' * 1500)"),
    )
    model_server.script(Reply.calls(ToolCall("leaky", {}, id="L")), Reply.text("sorry"))
    caps = host.LiveCapabilities(env=model_server.env)
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[leaky])
    result = await caps.run_agent(capabilities.AgentTask("a", spec, "go"), ctx)
    assert isinstance(result, capabilities.NodeResult)

    [record] = result.detail["toolCalls"]
    assert set(record) == {"id", "name", "status", "startedAt", "finishedAt", "durationMs", "error"}
    assert record["status"] == "error"
    assert API_KEY not in record["error"] and "[redacted]" in record["error"]
    assert len(record["error"]) <= 503
    assert API_KEY not in model_server.requests[1].messages[-1]["content"]
