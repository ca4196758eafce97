"""What a Flow or Agent refers to, read from the API: other Agents and Flows, named Secrets.

Used by the Agent and Flow validators and by the runner pod's env. Which Secrets a spec names
comes from the one reference walk, :mod:`agentflows.api.references` (the admission policy that
authorizes them is generated from it too). Agents and Flows come from
the operator's cache (:class:`agentflows.controller.cache.Namespace`). A Secret is checked with a
metadata-only GET (``PartialObjectMetadata``): the operator learns that it exists, never a value.
"""

from __future__ import annotations

import dataclasses

from agentflows.api import agent as agent_api
from agentflows.api import common, documents, references
from agentflows.api import flow as flow_api
from agentflows.controller import cache
from agentflows.kube import client as kube

#: Ask for metadata only, so a GET on a Secret never returns its data.
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
#: A Secret named, with the path of the field naming it.
SecretRef = tuple[str, common.SecretKeySelector]


# ----- secrets ----------------------------------------------------------------------------------


def _secrets(found: list[references.Reference], for_runner: bool) -> list[SecretRef]:
    return [
        (ref.path, common.SecretKeySelector(name=ref.name, key=ref.key or ""))
        for ref in found
        if ref.kind == references.SECRET and ref.for_runner == for_runner
    ]


def agent_secret_refs(spec: agent_api.AgentSpec) -> list[SecretRef]:
    """Every secret an Agent names, with the path of the field naming it."""
    return _secrets(references.agent_references(spec), for_runner=True)


def flow_secret_refs(spec: flow_api.FlowSpec) -> list[SecretRef]:
    """Every secret the runner needs for a Flow's own nodes and runner env (not its Agents')."""
    return _secrets(references.flow_references(spec), for_runner=True)


def trigger_secret_refs(spec: flow_api.FlowSpec) -> list[SecretRef]:
    """Secrets of webhook triggers (read by the webhook receiver, not the runner)."""
    return _secrets(references.flow_references(spec), for_runner=False)


def _map_tool(node: flow_api.Node) -> flow_api.ToolCall | None:
    return node.map.tool if node.map is not None else None


async def secret_exists(api: kube.Client, namespace: str, name: str) -> bool | None:
    """True/False when the Secret exists or not; None when we may not look (403).

    The request asks for ``PartialObjectMetadata``, so the answer carries no data even though
    RBAC's ``get`` on secrets would allow it.
    """
    try:
        await api.request("GET", kube.path_of("secrets", namespace, name), accept=PARTIAL_METADATA)
    except kube.ApiError as exc:
        if exc.not_found:
            return False
        if exc.status == 403:
            return None
        raise
    return True


async def missing_secrets(
    api: kube.Client, namespace: str, refs: list[SecretRef]
) -> list[documents.Problem]:
    """A problem for every reference whose Secret does not exist (each Secret checked once)."""
    seen: dict[str, bool | None] = {}
    problems: list[documents.Problem] = []
    for path, ref in refs:
        if ref.name not in seen:
            seen[ref.name] = await secret_exists(api, namespace, ref.name)
        exists = seen[ref.name]
        if exists is False:
            problems.append(documents.Problem(path, f'Secret "{ref.name}" does not exist'))
        elif exists is None:
            problems.append(
                documents.Problem(path, f'Secret "{ref.name}" cannot be checked (forbidden)')
            )
    return problems


# ----- what a Flow reaches ----------------------------------------------------------------------


@dataclasses.dataclass
class Reach:
    """The Flows and Agents a Flow can reach through nodes, sub-agents and sub-flows."""

    flows: dict[str, flow_api.FlowSpec]
    agents: dict[str, agent_api.AgentSpec]
    missing: list[str]


def _flow_refs(spec: flow_api.FlowSpec) -> tuple[set[str], set[str]]:
    agents: set[str] = set()
    flows: set[str] = set()
    for node in spec.nodes:
        for call in (node.agent, node.map.agent if node.map else None):
            if call is not None:
                agents.add(call.name)
        for tool in (node.tool, _map_tool(node)):
            if tool is not None and tool.agent is not None:
                agents.add(tool.agent)
        for sub in (node.flow, node.map.flow if node.map else None):
            if sub is not None:
                flows.add(sub.name)
    return agents, flows


def reach(flow_name: str, ns: cache.Namespace) -> Reach:
    """Walk from ``flow_name`` over every Agent and sub-flow it can call."""
    out = Reach(flows={}, agents={}, missing=[])
    flow_stack = [flow_name]
    agent_stack: list[str] = []
    while flow_stack or agent_stack:
        if flow_stack:
            name = flow_stack.pop()
            if name in out.flows:
                continue
            flow_spec = ns.flows.get(name)
            if flow_spec is None:
                out.missing.append(f"Flow/{name}")
                continue
            out.flows[name] = flow_spec
            agents, flows = _flow_refs(flow_spec)
            agent_stack += sorted(agents)
            flow_stack += sorted(flows)
            continue
        name = agent_stack.pop()
        if name in out.agents:
            continue
        agent_spec = ns.agents.get(name)
        if agent_spec is None:
            out.missing.append(f"Agent/{name}")
            continue
        out.agents[name] = agent_spec
        agent_stack += agent_spec.agents_called()
        flow_stack += agent_spec.sub_flows
    return out
