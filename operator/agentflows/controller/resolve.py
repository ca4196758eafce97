"""What a Flow or Agent refers to, read from the API: other Agents and Flows, named Secrets.

Used by the Agent and Flow validators and by the runner pod's env. Which Secrets a spec names
comes from the one reference walk, :mod:`agentflows.api.references` (the admission policy that
authorizes them is generated from it too). Agents and Flows come from
the operator's cache (:class:`agentflows.controller.cache.Namespace`). A Secret is checked with a
metadata-only GET (``PartialObjectMetadata``): the operator learns that it exists, never a value.
"""

from __future__ import annotations

from agentflows.api import agent as agent_api
from agentflows.api import calls, common, documents, references
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


def reach(flow_name: str, ns: cache.Namespace) -> calls.Reach:
    """Every Agent and sub-flow ``flow_name`` names, transitively (a tool node's Agent too)."""
    return calls.reach(flow_name, ns.resolver())
