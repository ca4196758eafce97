"""Graph rules of an Agent Spec Flow, checked before anything runs; every problem has a path.

The rules of the reference runtime, plus what the agentflows engine needs:
- ``start_node`` is a StartNode of ``nodes``; node ids are unique; edges name nodes of the flow.
- Every node is reachable from the start node. A node with several unconditional outgoing
  edges does NOT fan out: the first edge listed is taken, so a node reached only through a
  later one is reported as never reached.
- A reachable EndNode exists, and no reachable node other than an EndNode is a dead end (a
  branch it can leave on with no edge).
- A BranchingNode mapping to a branch no edge leaves on, and an edge labelled with a branch
  its source never selects, are refused.
- A data edge reads an output its source can produce (an LlmNode without declared outputs
  produces only ``generated_text``) and writes an input its destination has, both nodes of the
  flow.
- The control flow may loop (through a BranchingNode, whose branch out of the loop is its
  exit): the engine checks the loop and bounds it by the Flow's ``limits.maxIterations``.
"""

from __future__ import annotations

import dataclasses
import json
import re

from agentflows.agentspec import errors, model
from agentflows.api import documents

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
BRANCHING_INPUT = "branching_mapping_key"
#: The branch a CatchExceptionNode leaves on when its sub-flow failed, and the output saying why.
CAUGHT_BRANCH = "caught_exception_branch"
CAUGHT_INFO = "caught_exception_info"
DEFAULT_OUTPUTS = {
    "LlmNode": "generated_text",
    "ApiNode": "response",
    "InputMessageNode": "user_input",
}


def key(component: model.Component) -> str:
    """The identity of a component: its id, else its name."""
    return component.id or f"name:{component.name}"


def titles(properties: list[model.Property] | None) -> list[str]:
    """The titles of a property list."""
    return [str(p.get("title")) for p in properties or []]


def placeholders(*texts: object) -> list[str]:
    """The ``{{name}}`` placeholders in strings (nested in lists and mappings too), in order."""
    found: list[str] = []

    def visit(value: object) -> None:
        if isinstance(value, str):
            found.extend(n for n in PLACEHOLDER.findall(value) if n not in found)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)

    for text in texts:
        visit(text)
    return found


def effective_agent(component: model.AgenticComponent) -> model.Agent:
    """The one Agent an agentic component runs as (its workers come from :func:`workers_of`).

    A SpecializedAgent is its agent with the additional instructions after the system prompt
    and the additional tools after its tools; a ManagerWorkers is its group manager, named and
    typed (inputs, outputs) as the ManagerWorkers when it declares them.
    """
    if isinstance(component, model.Agent):
        return component
    if isinstance(component, model.SpecializedAgent):
        base, extra = component.agent, component.agent_specialization_parameters
        prompt = "\n\n".join(p for p in (base.system_prompt, extra.additional_instructions) if p)
        merged: dict[str, object] = {
            "name": component.name,
            "id": component.id,
            "system_prompt": prompt,
            "tools": [*base.tools, *(extra.additional_tools or [])],
            "inputs": _merged(base.inputs, extra.inputs, component.inputs),
            "outputs": _merged(base.outputs, extra.outputs, component.outputs),
        }
        if extra.human_in_the_loop is not None:
            merged["human_in_the_loop"] = extra.human_in_the_loop
        return base.model_copy(update=merged)
    manager = effective_agent(component.group_manager)
    update: dict[str, object] = {"name": component.name, "id": component.id}
    for field in ("inputs", "outputs"):
        if getattr(component, field) is not None:
            update[field] = getattr(component, field)
    return manager.model_copy(update=update)


def _merged(*lists: list[model.Property] | None) -> list[model.Property] | None:
    if lists[-1] is not None:
        return lists[-1]
    seen: dict[str, model.Property] = {}
    for properties in lists[:-1]:
        for prop in properties or []:
            seen.setdefault(str(prop.get("title")), prop)
    return list(seen.values()) if any(p is not None for p in lists[:-1]) else None


def agent_io(
    component: model.AgenticComponent | model.A2AAgent,
) -> tuple[list[model.Property] | None, list[model.Property] | None]:
    """The inputs and outputs an AgentNode's agent declares."""
    if isinstance(component, model.A2AAgent):
        return component.inputs, component.outputs
    agent = effective_agent(component)
    return agent.inputs, agent.outputs


def workers_of(component: model.AgenticComponent) -> list[model.AgenticComponent]:
    """The workers a ManagerWorkers' manager may call (its own group manager's too)."""
    if isinstance(component, model.ManagerWorkers):
        return [*workers_of(component.group_manager), *component.workers]
    return []


