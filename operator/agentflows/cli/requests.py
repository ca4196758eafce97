"""Human requests on a cluster: list them, and approve, reject or answer them.

The decision patch itself is written by :mod:`agentflows.kube.actions`, which the console's
inbox uses too, so a decision from the CLI and from the page is the same patch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentflows.cli import views
from agentflows.kube import actions
from agentflows.kube import client as kube


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
                await actions.decide(
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
