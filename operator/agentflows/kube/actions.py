"""What a person does to runs on a cluster: start one, decide a request, and who they are.

Used by the CLI and the console alike, so a run started or a request decided from the page is
the same object or patch as from the command line. A decision is a patch of ``flowruns/status``
by the human, as JSON-patch ``add`` operations on the request's decision fields only (a merge
patch would drop nulls inside ``data``). ``decidedBy`` is the caller's user name as the API
server sees it (SelfSubjectReview, :func:`whoami`), because the admission policy requires
exactly that.
"""

from __future__ import annotations

from typing import Any

from agentflows import api as api_group
from agentflows.api import common, times, wellknown
from agentflows.kube import client as kube
from agentflows.kube import objects

SELF_REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def whoami(api: kube.Client) -> str:
    """The caller's user name, as the API server authenticates it."""
    review = await api.create(
        SELF_REVIEW, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(review["status"]["userInfo"]["username"])


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
    base = common.json_pointer("status", "requests", request_id)
    fields: dict[str, Any] = {
        "decision": decision,
        "decidedBy": decided_by,
        "decidedAt": times.api_time(),
    }
    if comment is not None:
        fields["comment"] = comment
    if edits is not None:
        fields["edits"] = edits
    if data is not None:
        fields["data"] = data
    operations = [{"op": "add", "path": f"{base}/{k}", "value": v} for k, v in fields.items()]
    await api.json_patch(kube.path_of("flowruns", namespace, run, sub="status"), operations)


async def start(
    api: kube.Client, namespace: str, flow: str, value: Any, *, name: str | None = None
) -> dict[str, Any]:
    """Create a FlowRun of ``flow`` (a manual run: never de-duplicated)."""
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": f"{flow}-"}
    metadata["labels"] = {wellknown.FLOW: objects.label_value(flow)}
    body = {
        "apiVersion": api_group.API_VERSION,
        "kind": "FlowRun",
        "metadata": metadata,
        "spec": {"flow": flow, "input": value, "trigger": {"type": "manual"}},
    }
    created: dict[str, Any] = await api.create(kube.path_of("flowruns", namespace), body)
    return created