@dataclasses.dataclass
class SwarmPlan:
    """Who in a Swarm may reach whom, by component key."""

    #: The agents, the first agent first, then in the order the relationships name them.
    agents: dict[str, model.AgenticComponent]
    #: Caller -> the recipients it sends messages to (their answer comes back).
    messages: dict[str, list[str]]
    #: Caller -> the recipients it may hand the conversation over to.
    handoffs: dict[str, list[str]]
    #: Agent -> where the document first writes it.
    paths: dict[str, str]


def swarm_plan(swarm: model.Swarm) -> SwarmPlan:
    """The agents and relationships of a Swarm; SpecInvalid on a pair it cannot run."""
    mode = swarm.handoff
    if isinstance(mode, bool):
        mode = "optional" if mode else "never"
    agents = {key(swarm.first_agent): swarm.first_agent}
    paths = {key(swarm.first_agent): "first_agent"}
    named: dict[str, str] = {swarm.first_agent.name: key(swarm.first_agent)}
    pairs: list[tuple[str, str]] = []
    found: list[documents.Problem] = []
    for i, (caller, recipient) in enumerate(swarm.relationships):
        for j, agent in enumerate((caller, recipient)):
            if named.setdefault(agent.name, key(agent)) != key(agent):
                found.append(errors.problem(
                    f"relationships[{i}][{j}]",
                    f"two different agents are named {agent.name!r}; give each its own name",
                ))  # fmt: skip
            agents.setdefault(key(agent), agent)
            paths.setdefault(key(agent), f"relationships[{i}][{j}]")
        pair = (key(caller), key(recipient))
        if pair[0] == pair[1]:
            found.append(errors.problem(f"relationships[{i}]", f"{caller.name!r} talks to itself"))
        elif pair in pairs:
            found.append(errors.problem(
                f"relationships[{i}]", f"{caller.name!r} -> {recipient.name!r} is listed twice"
            ))  # fmt: skip
        pairs.append(pair)
    if not any(key(swarm.first_agent) in pair for pair in pairs):
        found.append(errors.problem(
            "first_agent",
            f"{swarm.first_agent.name!r} is in no relationship: the swarm could not reach "
            "another agent (use an Agent instead)",
        ))  # fmt: skip
    if found:
        raise errors.SpecInvalid(found)
    recipients = {k: [r for c, r in dict.fromkeys(pairs) if c == k] for k in agents}
    empty: dict[str, list[str]] = {k: [] for k in agents}
    return SwarmPlan(
        agents,
        empty if mode == "always" else recipients,
        empty if mode == "never" else recipients,
        paths,
    )


def end_nodes(flow: model.Flow) -> list[model.EndNode]:
    """The flow's EndNodes."""
    return [n for n in flow.nodes if isinstance(n, model.EndNode)]


def flow_inputs(flow: model.Flow) -> list[model.Property]:
    """The flow's inputs: declared, else its StartNode's."""
    if flow.inputs is not None:
        return flow.inputs
    start = flow.start_node
    return start.outputs or start.inputs or []


def flow_outputs(flow: model.Flow) -> list[model.Property]:
    """The flow's outputs: declared, else the inputs of its EndNodes."""
    if flow.outputs is not None:
        return flow.outputs
    seen: dict[str, model.Property] = {}
    for end in end_nodes(flow):
        for prop in end.inputs or end.outputs or []:
            seen.setdefault(str(prop.get("title")), prop)
    return list(seen.values())


def outputs_of(node: model.Node) -> list[str]:
    """The outputs a node can produce."""
    if isinstance(node, model.StartNode):
        return titles(node.outputs or node.inputs)
    if isinstance(node, (model.EndNode, model.BranchingNode, model.OutputMessageNode)):
        return []
    if isinstance(node, model.AgentNode):
        return titles(node.outputs or agent_io(node.agent)[1])
    if isinstance(node, model.ToolNode):
        return titles(node.outputs or node.tool.outputs)
    if isinstance(node, model.FlowNode):
        return titles(node.outputs or flow_outputs(node.subflow))
    if isinstance(node, model.ParallelFlowNode):
        return titles(node.outputs) or [t for f in node.subflows for t in titles(flow_outputs(f))]
    if isinstance(node, model.CatchExceptionNode):
        return [*titles(caught_outputs(node)), CAUGHT_INFO]
    if isinstance(node, model.MapNode):
        return [f"collected_{t}" for t in reducers(node)]
    if node.outputs:
        return titles(node.outputs)
    return [DEFAULT_OUTPUTS[node.component_type]]


