"""An agent turn: the conversation with the model, and the tool-calling loop.

Called by :class:`agentflows.agents.host.LiveCapabilities` for ``agent`` nodes (and ``map`` items
running an agent). The conversation sent first is: the system prompt (skills' content, then the
Agent's ``systemPrompt``), the Agent's scripted ``history`` and the rendered prompt as a user
turn, with consecutive turns of one role merged into one (joined by a blank line) — several
providers reject two user turns in a row.

Then the loop: while the model asks for tools, the calls of one reply run concurrently, their
results are appended in the order the model asked for them, and the model is called again. A
reply with tool calls beyond ``maxToolIterations`` rounds fails the node. A tool that fails is
reported to the model as an error result and the turn goes on. Under ``autonomy: supervised`` a
reply calling a tool that is not read-only pauses the turn for a human
(:mod:`agentflows.agents.approval`); the conversation is saved in the pause's state and the turn
continues from it when called again with the decision. Before each model call the turn checks
the run's remaining token and cost budget.

The result's ``detail`` records each tool call (bounded) and the number of model calls; its
usage sums the model and tool calls made since the turn started or last resumed (the engine has
already counted what came before a pause). Secret values never appear in results, details or
errors: every text that leaves passes through the host's
:class:`~agentflows.agents.secrets.Redactor`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentflows.agents import approval, secrets, tools
from agentflows.agents import model as model_client
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities, envelope

#: Tool call records kept in a node's detail; later calls are only counted.
MAX_RECORDED_TOOL_CALLS = 200
#: Longest error text kept in a tool call record.
MAX_RECORDED_ERROR_CHARS = 500


def build_messages(spec: agent_api.AgentSpec, prompt: str) -> list[dict[str, Any]]:
    """Return the conversation an agent turn starts with (see module docstring)."""
    system = "\n\n".join(
        part for part in [*(skill.content for skill in spec.skills), spec.system_prompt] if part
    )
    turns: list[tuple[str, str]] = []
    if system:
        turns.append(("system", system))
    turns.extend((turn.role, turn.content) for turn in spec.history)
    turns.append(("user", prompt))
    return merge_turns(turns)


def merge_turns(turns: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Messages from (role, content) turns, consecutive same-role turns joined by a blank line."""
    messages: list[dict[str, Any]] = []
    for role, content in turns:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] = f"{messages[-1]['content']}\n\n{content}"
        else:
            messages.append({"role": role, "content": content})
    return messages


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

    def add_reply(self, reply: model_client.ModelReply) -> None:
        """Count one model call."""
        self.usage = self.usage.add(reply.usage)
        self.llm_calls += 1
        self.cost_known = self.cost_known and reply.cost_known

    def add_tool_call(self, record: dict[str, Any]) -> None:
        """Count one tool call, keeping its record while there is room."""
        self.usage = self.usage.add(common.Usage(tool_calls=1))
        if len(self.tool_calls) < MAX_RECORDED_TOOL_CALLS:
            self.tool_calls.append(record)
        else:
            self.tool_calls_not_recorded += 1

    def detail(self) -> dict[str, Any]:
        """Return the node detail: tool call records and the number of model calls."""
        detail: dict[str, Any] = {
            "toolCalls": self.tool_calls,
            "llmCalls": self.llm_calls,
            "costKnown": self.cost_known,
        }
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
            tool_calls=list(detail.get("toolCalls", [])),
            tool_calls_not_recorded=int(detail.get("toolCallsNotRecorded", 0)),
            cost_known=bool(detail.get("costKnown", True)),
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

    def to_json(self, log: TurnLog) -> dict[str, Any]:
        """Return the state (with the log's detail) as saved by the engine."""
        return {
            "messages": self.messages,
            "rounds": self.rounds,
            "pending": [dataclasses.asdict(call) for call in self.pending],
            "waiting": self.waiting,
            "log": log.detail(),
        }

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
                ),
                TurnLog.from_detail(state.get("log")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise capabilities.CapabilityError(
                f"cannot resume the agent turn: its saved state is damaged ({exc!r})"
            ) from None


async def run_turn(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    registry: tools.ToolRegistry,
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> capabilities.NodeResult | capabilities.Pause:
    """Run the agent's turn to its final answer, or pause it for a tool approval."""
    spec = task.agent
    if ctx.resume is not None:
        state, log = TurnState.from_json(ctx.resume.state)
        decided = approval.rulings(ctx.resume.request, state.waiting)
        await _run_round(state, log, registry, ctx, redactor, decided)
    else:
        state, log = TurnState(build_messages(spec, task.prompt)), TurnLog()
    schemas = registry.schemas()
    while True:
        _check_budget(ctx, log.usage)
        reply = await model_client.complete(
            spec.model, state.messages, env=env, redactor=redactor, tools=schemas
        )
        log.add_reply(reply)
        if not reply.tool_calls:
            return capabilities.NodeResult(
                output=envelope.from_text(reply.content, raw=reply.raw),
                usage=log.usage,
                detail=log.detail(),
            )
        if state.rounds >= spec.max_tool_iterations:
            raise capabilities.CapabilityError(
                f"agent {task.agent_name}: the model still asked for tools after "
                f"maxToolIterations={spec.max_tool_iterations} rounds of tool calls; raise "
                "spec.maxToolIterations or instruct the agent to answer with fewer tool calls"
            )
        state.messages.append(reply.assistant_message())
        state.pending = list(reply.tool_calls)
        waiting = [
            call
            for call in reply.tool_calls
            if approval.needs_approval(registry, call.name, ctx.autonomy)
        ]
        if waiting:
            state.waiting = [call.id for call in waiting]
            request = approval.request_for_calls(
                ctx.node_key, task.agent_name, waiting, reply.content, spec.human_review
            )
            return capabilities.Pause(
                request=request, state=state.to_json(log), usage=log.usage, detail=log.detail()
            )
        await _run_round(state, log, registry, ctx, redactor, {})


async def _run_round(
    state: TurnState,
    log: TurnLog,
    registry: tools.ToolRegistry,
    ctx: capabilities.NodeContext,
    redactor: secrets.Redactor,
    decided: Mapping[str, approval.Ruling],
) -> None:
    """Run the pending calls concurrently and append their results in the model's order."""
    results = await asyncio.gather(
        *(_call_tool(registry, call, ctx, redactor, decided.get(call.id)) for call in state.pending)
    )
    for call, (outcome, record) in zip(state.pending, results, strict=True):
        log.add_tool_call(record)
        state.messages.append(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "name": call.name,
                "content": redactor(outcome.content()),
            }
        )
    state.rounds += 1
    state.pending, state.waiting = [], []


def _check_budget(ctx: capabilities.NodeContext, used: common.Usage) -> None:
    """Stop before another model call once this turn has used the run's remaining budget."""
    tokens = used.prompt_tokens + used.completion_tokens
    if ctx.tokens_left is not None and tokens and tokens >= ctx.tokens_left:
        raise capabilities.CapabilityError(
            f"the run's token budget (limits.maxTokens) ran out during the agent turn "
            f"after {tokens} tokens"
        )
    if ctx.cost_left_usd is not None and used.cost_usd and used.cost_usd >= ctx.cost_left_usd:
        raise capabilities.CapabilityError(
            f"the run's cost budget (limits.maxCostUSD) ran out during the agent turn "
            f"after ${used.cost_usd:.4f}"
        )


async def _call_tool(
    registry: tools.ToolRegistry,
    call: model_client.ToolCallRequest,
    ctx: capabilities.NodeContext,
    redactor: secrets.Redactor,
    ruling: approval.Ruling | None,
) -> tuple[tools.ToolOutcome, dict[str, Any]]:
    """Run one requested tool call (as a human ruled); return its outcome and its record."""
    started_at = _now()
    started = time.monotonic()
    if ruling is not None and ruling.outcome is not None:
        outcome = ruling.outcome
    else:
        arguments = ruling.arguments if ruling and ruling.arguments is not None else call.arguments
        args, refusal = registry.parse_arguments(call.name, arguments)
        outcome = refusal or await registry.call(call.name, args, ctx)
    record: dict[str, Any] = {
        "id": call.id[:128],
        "name": call.name[:128],
        "status": outcome.status,
        "startedAt": started_at,
        "finishedAt": _now(),
        "durationMs": round((time.monotonic() - started) * 1000),
    }
    if outcome.error is not None:
        record["error"] = _truncate(redactor(outcome.error), MAX_RECORDED_ERROR_CHARS)
    return outcome, record


def _now() -> str:
    return (
        datetime.datetime.now(datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
