"""Human approval of tool calls under the Flow's ``autonomy: supervised``.

Under ``supervised``, a call to a tool not marked ``readOnly`` waits for a human: the agent turn
(or the ``tool`` node) returns a :class:`~agentflows.engine.capabilities.Pause` with a
``kind: tool`` request whose ``proposal`` lists the calls, and is called again with the decision:

- ``approve`` runs the calls as proposed;
- ``edit`` runs them with the human's ``edits`` as arguments: an object keyed by call id, or, when
  a single call waits, that call's arguments themselves;
- ``reject`` runs nothing; an agent's model is told the call was rejected (with the comment) and
  carries on, a ``tool`` node fails;
- ``respond`` runs nothing and gives the human's ``data`` (else the comment) to the model as the
  tool's result; when several calls wait and ``data`` is an object keyed by exactly their ids,
  each call gets its own entry.

A ``client`` tool is run by the caller whatever the autonomy: each call waits the same way, its
proposal entry says ``client: true``, and the caller answers ``respond`` with the result.

Read-only calls in the same model reply wait with the others and run once the decision is in,
so the results go back to the model together. Under ``readonly`` the non-read-only tools are not
offered at all (:meth:`agentflows.agents.tools.ToolRegistry.build`); under ``full`` nothing waits.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from agentflows.agents import model as model_client
from agentflows.agents import tools
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api

#: How much of the model's text a request quotes as its summary.
MAX_SUMMARY_CHARS = 2000


def needs_approval(registry: tools.ToolRegistry, name: str, autonomy: flow_api.Autonomy) -> bool:
    """Tell whether a call to tool ``name`` must wait for a human (or, client tools, the caller)."""
    tool = registry.get(name)
    if tool is None:
        return False
    return tool.client or (autonomy == flow_api.Autonomy.SUPERVISED and not tool.read_only)


def request_for_calls(
    node_key: str,
    agent_name: str,
    calls: Sequence[model_client.ToolCallRequest],
    reply_text: str,
    human_review: agent_api.HumanReview | None,
    client: frozenset[str] = frozenset(),
) -> flowrun_api.HumanRequest:
    """Return the request asking a human to approve the tool calls of one model reply.

    Calls of ``client`` tools are marked ``client: true``: their result comes from the caller.
    """
    names = ", ".join(dict.fromkeys(call.name for call in calls))
    return flowrun_api.HumanRequest(
        node=node_key,
        kind=flowrun_api.RequestKind.TOOL,
        message=f"Agent {agent_name} wants to call {names}.",
        summary=reply_text[:MAX_SUMMARY_CHARS],
        proposal={
            "calls": [
                {"id": call.id, "tool": call.name, "args": _parsed(call.arguments)}
                | ({"client": True} if call.name in client else {})
                for call in calls
            ]
        },
        approvers=human_review.approvers if human_review else common.Approvers(),
    )


def request_for_tool(
    node_key: str, tool_name: str, args: Any, *, client: bool = False
) -> flowrun_api.HumanRequest:
    """Return the request asking a human to approve (or the caller to run) one node's call."""
    call = {"id": tool_name, "tool": tool_name, "args": args} | ({"client": True} if client else {})
    return flowrun_api.HumanRequest(
        node=node_key,
        kind=flowrun_api.RequestKind.TOOL,
        message=f"Run client tool {tool_name} and respond with its result."
        if client
        else f"Call tool {tool_name}?",
        proposal={"calls": [call]},
    )


@dataclasses.dataclass(frozen=True)
class Ruling:
    """What to do with one waiting call: run it (with these arguments) or answer ``outcome``."""

    arguments: str | None = None
    outcome: tools.ToolOutcome | None = None


def rulings(request: flowrun_api.HumanRequest, waiting: Sequence[str]) -> dict[str, Ruling]:
    """Turn a human's decision into a ruling for each waiting call id (see module docstring)."""
    decision = request.decision
    who = f" ({request.decided_by})" if request.decided_by else ""
    said = f": {request.comment}" if request.comment else ""
    if decision == flowrun_api.Decision.APPROVE:
        return {call_id: Ruling() for call_id in waiting}
    if decision == flowrun_api.Decision.EDIT:
        return {
            call_id: Ruling(arguments=_edited(request.edits, call_id, waiting))
            for call_id in waiting
        }
    if decision == flowrun_api.Decision.RESPOND:
        answer = request.data if request.data is not None else request.comment
        if len(waiting) > 1 and isinstance(answer, dict) and set(answer) == set(waiting):
            return {c: Ruling(outcome=tools.ToolOutcome.success(answer[c])) for c in waiting}
        return {call_id: Ruling(outcome=tools.ToolOutcome.success(answer)) for call_id in waiting}
    rejected = tools.ToolOutcome("cancelled", error=f"a human{who} rejected this call{said}")
    return {call_id: Ruling(outcome=rejected) for call_id in waiting}


def _edited(edits: Any, call_id: str, waiting: Sequence[str]) -> str | None:
    """The edited arguments of ``call_id`` as JSON text, or None to keep the model's."""
    if isinstance(edits, dict) and set(edits) <= set(waiting) and edits:
        return json.dumps(edits[call_id]) if call_id in edits else None
    if len(waiting) == 1 and edits is not None:
        return json.dumps(edits)
    return None


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
