"""Human requests on a cluster: list them, and approve, reject or answer them.

A decision is a patch of ``flowruns/status`` by the human, written as JSON-patch ``add``
operations on the request's decision fields only (a merge patch would drop nulls inside
``data``). ``decidedBy`` is the caller's user name as the API server sees it
(SelfSubjectReview), because the admission policy requires exactly that.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from agentflows.cli import views
from agentflows.kube import client as kube

SELF_REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def whoami(api: kube.Client) -> str:
    """The caller's user name, as the API server authenticates it."""
    review = await api.create(
        SELF_REVIEW, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(review["status"]["userInfo"]["username"])


def _pointer(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def now() -> str:
    """RFC 3339 UTC time, as Kubernetes writes it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def decide(
    api: kube.Client,
    namespace: str,
    run: str,
    request_id: str,
    *,
    decision: str,
    decided_by: str,
    comment: str | None = None,
    edits: Any = None,
    data: Any = None,
) -> None:
    """Write a decision into ``status.requests.<id>``."""
    base = f"/status/requests/{_pointer(request_id)}"
    fields: dict[str, Any] = {"decision": decision, "decidedBy": decided_by, "decidedAt": now()}
    if comment is not None:
        fields["comment"] = comment
    if edits is not None:
        fields["edits"] = edits
    if data is not None:
        fields["data"] = data
    operations = [{"op": "add", "path": f"{base}/{k}", "value": v} for k, v in fields.items()]
    await api.json_patch(kube.path_of("flowruns", namespace, run, sub="status"), operations)


async def list_runs(
    api: kube.Client, namespace: str | None, flow: str | None
) -> list[dict[str, Any]]:
    """FlowRuns in a namespace (None: all), optionally of one Flow (``spec.flow``, exactly)."""
    params: dict[str, Any] = {}
    if flow:
        # spec.flow is a selectable field of the CRD: the API server filters, for every run
        params["fieldSelector"] = f"spec.flow={flow}"
    listed = await api.get(kube.path_of("flowruns", namespace), **params)
    items: list[dict[str, Any]] = listed.get("items", [])
    return [r for r in items if not flow or (r.get("spec") or {}).get("flow") == flow]


async def decide_all(
    api: kube.Client,
    runs: list[dict[str, Any]],
    *,
    decision: str,
    decided_by: str,
    comment: str | None,
    concurrency: int = 16,
) -> list[tuple[str, str, str | None]]:
    """Decide every pending request of the given runs; return (run, request, error) rows."""
    limit = asyncio.Semaphore(concurrency)
    rows: list[tuple[str, str, str | None]] = []

    async def one(run: dict[str, Any], rid: str) -> None:
        async with limit:
            name = run["metadata"]["name"]
            try:
                await decide(
                    api,
                    run["metadata"]["namespace"],
                    name,
                    rid,
                    decision=decision,
                    decided_by=decided_by,
                    comment=comment,
                )
                rows.append((name, rid, None))
            except kube.ApiError as exc:
                rows.append((name, rid, exc.message or str(exc)))

    await asyncio.gather(*(one(r, rid) for r in runs for rid in views.pending_requests(r)))
    return sorted(rows)
