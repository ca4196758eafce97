"""Write an agentflows Flow (with its Agents and sub-flows) as an Agent Spec document.

The exporter reads back the shapes :mod:`.importer` writes, so import -> export -> import gives
the same resources. A Flow written by hand exports when it keeps to those shapes: a first
transform node ``=(.run.input // {})`` (the StartNode), transforms building an object of
inputs (EndNodes), and node inputs that read outputs as ``.nodes.<id>.json.<key>``,
``.nodes.<id>.json`` or ``.nodes.<id>.text``. Anything else (another jq transform, an approval
that does not guard a tool, a model outside the OpenAI API family) is refused with its path,
because Agent Spec has no component for it.

Every component is written once under ``$referenced_components`` and referred to by id; ids
are ``<flow>.<node>``, names are the agentflows node ids (which the importer turns back into the
same ids). Agents, tools, models and root Agents or Swarms are written by
:mod:`.export_components`; this module writes Flows and their nodes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentflows.agentspec import (
    checks,
    document,
    errors,
    export_components,
    jqshapes,
    mapping,
)
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities

_READ = re.compile(
    r"^\.nodes\.([a-z][a-z0-9_]*)(\.text|\.json)((?:\.[A-Za-z_][A-Za-z0-9_]*|\.\"[^\"]+\")?)$"
)
_COLLECT = re.compile(
    r"^\(\.nodes\.([a-z][a-z0-9_]*)\.json \| "
    r"map\(\.(\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_]*)\) \| (.+)\)$"
)
#: :func:`mapping.by_name`: the single output of a tool or ApiNode.
_BY_NAME = re.compile(
    r'^\(\.nodes\.([a-z][a-z0-9_]*)\.json \| if type == "object" and has\(("(?:[^"\\]|\\.)*")\) '
    r"then \.\[\2\] else \. end\)$"
)
_TEMPLATE = re.compile(r"\{\{ (.+?) \}\}")
_START = re.compile(r"^=(?:(\{.*\}) \+ )?\(\.run\.input // \{\}\)$")
_REDUCERS = {".": "append", "add": "sum", "(add / length)": "average", "max": "max", "min": "min"}
#: The last prompt line of an AgentNode with outputs as import wrote it before agent.answer:
#: Flows imported then still export with those outputs.
_JSON_LINE = re.compile(r"^Answer with a JSON object with the keys: (.*)\.$")
_INPUT_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*): \{\{ (.+) \}\}$")
#: An agent node's ``history`` as import writes it: the turns of the nodes before it that ran.
_CONVERSATION = re.compile(
    r'^=\[\(if \.nodes\.[A-Za-z_][A-Za-z0-9_]* then \(\{"role": .* else empty end\)\]$', re.S
)


class _FlowWriter:
    """One Flow written as an Agent Spec Flow component."""

    def __init__(self, ex: export_components.Exporter, name: str, spec: flow_api.FlowSpec) -> None:
        self.ex, self.name, self.spec = ex, name, spec
        self.nodes = {n.id: n for n in spec.nodes}
        self.index = {n.id: i for i, n in enumerate(spec.nodes)}
        self.out: dict[str, dict[str, Any]] = {}
        self.data: list[dict[str, Any]] = []
        self.reads: dict[str, set[str]] = {n.id: set() for n in spec.nodes}
        self.guarded: dict[str, str] = {}
        #: Branch node id -> the flow node whose end branches it routes (FlowNode branches).
        self.routes: dict[str, str] = {}
        #: Join node id -> the flow nodes of a ParallelFlowNode; fork id -> join id.
        self.parallel = jqshapes.parallels(spec)
        #: Where a component's translation starts (a fork, a try) -> the component's node id.
        self.entries = {jqshapes.fork_of(spec, c): j for j, c in self.parallel.items()}
        #: A CatchExceptionNode's node id -> its catchErrors flow node and the outputs' defaults.
        self.catches = {n.id: c for n in spec.nodes if (c := jqshapes.catch(n)) is not None}
        self.entries.update({c[0]: j for j, c in self.catches.items()})
        #: An AgentNode with an A2AAgent: its node id -> its message/send tool node.
        self.remote = {n.id: r for n in spec.nodes if (r := jqshapes.a2a(n, self.nodes))}
        self.entries.update({c: j for j, c in self.remote.items()})
        self.agent_calls: list[
            tuple[str, str, list[str], list[dict[str, Any]], flow_api.AgentAnswer | None]
        ] = []

    def parallel_node(self, join: flow_api.Node, base: dict[str, Any]) -> dict[str, Any]:
        """A ParallelFlowNode: its sub-flows, and inputs fed to whichever sub-flow reads them."""
        bound: set[str] = set()
        subflows = []
        for call_id in self.parallel[join.id]:
            call = self.nodes[call_id].flow
            assert call is not None
            text = call.input if isinstance(call.input, str) else ""
            for title, expr in (jqshapes.parse_object(text[1:]) or {}).items():
                if title not in bound:
                    bound.add(title)
                    self.bind(expr, join.id, title, self.path(call_id, "flow.input"))
            subflows.append(self.ex.flow(call.name, self.path(call_id, "flow")))
        return {"component_type": "ParallelFlowNode", **base, "subflows": subflows}

    def catch_node(self, node: flow_api.Node, base: dict[str, Any]) -> dict[str, Any]:
        """A CatchExceptionNode: its sub-flow, inputs, and outputs with their defaults."""
        attempt, defaults = self.catches[node.id]
        call = self.nodes[attempt].flow if attempt in self.nodes else None
        if call is None or not call.catch_errors:
            self.ex.fail(self.path(node.id, "transform"), "reads no catchErrors flow node")
            return {}
        text = call.input if isinstance(call.input, str) else ""
        for title, expr in (jqshapes.parse_object(text[1:]) or {}).items():
            self.bind(expr, node.id, title, self.path(attempt, "flow.input"))
        info = {"title": checks.CAUGHT_INFO, "anyOf": [{"type": "string"}, {"type": "null"}]}
        outputs = [{"title": k, "default": v} for k, v in defaults.items()]
        return {
            "component_type": "CatchExceptionNode", **base,
            "subflow": self.ex.flow(call.name, self.path(attempt, "flow")),
            "outputs": [*outputs, {**info, "default": None}],
        }  # fmt: skip

    def a2a_node(self, node: flow_api.Node, base: dict[str, Any]) -> dict[str, Any]:
        """An AgentNode asking an A2AAgent: its URL, and inputs from the call's arguments."""
        call = self.nodes[self.remote[node.id]].tool
        assert call is not None and call.http is not None and isinstance(call.args, dict)
        inputs = []
        for title, value in call.args.items():
            if title == "message_id":
                continue
            expr = value[1:] if isinstance(value, str) and value.startswith("=") else "null"
            default = self.bind(expr, node.id, title, self.path(call.name or node.id, "tool.args"))
            inputs.append({"title": title, "type": "string", **(default or {})})
        agent = {
            "component_type": "A2AAgent", "name": node.id, "agent_url": call.http.url,
            "inputs": inputs, "outputs": [{"title": "output", "type": "string"}],
        }  # fmt: skip
        return {"component_type": "AgentNode", **base, "agent": agent}

    def route_of(self, branch: flow_api.Branch) -> str | None:
        """The FlowNode or CatchExceptionNode whose end branch ``branch`` routes on."""
        match = re.fullmatch(
            rf"=\.nodes\.([a-z][a-z0-9_]*)\.json\.{mapping.BRANCH_OUTPUT}", branch.value
        )
        source = self.nodes.get(match.group(1)) if match else None
        routable = source is not None and (source.flow is not None or source.id in self.catches)
        if source is None or not routable or branch.default is not None:
            return None
        return source.id

    def cid(self, node_id: str) -> str:
        return f"{self.name}.{node_id}"

    def path(self, node_id: str, field: str = "") -> str:
        return f"spec.nodes[{self.index[node_id]}]" + (f".{field}" if field else "")

    # -- reading expressions -----------------------------------------------------------------

    def read(self, expr: str) -> tuple[str, str] | None:
        match = _READ.match(expr)
        if match and match.group(1) in self.nodes:
            source, part, key = match.groups()
            if key:
                self.reads[source].add(f"json:{key[1:].strip(chr(34))}")
                return source, key[1:].strip('"')
            self.reads[source].add(part[1:])
            return source, self.whole_output(source, part[1:])
        match = _BY_NAME.match(expr)
        if match and match.group(1) in self.nodes:
            source, key = match.group(1), json.loads(match.group(2))
            self.reads[source].add(f"json:{key}")
            return source, key
        match = _COLLECT.match(expr)
        if match and match.group(1) in self.nodes and match.group(3) in _REDUCERS:
            source, key = match.group(1), match.group(2).strip('"')
            self.reads[source].add(f"collect:{key}:{_REDUCERS[match.group(3)]}")
            return source, f"collected_{key}"
        return None

    def whole_output(self, source: str, part: str) -> str:
        node = self.nodes[source]
        if part == "text":
            return "generated_text" if node.llm is not None else "output"
        if node.input is not None:
            return "user_input"
        return "response" if node.tool is not None and node.tool.http is not None else "result"

    def bind(self, expr: str, node_id: str, title: str, path: str) -> Any:
        """Add the data edges of one input; a JSON literal is returned as the input's default."""
        try:
            return {"default": json.loads(expr)}
        except ValueError:
            pass
        for alternative in jqshapes.split_alternatives(expr):
            found = self.read(alternative)
            if found is None:
                self.ex.fail(
                    path,
                    f"{expr[:120]!r}: Agent Spec can only pass a node's output here "
                    "(.nodes.<id>.json.<key>, .json or .text)",
                )
                return None
            source, output = found
            self.data.append(
                {
                    "component_type": "DataFlowEdge",
                    "name": f"{source}_{output}_to_{node_id}_{title}",
                    "source_node": export_components.ref(self.cid(source)),
                    "source_output": output,
                    "destination_node": export_components.ref(self.cid(node_id)),
                    "destination_input": title,
                }
            )
        return None

    def template(self, text: str, node_id: str, path: str) -> str:
        """``{{ expr }}`` -> ``{{name}}`` with a data edge into input ``name``."""
        names: dict[str, str] = {}

        def one(match: re.Match[str]) -> str:
            expr = match.group(1)
            if expr not in names:
                found = self.read(jqshapes.split_alternatives(expr)[0])
                stem = found[1] if found else "value"
                title, n = stem, 2
                while title in names.values():
                    title, n = f"{stem}_{n}", n + 1
                names[expr] = title
                self.bind(expr, node_id, title, path)
            return "{{" + names[expr] + "}}"

        return _TEMPLATE.sub(one, text)

    # -- nodes -------------------------------------------------------------------------------

    def node(self, node: flow_api.Node, first: bool) -> dict[str, Any] | None:
        base: dict[str, Any] = {"id": self.cid(node.id), "name": node.id}
        if node.description:
            base["description"] = node.description
        if node.id in self.parallel:
            return self.parallel_node(node, base)
        if node.id in self.catches:
            return self.catch_node(node, base)
        if node.id in self.remote:
            return self.a2a_node(node, base)
        if node.id in self.entries or any(node.id in c for c in self.parallel.values()):
            return None
        if node.transform is not None:
            return self.transform(node, base, first)
        if node.llm is not None:
            return self.llm(node, node.llm, base)
        if node.agent is not None:
            return self.agent(node, node.agent, base)
        if node.tool is not None:
            return self.tool(node, node.tool, base)
        if node.branch is not None and self.route_of(node.branch) is not None:
            self.routes[node.id] = self.route_of(node.branch) or ""
            return None
        if node.branch is not None:
            value = node.branch.value
            if value.startswith("="):
                self.bind(
                    value[1:], node.id, "branching_mapping_key", self.path(node.id, "branch.value")
                )
            else:
                self.ex.fail(
                    self.path(node.id, "branch.value"),
                    "an Agent Spec branch reads an input: use =<expression>",
                )
            return {"component_type": "BranchingNode", **base, "mapping": dict(node.branch.cases)}
        if node.flow is not None:
            return self.subflow(node, node.flow, base)
        if node.map is not None:
            return self.map(node, node.map, base)
        if node.input is not None:
            message = self.template(
                node.input.message, node.id, self.path(node.id, "input.message")
            )
            return {"component_type": "InputMessageNode", **base, "message": message}
        self.approval(node)
        return None

    def transform(
        self, node: flow_api.Node, base: dict[str, Any], first: bool
    ) -> dict[str, Any] | None:
        assert node.transform is not None
        if first and _START.match(node.transform):
            properties = export_components.properties(self.spec.input)
            return {
                "component_type": "StartNode",
                **base,
                "inputs": properties,
                "outputs": properties,
            }
        fields = (
            jqshapes.parse_object(node.transform[1:]) if node.transform.startswith("=") else None
        )
        message = (
            jqshapes.parse_text(node.transform[1:]) if node.transform.startswith("=") else None
        )
        if not first and fields is None and message is not None:
            return self.output_message(node, base, message)
        if first or fields is None:
            self.ex.fail(
                self.path(node.id, "transform"),
                "a jq transform has no Agent Spec equivalent (only the StartNode form "
                '=(.run.input // {}) first and EndNode objects {"key": (expr)} export)',
            )
            return None
        outputs = []
        branch = jqshapes.literal_string(fields.pop(mapping.BRANCH_OUTPUT, None))
        for title, expr in fields.items():
            default = self.bind(expr, node.id, title, self.path(node.id, "transform"))
            outputs.append({"title": title, **(default or {})})
        end = {"component_type": "EndNode", **base, "inputs": outputs, "outputs": outputs}
        return end | ({"branch_name": branch} if branch is not None else {})

    def output_message(
        self, node: flow_api.Node, base: dict[str, Any], parts: list[tuple[bool, str]]
    ) -> dict[str, Any]:
        """An OutputMessageNode: literal text and ``{{name}}`` placeholders fed by data edges."""
        text = ""
        for is_expr, part in parts:
            text += (
                self.template("{{ " + part + " }}", node.id, self.path(node.id, "transform"))
                if is_expr
                else part
            )
        return {"component_type": "OutputMessageNode", **base, "message": text}

    def llm(
        self, node: flow_api.Node, call: flow_api.LlmCall, base: dict[str, Any]
    ) -> dict[str, Any]:
        if call.system:
            self.ex.fail(
                self.path(node.id, "llm.system"),
                "an LlmNode has no system prompt; put it in the prompt",
            )
        out = {
            "component_type": "LlmNode", **base,
            "llm_config": self.ex.llm_config(call.model, self.path(node.id, "llm.model")),
            "prompt_template": self.template(
                call.prompt, node.id, self.path(node.id, "llm.prompt")
            ),
        }  # fmt: skip
        if call.output_schema is not None:
            out["outputs"] = export_components.properties(_one_output(call.output_schema))
        return out

    def agent(
        self, node: flow_api.Node, call: flow_api.AgentCall, base: dict[str, Any]
    ) -> dict[str, Any]:
        inputs: list[str] = []
        outputs: list[dict[str, Any]] = []
        for field, wire in (("node_tools", "nodeTools"), ("files", "files")):
            if getattr(call, field):
                self.ex.fail(
                    self.path(node.id, f"agent.{wire}"), f"{wire} have no Agent Spec equivalent"
                )
        if call.history is not None and not _CONVERSATION.match(call.history):
            # import gives an AgentNode the flow's conversation; any other history would be lost
            self.ex.fail(
                self.path(node.id, "agent.history"),
                "only the flow's conversation (as import writes it) has an Agent Spec "
                "equivalent: an AgentNode sees the messages before it; leave history out",
            )
        lines = [] if call.prompt == "Begin." else call.prompt.split("\n")
        for line in lines:
            as_input, as_json = _INPUT_LINE.match(line), _JSON_LINE.match(line)
            if as_input:
                inputs.append(as_input.group(1))
                self.bind(
                    as_input.group(2),
                    node.id,
                    as_input.group(1),
                    self.path(node.id, "agent.prompt"),
                )
            elif as_json:
                outputs = [{"title": t} for t in as_json.group(1).split(", ")]
            else:
                self.ex.fail(
                    self.path(node.id, "agent.prompt"),
                    "an AgentNode passes inputs, not a prompt: "
                    "write it as lines 'name: {{ expr }}'",
                )
                break
        if call.answer is not None:
            outputs = export_components.properties(call.answer.schema_)
        self.agent_calls.append((node.id, call.name, inputs, outputs, call.answer))
        return {"component_type": "AgentNode", **base}

    def tool(
        self, node: flow_api.Node, call: flow_api.ToolCall, base: dict[str, Any]
    ) -> dict[str, Any] | None:
        tool: dict[str, Any]
        args = call.args if isinstance(call.args, dict) else {}
        if call.args is not None and not isinstance(call.args, dict):
            self.ex.fail(
                self.path(node.id, "tool.args"),
                "Agent Spec tool inputs are a mapping of name -> =expression",
            )
        inputs = []
        for title, value in args.items():
            expr = (
                value[1:] if isinstance(value, str) and value.startswith("=") else json.dumps(value)
            )
            default = self.bind(expr, node.id, title, self.path(node.id, f"tool.args.{title}"))
            inputs.append({"title": title, **(default or {})})
        if call.http is not None:
            return {
                "component_type": "ApiNode",
                **base,
                "inputs": inputs,
                **self.ex.http(call.http, self.path(node.id, "tool.http")),
            }
        if call.mcp is not None:
            tool = {
                "component_type": "MCPTool",
                "name": call.name,
                "inputs": inputs,
                "client_transport": self.ex.transport(call.mcp, self.path(node.id, "tool.mcp")),
            }
            return {"component_type": "ToolNode", **base, "tool": tool}
        if call.client is not None:
            tool = {
                "component_type": "ClientTool",
                "name": call.name or f"{node.id}_tool",
                "inputs": inputs,
            }
            return {"component_type": "ToolNode", **base, "tool": tool}
        if call.python is None:
            self.ex.fail(
                self.path(node.id, "tool"),
                "a tool of an Agent called by name has no Agent Spec equivalent; "
                "use an inline python or http tool",
            )
            return None
        tool = {
            "component_type": "ServerTool",
            "name": f"{node.id}_tool",
            "inputs": inputs,
            "metadata": {mapping.METADATA_KEY: {"python": call.python.script}},
        }
        return {"component_type": "ToolNode", **base, "tool": tool}

    def subflow(
        self, node: flow_api.Node, call: flow_api.FlowCall, base: dict[str, Any]
    ) -> dict[str, Any]:
        fields = (
            jqshapes.parse_object(call.input[1:])
            if isinstance(call.input, str) and call.input.startswith("=")
            else None
        )
        if fields is None and call.input is not None:
            self.ex.fail(
                self.path(node.id, "flow.input"), 'a FlowNode input is an object {"name": (expr)}'
            )
        for title, expr in (fields or {}).items():
            self.bind(expr, node.id, title, self.path(node.id, "flow.input"))
        return {
            "component_type": "FlowNode",
            **base,
            "subflow": self.ex.flow(call.name, self.path(node.id, "flow")),
        }

    def map(
        self, node: flow_api.Node, spec: flow_api.MapNode, base: dict[str, Any]
    ) -> dict[str, Any] | None:
        body = spec.flow
        fields = (
            jqshapes.parse_object(body.input[1:])
            if body and isinstance(body.input, str) and body.input.startswith("=")
            else None
        )
        if body is None or fields is None:
            self.ex.fail(
                self.path(node.id, "map"), 'a MapNode runs a sub-flow with input {"name": (.item)}'
            )
            return None
        # Fields reading the item are mapped over (iterated_<t>); the others are one value for
        # every item, an input of the sub-flow's own name (as the importer writes them).
        given = {t: e for t, e in fields.items() if not re.match(r"^\.item(\[\d+\])?$", e)}
        titles = [t for t in fields if t not in given]
        lists = [spec.items[1:]] if len(titles) == 1 else None
        multi = re.match(r"^=\[(.*)\] \| transpose$", spec.items)
        if spec.items.endswith(f"] | {mapping.MAP_ZIP}"):
            multi = re.match(r"^=\[(.*)\] \| ", spec.items.removesuffix(mapping.MAP_ZIP))
        if multi:
            parts = jqshapes.split_commas(multi.group(1)) if multi.group(1) else []
            lists = [p[1:-1] for p in parts]
        if not spec.items.startswith("=") or lists is None or len(lists) != len(titles):
            self.ex.fail(
                self.path(node.id, "map.items"),
                "Agent Spec maps over inputs: =<expression of a list>",
            )
            return None
        for title, expr in zip(titles, lists, strict=True):
            self.bind(expr, node.id, f"iterated_{title}", self.path(node.id, "map.items"))
        for title, expr in given.items():
            self.bind(expr, node.id, title, self.path(node.id, "map.flow.input"))
        kind = "MapNode" if spec.concurrency == 1 else "ParallelMapNode"
        if given:  # declared, as inferred inputs are all iterated_
            inputs = [*(f"iterated_{t}" for t in titles), *given]
            base = {**base, "inputs": [{"title": t} for t in inputs]}
        return {
            "component_type": kind,
            **base,
            "subflow": self.ex.flow(body.name, self.path(node.id, "map.flow")),
        }

    def approval(self, node: flow_api.Node) -> None:
        after = [e.to for e in self.spec.edges if e.from_ == node.id]
        target = self.nodes.get(after[0]) if len(after) == 1 else None
        if target is None or target.tool is None:
            self.ex.fail(
                self.path(node.id),
                f"{node.kind}: only an approval right before a tool exports "
                "(as requires_confirmation)",
            )
            return None
        self.guarded[node.id] = target.id
        return None


