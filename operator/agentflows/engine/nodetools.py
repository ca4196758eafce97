"""Nodes offered to agents as tools (``agent.nodeTools``): which they are, and what they accept.

Called by :mod:`agentflows.engine.graph` while it validates and compiles a Flow; the calls
themselves run through :func:`agentflows.engine.nodes.run_node_tool`, the normal node
execution with the agent's arguments merged in.

Rules, written down because users will ask:
- A node listed in some agent's ``nodeTools`` is a *tool node*: it runs only when an agent
  calls it, never on its own. So no edge (nor a branch case) may lead to it or out of it, it
  cannot be the first node (the start), and with ``edges`` omitted the list order skips it.
- Only ``agent``, ``llm``, ``tool``, ``transform`` and ``flow`` nodes can be tools: a branch,
  a map or a human gate means nothing outside the graph.
- A tool node cannot offer node tools itself, so calls never recurse.
- The tool's parameters are the listed fields, all required. Their types come from where the
  node kind defines them: the string fields of ``llm``/``agent`` calls, the ``parameters`` of an
  Agent's tool, the ``input`` schema of a sub-flow; anything else is a string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from agentflows.api import flow as flow_api
from agentflows.engine import capabilities

#: Node kinds an agent may call as a tool.
TOOL_KINDS = ("agent", "llm", "tool", "transform", "flow")
_STRING = {"type": "string"}

Report = Callable[[str, str], None]


def _agent_calls(node: flow_api.Node, path: str) -> Iterator[tuple[str, flow_api.AgentCall]]:
    if node.agent is not None:
        yield f"{path}.agent", node.agent
    if node.map is not None and node.map.agent is not None:
        yield f"{path}.map.agent", node.map.agent


def tool_nodes(spec: flow_api.FlowSpec) -> dict[str, str]:
    """Each node id some agent offers as a tool, with the path of its first listing."""
    found: dict[str, str] = {}
    for index, node in enumerate(spec.nodes):
        for where, call in _agent_calls(node, f"spec.nodes[{index}]"):
            for n, entry in enumerate(call.node_tools):
                found.setdefault(entry.node, f"{where}.nodeTools[{n}]")
    return found


def check(spec: flow_api.FlowSpec, tools: dict[str, str], report: Report) -> None:
    """Report every broken nodeTools rule (see the module docstring) at its field path."""
    by_id = {node.id: (index, node) for index, node in reversed(list(enumerate(spec.nodes)))}
    for index, node in enumerate(spec.nodes):
        for where, call in _agent_calls(node, f"spec.nodes[{index}]"):
            for n, entry in enumerate(call.node_tools):
                _check_entry(entry, f"{where}.nodeTools[{n}]", by_id, report)
    for node_id, listed in tools.items():
        if node_id not in by_id:
            continue
        index, node = by_id[node_id]
        if index == 0:
            report(
                f"spec.nodes[{index}]",
                f'node "{node_id}" is the start node, so it cannot be a tool ({listed}); '
                "move it after the node that starts the flow",
            )
        if any(call.node_tools for _, call in _agent_calls(node, "")):
            report(
                f"spec.nodes[{index}]",
                f'node "{node_id}" is a tool ({listed}) and cannot offer nodeTools itself',
            )
    _check_edges(spec, tools, report)


def _check_entry(
    entry: flow_api.NodeTool,
    path: str,
    by_id: dict[str, tuple[int, flow_api.Node]],
    report: Report,
) -> None:
    if entry.node not in by_id:
        report(f"{path}.node", f'no node "{entry.node}"')
        return
    index, node = by_id[entry.node]
    if node.kind not in TOOL_KINDS:
        report(
            f"{path}.node",
            f'node "{entry.node}" ({node.kind}) cannot be a tool; a tool is one of '
            + ", ".join(TOOL_KINDS),
        )
        return
    if len(set(entry.fields)) != len(entry.fields):
        report(f"{path}.fields", "each field may be listed once")
    holder = _merge_target(node)
    if entry.fields and holder is not None and not _may_be_mapping(holder[1]):
        report(
            f"{path}.fields",
            f'node "{entry.node}" has a spec.nodes[{index}].{holder[0]} that is not a mapping, '
            "so no field can be merged into it",
        )


def _may_be_mapping(value: Any) -> bool:
    """A mapping, nothing, or an expression (whose value is checked when the node runs)."""
    return value is None or isinstance(value, dict) or str(value).startswith("=")


def _merge_target(node: flow_api.Node) -> tuple[str, Any] | None:
    """Where a node merges an agent's fields: a tool's ``args``, a flow's ``input``, else None."""
    if node.tool is not None:
        return "tool.args", node.tool.args
    if node.flow is not None:
        return "flow.input", node.flow.input
    return None


def _check_edges(spec: flow_api.FlowSpec, tools: dict[str, str], report: Report) -> None:
    def refuse(path: str, node_id: str) -> None:
        report(
            path,
            f'node "{node_id}" is a tool ({tools[node_id]}): it runs only when the agent '
            "calls it, so no edge may lead to it or from it",
        )

    for index, edge in enumerate(spec.edges):
        for end, value in (("from", edge.from_), ("to", edge.to)):
            if value in tools:
                refuse(f"spec.edges[{index}].{end}", value)
    for index, node in enumerate(spec.nodes):
        if node.branch is None:
            continue
        for case, target in node.branch.cases.items():
            if target in tools:
                refuse(f"spec.nodes[{index}].branch.cases.{case}", target)
        if node.branch.default in tools:
            refuse(f"spec.nodes[{index}].branch.default", node.branch.default)


def offers(
    call: flow_api.AgentCall, spec: flow_api.FlowSpec, resolver: capabilities.Resolver
) -> list[capabilities.NodeToolOffer]:
    """The tools one agent call offers (its nodeTools must have passed :func:`check`)."""
    by_id = {node.id: node for node in reversed(spec.nodes)}
    found = []
    for entry in call.node_tools:
        node = by_id[entry.node]
        properties = {f: _field_schema(node, f, resolver) for f in entry.fields}
        found.append(
            capabilities.NodeToolOffer(
                node=node.id,
                kind=node.kind,
                description=entry.description
                or node.description
                or f'Run the flow\'s {node.kind} node "{node.id}" and get its output.',
                parameters={
                    "type": "object",
                    "properties": properties,
                    "required": list(entry.fields),
                    "additionalProperties": False,
                },
            )
        )
    return found


def _field_schema(node: flow_api.Node, field: str, resolver: capabilities.Resolver) -> Any:
    """The JSON Schema of one field, from where the node kind defines it (else a string)."""
    if node.llm is not None or node.agent is not None:
        model = flow_api.LlmCall if node.llm is not None else flow_api.AgentCall
        info = model.model_fields.get(field)
        if info is not None and info.annotation in (str, "str"):
            return dict(_STRING)
    if node.tool is not None and node.tool.agent is not None:
        agent = resolver.agent(node.tool.agent)
        declared = (
            next((t for t in agent.tools if t.name == node.tool.name), None) if agent else None
        )
        found = _property(declared.parameters if declared else None, field)
        if found is not None:
            return found
    if node.flow is not None:
        sub = resolver.flow(node.flow.name)
        found = _property(sub.input if sub is not None else None, field)
        if found is not None:
            return found
    return dict(_STRING)


def _property(schema: Any, field: str) -> Any:
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        found = schema["properties"].get(field)
        return found if isinstance(found, dict) else None
    return None
