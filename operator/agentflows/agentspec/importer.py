"""Translate a checked Agent Spec Flow or Agent into agentflows Agent and Flow resources.

How each component maps is the support matrix in docs/agentspec.md. The shape, in short:

- Every Agent Spec node becomes one Flow node whose id is its name made an identifier; a
  StartNode becomes a transform that applies the input defaults, an EndNode a transform that
  collects the flow's outputs. Outputs are read as ``.nodes.<id>.json.<output>``, except the
  text of an unstructured LlmNode or an A2AAgent's AgentNode (``.nodes.<id>.text``), the
  answer of an InputMessageNode (``.nodes.<id>.json``) and the single output of a tool or
  ApiNode: its key of an object result that has it, else the whole result
  (:func:`mapping.by_name`). An AgentNode's Agent that declares outputs submits them
  (``agent.answer``, :func:`answer_of`), so they too are read from ``.json``.
- Data edges become the expressions of the destination's inputs (several edges into one input,
  from paths that exclude each other, read whichever ran); without ``data_flow_connections`` an
  input is bound to the StartNode's output of the same name, else to the one node producing it.
- Control edges become edges, only the first one per source and branch (Agent Spec does not fan
  out); a BranchingNode becomes a branch node whose cases are its mapping's keys.
- Agents, sub-flows and map bodies become their own resources, named after the component.
- A tool with ``requires_confirmation`` in a ToolNode gets an approval node before it; in an
  Agent it is a tool that is not ``readOnly``, and the flow runs under autonomy ``supervised``.
- A top-level Agent becomes the Agent and a Flow of one agent node, prompted with input
  ``message``; with outputs, the Flow's output is the object the agent submits.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agentflows.agentspec import (
    checks,
    components,
    document,
    errors,
    implementations,
    mapping,
    model,
)
from agentflows.api import agent as agent_api
from agentflows.api import common, documents
from agentflows.api import flow as flow_api

_REDUCE = {"append": ".", "sum": "add", "average": "(add / length)", "max": "max", "min": "min"}


@dataclasses.dataclass
class Imported:
    """The resources of one document; ``flow`` names the one to run."""

    flow: str = ""
    flows: dict[str, flow_api.Flow] = dataclasses.field(default_factory=dict)
    agents: dict[str, agent_api.Agent] = dataclasses.field(default_factory=dict)
    version: str = ""
    #: "Flow" or "Agent": what the document's root is.
    root: str = "Flow"
    #: Flow name -> node id -> the Agent Spec component type the node was translated from.
    kinds: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def resources(self) -> list[agent_api.Agent | flow_api.Flow]:
        """Agents first, then flows, each sub-flow before the flows that call it."""
        return [*self.agents.values(), *reversed(list(self.flows.values()))]


class _Translator:
    def __init__(self, impl: implementations.Implementations) -> None:
        self.impl = impl
        self.result = Imported()
        self.agent_names: set[str] = set()
        self.flow_names: set[str] = set()
        self.done: dict[str, str] = {}
        self.problems: list[documents.Problem] = []

    def agent(self, component: model.AgenticComponent, path: str) -> str:
        """The Agent resource of an agentic component (a ManagerWorkers' workers as sub-agents)."""
        done_key = f"agent:{checks.key(component)}"
        if done_key not in self.done:
            agent = checks.effective_agent(component)
            name = mapping.resource_name(agent.name, self.agent_names, common.NAME_MAX)
            self.done[done_key] = name
            spec = components.agent_spec(agent, path, self.problems, self.impl)
            workers = [
                self.agent(w, f"{path}.workers[{i}]" if path else f"workers[{i}]")
                for i, w in enumerate(checks.workers_of(component))
            ]
            if workers:
                spec = spec.model_copy(update={"sub_agents": workers})
            meta = common.ObjectMeta(name=name)
            self.result.agents[name] = agent_api.Agent(metadata=meta, spec=spec)
        return self.done[done_key]

    def flow(self, flow: model.Flow, path: str, *, branches: bool = False) -> str:
        """The Flow resource of ``flow``; with ``branches`` its output says the end branch."""
        done_key = f"flow:{checks.key(flow)}"
        if done_key not in self.done:
            name = mapping.resource_name(flow.name, self.flow_names)
            self.done[done_key] = name
            builder = _FlowBuilder(self, flow, checks.check(flow), path)
            builder.says_branch = branches and len(checks.branches_of_flow(flow)) > 1
            spec = builder.build()
            self.result.kinds[name] = {
                builder.ids[k]: n.component_type for k, n in builder.graph.nodes.items()
            }
            self.result.flows[name] = flow_api.Flow(
                metadata=common.ObjectMeta(name=name), spec=spec
            )
        return self.done[done_key]

    def swarm(self, swarm: model.Swarm) -> str:
        """A Swarm: an Agent per member; each reaches its recipients through tools.

        ``call_sub_agent`` (``subAgents``) sends a recipient a message and returns its answer;
        ``handoff_conversation`` (``handoffs``) hands the conversation over: the recipient
        answers in the caller's place (:mod:`agentflows.agents.handoff`). The Flow runs the
        first agent.
        """
        plan = checks.swarm_plan(swarm)
        names = {k: self.agent(a, plan.paths[k]) for k, a in plan.agents.items()}
        for k in plan.agents:
            resource = self.result.agents[names[k]]
            spec = resource.spec
            update: dict[str, Any] = {
                "sub_agents": [*spec.sub_agents, *(names[r] for r in plan.messages[k])]
            }
            update["handoffs"] = [names[r] for r in plan.handoffs[k]]
            resource.spec = spec.model_copy(update=update)
        confirm = any(self.needs_confirmation(a) for a in plan.agents.values())
        return self.top_agent(swarm.first_agent, swarm, confirm)

    def top_agent(
        self,
        component: model.AgenticComponent,
        named: model.Component | None = None,
        confirm: bool | None = None,
    ) -> str:
        """The Flow of a root agentic component (named after ``named``, e.g. its Swarm)."""
        agent = checks.effective_agent(component)
        name = mapping.resource_name((named or agent).name, self.flow_names)
        agent_name = self.agent(component, "first_agent" if named else "")
        inputs = agent.inputs
        if inputs is None:
            inputs = [
                {"title": t, "type": "string"} for t in checks.placeholders(agent.system_prompt)
            ]
        lines = [mapping.input_line(p) for p in inputs]
        message = {"title": "message", "type": "string", "description": "The user's message."}
        schema = mapping.object_schema([message, *inputs])
        call = flow_api.AgentCall(
            name=agent_name,
            prompt="\n".join([*lines, "{{ .run.input.message }}"]),
            answer=answer_of(agent.outputs, agent.human_in_the_loop),
        )
        if confirm is None:
            confirm = self.needs_confirmation(component)
        spec = flow_api.FlowSpec(
            description=(named or agent).description or "",
            input=schema,
            nodes=[flow_api.Node(id="agent", agent=call)],
            output="=.nodes.agent.json" if call.answer else "=.nodes.agent.text",
            autonomy=_autonomy(confirm),
        )
        self.result.flows[name] = flow_api.Flow(metadata=common.ObjectMeta(name=name), spec=spec)
        self.result.root = "Agent"
        self.result.kinds[name] = {"agent": "Agent"}
        return name

    def asks_user(self, name: str) -> None:
        """Give Agent ``name`` (run by an AgentNode) the ``ask_user`` client tool, once."""
        resource = self.result.agents[name]
        if not components.asks_user(resource.spec):
            tools = [*resource.spec.tools, components.ask_user_tool()]
            resource.spec = resource.spec.model_copy(update={"tools": tools})

    def needs_confirmation(self, component: model.AgenticComponent) -> bool:
        """True when a tool of the agent, or of a worker, asks to confirm each call."""
        found = components.needs_confirmation(checks.effective_agent(component))
        return found or any(self.needs_confirmation(w) for w in checks.workers_of(component))


def answer_of(outputs: list[model.Property] | None, ask_user: bool) -> flow_api.AgentAnswer | None:
    """The answer contract of an Agent that declares outputs (none without outputs).

    Agent Spec's Agent fills its outputs before it terminates: the agent submits them with
    ``submit_result`` (:mod:`agentflows.agents.answer`), even a single string, and a text reply
    is a message to the user (``human_in_the_loop``) rather than the answer, as in WayFlow.
    """
    schema = mapping.object_schema(outputs or [])
    return flow_api.AgentAnswer(schema_=schema, ask_user=ask_user) if schema else None


def _autonomy(supervised: bool) -> flow_api.Autonomy:
    return flow_api.Autonomy.SUPERVISED if supervised else flow_api.Autonomy.FULL


def _literal(value: Any) -> str:
    return json.dumps(value)


def _input_properties(node: model.Node) -> list[model.Property]:
    """Declared properties an input of ``node`` may take its default from."""
    found = list(node.inputs or [])
    if isinstance(node, model.ToolNode):
        found += node.tool.inputs or []
    elif isinstance(node, model.AgentNode):
        found += checks.agent_io(node.agent)[0] or []
    elif isinstance(node, (model.FlowNode, model.MapNode, model.CatchExceptionNode)):
        found += checks.flow_inputs(node.subflow)
    elif isinstance(node, model.ParallelFlowNode):
        found += [p for f in node.subflows for p in checks.flow_inputs(f)]
    elif isinstance(node, model.EndNode):
        found += node.outputs or []
    return found


class _FlowBuilder:
    """One Agent Spec Flow made a FlowSpec."""

    def __init__(self, tr: _Translator, flow: model.Flow, graph: checks.Graph, path: str) -> None:
        self.tr, self.flow, self.graph, self.path = tr, flow, graph, path
        self.taken_ids: set[str] = set()
        self.ids = {k: mapping.identifier(n.name, self.taken_ids) for k, n in graph.nodes.items()}
        #: Where control enters a node's translation (an approval before a confirmed tool).
        self.entry = dict(self.ids)
        self.nodes: list[flow_api.Node] = []
        self.edges: list[flow_api.Edge] = []
        self.supervised = False
        #: The EndNodes add output ``branch_name`` (a FlowNode routes on it).
        self.says_branch = False
        #: FlowNode key -> id of the branch node after it (a sub-flow with several end branches).
        self.routed: dict[str, str] = {}

    def problem(self, key: str, message: str) -> None:
        where = f"nodes[{self.graph.index[key]}]"
        self.tr.problems.append(
            errors.problem(f"{self.path}.{where}" if self.path else where, message)
        )

    def build(self) -> flow_api.FlowSpec:
        bindings = self.bindings()
        start = checks.key(self.flow.start_node)
        for key in sorted(self.graph.nodes, key=lambda k: (k != start, self.graph.index[k])):
            self.node(key, self.graph.nodes[key], bindings[key])
        self.converse(bindings)
        self.enter_through_entries()
        self.routes()
        for (source, _branch), target in self.graph.taken.items():
            routed = source in self.routed
            if not routed and not isinstance(self.graph.nodes[source], model.BranchingNode):
                self.edges.append(flow_api.Edge(from_=self.ids[source], to=self.entry[target]))
        return flow_api.FlowSpec(
            description=self.flow.description or "",
            input=mapping.object_schema(checks.flow_inputs(self.flow)),
            nodes=self.nodes,
            edges=self.edges,
            autonomy=_autonomy(self.supervised),
        )

    # -- data --------------------------------------------------------------------------------

    def output(self, key: str, title: str) -> str:
        """The jq expression reading output ``title`` of node ``key``."""
        node, ref = self.graph.nodes[key], f".nodes.{self.ids[key]}"
        if isinstance(node, model.MapNode):
            inner = title.removeprefix("collected_")
            reduce = _REDUCE[checks.reducers(node)[inner]]
            return f"({ref}.json | map({mapping.field(inner)}) | {reduce})"
        if isinstance(node, model.LlmNode) and mapping.is_text_output(node.outputs):
            return f"{ref}.text"
        if isinstance(node, model.LlmNode) and len(node.outputs or []) == 1:
            return mapping.by_name(ref, title)
        if isinstance(node, model.AgentNode) and isinstance(node.agent, model.A2AAgent):
            return f"{ref}.text"
        if isinstance(node, model.InputMessageNode):
            return f"{ref}.json"
        single = isinstance(node, (model.ToolNode, model.ApiNode))
        if single and len(checks.outputs_of(node)) == 1:
            return mapping.by_name(ref, title)
        return f"{ref}.json{mapping.field(title)}"

    def bindings(self) -> dict[str, dict[str, str]]:
        """Node key -> input -> jq expression."""
        found: dict[str, dict[str, list[str]]] = {k: {} for k in self.graph.nodes}
        if self.flow.data_flow_connections is not None:
            for edge in self.flow.data_flow_connections:
                source, target = checks.key(edge.source_node), checks.key(edge.destination_node)
                exprs = found[target].setdefault(edge.destination_input, [])
                exprs.append(self.output(source, edge.source_output))
        else:
            self.bind_by_name(found)
        result: dict[str, dict[str, str]] = {}
        for key, node in self.graph.nodes.items():
            result[key] = {
                n: " // ".join(f"({e})" for e in es) if len(es) > 1 else es[0]
                for n, es in found[key].items()
            }
            self.defaults(key, node, result[key])
        return result

    def bind_by_name(self, found: dict[str, dict[str, list[str]]]) -> None:
        start = checks.key(self.flow.start_node)
        producers: dict[str, list[str]] = {}
        for key, node in self.graph.nodes.items():
            for title in checks.outputs_of(node):
                producers.setdefault(title, []).append(key)
        for key, node in self.graph.nodes.items():
            for title in checks.inputs_of(node):
                candidates = [p for p in producers.get(title, []) if p != key]
                chosen = [start] if start in candidates else candidates
                if len(chosen) > 1:
                    names = ", ".join(repr(self.graph.nodes[c].name) for c in chosen)
                    self.problem(
                        key,
                        f"input {title!r} could come from {names}; "
                        "add data_flow_connections to say which",
                    )
                elif chosen:
                    found[key][title] = [self.output(chosen[0], title)]

    def defaults(self, key: str, node: model.Node, bound: dict[str, str]) -> None:
        properties = {str(p.get("title")): p for p in _input_properties(node)}
        for title in checks.inputs_of(node):
            if title in bound:
                continue
            prop = properties.get(title)
            if prop is not None and "default" in prop:
                subflows = (
                    model.FlowNode,
                    model.MapNode,
                    model.ParallelFlowNode,
                    model.CatchExceptionNode,
                )
                if not isinstance(node, subflows):
                    bound[title] = _literal(prop["default"])
                continue
            self.problem(
                key,
                f"input {title!r} of {node.component_type} {node.name!r} is not connected: "
                "add a DataFlowEdge into it or give the property a default",
            )

    # -- nodes -------------------------------------------------------------------------------

    def add(self, key: str, **kind: Any) -> None:
        node = self.graph.nodes[key]
        self.nodes.append(
            flow_api.Node(id=self.ids[key], description=node.description or "", **kind)
        )

    def node(self, key: str, node: model.Node, bound: dict[str, str]) -> None:
        if isinstance(node, model.StartNode):
            defaults = {
                str(p["title"]): p["default"]
                for p in checks.flow_inputs(self.flow)
                if "default" in p
            }
            prefix = f"{_literal(defaults)} + " if defaults else ""
            self.add(key, transform=f"={prefix}(.run.input // {{}})")
        elif isinstance(node, model.EndNode):
            self.end(key, node, bound)
        elif isinstance(node, model.LlmNode):
            self.llm(key, node, bound)
        elif isinstance(node, model.AgentNode):
            self.agent(key, node, bound)
        elif isinstance(node, (model.ToolNode, model.ApiNode)):
            self.tool(key, node, bound)
        elif isinstance(node, model.BranchingNode):
            self.branch(key, node, bound)
        elif isinstance(node, model.FlowNode):
            self.subflow(key, node, bound)
        elif isinstance(node, model.MapNode):
            self.map(key, node, bound)
        elif isinstance(node, model.ParallelFlowNode):
            self.parallel(key, node, bound)
        elif isinstance(node, model.CatchExceptionNode):
            self.catch(key, node, bound)
        elif isinstance(node, model.OutputMessageNode):
            self.add(key, transform="=" + mapping.jq_text(node.message, bound))
        else:
            message = mapping.substitute(node.message or "", bound) or "Your message:"
            self.add(key, input=flow_api.InputRequest(message=message, schema_={"type": "string"}))

    # -- the conversation -------------------------------------------------------------------

    def converse(self, bindings: dict[str, dict[str, str]]) -> None:
        """Give each AgentNode's agent the flow's conversation so far as ``history``.

        As in Agent Spec (and WayFlow), an agent in a flow sees the messages before it: each
        InputMessageNode's question and the user's answer, each OutputMessageNode's message and
        each earlier AgentNode's answer, of the nodes that ran, in the order of the control
        flow. The ``name: value`` lines stay its prompt.
        """
        order = self.control_order()
        for i, key in enumerate(order):
            node = self.graph.nodes[key]
            if not isinstance(node, model.AgentNode) or isinstance(node.agent, model.A2AAgent):
                continue
            before = self.leading_to(key)
            said = [p for k in order[:i] if k in before for p in self.said(k, bindings[k])]
            if not said:
                continue
            at = next(j for j, n in enumerate(self.nodes) if n.id == self.ids[key])
            call = self.nodes[at].agent
            assert call is not None
            history = "=[" + ", ".join(said) + "]"
            call = call.model_copy(update={"history": history})
            self.nodes[at] = self.nodes[at].model_copy(update={"agent": call})

    def said(self, key: str, bound: dict[str, str]) -> list[str]:
        """The jq turns node ``key`` adds to the conversation when it ran (none otherwise)."""
        node, ref = self.graph.nodes[key], f".nodes.{self.ids[key]}"
        turns: list[tuple[str, str]] = []
        if isinstance(node, model.InputMessageNode):
            question = mapping.jq_text(node.message or "Your message:", bound)
            turns = [("assistant", question), ("user", f"{ref}.json | {mapping.AS_TEXT}")]
        elif isinstance(node, model.OutputMessageNode):
            turns = [("assistant", f"{ref}.json | {mapping.AS_TEXT}")]
        elif isinstance(node, model.AgentNode):
            turns = [("assistant", f"{ref}.text // ({ref}.json | {mapping.AS_TEXT})")]
        if not turns:
            return []
        objects = ", ".join(f'{{"role": "{role}", "content": ({e})}}' for role, e in turns)
        return [f"(if {ref} then ({objects}) else empty end)"]

    def control_order(self) -> list[str]:
        """The flow's nodes in the order control reaches them (depth first, back edges left)."""
        successors: dict[str, list[str]] = {}
        for (source, _branch), target in self.graph.taken.items():
            successors.setdefault(source, []).append(target)
        seen: set[str] = set()
        finished: list[str] = []

        def visit(key: str) -> None:
            seen.add(key)
            for target in successors.get(key, []):
                if target not in seen:
                    visit(target)
            finished.append(key)

        visit(checks.key(self.flow.start_node))
        return finished[::-1]

    def leading_to(self, key: str) -> set[str]:
        """The nodes from which control can reach ``key``."""
        found, todo = set(), [key]
        while todo:
            current = todo.pop()
            for (source, _branch), target in self.graph.taken.items():
                if target == current and source not in found:
                    found.add(source)
                    todo.append(source)
        return found

    def where(self, key: str) -> str:
        where = f"nodes[{self.graph.index[key]}]"
        return f"{self.path}.{where}" if self.path else where

    def llm(self, key: str, node: model.LlmNode, bound: dict[str, str]) -> None:
        if "{%" in node.prompt_template:
            self.tr.problems.append(
                errors.problem(
                    f"{self.where(key)}.prompt_template",
                    "Jinja statements ({% ... %}) are not supported; use {{name}} placeholders",
                )
            )
        structured = not mapping.is_text_output(node.outputs)
        call = flow_api.LlmCall(
            model=mapping.model_spec(
                node.llm_config, f"{self.where(key)}.llm_config", self.tr.problems
            ),
            prompt=mapping.substitute(node.prompt_template, bound),
            output_schema=mapping.llm_output_schema(node.outputs or []) if structured else None,
        )
        self.add(key, llm=call)

    def agent(self, key: str, node: model.AgentNode, bound: dict[str, str]) -> None:
        if isinstance(node.agent, model.A2AAgent):
            self.a2a(key, node, node.agent, bound)
            return
        name = self.tr.agent(node.agent, f"{self.where(key)}.agent")
        agent = checks.effective_agent(node.agent)
        answer = answer_of(node.outputs or agent.outputs, agent.human_in_the_loop)
        if agent.human_in_the_loop and answer is None:
            # an agent that submits asks the user with its text replies; one that answers
            # with text asks with a tool
            self.tr.asks_user(name)
        self.supervised |= self.tr.needs_confirmation(node.agent)
        lines = [f"{title}: {{{{ {expr} }}}}" for title, expr in bound.items()]
        call = flow_api.AgentCall(name=name, prompt="\n".join(lines) or "Begin.", answer=answer)
        self.add(key, agent=call)

    def a2a(
        self, key: str, node: model.AgentNode, agent: model.A2AAgent, bound: dict[str, str]
    ) -> None:
        """An http tool node ``<id>_call`` sending ``message/send``, and the reply's text."""
        if not mapping.is_text_output(node.outputs or agent.outputs):
            self.problem(
                key, f"A2AAgent {agent.name!r} answers with text: declare one string output"
            )
        call_id = mapping.identifier(f"{self.ids[key]}_call", self.taken_ids)
        args = {"message_id": f'=.run.name + "-{self.ids[key]}"'}
        args |= {title: f"={expr}" for title, expr in bound.items()}
        http = agent_api.HttpTool(
            method="POST", url=agent.agent_url, body=mapping.a2a_body(list(bound))
        )
        self.nodes.append(flow_api.Node(id=call_id, tool=flow_api.ToolCall(http=http, args=args)))
        self.edges.append(flow_api.Edge(from_=call_id, to=self.ids[key]))
        self.entry[key] = call_id
        self.add(key, transform=f"=.nodes.{call_id}.json | {mapping.A2A_TEXT}")

    def tool(self, key: str, node: model.ToolNode | model.ApiNode, bound: dict[str, str]) -> None:
        path = self.where(key)
        args = {title: f"={expr}" for title, expr in bound.items()} or None
        if isinstance(node, model.ApiNode):
            call = flow_api.ToolCall(
                http=components.http_tool(node, path, self.tr.problems), args=args
            )
        elif isinstance(node.tool, model.RemoteTool):
            http = components.http_tool(node.tool, f"{path}.tool", self.tr.problems)
            call = flow_api.ToolCall(http=http, args=args)
        elif isinstance(node.tool, model.ServerTool):
            script = components.python_script(
                node.tool, f"{path}.tool", self.tr.problems, self.tr.impl
            )
            call = flow_api.ToolCall(python=agent_api.PythonTool(script=script), args=args)
        elif isinstance(node.tool, model.ClientTool):
            client = agent_api.ClientTool()
            call = flow_api.ToolCall(client=client, name=node.tool.name, args=args)
        else:
            where = f"{path}.tool.client_transport"
            server = components.mcp(
                node.tool.client_transport, [node.tool.name], where, self.tr.problems
            )
            call = flow_api.ToolCall(mcp=server, name=node.tool.name, args=args)
        if isinstance(node, model.ToolNode) and node.tool.requires_confirmation:
            confirm = mapping.identifier(f"{node.name}_confirm", self.taken_ids)
            summary = "arguments: {{ " + _object(bound) + " }}" if bound else ""
            approval = flow_api.Approval(message=f"Run {node.name}?", summary=summary)
            self.nodes.append(flow_api.Node(id=confirm, approval=approval))
            self.edges.append(flow_api.Edge(from_=confirm, to=self.ids[key]))
            self.entry[key] = confirm
        self.add(key, tool=call)

    def branch(self, key: str, node: model.BranchingNode, bound: dict[str, str]) -> None:
        def target(branch: str) -> str:
            return self.entry[self.graph.taken[(key, branch)]]

        # Its one input, by the name the document gives it (branching_mapping_key by default).
        value = next(iter(bound.values()), "null")
        branch = flow_api.Branch(
            value=f"={value}",
            cases={k: target(b) for k, b in node.mapping.items()},
            default=target(model.DEFAULT_BRANCH),
        )
        self.add(key, branch=branch)

    def end(self, key: str, node: model.EndNode, bound: dict[str, str]) -> None:
        """The flow's outputs; with several end branches, ``branch_name`` says which ended it."""
        if self.says_branch:
            if mapping.BRANCH_OUTPUT in bound:
                self.problem(
                    key,
                    f"EndNode {node.name!r}: an output named {mapping.BRANCH_OUTPUT!r} in a flow "
                    "that ends on several branches is reserved for the branch; rename it",
                )
            bound = {**bound, mapping.BRANCH_OUTPUT: _literal(node.branch_name)}
        self.add(key, transform="=" + _object(bound))

    def subflow(self, key: str, node: model.FlowNode, bound: dict[str, str]) -> None:
        """A flow node; a sub-flow ending on several branches is followed by a branch node."""
        name = self.tr.flow(node.subflow, f"{self.where(key)}.subflow", branches=True)
        self.add(key, flow=flow_api.FlowCall(name=name, input="=" + _object(bound)))
        branches = checks.branches_of(node)
        if len(branches) < 2:
            return
        self.routed[key] = mapping.identifier(f"{self.ids[key]}_branch", self.taken_ids)

    def enter_through_entries(self) -> None:
        """Point branch cases at where each target's translation starts.

        A BranchingNode may be translated before its target, whose entry (an approval before a
        confirmed tool, the fork of a ParallelFlowNode) is known only once the target is.
        """
        entry_of = {self.ids[k]: e for k, e in self.entry.items()}
        for i, node in enumerate(self.nodes):
            if node.branch is None:
                continue
            branch = node.branch
            cases = {k: entry_of.get(t, t) for k, t in branch.cases.items()}
            default = entry_of.get(branch.default, branch.default) if branch.default else None
            update = {"cases": cases, "default": default}
            self.nodes[i] = node.model_copy(update={"branch": branch.model_copy(update=update)})

    def routes(self) -> None:
        """The branch node after each FlowNode with several end branches (targets known now)."""
        for key, route in self.routed.items():
            branches = checks.branches_of(self.graph.nodes[key])
            cases = {b: self.entry[self.graph.taken[(key, b)]] for b in branches}
            value = f"=.nodes.{self.ids[key]}.json.{mapping.BRANCH_OUTPUT}"
            branch = flow_api.Branch(value=value, cases=cases)
            self.nodes.append(flow_api.Node(id=route, branch=branch))
            self.edges.append(flow_api.Edge(from_=self.ids[key], to=route))

    def parallel(self, key: str, node: model.ParallelFlowNode, bound: dict[str, str]) -> None:
        """A fork (``<id>_fork``), one flow node per sub-flow (``<id>_<n>``), and the join.

        The engine starts the successors of a finished node together and runs a node with
        several predecessors once all are settled, so the sub-flows run at the same time and
        the join (this node's id) merges their outputs into one object.
        """
        fork = mapping.identifier(f"{self.ids[key]}_fork", self.taken_ids)
        self.nodes.append(flow_api.Node(id=fork, transform="={}"))
        self.entry[key] = fork
        calls = []
        for j, subflow in enumerate(node.subflows):
            name = self.tr.flow(subflow, f"{self.where(key)}.subflows[{j}]")
            call_id = mapping.identifier(f"{self.ids[key]}_{j + 1}", self.taken_ids)
            inputs = {t: bound[t] for t in checks.titles(checks.flow_inputs(subflow)) if t in bound}
            call = flow_api.FlowCall(name=name, input="=" + _object(inputs))
            self.nodes.append(flow_api.Node(id=call_id, flow=call))
            self.edges += [flow_api.Edge(from_=fork, to=call_id)]
            self.edges += [flow_api.Edge(from_=call_id, to=self.ids[key])]
            calls.append(f"(.nodes.{call_id}.json)")
        self.add(key, transform="=" + " + ".join(calls))

    def catch(self, key: str, node: model.CatchExceptionNode, bound: dict[str, str]) -> None:
        """A ``catchErrors`` flow node (``<id>_try``), this node's outputs, a branch node after."""
        name = self.tr.flow(node.subflow, f"{self.where(key)}.subflow", branches=True)
        attempt = mapping.identifier(f"{self.ids[key]}_try", self.taken_ids)
        call = flow_api.FlowCall(name=name, input="=" + _object(bound), catch_errors=True)
        self.nodes.append(flow_api.Node(id=attempt, flow=call))
        self.edges.append(flow_api.Edge(from_=attempt, to=self.ids[key]))
        self.entry[key] = attempt
        defaults = {str(p["title"]): p.get("default") for p in checks.caught_outputs(node)}
        branch = checks.branches_of_flow(node.subflow)[0]
        self.add(key, transform=mapping.catch_transform(attempt, defaults, branch))
        self.routed[key] = mapping.identifier(f"{self.ids[key]}_branch", self.taken_ids)

    def map(self, key: str, node: model.MapNode, bound: dict[str, str]) -> None:
        name = self.tr.flow(node.subflow, f"{self.where(key)}.subflow")
        inner = [
            t for t in checks.titles(checks.flow_inputs(node.subflow)) if f"iterated_{t}" in bound
        ]
        lists = ", ".join(f"({bound[f'iterated_{t}']})" for t in inner)
        # A sub-flow input the node takes by its own name is the same value for every item.
        given = {t: bound[t] for t in checks.titles(checks.flow_inputs(node.subflow)) if t in bound}
        items = {t: f".item[{i}]" for i, t in enumerate(inner)}
        parallel = node.component_type == "ParallelMapNode"
        spec = flow_api.MapNode(
            items=f"=[{lists}] | {mapping.MAP_ZIP}",
            concurrency=mapping.PARALLEL_MAP_CONCURRENCY if parallel else 1,
            flow=flow_api.FlowCall(name=name, input="=" + _object({**given, **items})),
        )
        self.add(key, map=spec)


def _object(fields: dict[str, str]) -> str:
    """A jq object of the given keys and expressions."""
    return "{" + ", ".join(f"{json.dumps(k)}: ({v})" for k, v in fields.items()) + "}"


def translate(
    root: model.Flow | model.AgenticComponent | model.Swarm,
    impl: implementations.Implementations = implementations.NONE,
) -> Imported:
    """The resources of a typed document; SpecInvalid with every problem.

    ``impl`` gives ServerTools without a script in the document theirs (a ``--tools`` module),
    or lets them be answered by the mock (``--dry-run``).
    """
    tr = _Translator(impl)
    if isinstance(root, model.Flow):
        checks.check(root)
        tr.result.flow = tr.flow(root, "")
    elif isinstance(root, model.Swarm):
        tr.result.flow = tr.swarm(root)
    else:
        tr.result.flow = tr.top_agent(root)
    if tr.problems:
        raise errors.SpecInvalid(tr.problems)
    return tr.result


def import_text(
    text: str, impl: implementations.Implementations = implementations.NONE
) -> Imported:
    """Read, resolve, type, check and translate an Agent Spec document."""
    resolved = document.load_text(text)
    imported = translate(model.parse(resolved), impl)
    imported.version = resolved.version
    return imported
