"""Validate a Flow and compile it into a :class:`CompiledFlow` the run loop executes.

Validation collects every problem (path + message) instead of stopping at the first. Compiling
fixes the graph: edges (list order when ``edges`` is empty), the branch that takes each edge,
predecessors and successors, and every expression compiled.

Graph rules, written down because users will ask:
- The first node is the start. Every other node needs an incoming edge (an explicit edge or a
  branch case); a node with none is "unreachable". This catches the common mistake of a node
  that was added but never wired.
- Edges may go back (a loop, :mod:`agentflows.engine.loops`): every loop needs a branch with a
  way out, loops do not share nodes, and each is bounded by its re-entry node's
  ``maxIterations`` (else ``spec.limits.maxIterations``).
- Calls between Flows are acyclic: given its own name, validation names a chain of sub-flow
  calls (through ``flow`` and ``map`` nodes and Agents' ``subFlows``) that
  comes back to the Flow, which would otherwise fail only at run time, five levels deep.
- Every expression is compiled, trigger ``input`` and ``filter`` included; a bad one inside a
  free-form value (``tool.args``) is reported at its own key. Every JSON Schema is checked by
  :mod:`agentflows.api.schemas` (no remote references, no loops that never end).
- Edges out of a branch node are taken only toward the chosen target; an edge's ``branch`` label,
  when given, must name a case (or ``default``) that leads to that target. Case targets are
  edges even when not listed under ``edges``.
- With ``edges`` empty, nodes run in list order, except that a branch node's successors are its
  case targets and default (the list-order edge out of it is dropped).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentflows.api import agent as agent_api
from agentflows.api import calls, errors, schemas
from agentflows.api import flow as flow_api
from agentflows.api import snapshot as snapshot_api
from agentflows.engine import capabilities, expressions, loops, nodetools
from agentflows.engine.loops import Loop

if TYPE_CHECKING:  # imported when a problem is found: a runner compiles a valid Flow without
    # the YAML reader that api.documents brings (issue 25: runner start -> first request)
    from agentflows.api import documents

DEFAULT_CASE = "default"


@dataclasses.dataclass(frozen=True)
class CompiledEdge:
    """An edge with, for edges out of a branch node, the target that must be chosen."""

    source: str
    target: str


@dataclasses.dataclass
class CompiledNode:
    """A node with its compiled expressions."""

    id: str
    index: int
    spec: flow_api.Node
    kind: str
    templates: dict[str, expressions.Template]
    predecessors: list[str] = dataclasses.field(default_factory=list)
    successors: list[str] = dataclasses.field(default_factory=list)
    #: The nodes its agent (or map agent) may call as tools.
    node_tools: list[capabilities.NodeToolOffer] = dataclasses.field(default_factory=list)
    #: Targets of its back edges (loop heads it re-enters); not in ``successors``.
    back_to: list[str] = dataclasses.field(default_factory=list)
    #: The head of the loop whose body it is in, if any.
    loop: str | None = None


@dataclasses.dataclass
class CompiledFlow:
    """A validated flow, ready to run."""

    spec: flow_api.FlowSpec
    nodes: dict[str, CompiledNode]
    start: str
    output: expressions.Template | None
    sinks: list[str]
    #: Nodes offered to agents as tools: run only when called, never scheduled.
    tool_nodes: dict[str, CompiledNode] = dataclasses.field(default_factory=dict)
    #: Loops by head (the node each re-enters).
    loops: dict[str, Loop] = dataclasses.field(default_factory=dict)


class FlowInvalid(errors.AgentflowsError):
    """A flow did not validate; ``problems`` lists every reason."""

    def __init__(self, problems: list[documents.Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


class _Collector:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.problems: list[documents.Problem] = []

    def add(self, path: str, message: str) -> None:
        from agentflows.api import documents

        full = f"{self.prefix}.{path}" if path and self.prefix else (path or self.prefix)
        self.problems.append(documents.Problem(full, message))

    def template(self, path: str, value: Any, *, expression: bool = False) -> expressions.Template:
        try:
            if expression:
                return expressions.compile_expression(value)
            return expressions.compile_template(value)
        except expressions.ExpressionError as exc:
            # A bad leaf is reported at its own key; a problem of the whole value (its size)
            # has no leaf to blame and is reported at the value's path.
            if not (isinstance(value, (dict, list)) and self._each_leaf(path, value)):
                self.add(path, str(exc))
            return expressions.Template("literal", value=None)

    def _each_leaf(self, path: str, value: Any) -> int:
        """Report every bad expression inside a mapping or list, each at its own path.

        Returns how many were reported.
        """
        found = 0
        stack = [(path, value)]
        while stack:
            where, item = stack.pop()
            if isinstance(item, dict):
                stack.extend((f"{where}.{key}", child) for key, child in reversed(item.items()))
            elif isinstance(item, list):
                stack.extend(
                    (f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item)))
                )
            elif isinstance(item, str):
                try:
                    expressions.compile_template(item)
                except expressions.ExpressionError as exc:
                    self.add(where, str(exc))
                    found += 1
        return found


def _node_templates(
    node: flow_api.Node, path: str, out: _Collector
) -> dict[str, expressions.Template]:
    t: dict[str, expressions.Template] = {}
    if node.agent is not None:
        t["prompt"] = out.template(f"{path}.agent.prompt", node.agent.prompt)
        _memory_templates(node.agent, f"{path}.agent", out, t)
        if node.agent.history is not None:
            where = f"{path}.agent.history"
            t["history"] = out.template(where, node.agent.history, expression=True)
        if node.agent.answer is not None:
            _check_answer(node.agent.answer, f"{path}.agent.answer", out)
    elif node.llm is not None:
        t["prompt"] = out.template(f"{path}.llm.prompt", node.llm.prompt)
        t["system"] = out.template(f"{path}.llm.system", node.llm.system)
        _check_schema(node.llm.output_schema, f"{path}.llm.outputSchema", out)
    elif node.tool is not None:
        t["args"] = out.template(f"{path}.tool.args", node.tool.args)
    elif node.transform is not None:
        t["transform"] = out.template(f"{path}.transform", node.transform, expression=True)
    elif node.branch is not None:
        t["value"] = out.template(f"{path}.branch.value", node.branch.value, expression=True)
    elif node.map is not None:
        body = node.map
        t["items"] = out.template(f"{path}.map.items", body.items, expression=True)
        if body.agent is not None:
            t["prompt"] = out.template(f"{path}.map.agent.prompt", body.agent.prompt)
            _memory_templates(body.agent, f"{path}.map.agent", out, t)
        elif body.tool is not None:
            t["args"] = out.template(f"{path}.map.tool.args", body.tool.args)
        elif body.flow is not None:
            t["input"] = out.template(f"{path}.map.flow.input", body.flow.input)
    elif node.approval is not None:
        t["message"] = out.template(f"{path}.approval.message", node.approval.message)
        t["summary"] = out.template(f"{path}.approval.summary", node.approval.summary)
    elif node.input is not None:
        t["message"] = out.template(f"{path}.input.message", node.input.message)
        _check_schema(node.input.schema_, f"{path}.input.schema", out)
    elif node.flow is not None:
        t["input"] = out.template(f"{path}.flow.input", node.flow.input)
    return t


def memory_template(value: str) -> expressions.Template:
    """Compile a ``session`` or ``request``: an expression, or a template.

    ``={{ .run.input.ticket }}`` is read as the template ``{{ .run.input.ticket }}``: that is
    how the field is written in the docs, and as jq ``{{ ... }}`` would never compile.
    Raises ExpressionError on a bad one.
    """
    if value.startswith("={{"):
        value = value[1:]
    return expressions.compile_template(value)


def _memory_templates(
    call: flow_api.AgentCall, path: str, out: _Collector, t: dict[str, expressions.Template]
) -> None:
    """The node's ``session`` and ``request`` templates, when it sets them."""
    for name, value in (("session", call.session), ("request", call.request)):
        if value is None:
            continue
        try:
            t[name] = memory_template(value)
        except expressions.ExpressionError as exc:
            out.add(f"{path}.{name}", str(exc))


