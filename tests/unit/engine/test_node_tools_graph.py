"""Validation of ``agent.nodeTools``: a tool node is out of the schedule, and misuse is named."""

from __future__ import annotations

from agentflows.api import agent as agent_api
from agentflows.engine import graph

from .helpers import flow_spec

RESOLVER = graph.StaticResolver(
    agents={"helper": agent_api.AgentSpec.model_validate({"model": {"name": "openai/test"}})}
)


def problems(text: str) -> list[str]:
    return [str(p) for p in graph.validate(flow_spec(text), RESOLVER)]


def test_tool_nodes_are_left_out_of_the_schedule_and_the_list_order() -> None:
    compiled = graph.compile_flow(
        flow_spec(
            """
nodes:
  - id: ask
    agent: {name: helper, prompt: hi, nodeTools: [{node: lookup, fields: [city]}]}
  - id: lookup
    transform: "=.args"
  - id: done
    transform: "=1"
"""
        ),
        RESOLVER,
    )
    assert list(compiled.nodes) == ["ask", "done"]
    assert compiled.nodes["ask"].successors == ["done"]
    assert list(compiled.tool_nodes) == ["lookup"]
    [offer] = compiled.nodes["ask"].node_tools
    assert offer.parameters["properties"] == {"city": {"type": "string"}}


def test_an_edge_into_a_tool_node_is_refused_at_its_path() -> None:
    found = problems(
        """
nodes:
  - id: ask
    agent: {name: helper, prompt: hi, nodeTools: [{node: lookup}]}
  - id: lookup
    transform: "=1"
edges:
  - {from: ask, to: lookup}
"""
    )
    assert found == [
        'spec.edges[0].to: node "lookup" is a tool (spec.nodes[0].agent.nodeTools[0]): it runs '
        "only when the agent calls it, so no edge may lead to it or from it"
    ]


def test_nodes_that_cannot_be_tools_are_refused_with_what_can() -> None:
    found = problems(
        """
nodes:
  - id: ask
    agent: {name: helper, prompt: hi, nodeTools: [{node: gate}, {node: ghost}]}
  - id: gate
    approval: {message: ok?}
"""
    )
    assert found == [
        'spec.nodes[0].agent.nodeTools[0].node: node "gate" (approval) cannot be a tool; a tool '
        "is one of agent, llm, tool, transform, flow",
        'spec.nodes[0].agent.nodeTools[1].node: no node "ghost"',
    ]


def test_a_tool_node_cannot_be_the_start_nor_offer_tools_itself() -> None:
    found = problems(
        """
nodes:
  - id: first
    agent: {name: helper, prompt: hi, nodeTools: [{node: second}]}
  - id: second
    agent: {name: helper, prompt: hi, nodeTools: [{node: first}]}
"""
    )
    assert sorted(found) == [
        'spec.nodes[0]: node "first" is a tool (spec.nodes[1].agent.nodeTools[0]) and cannot '
        "offer nodeTools itself",
        'spec.nodes[0]: node "first" is the start node, so it cannot be a tool '
        "(spec.nodes[1].agent.nodeTools[0]); move it after the node that starts the flow",
        'spec.nodes[1]: node "second" is a tool (spec.nodes[0].agent.nodeTools[0]) and cannot '
        "offer nodeTools itself",
    ]


def test_fields_merged_into_args_that_are_not_a_mapping_are_refused() -> None:
    found = problems(
        """
nodes:
  - id: ask
    agent: {name: helper, prompt: hi, nodeTools: [{node: call, fields: [q]}]}
  - id: call
    tool: {http: {url: "http://127.0.0.1:1/x"}, args: [1, 2]}
"""
    )
    assert found == [
        'spec.nodes[0].agent.nodeTools[0].fields: node "call" has a spec.nodes[1].tool.args '
        "that is not a mapping, so no field can be merged into it"
    ]
