"""Human requests as the operator sees them: announce, check decisions, time out, count.

Called by :mod:`agentflows.controller.flowruns` on every reconcile of an unfinished run that has
requests. The runner writes a request's question and exits; a human (or ``agentflows approve``)
writes the decision fields; the admission policy (``config/policies/request-decisions.yaml``)
has already checked *who* decided. This module checks *what* was decided:

- a decision must pass :func:`agentflows.api.requests.decision_problem` (one the request's
  kind takes, ``edit`` with edits that would not be ignored, ``respond`` with ``data`` matching
  an input request's JSON Schema, read back first when it was offloaded);
- a decision that fails is taken back: the operator (exempt from the policy) removes the
  decision fields with one JSON patch guarded by a ``test`` of the decision, writes ``error`` on
  the request and posts a Warning Event, and the run keeps waiting for a new answer;
- a decision that passes gets a ``RequestDecided`` Event (who and what; data and edits only by
  their size), its wait time observed, and any ``error`` of an earlier answer removed.

What has been announced is kept in the annotation ``agentflows.io/requests`` (request id ->
``created`` | ``decided``), so a restarted operator never posts an Event twice. Expiry is the
engine's job (the node's ``onTimeout``); the operator only starts an attempt once ``expiresAt``
has passed (:func:`expired`, :func:`seconds_to_expiry`). Which requests are pending is
:mod:`agentflows.api.requests`' (pure, shared with the run's state).
"""

from __future__ import annotations

import json
from typing import Any

from agentflows.api import common, times, wellknown
from agentflows.api import requests as human_requests
from agentflows.api.flowrun import (
    Decision,
    FlowRunStatus,
    HumanRequest,
    RequestKind,
)
from agentflows.controller import context, events, runstate
from agentflows.kube import status_store

CREATED = "created"
DECIDED = "decided"

#: Kinds whose expiry the engine applies on the next attempt (approval and input nodes).
EXPIRING_KINDS = frozenset({RequestKind.APPROVAL, RequestKind.INPUT})
#: The fields a human writes; all of them are removed when a decision is taken back.
DECISION_FIELDS = ("decision", "decided_by", "decided_at", "comment", "edits", "data")
#: Longest comment quoted in an Event.
_COMMENT_CHARS = 200
_VERBS: dict[str, str] = {
    Decision.APPROVE: "approved",
    Decision.REJECT: "rejected",
    Decision.EDIT: "approved with edits",
    Decision.RESPOND: "answered",
}


def resumable(run: runstate.RunContext) -> list[str]:
    """Requests whose accepted decision the next attempt consumes (their node still waits).

    Accepted: :func:`review` checked it (a decision that appeared since waits for that).
    """
    seen = _seen(run)
    return sorted(
        rid
        for rid, request in run.stored.requests.items()
        if request.decision
        and seen.get(rid) == DECIDED
        and not request.error
        and human_requests.node_waits(run.stored.nodes, request)
    )


def _expiry(request: HumanRequest) -> float | None:
    """Seconds until the request expires (negative: past), if it expires and the engine acts."""
    expires = times.parse_time(request.expires_at)
    if expires is None or request.kind not in EXPIRING_KINDS:
        return None
    return (expires - times.now()).total_seconds()


def expired(status: FlowRunStatus) -> list[str]:
    """Pending approval and input requests past their ``expiresAt``."""
    return sorted(
        rid
        for rid, request in human_requests.pending(status).items()
        if (left := _expiry(request)) is not None and left <= 0
    )


def seconds_to_expiry(status: FlowRunStatus) -> float | None:
    """Seconds until the first pending request expires, if any will."""
    lefts = [
        left for r in human_requests.pending(status).values() if (left := _expiry(r)) is not None
    ]
    return max(0.0, min(lefts)) if lefts else None


