"""Which namespaces' runs a user may see when a page asks for "all namespaces".

The API server decides, as the user: :func:`runs_namespaces` first asks (a
SelfSubjectAccessReview, made as the caller) whether the user may list FlowRuns cluster-wide;
if not, it takes the namespaces the console is configured with (``--namespace``, repeatable;
chart value ``console.namespaces``) or, when none are and the user may list namespaces, every
namespace, and keeps those in which a review says the user may list FlowRuns. A user with a
RoleBinding in two namespaces of three sees the runs of those two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agentflows import api as api_pkg
from agentflows.kube import client as kube

REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


async def may_list(api: kube.Client, plural: str, group: str, namespace: str | None) -> bool:
    """Whether the caller may list ``plural`` in ``namespace`` (None: in every namespace)."""
    attributes = {"verb": "list", "group": group, "resource": plural}
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = await api.create(REVIEWS, review)
    return bool(((answer or {}).get("status") or {}).get("allowed"))


async def runs_namespaces(
    api: kube.Client, configured: Sequence[str], plural: str = "flowruns"
) -> list[str] | None:
    """The namespaces whose FlowRuns (or ``plural``) the caller may list; None: all of them."""
    if await may_list(api, plural, api_pkg.GROUP, None):
        return None
    candidates = list(dict.fromkeys(configured))
    if not candidates and await may_list(api, "namespaces", "", None):
        listed = await api.get(kube.path_of("namespaces", None))
        candidates = [str(n["metadata"]["name"]) for n in listed.get("items") or []]
    allowed = await asyncio.gather(*(may_list(api, plural, api_pkg.GROUP, ns) for ns in candidates))
    return [ns for ns, ok in zip(candidates, allowed, strict=True) if ok]


async def chosen(
    api: kube.Client, configured: Sequence[str], namespace: str, plural: str = "flowruns"
) -> list[str] | None:
    """The namespaces a page lists: the one chosen, else those the caller may list (None: all).

    When the caller may list runs in none, None: the cluster-wide list then shows the API
    server's refusal on the page.
    """
    if namespace:
        return [namespace]
    return await runs_namespaces(api, configured, plural) or None


async def list_runs(
    api: kube.Client, namespaces: list[str] | None, plural: str = "flowruns", **params: str
) -> list[dict[str, Any]]:
    """The FlowRuns (or ``plural``) of ``namespaces`` (None: every namespace, one list call)."""
    everywhere: list[str | None] = [None]
    found: list[dict[str, Any]] = []
    for namespace in namespaces or everywhere:
        listed = await api.get(kube.path_of(plural, namespace), **params)
        found += listed.get("items") or []
    return found
