"""Agent validation: ``Ready`` says whether an Agent's references resolve and its Secrets exist.

Reconciler for keys of kind Agent (the cache enqueues them, and the Flows and Agents that reach
one whose generation changed). It checks that sub-agents and sub-flows exist in the namespace
and that every Secret the Agent names exists (metadata-only GET; values are never read), and
writes ``Ready`` (True/False, one path-named message per problem), ``observedGeneration`` and
the tool names when they changed. The Secret check is kept with what it was computed from (the
Agent's version and which of its references exist); Secrets are not watched, so an Agent that
is not Ready is checked again every ``notReadyRecheckSeconds``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agentflows.agents import spec_tools
from agentflows.api import agent as agent_api
from agentflows.api import documents
from agentflows.controller import cache, conditions, context, resolve, tooldiscovery
from agentflows.controller.runtime import workqueue
from agentflows.engine import graph
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


def _reference_problems(spec: agent_api.AgentSpec, ns: cache.Namespace) -> list[documents.Problem]:
    problems = graph.validate_agent(spec)
    for index, name in enumerate(spec.sub_agents):
        if name not in ns.agents:
            problems.append(documents.Problem(f"spec.subAgents[{index}]", f'no Agent "{name}"'))
    for index, name in enumerate(spec.handoffs):
        if name not in ns.agents:
            problems.append(documents.Problem(f"spec.handoffs[{index}]", f'no Agent "{name}"'))
    for index, name in enumerate(spec.sub_flows):
        if name not in ns.flows:
            problems.append(documents.Problem(f"spec.subFlows[{index}]", f'no Flow "{name}"'))
    return problems


async def problems_of(
    ctl: context.Controller, agent: cache.Spec[agent_api.AgentSpec], namespace: str
) -> list[documents.Problem]:
    """Every reason the Agent is not Ready (the Secret check only when it is due)."""
    assert agent.spec is not None
    found = _reference_problems(agent.spec, ctl.cache.namespace(namespace))
    key = (agent.uid, agent.generation, tuple(str(p) for p in found))
    memo_key = (workqueue.AGENT, namespace, agent.name)
    known = ctl.validated.get(memo_key)
    recheck = ctl.config.not_ready_recheck_seconds
    if known is not None and known[0] == key:
        checked_at, problems = known[1], known[2]
        if not problems or time.monotonic() - checked_at < recheck:
            return list(problems)
    refs = resolve.agent_secret_refs(agent.spec)
    problems = found + await resolve.missing_secrets(ctl.api, namespace, refs)
    ctl.validated[memo_key] = (key, time.monotonic(), problems)
    ctl.metrics.validations.labels(workqueue.AGENT).inc()
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
    agent = ctl.cache.agent(key.namespace, key.name)
    if agent is None:
        ctl.tools.forget(key.namespace, key.name)
        ctl.validated.pop((workqueue.AGENT, key.namespace, key.name), None)
        return None
    obj, spec = agent.obj, agent.spec
    problems = list(agent.problems)
    extra: dict[str, Any] = {}
    discovered: tooldiscovery.Discovered | None = None
    if spec is not None:
        problems = await problems_of(ctl, agent, key.namespace)
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
        path = kube.path_of("agents", key.namespace, key.name, sub="status")
        ctl.cache.stored(await ctl.api.merge_patch(path, context.status_patch(status)))
        log.info("Agent %s/%s Ready=%s", key.namespace, key.name, not problems)
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