def _check_schema(schema: Any, path: str, out: _Collector) -> None:
    if schema is None:
        return
    for where, message in schemas.problems(schema):
        out.add(f"{path}.{where}" if where else path, message)


def _check_answer(answer: flow_api.AgentAnswer, path: str, out: _Collector) -> None:
    """The submitted values are the node's json output, an object: the schema must say so."""
    schema = answer.schema_
    if not isinstance(schema, dict) or schema.get("type") != "object":
        out.add(f"{path}.schema", 'must be a JSON Schema of an object ({"type": "object", ...})')
        return
    _check_schema(schema, f"{path}.schema", out)


def _check_triggers(spec: flow_api.FlowSpec, out: _Collector) -> None:
    """Trigger expressions are compiled here too, so a bad one never reaches the operator."""
    for index, trigger in enumerate(spec.triggers):
        path = f"spec.triggers[{index}]"
        if trigger.input is not None:
            out.template(f"{path}.input", trigger.input)
        if trigger.kubernetes is not None and trigger.kubernetes.filter is not None:
            out.template(f"{path}.kubernetes.filter", trigger.kubernetes.filter, expression=True)


def _check_references(
    node: flow_api.Node, path: str, resolver: capabilities.Resolver, out: _Collector
) -> None:
    for call in calls.node_calls(node, path):
        if call.kind == calls.FLOW:
            if resolver.flow(call.name) is None:
                out.add(call.path, f'no Flow "{call.name}"')
            continue
        agent = resolver.agent(call.name)
        tool = node.tool or (node.map.tool if node.map else None)
        if agent is None:
            out.add(call.path, f'no Agent "{call.name}"')
        elif call.via == calls.Via.TOOL and tool is not None:
            _check_tool_name(tool, agent, call.path.removesuffix(".agent"), out)


