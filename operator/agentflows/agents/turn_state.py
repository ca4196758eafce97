"""What an agent turn carries across pauses: its saved state and its log.

:class:`TurnState` is the conversation and the bookkeeping of a turn (rounds made, the calls
waiting for a human, which wait it is), saved by the engine when the turn pauses and rebuilt
when it resumes. :class:`TurnLog` counts what the turn did (model calls, tool call records,
compressions, usage) for the node's usage and detail. :mod:`agentflows.agents.turn` runs the
turn with them; :mod:`agentflows.agents.answer` and :mod:`agentflows.agents.host` (handoffs)
read and write them too, which is why they live apart from the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agentflows.agents import model as model_client
from agentflows.api import common
from agentflows.engine import capabilities

#: Tool call records kept in a node's detail; later calls are only counted.
MAX_RECORDED_TOOL_CALLS = 200
#: Compression records kept in a node's detail.
MAX_RECORDED_COMPRESSIONS = 50


@dataclasses.dataclass
class TurnLog:
    """What a turn did, for the node's usage and detail.

    Usage counts only this run of the turn (since it started or resumed), because the engine
    adds a paused node's usage to the run when it pauses; the detail's counts cover the whole
    turn across pauses.
    """

    usage: common.Usage = dataclasses.field(default_factory=common.Usage)
    llm_calls: int = 0
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_calls_not_recorded: int = 0
    cost_known: bool = True
    #: Models whose cost is unknown to litellm's table (counted as $0).
    unpriced: list[str] = dataclasses.field(default_factory=list)
    compressions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: The reference files the turn started with (name, source, size, sha256; no content).
    files: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def add_reply(self, reply: model_client.ModelReply, model_name: str) -> None:
        """Count one model call."""
        self.usage = self.usage.add(reply.usage)
        self.llm_calls += 1
        self.cost_known = self.cost_known and reply.cost_known
        if not reply.cost_known and model_name not in self.unpriced:
            self.unpriced.append(model_name)

    def add_tool_call(self, record: dict[str, Any], usage: common.Usage | None = None) -> None:
        """Count one tool call (and the model usage it spent), keeping its record if room."""
        self.usage = self.usage.add(common.Usage(tool_calls=1))
        if usage is not None:
            self.usage = self.usage.add(usage)
        if len(self.tool_calls) < MAX_RECORDED_TOOL_CALLS:
            self.tool_calls.append(record)
        else:
            self.tool_calls_not_recorded += 1

    def add_compression(self, record: dict[str, Any]) -> None:
        """Keep one compression record (the oldest go first when there are too many)."""
        self.compressions = [*self.compressions, record][-MAX_RECORDED_COMPRESSIONS:]

    def detail(self, pending: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """The node detail: tool call records (plus ``pending`` ones), compressions, counts."""
        detail: dict[str, Any] = {
            "toolCalls": [*self.tool_calls, *pending],
            "llmCalls": self.llm_calls,
            "costKnown": self.cost_known,
        }
        if self.unpriced:
            detail["costNote"] = (
                f"not in litellm's cost table, counted as $0: {', '.join(self.unpriced)}"
            )
        if self.compressions:
            detail["compressions"] = self.compressions
        if self.files:
            detail["files"] = self.files
        if self.tool_calls_not_recorded:
            detail["toolCallsNotRecorded"] = self.tool_calls_not_recorded
        return detail

    @classmethod
    def from_detail(cls, detail: Any) -> TurnLog:
        """Continue the log of a paused turn from the detail it saved (usage starts at zero)."""
        if not isinstance(detail, dict):
            return cls()
        return cls(
            llm_calls=int(detail.get("llmCalls", 0)),
            tool_calls=[r for r in detail.get("toolCalls", []) if r.get("status") != "pending"],
            tool_calls_not_recorded=int(detail.get("toolCallsNotRecorded", 0)),
            cost_known=bool(detail.get("costKnown", True)),
            compressions=list(detail.get("compressions", [])),
            files=list(detail.get("files", [])),
        )


@dataclasses.dataclass
class TurnState:
    """The JSON-able state a paused turn is saved as, and resumed from."""

    messages: list[dict[str, Any]]
    #: Rounds of tool calls made so far (bounded by maxToolIterations).
    rounds: int = 0
    #: The tool calls of the last model reply, waiting for a human decision.
    pending: list[model_client.ToolCallRequest] = dataclasses.field(default_factory=list)
    #: Ids of the pending calls that need the decision (the others are read-only).
    waiting: list[str] = dataclasses.field(default_factory=list)
    #: Id of the request_human_review call waiting for its review, if that is the wait.
    review: str | None = None
    #: The stored conversation's turn count when the turn loaded it (sessions.Memory.save).
    base_turns: int = 0
    #: The Agent answering, when a handoff made it another than the node's.
    agent: str | None = None
    #: The waiting request is the confirmation of client calls, asked before the caller runs them.
    confirming: bool = False
    #: The waiting request is the user's reply to a text reply of a turn with an answer.
    asking: bool = False
    #: The values a successful ``submit_result`` call of the last round gave (not saved: the
    #: turn ends right after that round).
    submitted: dict[str, Any] | None = None

    def to_json(self, log: TurnLog) -> dict[str, Any]:
        """Return the state (with the log's detail) as saved by the engine."""
        saved = {
            "messages": self.messages,
            "rounds": self.rounds,
            "pending": [dataclasses.asdict(call) for call in self.pending],
            "waiting": self.waiting,
            "review": self.review,
            "baseTurns": self.base_turns,
            "confirming": self.confirming,
            "asking": self.asking,
            "log": log.detail(),
        }
        return saved | ({"agent": self.agent} if self.agent is not None else {})

    @classmethod
    def from_json(cls, state: Any) -> tuple[TurnState, TurnLog]:
        """Rebuild a paused turn; raise CapabilityError when the saved state is unusable."""
        try:
            return (
                cls(
                    messages=list(state["messages"]),
                    rounds=int(state["rounds"]),
                    pending=[model_client.ToolCallRequest(**call) for call in state["pending"]],
                    waiting=[str(call_id) for call_id in state["waiting"]],
                    review=state.get("review"),
                    base_turns=int(state.get("baseTurns", 0)),
                    agent=state.get("agent"),
                    confirming=bool(state.get("confirming", False)),
                    asking=bool(state.get("asking", False)),
                ),
                TurnLog.from_detail(state.get("log")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise capabilities.CapabilityError(
                f"cannot resume the agent turn: its saved state is damaged ({exc!r})"
            ) from None