def _one_output(schema: Any) -> Any:
    """The object schema of :func:`mapping.llm_output_schema`'s one output (or its bare value)."""
    match schema:
        case {"anyOf": [{"properties": dict(props)} as whole, dict(bare)]}:
            if len(schema) == 1 and list(props.values()) == [bare]:
                return whole
    return schema


def _finish_outputs(writer: _FlowWriter) -> None:
    """Declare the outputs that later nodes read (known only once every node is written)."""
    for node_id, reads in writer.reads.items():
        component = writer.out.get(node_id)
        if component is None:
            continue
        keys = sorted(r[5:] for r in reads if r.startswith("json:"))
        if component["component_type"] == "ToolNode" and keys:
            component["tool"]["outputs"] = [{"title": k} for k in keys]
        elif component["component_type"] == "ToolNode" and "json" in reads:
            component["tool"]["outputs"] = [{"title": "result"}]
        elif component["component_type"] == "ApiNode" and keys:
            component["outputs"] = [{"title": k} for k in keys]
        elif component["component_type"] in ("MapNode", "ParallelMapNode"):
            collects = sorted(r.split(":")[1:] for r in reads if r.startswith("collect:"))
            component["reducers"] = {k: reducer for k, reducer in collects}
    for node_id, name, inputs, outputs, answer in writer.agent_calls:
        if not outputs and "text" in writer.reads[node_id]:
            outputs = [{"title": "output", "type": "string"}]
        where = writer.path(node_id, "agent")
        writer.out[node_id]["agent"] = writer.ex.agent(
            name, inputs, outputs, where, in_node=True, answer=answer
        )