def _check_tool_name(
    tool: flow_api.ToolCall, agent: agent_api.AgentSpec, where: str, out: _Collector
) -> None:
    if not any(t.name == tool.name for t in agent.tools) and not any(
        t.mcp is not None for t in agent.tools
    ):
        names = ", ".join(t.name for t in agent.tools) or "none"
        out.add(f"{where}.name", f'no tool "{tool.name}" in Agent "{tool.agent}" (has: {names})')


def _edges(
    spec: flow_api.FlowSpec, out: _Collector, ids: dict[str, int], tools: Iterable[str] = ()
) -> list[CompiledEdge]:
    edges: list[CompiledEdge] = []
    seen: set[tuple[str, str]] = set()

    def add(source: str, target: str) -> None:
        if (source, target) not in seen:
            seen.add((source, target))
            edges.append(CompiledEdge(source, target))

    by_id = {n.id: n for n in spec.nodes}
    for index, edge in enumerate(spec.edges):
        path = f"spec.edges[{index}]"
        ok = True
        for end, value in (("from", edge.from_), ("to", edge.to)):
            if value not in ids:
                out.add(f"{path}.{end}", f'no node "{value}"')
                ok = False
        if not ok:
            continue
        source = by_id[edge.from_]
        if edge.branch is not None:
            if source.branch is None:
                out.add(f"{path}.branch", f'node "{edge.from_}" is not a branch node')
                continue
            cases = source.branch.cases
            target = (
                source.branch.default if edge.branch == DEFAULT_CASE else cases.get(edge.branch)
            )
            if edge.branch != DEFAULT_CASE and edge.branch not in cases:
                known = ", ".join([*cases, DEFAULT_CASE])
                out.add(
                    f"{path}.branch",
                    f'no case "{edge.branch}" in node "{edge.from_}" (has: {known})',
                )
                continue
            if target is None:
                out.add(f"{path}.branch", f'node "{edge.from_}" has no default')
                continue
            if target != edge.to:
                out.add(
                    f"{path}.branch",
                    f'case "{edge.branch}" of node "{edge.from_}" goes to "{target}", '
                    f'not "{edge.to}"',
                )
                continue
        add(edge.from_, edge.to)
    for index, node in enumerate(spec.nodes):
        if node.branch is None:
            continue
        for case, target in node.branch.cases.items():
            if target not in ids:
                out.add(f"spec.nodes[{index}].branch.cases.{case}", f'no node "{target}"')
            else:
                add(node.id, target)
        if node.branch.default is not None:
            if node.branch.default not in ids:
                out.add(f"spec.nodes[{index}].branch.default", f'no node "{node.branch.default}"')
            else:
                add(node.id, node.branch.default)
    if not spec.edges:
        unique = [n for i, n in enumerate(spec.nodes) if ids.get(n.id) == i and n.id not in tools]
        for current, following in itertools.pairwise(unique):
            if current.branch is None:
                add(current.id, following.id)
    return edges