def reducers(node: model.MapNode) -> dict[str, str]:
    """Output title -> reduction of a map node (append for every sub-flow output by default)."""
    if node.reducers is not None:
        return dict(node.reducers)
    return {t: "append" for t in titles(flow_outputs(node.subflow))}


def inputs_of(node: model.Node) -> list[str]:
    """The inputs a node reads."""
    if isinstance(node, model.StartNode):
        return []
    if node.inputs is not None and not isinstance(node, model.MapNode):
        return titles(node.inputs)
    if isinstance(node, model.EndNode):
        return titles(node.outputs)
    if isinstance(node, model.LlmNode):
        return placeholders(node.prompt_template)
    if isinstance(node, model.AgentNode):
        if isinstance(node.agent, model.A2AAgent):
            return titles(node.agent.inputs)
        agent = effective_agent(node.agent)
        return (
            titles(agent.inputs) if agent.inputs is not None else placeholders(agent.system_prompt)
        )
    if isinstance(node, model.ToolNode):
        return titles(node.tool.inputs)
    if isinstance(node, model.BranchingNode):
        return [BRANCHING_INPUT]
    if isinstance(node, (model.FlowNode, model.CatchExceptionNode)):
        return titles(flow_inputs(node.subflow))
    if isinstance(node, model.ParallelFlowNode):
        return list(dict.fromkeys(t for f in node.subflows for t in titles(flow_inputs(f))))
    if isinstance(node, model.MapNode):
        return titles(node.inputs) or [f"iterated_{t}" for t in titles(flow_inputs(node.subflow))]
    if isinstance(node, model.ApiNode):
        return placeholders(node.url, node.data, node.headers, node.query_params)
    return placeholders(node.message or "")


def branches_of(node: model.Node) -> list[str]:
    """The branches a node can leave on."""
    if isinstance(node, model.EndNode):
        return []
    if isinstance(node, model.BranchingNode):
        return [*dict.fromkeys(node.mapping.values()), model.DEFAULT_BRANCH]
    if isinstance(node, model.FlowNode):
        return branches_of_flow(node.subflow)
    if isinstance(node, model.CatchExceptionNode):
        return [CAUGHT_BRANCH, *branches_of_flow(node.subflow)]
    return [model.NEXT]


def caught_outputs(node: model.CatchExceptionNode) -> list[model.Property]:
    """A CatchExceptionNode's outputs but the exception info (node's, else the sub-flow's).

    Each needs the default it gives when the sub-flow failed.
    """
    if node.outputs is not None:
        return [p for p in node.outputs if p.get("title") != CAUGHT_INFO]
    return flow_outputs(node.subflow)


def branches_of_flow(flow: model.Flow) -> list[str]:
    """The branches a flow ends on (its EndNodes' ``branch_name``)."""
    return list(dict.fromkeys(e.branch_name for e in end_nodes(flow))) or [model.NEXT]


@dataclasses.dataclass
class Graph:
    """A flow's nodes by key, with the edges the engine will take."""

    flow: model.Flow
    nodes: dict[str, model.Node]
    index: dict[str, int]
    #: (source key, branch) -> target key: the first edge listed for that branch.
    taken: dict[tuple[str, str], str]
    reachable: list[str]


def _edge_problems(
    flow: model.Flow, nodes: dict[str, model.Node], out: list[documents.Problem]
) -> dict[tuple[str, str], str]:
    taken: dict[tuple[str, str], str] = {}
    for i, edge in enumerate(flow.control_flow_connections):
        path = f"control_flow_connections[{i}]"
        source, target = key(edge.from_node), key(edge.to_node)
        bad = False
        for field, node_key in (("from_node", source), ("to_node", target)):
            if node_key not in nodes:
                out.append(
                    errors.problem(
                        f"{path}.{field}", f"node {node_key!r} is not in this flow's nodes"
                    )
                )
                bad = True
        if bad:
            continue
        branch = edge.from_branch or model.NEXT
        selects = branches_of(nodes[source])
        if branch not in selects:
            said = ", ".join(selects) or "none: it ends the flow"
            out.append(
                errors.problem(
                    f"{path}.from_branch",
                    f"{source} never selects branch {branch!r} (its branches: {said})",
                )
            )
            continue
        taken.setdefault((source, branch), target)
    return taken


def _walk(start: str, edges: dict[tuple[str, str], str] | list[tuple[str, str]]) -> list[str]:
    pairs = [(s, t) for (s, _), t in edges.items()] if isinstance(edges, dict) else edges
    seen = [start]
    for node in seen:
        seen.extend(t for s, t in pairs if s == node and t not in seen)
    return seen


