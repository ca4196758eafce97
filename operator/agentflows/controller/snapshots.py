"""The run snapshot, as the operator uses it: written once before the first pod, read back.

A thin layer over :mod:`agentflows.kube.snapshot` (the ConfigMap ``<run>-snapshot`` and its
layout are defined there and in ``kube/NOTES.md``): it feeds the namespace's parsed specs to
``build_snapshot`` and parses what is stored. An existing snapshot is never rewritten, so edits
to a Flow never change a started run and a restarted operator stays idempotent.
"""

from __future__ import annotations

import json
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.controller import resolve
from agentflows.kube import client as kube
from agentflows.kube import snapshot as kube_snapshot


def name_of(run_name: str) -> str:
    """The snapshot ConfigMap's name."""
    return kube_snapshot.snapshot_name(run_name)


def document(flow_name: str, ns: resolve.Namespace) -> dict[str, Any]:
    """The snapshot document of ``flow_name`` over the namespace's specs."""
    lookup = kube_snapshot.lookup_in(
        {name: spec.to_wire() for name, spec in ns.flows.items()},
        {name: spec.to_wire() for name, spec in ns.agents.items()},
    )
    return kube_snapshot.build_snapshot(flow_name, lookup)


async def ensure(api: kube.Client, run: dict[str, Any], snapshot: dict[str, Any]) -> dict[str, Any]:
    """Create the snapshot unless it exists; return the snapshot that is stored."""
    stored = await kube_snapshot.write_snapshot(api, run, snapshot)
    document: dict[str, Any] = json.loads(stored["data"][kube_snapshot.SNAPSHOT_KEY])
    return document


async def read(api: kube.Client, namespace: str, run_name: str) -> dict[str, Any] | None:
    """The stored snapshot document of a run, or None when it is missing or malformed."""
    try:
        found = await kube_snapshot.read_snapshot(api, namespace, run_name)
    except kube_snapshot.SnapshotError:
        return None
    return {"flow": found.flow, "flows": found.flows, "agents": found.agents}


def specs(
    snapshot: dict[str, Any],
) -> tuple[flow_api.FlowSpec, dict[str, flow_api.FlowSpec], dict[str, agent_api.AgentSpec]]:
    """The run's Flow, and every Flow and Agent of the snapshot, parsed."""
    flows = {
        name: flow_api.FlowSpec.model_validate(spec)
        for name, spec in snapshot.get("flows", {}).items()
    }
    agents = {
        name: agent_api.AgentSpec.model_validate(spec)
        for name, spec in snapshot.get("agents", {}).items()
    }
    return flows[snapshot["flow"]], flows, agents
