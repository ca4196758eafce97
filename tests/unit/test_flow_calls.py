"""What a Flow reaches (``agentflows.api.calls``), and how each caller filters the one walk.

A tool node's Agent is a reference (its definition must exist and travel with the run) but
it does not run (its model, sub-agents and sub-flows are never called): the snapshot, the
Ready check and the cache's referrer index count it; the call-cycle check and the models a
local run needs keys for do not.
"""

from __future__ import annotations

from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import calls
from agentflows.api import flow as flow_api
from agentflows.cli import local
from agentflows.controller import cache, resolve
from agentflows.engine import graph
from agentflows.kube import snapshot

MODEL = {"name": "openai/test"}
ROOT = {
    "nodes": [
        {"id": "a", "agent": {"name": "writer", "prompt": "p"}},
        {"id": "t", "tool": {"agent": "tooler", "name": "search"}},
        {"id": "m", "map": {"items": "=[]", "tool": {"agent": "mapped-tooler", "name": "x"}}},
        {"id": "s", "flow": {"name": "sub"}},
    ],
    "edges": [{"from": "a", "to": "t"}, {"from": "t", "to": "m"}, {"from": "m", "to": "s"}],
}


def agent(**fields: Any) -> agent_api.AgentSpec:
    return agent_api.AgentSpec.model_validate({"model": MODEL, **fields})


def resolver() -> graph.StaticResolver:
    tool = [{"name": "search", "python": {"script": "print(1)"}}]
    return graph.StaticResolver(
        agents={
            "writer": agent(subAgents=["helper"], handoffs=["helper"]),
            "helper": agent(model={"name": "openai/helper"}),
            "tooler": agent(model={"name": "openai/tooler"}, tools=tool, subFlows=["root"]),
            "mapped-tooler": agent(tools=[{"name": "x", "python": {"script": "print(1)"}}]),
        },
        flows={
            "root": flow_api.FlowSpec.model_validate(ROOT),
            "sub": flow_api.FlowSpec.model_validate({"nodes": [{"id": "y", "transform": "=1"}]}),
        },
    )


def test_calls_name_each_agent_and_flow_with_how_it_is_called_and_its_field() -> None:
    found = calls.calls(flow_api.FlowSpec.model_validate(ROOT))
    assert [(c.kind, c.name, c.via, c.path, c.runs) for c in found] == [
        ("Agent", "writer", "agent", "spec.nodes[0].agent.name", True),
        ("Agent", "tooler", "tool", "spec.nodes[1].tool.agent", False),
        ("Agent", "mapped-tooler", "tool", "spec.nodes[2].map.tool.agent", False),
        ("Flow", "sub", "flow", "spec.nodes[3].flow.name", True),
    ]
    assert [c.path for c in calls.agent_calls(resolver().agents["writer"])] == [
        "spec.subAgents[0]",
        "spec.handoffs[0]",
    ]


def test_reach_follows_a_tool_nodes_agent_unless_the_caller_follows_only_what_runs() -> None:
    every = calls.reach("root", resolver())
    assert sorted(every.agents) == ["helper", "mapped-tooler", "tooler", "writer"]
    assert sorted(every.flows) == ["root", "sub"] and every.missing == []
    running = calls.reach("root", resolver(), calls.running)
    assert sorted(running.agents) == ["helper", "writer"]


def test_reach_names_what_is_missing_the_root_flow_too() -> None:
    lookup = graph.StaticResolver(flows={"root": flow_api.FlowSpec.model_validate(ROOT)})
    assert calls.reach("root", lookup).missing == [
        "Flow/sub",
        "Agent/writer",
        "Agent/tooler",
        "Agent/mapped-tooler",
    ]
    assert calls.reach("gone", lookup).missing == ["Flow/gone"]


def test_the_snapshot_ready_check_and_referrer_index_count_a_tool_nodes_agent() -> None:
    lookup = resolver()
    taken = snapshot.build_snapshot("root", lookup)
    assert sorted(taken.agents) == ["helper", "mapped-tooler", "tooler", "writer"]
    assert taken.agents["tooler"] == lookup.agents["tooler"].to_wire()
    ns = cache.Namespace(agents=lookup.agents, flows=lookup.flows)
    assert sorted(resolve.reach("root", ns).agents) == sorted(taken.agents)
    assert ("Agent", "tooler") in cache._flow_refs(lookup.flows["root"])


def test_a_tool_nodes_agent_is_no_call_cycle_and_calls_no_model() -> None:
    lookup = resolver()
    # tooler's subFlows name root, but a tool node never runs tooler's turn
    assert graph.validate(lookup.flows["root"], lookup, name="root") == []
    models = sorted(m.name for m in local.models_used("root", lookup))
    assert models == ["openai/helper", "openai/test"]


def test_a_tool_nodes_missing_agent_and_tool_are_named_at_their_fields() -> None:
    lookup = resolver()
    del lookup.agents["tooler"]
    lookup.agents["mapped-tooler"] = agent(tools=[{"name": "other", "python": {"script": "1"}}])
    found = [str(p) for p in graph.validate(lookup.flows["root"], lookup, name="root")]
    assert found == [
        'spec.nodes[1].tool.agent: no Agent "tooler"',
        'spec.nodes[2].map.tool.name: no tool "x" in Agent "mapped-tooler" (has: other)',
    ]
