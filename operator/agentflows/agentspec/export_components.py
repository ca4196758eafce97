"""Write agentflows Agents, tools and models as Agent Spec components; root Agents and Swarms.

Used by :mod:`.exporter`, which writes Flows: :class:`Exporter` holds the components written so
far (each once, under ``$referenced_components``) and the problems found; it writes a Flow it
meets through the ``write_flow`` function the exporter gives it. A Flow of one agent node whose
prompt ends with the user's message is a root Agent (:func:`agent_document`), or a Swarm when its
agents hand the conversation to each other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from agentflows.agentspec import components, document, errors, mapping
from agentflows.api import agent as agent_api
from agentflows.api import documents
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities

_ARG = re.compile(r"\{\{ \.args\.([A-Za-z_][A-Za-z0-9_]*) \}\}")
#: Writes one Flow as an Agent Spec Flow component.
FlowWriter = Callable[["Exporter", str, flow_api.FlowSpec], dict[str, Any]]


def ref(component_id: str) -> dict[str, str]:
    """A ``$component_ref`` to ``component_id``."""
    return {document.REF: component_id}


class Exporter:
    """The components of one export, and the problems found writing them."""

    def __init__(self, resolver: capabilities.Resolver, write_flow: FlowWriter) -> None:
        self.resolver = resolver
        self.write_flow = write_flow
        self.components: dict[str, Any] = {}
        self.problems: list[documents.Problem] = []
        self.flows: dict[str, str] = {}
        self.agents: dict[str, str] = {}
        self.llms: dict[str, str] = {}
        #: Exporting a Swarm's agents: their sub-agents and handoffs are its relationships.
        self.swarm = False

    def fail(self, path: str, message: str) -> None:
        """Record that what is at ``path`` has no Agent Spec equivalent, and why."""
        self.problems.append(errors.problem(path, message))

    def llm_config(self, model: agent_api.ModelSpec, path: str) -> dict[str, str]:
        """A reference to the LLM config of ``model`` (one per distinct config)."""
        provider, _, model_id = model.name.partition("/")
        if provider != "openai" or not model_id:
            self.fail(
                f"{path}.name",
                f"{model.name!r}: Agent Spec has no config for this provider; "
                "export supports openai/<model>",
            )
        if model.api_key is not None:
            self.fail(f"{path}.apiKey", "a model key from a Secret has no Agent Spec equivalent")
        config: dict[str, Any] = {"name": model.name, "model_id": model_id}
        if model.api_base:
            config = {"component_type": "OpenAiCompatibleConfig", **config, "url": model.api_base}
        else:
            config = {"component_type": "OpenAiConfig", **config}
        params = {
            k: getattr(model, k)
            for k in ("temperature", "top_p", "max_tokens")
            if getattr(model, k) is not None
        }
        if params:
            config["default_generation_parameters"] = params
        if model.timeout_seconds != agent_api.ModelSpec.model_fields["timeout_seconds"].default:
            config["retry_policy"] = {"request_timeout": model.timeout_seconds}
        canonical = json.dumps(config, sort_keys=True)
        if canonical not in self.llms:
            key = f"llm-{len(self.llms) + 1}"
            self.llms[canonical] = key
            self.components[key] = {"id": key, **config}
        return ref(self.llms[canonical])

    def flow(self, name: str, path: str) -> dict[str, str]:
        """A reference to the exported Flow ``name`` (written once)."""
        cid = f"flow.{name}"
        if name not in self.flows:
            self.flows[name] = cid
            spec = self.resolver.flow(name)
            if spec is None:
                self.fail(path, f'no Flow "{name}"')
            else:
                self.components[cid] = self.write_flow(self, name, spec)
        return ref(cid)

    # -- tools and agents --------------------------------------------------------------------

    def transport(self, mcp: agent_api.McpTool, path: str) -> dict[str, Any]:
        """The MCP client transport of an mcp tool."""
        if mcp.headers:
            self.fail(f"{path}.headers", "MCP headers from Secrets have no Agent Spec equivalent")
        if mcp.command is not None:
            transport: dict[str, Any] = {
                "component_type": "StdioTransport",
                "name": "stdio",
                "command": mcp.command,
                "args": mcp.args,
            }
            if mcp.env:
                transport["env"] = mcp.env
        else:
            transport = {
                "component_type": "SSETransport" if mcp.sse else "StreamableHTTPTransport",
                "name": "http",
                "url": mcp.url,
            }
        if mcp.timeout_seconds != 60:
            transport["session_parameters"] = {"read_timeout_seconds": mcp.timeout_seconds}
        return transport

    def tool(self, tool: agent_api.Tool, path: str) -> tuple[str, dict[str, Any]]:
        """("tools" or "toolboxes", the component) for an Agent's tool."""
        base: dict[str, Any] = {"name": tool.name}
        if tool.description:
            base["description"] = tool.description
        if tool.mcp is not None:
            if tool.mcp.prefix_names:  # not Agent Spec's way: say so, for import to keep it
                meta = {components.PREFIX_NAMES: True}
                base["metadata"] = {mapping.METADATA_KEY: meta}
            transport = self.transport(tool.mcp, f"{path}.mcp")
            include = tool.mcp.include
            if len(include) == 1 and mapping.identifier(include[0], set()) == tool.name:
                return "tools", {
                    "component_type": "MCPTool",
                    **base,
                    "name": include[0],
                    "client_transport": transport,
                    "requires_confirmation": not tool.read_only,
                }
            box = {
                "component_type": "MCPToolBox",
                **base,
                "client_transport": transport,
                "requires_confirmation": not tool.read_only,
            }
            if include:
                box["tool_filter"] = include
            if tool.mcp.exclude:
                self.fail(f"{path}.mcp.exclude", "an exclude list has no Agent Spec equivalent")
            return "toolboxes", box
        base["inputs"] = properties(tool.parameters)
        base["requires_confirmation"] = not tool.read_only
        if tool.http is not None:
            return "tools", {
                "component_type": "RemoteTool",
                **base,
                **self.http(tool.http, f"{path}.http"),
            }
        if tool.client is not None:
            return "tools", {"component_type": "ClientTool", **base}
        assert tool.python is not None
        return "tools", {
            "component_type": "ServerTool",
            **base,
            "metadata": {mapping.METADATA_KEY: {"python": tool.python.script}},
        }

    def http(self, http: agent_api.HttpTool, path: str) -> dict[str, Any]:
        """The RemoteTool/ApiNode fields of an http tool."""
        if http.secret_headers:
            self.fail(
                f"{path}.secretHeaders", "header values from Secrets have no Agent Spec equivalent"
            )
        out: dict[str, Any] = {"url": placeholders(http.url), "http_method": http.method}
        if http.headers:
            out["headers"] = {k: placeholders(v) for k, v in http.headers.items()}
        if http.body is not None:
            out["data"] = placeholders(http.body)
        if http.allow_hosts:
            out["url_allow_list"] = http.allow_hosts
        return out

    def agent(
        self,
        name: str,
        inputs: list[str],
        outputs: list[dict[str, Any]],
        path: str,
        in_node: bool = False,
        answer: flow_api.AgentAnswer | None = None,
    ) -> dict[str, str]:
        """A reference to the exported Agent ``name``; ``in_node``: an AgentNode runs it.

        With an ``answer`` the Agent's outputs are submitted, and ``askUser`` is its
        ``human_in_the_loop``; without, in a node, it is whether it has ``ask_user``.
        """
        cid = f"agent.{name}"
        if name in self.agents:
            return ref(cid)
        self.agents[name] = cid
        spec = self.resolver.agent(name)
        if spec is None:
            self.fail(path, f'no Agent "{name}"')
            return ref(cid)
        for field in ("skills", "sub_flows", "history", "files"):
            if getattr(spec, field):
                self.fail(f"{path}.{field}", f"Agent {name}: {field} have no Agent Spec equivalent")
        if spec.handoffs and not self.swarm:
            self.fail(
                f"{path}.handoffs",
                f"Agent {name}: handoffs have an Agent Spec equivalent only in a Swarm, an Agent "
                "at the root whose agents hand the conversation over",
            )
        system = spec.system_prompt
        for title in inputs:
            system = system.replace(f"<{title}>", f"{{{{{title}}}}}")
        component: dict[str, Any] = {
            "component_type": "Agent", "id": cid, "name": name,
            "llm_config": self.llm_config(spec.model, f"{path}.model"),
            "system_prompt": system,
            "inputs": [{"title": t, "type": "string"} for t in inputs],
            "outputs": outputs,
            "tools": [], "toolboxes": [],
        }  # fmt: skip
        asks = answer.ask_user if answer is not None else components.asks_user(spec)
        if (in_node or answer is not None) and not asks:
            component["human_in_the_loop"] = False
        for i, tool in enumerate(spec.tools):
            if tool.client is not None and tool.name == components.ASK_USER_TOOL:
                continue
            where, exported = self.tool(tool, f"Agent {name}.tools[{i}]")
            component[where].append(exported)
        if spec.sub_agents and not self.swarm:
            component = self.manager_workers(component, spec.sub_agents, path)
        self.components[cid] = component
        return ref(cid)

    def manager_workers(
        self, manager: dict[str, Any], workers: list[str], path: str
    ) -> dict[str, Any]:
        """An Agent with sub-agents as a ManagerWorkers: the Agent manages, sub-agents work."""
        cid, name = manager.pop("id"), manager["name"]
        return {
            "component_type": "ManagerWorkers", "id": cid, "name": name,
            "inputs": manager["inputs"], "outputs": manager["outputs"],
            "group_manager": {**manager, "name": f"{name}-manager"},
            "workers": [self.agent(w, [], [], f"{path}.subAgents") for w in workers],
        }  # fmt: skip


