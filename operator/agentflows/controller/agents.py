"""Agent validation: ``Ready`` says whether an Agent's references resolve and its Secrets exist.

Reconciler for keys of kind Agent (:mod:`agentflows.controller.handlers` enqueues them). It
checks that sub-agents and sub-flows exist in the namespace and that every Secret the Agent
names exists (metadata-only GET; values are never read), writes ``Ready`` (True/False, one
path-named message per problem), ``observedGeneration`` and the tool names, and, when the spec
changed or the Agent is gone, re-validates the Flows of the namespace (they may use it).
Secrets are not watched, so an Agent that is not Ready is looked at again periodically.
"""

from __future__ import annotations

import logging
from typing import Any

from agentflows.agents import spec_tools
from agentflows.api import agent as agent_api
from agentflows.api import documents
from agentflows.controller import conditions, context, resolve, tooldiscovery, workqueue
from agentflows.engine import graph
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


async def problems_of(
    ctl: context.Controller, namespace: str, spec: agent_api.AgentSpec, ns: resolve.Namespace
) -> list[documents.Problem]:
    """Every reason the Agent is not Ready."""
    problems = graph.validate_agent(spec)
    for index, name in enumerate(spec.sub_agents):
        if name not in ns.agents:
            problems.append(documents.Problem(f"spec.subAgents[{index}]", f'no Agent "{name}"'))
    for index, name in enumerate(spec.sub_flows):
        if name not in ns.flows:
            problems.append(documents.Problem(f"spec.subFlows[{index}]", f'no Flow "{name}"'))
    problems += await resolve.missing_secrets(ctl.api, namespace, resolve.agent_secret_refs(spec))
    return problems


def ready_status(
    obj: dict[str, Any], problems: list[documents.Problem], extra: dict[str, Any]
) -> dict[str, Any]:
    """The operator's status keys for a validated Agent or Flow."""
    generation = obj["metadata"].get("generation")
    current = (obj.get("status") or {}).get("conditions") or []
    if problems:
        message = "; ".join(str(p) for p in problems)
        conds = conditions.set_condition(
            current, "Ready", "False", "Invalid", message, generation=generation
        )
    else:
        conds = conditions.set_condition(
            current, "Ready", "True", "Valid", "", generation=generation
        )
    return {"observedGeneration": generation, "conditions": conds, **extra}


def unchanged(obj: dict[str, Any], status: dict[str, Any]) -> bool:
    """True when writing ``status`` would change nothing."""
    current = obj.get("status") or {}
    return all(current.get(key) == value for key, value in status.items())


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Validate one Agent; return when to look again (not Ready: Secrets may appear)."""
    path = kube.path_of("agents", key.namespace, key.name)
    try:
        obj = await ctl.api.get(path)
    except kube.ApiError as exc:
        if exc.not_found:
            ctl.tools.forget(key.namespace, key.name)
            _revalidate_flows(ctl, key.namespace, await _flow_names(ctl, key.namespace))
            return None
        raise
    spec, problems = resolve.parse_spec(agent_api.AgentSpec, obj.get("spec"))
    ns = await resolve.load_namespace(ctl.api, key.namespace)
    extra: dict[str, Any] = {}
    discovered: tooldiscovery.Discovered | None = None
    if spec is not None:
        problems = await problems_of(ctl, key.namespace, spec, ns)
        discovered = _discover(ctl, obj, spec)
        if discovered is not None:
            extra["tools"] = spec_tools.declared_tool_names(spec) + discovered.names
    status = ready_status(obj, problems, extra)
    if spec is not None:
        status["conditions"] = conditions.set_condition(
            status["conditions"],
            tooldiscovery.TOOLS_DISCOVERED,
            *_discovery_condition(spec, discovered),
            generation=status["observedGeneration"],
        )
    if not unchanged(obj, status):
        await ctl.api.merge_patch(path + "/status", context.status_patch(status))
        log.info("Agent %s/%s Ready=%s", key.namespace, key.name, not problems)
    if (obj.get("status") or {}).get("observedGeneration") != status["observedGeneration"]:
        _revalidate_flows(ctl, key.namespace, list(ns.flows) + _broken_flows(ns))
    if problems or (discovered is not None and discovered.errors):
        return ctl.config.not_ready_recheck_seconds
    return None


def _discover(
    ctl: context.Controller, obj: dict[str, Any], spec: agent_api.AgentSpec
) -> tooldiscovery.Discovered | None:
    """The HTTP MCP servers' tool names for this generation; None while they are asked."""
    servers = tooldiscovery.http_servers(spec)
    if not servers:
        return tooldiscovery.Discovered([], [], 0.0)
    meta = obj["metadata"]
    version = f"{meta.get('uid')}/{meta.get('generation')}"
    return ctl.tools.lookup(meta["namespace"], meta["name"], version, servers)


def _discovery_condition(
    spec: agent_api.AgentSpec, discovered: tooldiscovery.Discovered | None
) -> tuple[str, str, str]:
    """``ToolsDiscovered``: (status, reason, message)."""
    if discovered is None:
        names = ", ".join(t.name for t in tooldiscovery.http_servers(spec))
        return "Unknown", "Discovering", f"listing the tools of MCP servers: {names}"
    if discovered.errors:
        return "False", "McpUnavailable", "; ".join(discovered.errors)
    stdio = [t.name for t in tooldiscovery.stdio_servers(spec)]
    if stdio:
        note = f"stdio MCP servers are listed when a run starts them: {', '.join(stdio)}"
        return "True", "Discovered", note
    return "True", "Discovered", ""


def _broken_flows(ns: resolve.Namespace) -> list[str]:
    return [name.split("/", 1)[1] for name in ns.broken if name.startswith("Flow/")]


async def _flow_names(ctl: context.Controller, namespace: str) -> list[str]:
    items = (await ctl.api.get(kube.path_of("flows", namespace))).get("items", [])
    return [item["metadata"]["name"] for item in items]


def _revalidate_flows(ctl: context.Controller, namespace: str, names: list[str]) -> None:
    for name in names:
        ctl.enqueue(workqueue.FLOW, namespace, name)
