"""Handing the conversation over: the ``handoff_conversation`` tool of an Agent's ``handoffs``.

An Agent that names other Agents in ``handoffs`` gets the tool ``handoff_conversation {agent}``
(the names as an ``enum``, so a name outside them is an error result and the caller goes on).
A call hands the node's turn over: once the reply's calls have run,
:func:`agentflows.agents.turn.run_turn` returns a :class:`~agentflows.agents.turn.Handoff`
and the host (:class:`agentflows.agents.host.LiveCapabilities`) goes on with the named Agent,
which answers the node's prompt in the caller's place and may hand over in turn. This is
Agent Spec's Swarm ``handoff`` (WayFlow's ``handoff_conversation``): the whole dialogue with the
user moves to the recipient, which then talks to the user.

What the recipient is given (:func:`carried_messages`): its own system prompt and scripted
history, then the dialogue so far, that is the user's messages and the agents' text answers.
The caller's tool calls and their results stay with the caller, as another agent's tools mean
nothing to the recipient (and a provider may refuse calls to tools it was not offered).

The Agent answering is durable state, kept in the node's record:

- at the handoff, the recipient's starting conversation is kept on the Running record
  (``NodeContext.save_progress``), so a runner killed after the handoff is followed by one that
  goes on with the recipient, without asking the caller again;
- a turn that pauses for a human saves it with the conversation
  (:class:`~agentflows.agents.turn_state.TurnState` ``agent``), so the runner pod that resumes the
  run goes on with the recipient;
- a node that answers records it as ``agent`` in its detail (``status.nodes.<node>.detail``),
  where a conversation's next turn reads it.

Only the node's own turn hands over: a sub-agent run through ``call_sub_agent`` answers its
caller, so it is not offered the tool (as in a Swarm, where a message's recipient answers the
sender). More than :data:`MAX_HANDOFFS` handoffs in one turn fail the node: agents passing the
user back and forth would otherwise never answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentflows.agents import tools, turn
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities

HANDOFF_TOOL = "handoff_conversation"
#: Handoffs in one turn before the node fails.
MAX_HANDOFFS = 5


class HandoffProvider:
    """The ``handoff_conversation`` tool over the Agent's ``handoffs``."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(dict.fromkeys(names))

    async def list_tools(self) -> list[tools.ToolDef]:
        """One tool, with the recipients as an enum (none when the Agent hands over to none)."""
        if not self._names:
            return []
        return [
            tools.ToolDef(
                name=HANDOFF_TOOL,
                description="Hand the whole conversation with the user over to another agent, "
                "which answers the user in your place from now on. Agents: "
                + ", ".join(self._names)
                + ".",
                parameters={
                    "type": "object",
                    "properties": {"agent": {"type": "string", "enum": self._names}},
                    "required": ["agent"],
                    "additionalProperties": False,
                },
                read_only=True,
                handoff=True,
            )
        ]

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Accept the handoff; the turn hands over once the reply's calls have run."""
        agent = str(args["agent"])
        return tools.ToolOutcome.success(f"The conversation is handed over to {agent}.")


def carried_messages(
    spec: agent_api.AgentSpec, messages: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """What the recipient of a handoff starts from (see module docstring)."""
    said = [
        (str(m["role"]), m["content"])
        for m in messages
        if m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
        if m["content"].strip()
    ]
    return turn.merge_turns([*turn.opening_turns(spec), *said])