def edges(spec: flow_api.FlowSpec) -> list[CompiledEdge]:
    """The edges the engine runs a flow by: explicit edges, branch cases and defaults, list order.

    For pictures of a flow (:mod:`agentflows.diagram`), which draw a flow whether or not its
    references resolve: an edge that :func:`validate` would refuse (an unknown node, a branch
    label that contradicts its case) is left out here, and reported there.
    """
    ids: dict[str, int] = {}
    for index, node in enumerate(spec.nodes):
        ids.setdefault(node.id, index)
    return _edges(spec, _Collector(""), ids)


def _check_shape(spec: flow_api.FlowSpec, nodes: dict[str, CompiledNode], out: _Collector) -> None:
    start = spec.nodes[0].id
    reachable: set[str] = set()
    stack = [start]
    while stack:
        current = stack.pop()
        if current in reachable:
            continue
        reachable.add(current)
        stack.extend(nodes[current].successors)
    for node in spec.nodes:
        if (
            node.id not in reachable
            and node.id in nodes
            and nodes[node.id].index == spec.nodes.index(node)
        ):
            out.add(
                f"spec.nodes[{nodes[node.id].index}]",
                f'node "{node.id}" is unreachable: '
                f'no edge leads to it from the start node "{start}"',
            )


def _loops(
    spec: flow_api.FlowSpec, nodes: dict[str, CompiledNode], out: _Collector
) -> dict[str, Loop]:
    """Find the loops, check them, and take the back edges out of successors/predecessors."""
    successors = {n: list(node.successors) for n, node in nodes.items()}

    def bound(head: str) -> int:
        return nodes[head].spec.max_iterations or spec.limits.max_iterations

    found, backs = loops.find(spec.nodes[0].id, successors, bound)
    for message in loops.problems(found, successors, lambda n: nodes[n].kind == "branch"):
        out.add("spec.edges", message)
    for source, target in backs:
        nodes[source].successors.remove(target)
        nodes[target].predecessors.remove(source)
        nodes[source].back_to.append(target)
    for loop in found.values():
        for node_id in loop.body:
            nodes[node_id].loop = nodes[node_id].loop or loop.head
    return found


def _callees(kind: str, name: str, resolver: capabilities.Resolver) -> list[tuple[str, str]]:
    """What an Agent or a Flow runs in turn (a tool node's Agent does not run, so not it)."""
    spec: flow_api.FlowSpec | agent_api.AgentSpec | None
    if kind == calls.FLOW:
        spec = resolver.flow(name)
        found = calls.calls(spec) if spec is not None else []
    else:
        spec = resolver.agent(name)
        found = calls.agent_calls(spec) if isinstance(spec, agent_api.AgentSpec) else []
    return [call.ref for call in found if call.runs]


def _chain_back(
    start: tuple[str, str], target: str, resolver: capabilities.Resolver
) -> list[tuple[str, str]] | None:
    """The shortest chain of calls from ``start`` back to Flow ``target``, or None."""
    queue: list[list[tuple[str, str]]] = [[start]]
    seen = {start}
    while queue:
        chain = queue.pop(0)
        if chain[-1] == ("Flow", target):
            return chain
        for callee in _callees(*chain[-1], resolver):
            if callee not in seen:
                seen.add(callee)
                queue.append([*chain, callee])
    return None


def _check_call_cycles(
    name: str, spec: flow_api.FlowSpec, resolver: capabilities.Resolver, out: _Collector
) -> None:
    """A Flow that calls itself through sub-flows and agents would recurse until the depth limit."""
    for call in calls.calls(spec):
        if not call.runs:
            continue
        chain = _chain_back(call.ref, name, resolver)
        if chain is not None:
            steps = " -> ".join(f"{k} {n}" for k, n in [("Flow", name), *chain])
            out.add(call.path, f"calls itself: {steps} (sub-flow calls must not loop)")


def _check_input_schema(spec: flow_api.FlowSpec, out: _Collector) -> None:
    _check_schema(spec.input, "spec.input", out)


