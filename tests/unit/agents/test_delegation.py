"""Sub-agents (``call_sub_agent``) and sub-flows (``call_sub_flow``) through the real engine."""

from __future__ import annotations

import json
from typing import Any

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, graph, run, store
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall


def agent(server: ScriptedModelServer, **fields: Any) -> agent_api.AgentSpec:
    return agent_api.AgentSpec(model=server.model_spec(), **fields)


def tool_messages(server: ScriptedModelServer, index: int) -> list[dict[str, Any]]:
    return [m for m in server.requests[index].messages if m["role"] == "tool"]


async def test_sub_agents_called_in_one_reply_run_concurrently_and_answer_the_caller(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    workers = [f"w{i}" for i in range(4)]
    resolver = host.MappingResolver(
        {"lead": agent(model_server, sub_agents=workers)}
        | {name: agent(model_server, system_prompt=f"You are {name}.") for name in workers}
    )
    model_server.script(
        Reply.calls(
            *[
                ToolCall("call_sub_agent", {"agent": name, "prompt": f"part {name}"}, id=name)
                for name in workers
            ]
        ),
        *[Reply.text('{"done": true}', delay=1.0) for _ in workers],
        Reply.text("all parts done"),
    )
    caps = host.LiveCapabilities(resolver, env=model_server.env)
    lead = resolver.agent("lead")
    assert lead is not None
    result = await caps.run_agent(capabilities.AgentTask("lead", lead, "Do it."), ctx)

    assert isinstance(result, capabilities.NodeResult)
    # each sub-agent's answer takes 1 s: calls made one after another never overlap
    assert model_server.max_in_flight > 1, "the four sub-agents did not run at the same time"
    [schema] = model_server.requests[0].body["tools"]
    assert schema["function"]["parameters"]["properties"]["agent"]["enum"] == workers
    results = tool_messages(model_server, 5)
    assert [m["tool_call_id"] for m in results] == workers
    assert all(json.loads(m["content"]) == {"done": True} for m in results)
    assert result.usage.llm_calls == 6, "the sub-agents' model calls count in the caller's usage"
    assert result.usage.tool_calls == 4
    assert [r["status"] for r in result.detail["toolCalls"]] == ["success"] * 4


async def test_sub_agents_nested_deeper_than_five_levels_fail_clearly_to_the_caller(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    resolver = host.MappingResolver({"loop": agent(model_server, sub_agents=["loop"])})
    dive = ToolCall("call_sub_agent", {"agent": "loop", "prompt": "deeper"})
    model_server.script(
        *[Reply.calls(dive) for _ in range(6)], *[Reply.text(f"up {i}") for i in range(6)]
    )
    caps = host.LiveCapabilities(resolver, env=model_server.env)
    spec = resolver.agent("loop")
    assert spec is not None
    result = await caps.run_agent(capabilities.AgentTask("loop", spec, "Go."), ctx)

    assert isinstance(result, capabilities.NodeResult)
    assert len(model_server.requests) == 12
    refused = json.loads(tool_messages(model_server, 6)[0]["content"])
    assert refused["status"] == "error"
    assert "6 levels deep, deeper than the limit of 5" in refused["error"]


SUB_FLOW = flow_api.FlowSpec.model_validate(
    {
        "input": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "nodes": [{"id": "double", "transform": "={twice: (.run.input.n * 2)}"}],
    }
)


async def run_parent(
    server: ScriptedModelServer, flows: dict[str, flow_api.FlowSpec], **agent_fields: Any
) -> tuple[store.Outcome, store.MemoryStore]:
    resolver = graph.StaticResolver({"planner": agent(server, **agent_fields)}, flows)
    parent = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "plan", "agent": {"name": "planner", "prompt": "Plan."}}]}
    )
    memory = store.MemoryStore()
    outcome = await run.run_flow(
        graph.compile_flow(parent, resolver),
        run_name="r",
        input_value=None,
        store_=memory,
        caps=host.LiveCapabilities(resolver, env=server.env),
        resolver=resolver,
    )
    return outcome, memory


async def test_sub_flow_runs_inside_the_run_with_its_nodes_under_the_call_prefix(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(
        Reply.calls(ToolCall("call_sub_flow", {"flow": "doubler", "input": {"n": 21}}, id="c1")),
        Reply.text("42"),
    )
    outcome, memory = await run_parent(model_server, {"doubler": SUB_FLOW}, sub_flows=["doubler"])

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    [schema] = model_server.requests[0].body["tools"]
    assert schema["function"]["parameters"]["properties"]["flow"]["enum"] == ["doubler"]
    assert json.loads(tool_messages(model_server, 1)[0]["content"]) == {"twice": 42}
    sub_record = memory.checkpoint.nodes["plan/c1/double"]
    assert sub_record.phase == flowrun_api.NodePhase.SUCCEEDED
    assert sub_record.output["json"] == {"twice": 42}


async def test_sub_flows_nested_deeper_than_five_levels_fail_clearly_to_the_agent(
    model_server: ScriptedModelServer,
) -> None:
    # Each level is a flow whose agent calls the same flow again.
    recursive = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "step", "agent": {"name": "planner", "prompt": "Again."}}]}
    )
    again = ToolCall("call_sub_flow", {"flow": "again", "input": {}})
    model_server.script(
        *[Reply.calls(again) for _ in range(6)], *[Reply.text(f"up {i}") for i in range(6)]
    )
    outcome, memory = await run_parent(model_server, {"again": recursive}, sub_flows=["again"])

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    refused = json.loads(tool_messages(model_server, 6)[0]["content"])
    assert refused["status"] == "error"
    assert "deeper than" in refused["error"] and "5" in refused["error"]
    deepest = max(memory.checkpoint.nodes, key=lambda key: key.count("/"))
    assert deepest.count("step") == 5, deepest
