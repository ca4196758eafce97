"""The answer contract: an agent that must submit values, through the ``submit_result`` tool.

An agent node with ``agent.answer`` (an imported Agent Spec Agent that declares outputs) does
not finish on a text reply. Its turn is offered ``submit_result``, whose parameters are the
answer's schema; :func:`agentflows.agents.turn.run_turn` ends the turn when a call of it
succeeds, with the submitted values (each left-out property that has a ``default`` filled
with it) as the node's json output (:func:`output`). A call whose arguments do not match the
schema is an error result, as for any tool, and the model goes on.

A text reply instead is, as Agent Spec's reference runtime (WayFlow 26.3.1) treats it:

- with ``askUser`` (Agent Spec ``human_in_the_loop``, the default): a message to the user. The
  turn pauses with an ``input`` request whose message is the text (:func:`user_request`); the
  user's reply is appended to the conversation as a user message and the turn goes on
  (:func:`resume`);
- without: the user is not there. :data:`REMINDER` is appended as a user message and the model
  is called again; each reminder counts as a round of ``maxToolIterations``, so a model that
  never submits fails the node instead of looping.

:func:`text_reply` decides between the two; the turn's loop calls it for every text reply of a
turn with an answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentflows.agents import model as model_client
from agentflows.agents import tools, turn_state
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, envelope

SUBMIT_TOOL = "submit_result"
#: The tool result of an accepted submission (the model sees it if the conversation goes on).
ACCEPTED = "The submission was successful."
#: Appended as a user message after a text reply when no user is there to read it.
REMINDER = (
    "The user is not available; you are not allowed to answer with text. Finish the task "
    f"yourself and give the result by calling the `{SUBMIT_TOOL}` tool, with grounded values."
)
_ASKING = (
    "Function to finish the task once you have every required value. Never make values up: "
    "first ask the user for any missing information (answer with text), then call this function."
)
_ALONE = (
    "Function to finish the task once you have every required value. Never make values up; "
    "the user cannot be asked: use your tools and knowledge to fill them."
)


class SubmitProvider:
    """The ``submit_result`` tool of a turn with an answer (none without)."""

    def __init__(self, answer: flow_api.AgentAnswer | None) -> None:
        self._answer = answer

    async def list_tools(self) -> list[tools.ToolDef]:
        """One tool whose parameters are the answer's schema."""
        if self._answer is None:
            return []
        return [
            tools.ToolDef(
                name=SUBMIT_TOOL,
                description=_ASKING if self._answer.ask_user else _ALONE,
                parameters=dict(self._answer.schema_),
                read_only=True,
                submit=True,
            )
        ]

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Accept the submission (the registry has checked it against the schema)."""
        return tools.ToolOutcome.success(ACCEPTED)


def submitted(answer: flow_api.AgentAnswer, args: Mapping[str, Any]) -> dict[str, Any]:
    """The submitted values, each property left out that has a default filled with it."""
    properties = answer.schema_.get("properties") or {}
    defaults = {
        name: prop["default"]
        for name, prop in properties.items()
        if isinstance(prop, dict) and "default" in prop
    }
    return {**defaults, **args}


def user_request(node_key: str, agent_name: str, text: str) -> flowrun_api.HumanRequest:
    """The ``input`` request a text reply waits on: the user answers with a message."""
    return flowrun_api.HumanRequest(
        node=node_key,
        kind=flowrun_api.RequestKind.INPUT,
        message=text,
        summary=f"Agent {agent_name} waits for your reply; it finishes when it submits "
        f"its result ({SUBMIT_TOOL}).",
        schema_={"type": "string"},
    )


def user_reply(request: flowrun_api.HumanRequest, agent_name: str) -> dict[str, Any]:
    """The user message a decided :func:`user_request` continues the turn with.

    A rejection fails the node: the agent asked for something only the user can give.
    """
    if request.decision != flowrun_api.Decision.RESPOND:
        comment = f": {request.comment}" if request.comment else ""
        raise capabilities.CapabilityError(
            f"agent {agent_name}: the user did not answer its message ({request.decision}{comment})"
        )
    data = request.data
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return {"role": "user", "content": text}


def text_reply(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    reply: model_client.ModelReply,
) -> capabilities.Pause | None:
    """A text reply of a turn that must submit: ask the user (a Pause), or remind the model (None).

    The reminder counts as a round of ``maxToolIterations``; past them the node fails.
    """
    assert task.answer is not None
    state.messages.append({"role": "assistant", "content": reply.content})
    if task.answer.ask_user:
        state.asking = True
        return capabilities.Pause(
            request=user_request(ctx.node_key, task.agent_name, reply.content),
            state=state.to_json(log),
            usage=log.usage,
            detail=log.detail(),
        )
    if state.rounds >= task.agent.max_tool_iterations:
        raise capabilities.CapabilityError(
            f"agent {task.agent_name}: the model answered with text instead of calling "
            f"{SUBMIT_TOOL} within maxToolIterations={task.agent.max_tool_iterations} "
            "rounds, and no user is there to answer it (human_in_the_loop is false); raise "
            "spec.maxToolIterations or instruct the agent to submit its result"
        )
    state.messages.append({"role": "user", "content": REMINDER})
    state.rounds += 1
    return None


def resume(state: turn_state.TurnState, request: flowrun_api.HumanRequest, agent_name: str) -> None:
    """Continue a turn paused by :func:`text_reply` with the user's reply (:func:`user_reply`)."""
    state.messages.append(user_reply(request, agent_name))
    state.asking = False


def output(task: capabilities.AgentTask, state: turn_state.TurnState) -> dict[str, Any]:
    """The node output of a turn whose last round submitted: the values, defaults filled."""
    assert task.answer is not None and state.submitted is not None
    return envelope.from_value(submitted(task.answer, state.submitted))