def compile_flow(
    spec: flow_api.FlowSpec,
    resolver: capabilities.Resolver,
    *,
    prefix: str = "",
    name: str | None = None,
) -> CompiledFlow:
    """Validate and compile; raise FlowInvalid listing every problem.

    With ``name`` (the Flow's own name), a chain of sub-flow calls back to it is a problem too.
    """
    out = _Collector(prefix)
    ids: dict[str, int] = {}
    nodes: dict[str, CompiledNode] = {}
    for index, node in enumerate(spec.nodes):
        path = f"spec.nodes[{index}]"
        if node.id in ids:
            out.add(
                f"{path}.id", f'duplicate node id "{node.id}" (first at spec.nodes[{ids[node.id]}])'
            )
            continue
        ids[node.id] = index
        templates = _node_templates(node, path, out)
        _check_references(node, path, resolver, out)
        nodes[node.id] = CompiledNode(node.id, index, node, node.kind, templates)
    _check_input_schema(spec, out)
    _check_triggers(spec, out)
    if name is not None:
        _check_call_cycles(name, spec, resolver, out)
    tools = nodetools.tool_nodes(spec)
    nodetools.check(spec, tools, out.add)
    tool_nodes = {node_id: nodes.pop(node_id) for node_id in tools if node_id in nodes}
    for edge in _edges(spec, out, ids, tools):
        if edge.source in nodes and edge.target in nodes:
            nodes[edge.source].successors.append(edge.target)
            nodes[edge.target].predecessors.append(edge.source)
    found_loops: dict[str, Loop] = {}
    if spec.nodes[0].id in nodes:
        _check_shape(spec, nodes, out)
        found_loops = _loops(spec, nodes, out)
    output = out.template("spec.output", spec.output, expression=True) if spec.output else None
    if out.problems:
        raise FlowInvalid(out.problems)
    for compiled in [*nodes.values(), *tool_nodes.values()]:
        call = compiled.spec.agent or (compiled.spec.map.agent if compiled.spec.map else None)
        if call is not None and call.node_tools:
            compiled.node_tools = nodetools.offers(call, spec, resolver)
    sinks = [n.id for n in nodes.values() if not n.successors and not n.back_to]
    return CompiledFlow(spec, nodes, spec.nodes[0].id, output, sinks, tool_nodes, found_loops)


def validate(
    spec: flow_api.FlowSpec,
    resolver: capabilities.Resolver,
    *,
    prefix: str = "",
    name: str | None = None,
) -> list[documents.Problem]:
    """Every problem of a flow (empty when it is valid); see :func:`compile_flow`."""
    try:
        compile_flow(spec, resolver, prefix=prefix, name=name)
    except FlowInvalid as exc:
        return exc.problems
    return []


class StaticResolver:
    """A resolver over in-memory Agents and Flows (files, a run's snapshot)."""

    def __init__(
        self,
        agents: dict[str, Any] | None = None,
        flows: dict[str, flow_api.FlowSpec] | None = None,
    ) -> None:
        self.agents = dict(agents or {})
        self.flows = dict(flows or {})

    @classmethod
    def of_snapshot(cls, snapshot: snapshot_api.Snapshot) -> StaticResolver:
        """A resolver over a run's snapshot; pydantic's ValidationError on a bad spec in it."""
        return cls(snapshot.agent_specs, snapshot.flow_specs)

    def agent(self, name: str) -> Any:
        """The Agent spec called ``name``, or None."""
        return self.agents.get(name)

    def flow(self, name: str) -> flow_api.FlowSpec | None:
        """The Flow spec called ``name``, or None."""
        return self.flows.get(name)


def names(items: Iterable[str]) -> str:
    """Join names for a message."""
    return ", ".join(sorted(items)) or "none"


def validate_agent(spec: agent_api.AgentSpec) -> list[documents.Problem]:
    """Every problem of an Agent the models alone cannot see.

    Its tools' argument schemas, and its ``session`` and ``request`` expressions.
    """
    out = _Collector("")
    for index, tool in enumerate(spec.tools):
        _check_schema(tool.parameters, f"spec.tools[{index}].parameters", out)
    for index, skill in enumerate(spec.skills):
        _check_schema(skill.parameters, f"spec.skills[{index}].parameters", out)
    for name, value in (("session", spec.session), ("request", spec.request)):
        if value is not None:
            try:
                memory_template(value)
            except expressions.ExpressionError as exc:
                out.add(f"spec.{name}", str(exc))
    return out.problems
