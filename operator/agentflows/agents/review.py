"""Review inside a turn: the ``request_human_review`` tool of an Agent with ``humanReview``.

The agent calls ``request_human_review {message, tool?, args?}`` to ask a human before it acts:
``tool``/``args`` is the action it proposes (one of its tools), ``message`` what the human should
know. The turn (:mod:`agentflows.agents.turn`) does not run the tool: it saves the conversation
in the pause's state and returns a ``kind: review`` request whose ``proposal`` is
``{tool, args}`` and whose ``message`` is the agent's; the engine persists both (the FlowRun
status, or the local run file) and the runner exits. When a human decides, a new runner (or
``agentflows resume``) calls the turn again and it goes on from the saved conversation:

- ``approve`` runs the proposed action as proposed; ``edit`` runs it with the human's ``edits``
  as its arguments (the edits replace the proposed ``args``). The tool result the model gets is
  ``{decision, comment, result}`` (``error`` instead of ``result`` when the action failed). A
  review without a proposed action just gets ``{decision, comment}``.
- ``reject`` runs nothing and ends the turn: the refusal is the review call's tool result (kept
  in the saved conversation), and the node's output is
  ``{"rejected": true, "message", "comment", "decidedBy", "proposal"}``, so a Flow can branch on
  ``.nodes.<id>.json.rejected``.
- ``respond`` gives the human's ``data`` (else the comment) to the model as the result.

A human-approved action runs even under ``autonomy: supervised`` (the review was its approval);
under ``readonly`` a tool that is not offered cannot be proposed. Other tool calls in the reply
that asked for review are not run (status ``cancelled``): the model is told to call them again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentflows.agents import tools
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.api import flowrun as flowrun_api

REVIEW_TOOL = "request_human_review"
#: How much of the model's text a request quotes as its summary.
MAX_SUMMARY_CHARS = 2000
NOT_RUN = (
    "not run: this reply also asked for human review; call it again after the review if it is "
    "still needed"
)


class ReviewProvider:
    """Offers ``request_human_review``; the turn intercepts its calls (see module docstring)."""

    def __init__(self, review: agent_api.HumanReview | None) -> None:
        self._review = review

    async def list_tools(self) -> list[tools.ToolDef]:
        """The review tool, when the Agent enables human review."""
        if self._review is None or not self._review.enabled:
            return []
        guidelines = f" Guidelines: {self._review.guidelines}" if self._review.guidelines else ""
        return [
            tools.ToolDef(
                name=REVIEW_TOOL,
                description=(
                    "Ask a human to review an action before you take it: name the tool and "
                    "arguments you propose, and explain why. The human approves (the action "
                    "runs and you get its result), edits the arguments, or rejects it." + guidelines
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "message": {"type": "string", "description": "What the human decides."},
                        "tool": {"type": "string", "description": "The tool you propose to call."},
                        "args": {"type": "object", "description": "Its arguments."},
                    },
                    "required": ["message"],
                    "additionalProperties": False,
                },
                read_only=True,
            )
        ]

    async def call(self, name: str, args: Any, ctx: Any) -> tools.ToolOutcome:
        """Never reached: the turn pauses instead of calling the review tool."""
        return tools.ToolOutcome.failure("request_human_review is handled by the agent turn")


def request(
    node_key: str,
    agent_name: str,
    args: dict[str, Any],
    reply_text: str,
    review: agent_api.HumanReview | None,
) -> flowrun_api.HumanRequest:
    """The ``kind: review`` request for one ``request_human_review`` call."""
    proposal = {"tool": args["tool"], "args": args.get("args") or {}} if args.get("tool") else None
    return flowrun_api.HumanRequest(
        node=node_key,
        kind=flowrun_api.RequestKind.REVIEW,
        message=str(args.get("message") or f"Agent {agent_name} asks for a review."),
        summary=reply_text[:MAX_SUMMARY_CHARS],
        proposal=proposal,
        approvers=review.approvers if review else common.Approvers(),
    )


@dataclasses.dataclass
class Verdict:
    """What the decision means for the turn: the action to run (if any) and how to answer."""

    decision: str
    #: (tool, arguments) to run, for approve and edit with a proposed action.
    action: tuple[str, Any] | None
    #: The review call's result when nothing runs (reject, respond, no action).
    answer: Any
    #: The turn ends with this output (reject).
    ends_turn: bool = False


def verdict(decided: flowrun_api.HumanRequest) -> Verdict:
    """Turn a decided review request into what the turn does next."""
    decision = str(decided.decision) if decided.decision else "reject"
    proposal = decided.proposal if isinstance(decided.proposal, dict) else None
    base = {"decision": decision, "comment": decided.comment, "decidedBy": decided.decided_by}
    if decision == flowrun_api.Decision.REJECT.value:
        refusal = {**base, "rejected": True, "message": decided.message, "proposal": proposal}
        return Verdict(decision, None, refusal, ends_turn=True)
    if decision == flowrun_api.Decision.RESPOND.value:
        data = decided.data if decided.data is not None else decided.comment
        return Verdict(decision, None, {**base, "response": data})
    if proposal is None or not proposal.get("tool"):
        return Verdict(decision, None, {**base, "edits": decided.edits})
    args = proposal.get("args") or {}
    if decision == flowrun_api.Decision.EDIT.value and decided.edits is not None:
        args = decided.edits
    return Verdict(decision, (str(proposal["tool"]), args), base)


def not_run() -> tools.ToolOutcome:
    """The result of a call that was not run because its reply asked for review."""
    return tools.ToolOutcome("cancelled", error=NOT_RUN)