def _control_edges(writer: _FlowWriter) -> list[dict[str, Any]]:
    def edge(source: str, target: str, branch: str | None = None) -> dict[str, Any]:
        target = writer.entries.get(target, writer.guarded.get(target, target))
        out = {
            "component_type": "ControlFlowEdge",
            "name": f"{source}_to_{target}",
            "from_node": export_components.ref(writer.cid(source)),
        }
        if branch is not None:
            out["from_branch"] = branch
        return {**out, "to_node": export_components.ref(writer.cid(target))}

    edges = [
        edge(e.from_, e.to)
        for e in writer.spec.edges
        if e.from_ not in writer.guarded
        and e.from_ not in writer.routes
        and e.to not in writer.routes
        and e.from_ not in writer.entries
        and e.to not in writer.parallel
    ]
    for node in writer.spec.nodes:
        if node.branch is not None and node.id in writer.routes:
            edges += [edge(writer.routes[node.id], t, b) for b, t in node.branch.cases.items()]
        elif node.branch is not None:
            edges += [
                edge(node.id, target, target)
                for target in dict.fromkeys(node.branch.cases.values())
            ]
            if node.branch.default is not None:
                edges.append(edge(node.id, node.branch.default, "default"))
    return edges


def _write_flow(
    ex: export_components.Exporter, name: str, spec: flow_api.FlowSpec
) -> dict[str, Any]:
    writer = _FlowWriter(ex, name, spec)
    if not spec.edges and len(spec.nodes) > 1:
        ex.fail("spec.edges", "a flow that runs in list order has no edges to export; list them")
    for i, node in enumerate(spec.nodes):
        component = writer.node(node, i == 0)
        if component is not None:
            writer.out[node.id] = component
    _finish_outputs(writer)
    for node_id, component in writer.out.items():
        for tool_node in writer.guarded.values():
            if tool_node == node_id:
                component["tool"]["requires_confirmation"] = True
        ex.components[writer.cid(node_id)] = component
    first = spec.nodes[0].id
    flow: dict[str, Any] = {
        "component_type": "Flow", "id": f"flow.{name}", "name": name,
        "start_node": export_components.ref(writer.cid(first)),
        "nodes": [export_components.ref(writer.cid(n)) for n in writer.out],
        "control_flow_connections": _control_edges(writer),
        "data_flow_connections": writer.data,
    }  # fmt: skip
    if spec.description:
        flow["description"] = spec.description
    return flow


def export(flow_name: str, resolver: capabilities.Resolver) -> dict[str, Any]:
    """The Agent Spec document of a Flow; SpecInvalid naming what has no equivalent."""
    ex = export_components.Exporter(resolver, _write_flow)
    spec = resolver.flow(flow_name)
    if spec is not None and export_components.runs_one_agent(spec):
        return export_components.agent_document(ex, flow_name, spec)
    root = ex.flow(flow_name, "")
    if ex.problems:
        raise errors.SpecInvalid(ex.problems)
    flow = ex.components.pop(root[document.REF])
    return {document.VERSION_FIELD: document.EXPORT_VERSION, **flow, document.REFS: ex.components}