def placeholders(value: Any) -> Any:
    """``{{ .args.x }}`` -> ``{{x}}`` inside strings, lists and mappings."""
    if isinstance(value, str):
        return _ARG.sub(lambda m: "{{" + m.group(1) + "}}", value)
    if isinstance(value, dict):
        return {k: placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [placeholders(v) for v in value]
    return value


def properties(schema: Any) -> list[dict[str, Any]]:
    """An object schema's properties as Agent Spec properties (the title is the key)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    return [
        {**(p if isinstance(p, dict) else {}), "title": k} for k, p in schema["properties"].items()
    ]


_MESSAGE = "{{ .run.input.message }}"


def runs_one_agent(spec: flow_api.FlowSpec) -> bool:
    """True for the flow the importer writes for a top-level Agent."""
    node = spec.nodes[0]
    return len(spec.nodes) == 1 and node.agent is not None and node.agent.prompt.endswith(_MESSAGE)


def agent_document(ex: Exporter, flow_name: str, spec: flow_api.FlowSpec) -> dict[str, Any]:
    """A top-level Agent (or Swarm): inputs are the flow's (less ``message``), as prompt lines."""
    call = spec.nodes[0].agent
    assert call is not None
    inputs = [p for p in properties(spec.input) if p["title"] != "message"]
    lines = call.prompt.removesuffix(_MESSAGE).splitlines()
    expected = [mapping.input_line(p) for p in inputs]
    if lines != expected:
        ex.fail(
            "spec.nodes[0].agent.prompt",
            f"a top-level Agent's prompt is the input lines then {_MESSAGE}",
        )
    members = _swarm_members(ex.resolver, call.name)
    ex.swarm = any(_handoffs(ex.resolver.agent(m)) for m in members)
    outputs = properties(call.answer.schema_) if call.answer is not None else []
    titles = [str(p["title"]) for p in inputs]
    ref = ex.agent(call.name, titles, outputs, "spec.nodes[0].agent", answer=call.answer)
    root = _swarm(ex, flow_name, members) if ex.swarm else None
    if ex.problems:
        raise errors.SpecInvalid(ex.problems)
    first = ex.components[ref[document.REF]]
    first["inputs"] = inputs
    if root is None:
        root = ex.components.pop(ref[document.REF])
    if spec.description:
        root["description"] = spec.description
    return {document.VERSION_FIELD: document.EXPORT_VERSION, **root, document.REFS: ex.components}


def _swarm_members(resolver: capabilities.Resolver, first: str) -> list[str]:
    """``first`` and every Agent it reaches through sub-agents and handoffs, in order met."""
    members = [first]
    for name in members:
        spec = resolver.agent(name)
        reached = spec.agents_called() if spec else []
        members += [n for n in dict.fromkeys(reached) if n not in members]
    return members


def _swarm(ex: Exporter, flow_name: str, members: list[str]) -> dict[str, Any]:
    """The Swarm of Agents that hand the conversation over: who reaches whom, and how."""
    pairs: list[list[dict[str, str]]] = []
    modes: set[str] = set()
    for name in members:
        spec = ex.resolver.agent(name)
        messages = list(spec.sub_agents) if spec else []
        handoffs = _handoffs(spec)
        if messages and handoffs and messages != handoffs:
            ex.fail(
                f"Agent {name}.subAgents",
                "the sub-agents differ from the handoffs; an Agent Spec "
                "Swarm gives every relationship the same handoff setting",
            )
        if messages or handoffs:
            modes.add("optional" if messages and handoffs else "always" if handoffs else "never")
        for recipient in dict.fromkeys([*messages, *handoffs]):
            pairs.append([ex.agent(name, [], [], ""), ex.agent(recipient, [], [], "")])
    if len(modes) > 1:
        ex.fail(
            "spec.nodes[0].agent", f"the agents mix handoff settings ({', '.join(sorted(modes))})"
        )
    return {
        "component_type": "Swarm", "id": flow_name, "name": flow_name,
        "first_agent": ex.agent(members[0], [], [], ""),
        "relationships": pairs,
        "handoff": modes.pop() if modes else "optional",
    }  # fmt: skip


def _handoffs(spec: agent_api.AgentSpec | None) -> list[str]:
    return list(spec.handoffs) if spec is not None else []