def build(flow: model.Flow, out: list[documents.Problem]) -> Graph | None:
    """Check the flow's structure into ``out``; the graph when it can be built."""
    nodes: dict[str, model.Node] = {}
    index: dict[str, int] = {}
    for i, node in enumerate(flow.nodes):
        if key(node) in nodes:
            out.append(errors.problem(f"nodes[{i}].id", f"duplicate node {key(node)!r}"))
        nodes[key(node)] = node
        index.setdefault(key(node), i)
    start = key(flow.start_node)
    if not isinstance(flow.start_node, model.StartNode):
        out.append(
            errors.problem(
                "start_node", f"{start} is a {flow.start_node.component_type}, not a StartNode"
            )
        )
        return None
    if start not in nodes:
        out.append(errors.problem("start_node", f"{start} is not one of the flow's nodes"))
        return None
    for i, node in enumerate(flow.nodes):
        if isinstance(node, model.StartNode) and key(node) != start:
            out.append(errors.problem(f"nodes[{i}]", "a second StartNode (a flow has one)"))
    taken = _edge_problems(flow, nodes, out)
    return Graph(flow, nodes, index, taken, _walk(start, taken))


def _reach_problems(graph: Graph, out: list[documents.Problem]) -> None:
    every = [
        (key(e.from_node), key(e.to_node))
        for e in graph.flow.control_flow_connections
        if key(e.from_node) in graph.nodes and key(e.to_node) in graph.nodes
    ]
    loose = _walk(key(graph.flow.start_node), every)
    for node_key, node in graph.nodes.items():
        path = f"nodes[{graph.index[node_key]}]"
        if node_key not in graph.reachable:
            why = (
                "reached only through an edge that is never taken (a node with several "
                "outgoing edges on one branch takes the first)"
                if node_key in loose
                else "not reachable from the start node"
            )
            out.append(errors.problem(path, f"{node.component_type} {node.name!r} is {why}"))
            continue
        for branch in branches_of(node):
            if (node_key, branch) in graph.taken:
                continue
            if isinstance(node, model.BranchingNode) and branch != model.DEFAULT_BRANCH:
                keys = [k for k, v in node.mapping.items() if v == branch]
                out.append(
                    errors.problem(
                        f"{path}.mapping.{keys[0]}",
                        f"maps to branch {branch!r}, but no control edge leaves "
                        f"{node.name!r} on it",
                    )
                )
            else:
                out.append(
                    errors.problem(
                        path,
                        f"{node.component_type} {node.name!r} is a dead end: no control edge "
                        f"leaves it on branch {branch!r} (only an EndNode ends a flow)",
                    )
                )
    if not any(isinstance(graph.nodes[k], model.EndNode) for k in graph.reachable):
        out.append(errors.problem("nodes", "no EndNode is reachable from the start node"))


def _data_problems(graph: Graph, out: list[documents.Problem]) -> None:
    for i, edge in enumerate(graph.flow.data_flow_connections or []):
        path = f"data_flow_connections[{i}]"
        ends = (
            ("source_node", key(edge.source_node), "source_output", edge.source_output, outputs_of),
            (
                "destination_node",
                key(edge.destination_node),
                "destination_input",
                edge.destination_input,
                inputs_of,
            ),
        )
        for node_field, node_key, name_field, name, produces in ends:
            node = graph.nodes.get(node_key)
            if node is None:
                out.append(
                    errors.problem(
                        f"{path}.{node_field}", f"node {node_key!r} is not in this flow's nodes"
                    )
                )
                continue
            have = produces(node)
            if name not in have:
                verb = "produces" if name_field == "source_output" else "reads"
                out.append(
                    errors.problem(
                        f"{path}.{name_field}",
                        f"{node.component_type} {node.name!r} has no {name_field.split('_')[1]} "
                        f"{name!r} (it {verb}: {', '.join(have) or 'none'})",
                    )
                )


def _parallel_problems(node: model.ParallelFlowNode, path: str) -> list[documents.Problem]:
    """Sub-flows of a ParallelFlowNode give distinct outputs and type a shared input alike.

    The node has one input per name, given to every sub-flow that takes it, so sub-flows
    declaring an input of one name with different types cannot all be given it.
    """
    out, seen = _parallel_input_problems(node, path), set()
    for j, subflow in enumerate(node.subflows):
        for title in titles(flow_outputs(subflow)):
            if title in seen:
                out.append(
                    errors.problem(
                        f"{path}.subflows[{j}]",
                        f"output {title!r} comes from two sub-flows of ParallelFlowNode "
                        f"{node.name!r}; outputs of parallel sub-flows must have distinct names",
                    )
                )
            seen.add(title)
    return out


