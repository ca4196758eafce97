"""Validation sees what only a run used to find: sub-flow loops, trigger expressions, every bad arg."""

from __future__ import annotations

from agentflows.api import agent as agent_api
from agentflows.engine import graph

from .helpers import flow_spec

PING = """
nodes:
  - id: call
    flow: {name: pong}
"""
PONG = """
nodes:
  - id: fan
    map: {items: "=[1]", flow: {name: helper}}
"""


def test_flows_that_call_each_other_are_a_cycle_named_at_validation() -> None:
    resolver = graph.StaticResolver(
        flows={"ping": flow_spec(PING), "pong": flow_spec("nodes: [{id: c, flow: {name: ping}}]")}
    )
    found = [str(p) for p in graph.validate(flow_spec(PING), resolver, name="ping")]
    assert found == [
        "spec.nodes[0].flow.name: calls itself: Flow ping -> Flow pong -> Flow ping"
        " (sub-flow calls must not loop)"
    ]


def test_a_loop_through_a_map_body_and_an_agents_sub_flows_is_named() -> None:
    helper = agent_api.AgentSpec.model_validate(
        {"model": {"name": "openai/test"}, "subFlows": ["ping"]}
    )
    resolver = graph.StaticResolver(
        agents={"helper": helper},
        flows={
            "ping": flow_spec(PING),
            "pong": flow_spec(
                PONG.replace("flow: {name: helper}", "agent: {name: helper, prompt: p}")
            ),
        },
    )
    found = [str(p) for p in graph.validate(flow_spec(PING), resolver, name="ping")]
    assert found == [
        "spec.nodes[0].flow.name: calls itself: Flow ping -> Flow pong -> Agent helper ->"
        " Flow ping (sub-flow calls must not loop)"
    ]


def test_a_flow_calling_another_flow_twice_is_no_loop() -> None:
    resolver = graph.StaticResolver(flows={"leaf": flow_spec("nodes: [{id: a, transform: '=1'}]")})
    spec = flow_spec("""
nodes:
  - {id: a, flow: {name: leaf}}
  - id: b
    map: {items: "=[1, 2]", flow: {name: leaf}}
""")
    assert graph.validate(spec, resolver, name="root") == []


def test_trigger_input_and_filter_expressions_are_compiled_at_validation() -> None:
    spec = flow_spec("""
nodes: [{id: a, transform: "."}]
triggers:
  - name: k
    kubernetes: {apiVersion: v1, kind: Pod, filter: "[[[ not jq"}
  - name: hook
    webhook: {secret: {name: s, key: k}}
    input: {title: "=also ((( not jq", fine: "=.run.trigger"}
""")
    found = [str(p) for p in graph.validate(spec, graph.StaticResolver())]
    assert [p.split(": jq syntax error")[0] for p in found] == [
        "spec.triggers[0].kubernetes.filter",
        "spec.triggers[1].input.title",
    ]


def test_every_bad_expression_in_tool_args_is_reported_at_its_key() -> None:
    spec = flow_spec("""
nodes:
  - id: c
    tool:
      python: {script: "print(1)"}
      args:
        x: "=.nodes.a.json["
        nested: {deep: ["ok", "=.a | | b"]}
        y: "text {{ .run.input. }} more"
        fine: "=.run.input"
""")
    found = [str(p) for p in graph.validate(spec, graph.StaticResolver())]
    assert [p.split(": jq syntax error")[0] for p in found] == [
        "spec.nodes[0].tool.args.x",
        "spec.nodes[0].tool.args.nested.deep[1]",
        "spec.nodes[0].tool.args.y",
    ]


def test_a_schema_problem_does_not_hide_graph_problems() -> None:
    spec = flow_spec("""
input: {type: objekt}
nodes:
  - {id: a, transform: "=1"}
  - {id: orphan, transform: "=2"}
edges: [{from: a, to: ghost}]
""")
    found = [str(p) for p in graph.validate(spec, graph.StaticResolver())]
    assert found[0].startswith("spec.input.type: not a valid JSON Schema: type must be one of")
    assert 'spec.edges[0].to: no node "ghost"' in found
    assert any('node "orphan" is unreachable' in p for p in found)
