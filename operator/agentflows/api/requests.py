"""Human requests, pure: which are pending, which a human may still decide, what a decision lacks.

One owner for every surface: the operator (:mod:`agentflows.controller.requests` checks and
takes back decisions, :mod:`agentflows.controller.runstate` counts pending ones), the CLI
(``agentflows requests``, ``get``, the decide hints, ``resume --decision``) and the console.

- :func:`pending` (:func:`pending_in` over an engine checkpoint's requests and nodes, for the
  engine's waiting message, the Agent Spec conversation and ``agentflows resume``): undecided,
  and the request's node still waits (no record yet, or Waiting).
  A request whose node runs again is being consumed or re-asked: not pending. Expired ones are
  still pending here: the operator starts the attempt that applies their ``onTimeout``.
- :func:`decidable`: what a human is offered — pending, the run not finished, not expired
  (:func:`decidable_of` a FlowRun object, for the CLI and the console).
- :func:`decision_problem`: why a decision (decision, edits, data as written) cannot be
  accepted: a decision the kind does not take (:data:`~agentflows.api.flowrun.DECISIONS`),
  ``edit`` without edits or with edits that would be ignored (:func:`edits_problem`),
  ``respond`` without data, or an input request's data not matching its schema.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pydantic

from agentflows.api import schemas, times
from agentflows.api.flowrun import (
    DECISIONS,
    Decision,
    FlowRunStatus,
    HumanRequest,
    NodePhase,
    NodeStatus,
    RequestKind,
    fold_holding,
    status_of,
)


def node_waits(nodes: Mapping[str, NodeStatus], request: HumanRequest) -> bool:
    """Whether the request's node still waits (a request written before its node: yes).

    The node of an older loop iteration may be folded (``review#5`` into ``review#2-990``):
    it finished, so it does not wait.
    """
    node = nodes.get(request.node)
    if node is None:
        return fold_holding(nodes, request.node) is None
    return node.phase is NodePhase.WAITING


def pending_in(
    requests: Mapping[str, HumanRequest], nodes: Mapping[str, NodeStatus]
) -> dict[str, HumanRequest]:
    """Requests waiting for a decision: undecided, and their node has no record yet or waits.

    Over a status's or an engine checkpoint's ``requests`` and ``nodes`` alike.
    """
    return {
        rid: request
        for rid, request in requests.items()
        if not request.decision and node_waits(nodes, request)
    }


def pending(status: FlowRunStatus) -> dict[str, HumanRequest]:
    """:func:`pending_in` a FlowRun's status."""
    return pending_in(status.requests, status.nodes)


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


def decidable(status: FlowRunStatus, now: dt.datetime | None = None) -> dict[str, HumanRequest]:
    """Pending requests a human may still decide: the run goes on and they have not expired."""
    if status.phase is not None and status.phase.terminal:
        return {}
    at = now or times.now()
    return {
        rid: request
        for rid, request in pending(status).items()
        if (expires := times.parse_time(request.expires_at)) is None or expires > at
    }


def decidable_of(run: Mapping[str, Any]) -> dict[str, HumanRequest]:
    """:func:`decidable` of a FlowRun object (none when its status does not read)."""
    try:
        status = status_of(run)
    except pydantic.ValidationError:
        return {}
    return decidable(status)


def _tool_edits_problem(request: HumanRequest) -> str | None:
    """With several calls waiting, edits keyed by anything but their ids would be ignored."""
    calls = request.proposal.get("calls") if isinstance(request.proposal, dict) else None
    ids = [str(c.get("id")) for c in calls or [] if isinstance(c, dict)]
    edits = request.edits
    if len(ids) > 1:
        if not (isinstance(edits, dict) and edits and set(edits) <= set(ids)):
            return (
                f"edits: {len(ids)} calls wait, so give an object keyed by call id "
                f"(valid: {', '.join(ids)}) with each call's new arguments"
            )
        wrong = next((k for k, v in edits.items() if not isinstance(v, dict)), None)
        return f"edits.{wrong}: a call's arguments are a JSON object" if wrong else None
    if not isinstance(edits, dict):
        return "edits: the call's arguments are a JSON object"
    return None


def _review_edits_problem(request: HumanRequest) -> str | None:
    """Edits replace a reviewed action's arguments, so they are an object."""
    proposal = request.proposal if isinstance(request.proposal, dict) else None
    if proposal and proposal.get("tool") and not isinstance(request.edits, dict):
        return f"edits: they replace the arguments of {proposal['tool']}, so give a JSON object"
    return None


#: How each kind of request takes ``edits``: what would be ignored or refused is a problem.
_EDITS_CHECKS = {RequestKind.TOOL: _tool_edits_problem, RequestKind.REVIEW: _review_edits_problem}


def edits_problem(request: HumanRequest) -> str | None:
    """Why the request's ``edits`` would not set the arguments they mean to, or None."""
    check = _EDITS_CHECKS.get(request.kind)
    return check(request) if check is not None else None


def kind_problem(kind: RequestKind, decision: str | None) -> str | None:
    """Why ``decision`` is not one a request of ``kind`` takes, or None."""
    allowed = DECISIONS.get(kind.value, frozenset(Decision))
    if decision in allowed:
        return None
    valid = ", ".join(sorted(allowed))
    article = "an" if kind.value[:1] in ("a", "i") else "a"
    shown = str(decision) if decision else None
    return f"decision {shown!r} is not valid for {article} {kind.value} request (valid: {valid})"


def decision_problem(request: HumanRequest, schema: Any = None) -> str | None:
    """Why the request's decision cannot be accepted, or None when it can.

    ``schema`` is the input request's JSON Schema as read (the operator reads an offloaded
    one back first); fields count as given when they are set on the model (``edits: null``
    is given, an absent key is not).
    """
    decision = request.decision
    wrong = kind_problem(request.kind, decision)
    if wrong is not None:
        return wrong
    given = request.model_fields_set
    if decision == Decision.EDIT:
        if "edits" not in given:
            return "decision 'edit' needs edits (the replacement arguments)"
        return edits_problem(request)
    if decision == Decision.RESPOND:
        if "data" not in given:
            return "decision 'respond' needs data (the answer)"
        if request.kind == RequestKind.INPUT and schema is not None:
            found = schemas.mismatch(schema, request.data)
            if found is not None:
                where = "data" + "".join(f"[{part!r}]" for part in found.path)
                return f"{where} does not match the request's schema: {found.message}"[:1024]
    return None