def _seen(run: runstate.RunContext) -> dict[str, str]:
    annotations = run.obj["metadata"].get("annotations") or {}
    try:
        seen = json.loads(annotations.get(wellknown.REQUESTS_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in seen.items()} if isinstance(seen, dict) else {}


async def _schema(ctl: context.Controller, run: runstate.RunContext, request: HumanRequest) -> Any:
    """The request's JSON Schema, read back from ConfigMaps when it was offloaded."""
    schema = request.schema_
    if isinstance(schema, dict) and set(schema) == {status_store.OFFLOADED}:
        return await status_store.read_output(
            ctl.api, run.namespace, str(schema[status_store.OFFLOADED])
        )
    return schema


async def problem(
    ctl: context.Controller, run: runstate.RunContext, request: HumanRequest
) -> str | None:
    """Why the request's decision cannot be accepted (:func:`human_requests.decision_problem`)."""
    schema = None
    if request.decision == Decision.RESPOND and request.kind == RequestKind.INPUT:
        schema = await _schema(ctl, run, request)
    return human_requests.decision_problem(request, schema)


async def _take_back(
    ctl: context.Controller, run: runstate.RunContext, rid: str, request: HumanRequest, why: str
) -> None:
    """Remove the decision fields and write ``error``, so the human can answer again."""
    base = ("status", "requests", rid)
    assert request.decision is not None
    ops: list[dict[str, Any]] = [
        {
            "op": "test",
            "path": common.json_pointer(*base, "decision"),
            "value": request.decision.value,
        }
    ]
    ops += [
        {"op": "remove", "path": common.json_pointer(*base, common.wire_name(HumanRequest, f))}
        for f in DECISION_FIELDS
        if f in request.model_fields_set
    ]
    ops.append({"op": "add", "path": common.json_pointer(*base, "error"), "value": why})
    run.refresh(await ctl.api.json_patch(run.path + "/status", ops), ctl)


def _describe(rid: str, request: HumanRequest) -> str:
    """``alice approved request review: "lgtm"`` (data and edits only by their size)."""
    decision = request.decision.value if request.decision else ""
    text = f"{request.decided_by or 'someone'} {_VERBS.get(decision, decision)} request {rid}"
    for field in ("edits", "data"):
        if field in request.model_fields_set:
            value = getattr(request, field)
            size = len(json.dumps(value, separators=(",", ":")))
            text += f" ({field}: {size} bytes of JSON)"
    comment = request.comment or ""
    if comment:
        quoted = comment if len(comment) <= _COMMENT_CHARS else comment[:_COMMENT_CHARS] + "..."
        text += f": {json.dumps(quoted, ensure_ascii=False)}"
    return text


async def _check_decision(
    ctl: context.Controller, run: runstate.RunContext, rid: str, request: HumanRequest
) -> bool:
    """Accept or take back a new decision; True when accepted."""
    why = await problem(ctl, run, request)
    if why is not None:
        await _take_back(ctl, run, rid, request, why)
        who = request.decided_by or "someone"
        run.event(events.WARNING, "RequestDecisionInvalid", f"request {rid} by {who}: {why}")
        return False
    if request.error:
        path = common.json_pointer("status", "requests", rid, "error")
        stored = await ctl.api.json_patch(run.path + "/status", [{"op": "remove", "path": path}])
        run.refresh(stored, ctl)
    run.event(events.NORMAL, "RequestDecided", _describe(rid, request))
    assert request.decision is not None
    ctl.metrics.request_waited(run.namespace, run.flow, request, request.decision.value)
    return True


def _created_message(rid: str, request: HumanRequest) -> str:
    message = request.message[:200]
    text = f"{request.kind.value} request {rid} from node {request.node}: {message}"
    names = [*request.approvers.users, *(f"group {g}" for g in request.approvers.groups)]
    if names:
        text += f" (approvers: {', '.join(names)})"
    if request.expires_at:
        text += f"; expires at {request.expires_at}"
    return text


async def review(ctl: context.Controller, run: runstate.RunContext) -> None:
    """Announce new requests and check new decisions (Events after the run's next save)."""
    seen = _seen(run)
    before = dict(seen)
    for rid, request in sorted(run.stored.requests.items()):
        if rid not in seen:
            run.event(events.NORMAL, "RequestCreated", _created_message(rid, request))
            seen[rid] = CREATED
        new_decision = bool(request.decision) and seen[rid] != DECIDED
        if new_decision and await _check_decision(ctl, run, rid, request):
            seen[rid] = DECIDED
    if seen != before:
        value = json.dumps(seen, separators=(",", ":"), sort_keys=True)
        patch = {"metadata": {"annotations": {wellknown.REQUESTS_ANNOTATION: value}}}
        run.refresh(await ctl.api.merge_patch(run.path, patch), ctl)


def mark_expired(ctl: context.Controller, run: runstate.RunContext, rids: list[str]) -> None:
    """Post ``RequestExpired`` and observe the wait for requests the next attempt times out."""
    for rid in rids:
        request = run.stored.requests[rid]
        action = request.on_timeout or "reject"
        run.event(
            events.WARNING,
            "RequestExpired",
            f"request {rid} expired at {request.expires_at}; onTimeout: {action}",
        )
        ctl.metrics.request_waited(run.namespace, run.flow, request, "expired")
