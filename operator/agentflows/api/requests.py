"""Which human requests of a FlowRun are pending: pure functions of its status.

:mod:`agentflows.controller.requests` (announce, check decisions, expiry) and
:mod:`agentflows.controller.runstate` (the pending-requests gauge) both read them from here,
so neither imports the other for them.
"""

from __future__ import annotations

from agentflows.api.flowrun import FlowRunStatus, HumanRequest, NodePhase, fold_holding


def node_waits(status: FlowRunStatus, request: HumanRequest) -> bool:
    """Whether the request's node still waits (a request written before its node: yes).

    The node of an older loop iteration may be folded (``review#5`` into ``review#2-990``):
    it finished, so it does not wait.
    """
    node = status.nodes.get(request.node)
    if node is None:
        return fold_holding(status.nodes, request.node) is None
    return node.phase is NodePhase.WAITING


def pending(status: FlowRunStatus) -> dict[str, HumanRequest]:
    """Requests waiting for a decision: undecided, and their node still waits."""
    return {
        rid: request
        for rid, request in status.requests.items()
        if not request.decision and node_waits(status, request)
    }


def missing(status: FlowRunStatus) -> list[str]:
    """``node (request id)`` of each waiting node whose request is gone from status.requests."""
    found = []
    for key, node in sorted(status.nodes.items()):
        detail = node.detail if isinstance(node.detail, dict) else {}
        request_id = detail.get("request")
        if node.phase is NodePhase.WAITING and request_id and request_id not in status.requests:
            found.append(f"{key} ({request_id})")
    return found


def pending_by_kind(status: FlowRunStatus) -> dict[str, int]:
    """The number of pending requests per kind (the pending-requests gauge)."""
    counts: dict[str, int] = {}
    for request in pending(status).values():
        counts[request.kind.value] = counts.get(request.kind.value, 0) + 1
    return counts