def _parallel_input_problems(node: model.ParallelFlowNode, path: str) -> list[documents.Problem]:
    out: list[documents.Problem] = []
    first: dict[str, tuple[int, dict[str, object]]] = {}
    for j, subflow in enumerate(node.subflows):
        for prop in flow_inputs(subflow):
            title = str(prop.get("title"))
            kind = {k: v for k, v in prop.items() if k not in _NOT_TYPE}
            if title not in first:
                first[title] = (j, kind)
            elif first[title][1] != kind:
                out.append(
                    errors.problem(
                        f"{path}.subflows[{j}]",
                        f"input {title!r} of ParallelFlowNode {node.name!r} is "
                        f"{json.dumps(kind)} here but {json.dumps(first[title][1])} in "
                        f"subflows[{first[title][0]}]; sub-flows run in parallel share their "
                        "inputs by name: give the inputs one type or distinct names",
                    )
                )
    return out


def _map_input_problems(node: model.MapNode, path: str) -> list[documents.Problem]:
    """Each declared input of a MapNode names a sub-flow input, with or without ``iterated_``.

    ``iterated_<t>`` is a list mapped over (or one value for every item); an input named as
    the sub-flow's ``<t>`` is one value for every item (WayFlow maps such an input name to
    name; pyagentspec infers only ``iterated_`` inputs). Any other name would reach nothing.
    """
    inner = titles(flow_inputs(node.subflow))
    out = []
    for j, title in enumerate(titles(node.inputs)):
        if title in inner or title.removeprefix("iterated_") in inner:
            continue
        valid = ", ".join(f"iterated_{t}" for t in inner) or "none: the sub-flow takes no input"
        out.append(
            errors.problem(
                f"{path}.inputs[{j}].title",
                f"{node.component_type} {node.name!r} has input {title!r}, but its sub-flow has "
                f"no input {title.removeprefix('iterated_')!r}; name an input "
                f"iterated_<sub-flow input> ({valid})",
            )
        )
    return out


#: Property keys that document a property rather than say what values it takes.
_NOT_TYPE = frozenset({"title", "description", "default", "examples"})


def _catch_problems(node: model.CatchExceptionNode, path: str) -> list[documents.Problem]:
    """Every output of a CatchExceptionNode has a default (its value when the sub-flow failed)."""
    out = []
    for prop in caught_outputs(node):
        if "default" not in prop:
            out.append(
                errors.problem(
                    f"{path}.outputs",
                    f"output {prop.get('title')!r} of CatchExceptionNode {node.name!r} needs a "
                    "default: it is the value when the sub-flow fails",
                )
            )
    if CAUGHT_BRANCH in branches_of_flow(node.subflow):
        out.append(
            errors.problem(
                f"{path}.subflow",
                f"an EndNode of the sub-flow ends on {CAUGHT_BRANCH!r}, "
                "the branch taken when the sub-flow fails; rename it",
            )
        )
    return out


def check(flow: model.Flow, prefix: str = "") -> Graph:
    """The flow's graph, or SpecInvalid with every problem (sub-flows checked too)."""
    out: list[documents.Problem] = []
    graph = build(flow, out)
    if graph is not None:
        _reach_problems(graph, out)
        _data_problems(graph, out)
    for i, node in enumerate(flow.nodes):
        one = (model.FlowNode, model.MapNode, model.CatchExceptionNode)
        subflows = {"subflow": node.subflow} if isinstance(node, one) else {}
        if isinstance(node, model.CatchExceptionNode):
            out += _catch_problems(node, f"nodes[{i}]")
        if isinstance(node, model.MapNode):
            out += _map_input_problems(node, f"nodes[{i}]")
        if isinstance(node, model.ParallelFlowNode):
            subflows = {f"subflows[{j}]": f for j, f in enumerate(node.subflows)}
            out += _parallel_problems(node, f"nodes[{i}]")
        for where, subflow in subflows.items():
            try:
                check(subflow, f"nodes[{i}].{where}")
            except errors.SpecInvalid as exc:
                out.extend(exc.problems)
    if prefix:
        out = [dataclasses.replace(p, path=f"{prefix}.{p.path}" if p.path else prefix) for p in out]
    if out:
        raise errors.SpecInvalid(out)
    assert graph is not None
    return graph
