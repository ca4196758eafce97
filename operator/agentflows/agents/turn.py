"""An agent turn: the conversation with the model, and the tool-calling loop.

Called by :class:`agentflows.agents.host.LiveCapabilities` for ``agent`` nodes (and ``map`` items
running an agent). The conversation sent first is: the system prompt (each skill's content,
then the Agent's ``systemPrompt``, joined by ``---`` lines), the Agent's scripted ``history`` and
the rendered prompt as a user turn, with consecutive turns of one role merged into one (joined by
a blank line) — several providers reject two user turns in a row. Reference files
(:mod:`agentflows.agents.files`) open the pre-history as a user turn of their own, merged the
same way.

Then the loop: while the model asks for tools, the calls of one reply run concurrently, their
results are appended in the order the model asked for them, and the model is called again. A
reply with tool calls beyond ``maxToolIterations`` rounds fails the node. A tool that fails is
reported to the model as an error result and the turn goes on. Under ``autonomy: supervised`` a
reply calling a tool that is not read-only pauses the turn for a human
(:mod:`agentflows.agents.approval`), and so does a call to ``request_human_review``
(:mod:`agentflows.agents.review`); the conversation is saved in the pause's state
(:class:`~agentflows.agents.turn_state.TurnState`, with its
:class:`~agentflows.agents.turn_state.TurnLog`) and the turn continues from it when called
again with the decision. A reply calling ``handoff_conversation``
ends the turn's part for this Agent once its calls have run: :func:`run_turn` returns a
:class:`Handoff` and the host goes on with the recipient (:mod:`agentflows.agents.handoff`).
A turn with an ``answer`` (values to submit) ends only on a successful ``submit_result`` call;
its text replies pause for the user's reply or remind the model (:mod:`agentflows.agents.answer`).
Before each model call the turn checks
the run's remaining token and cost budget and compresses the conversation when it nears the
context window (:mod:`agentflows.agents.compression`).

Each tool call gets a context whose ``node_key`` is ``<node>/<call id>``, so a sub-flow it runs
is recorded under that prefix. The result's ``detail`` records each tool call (id, name, status,
start, end, duration, error; bounded in number and size), each compression and the number of
model calls; its usage sums the model calls, tool calls and sub-agent turns made since the turn
started or last resumed (the engine has already counted what came before a pause). Secret values
never appear in results, details or errors: every text that leaves passes through the host's
:class:`~agentflows.agents.secrets.Redactor`.

A turn with a memory (a ``session``, :mod:`agentflows.agents.sessions`) starts from its stored
conversation instead of the scripted history, and saves the conversation once it has its final
answer (a paused turn saves nothing until it finishes); the detail's ``memory`` says what was
saved, and a compaction's summary call counts like any model call. A turn is an
``invoke_agent`` span, parent of its model calls' ``chat`` spans and its tool calls'
``execute_tool`` spans (:mod:`agentflows.engine.spans`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentflows.agents import (
    answer,
    approval,
    compression,
    files,
    review,
    secrets,
    sessions,
    streaming,
    tools,
    turn_state,
)
from agentflows.agents import model as model_client
from agentflows.api import agent as agent_api
from agentflows.api import common, times
from agentflows.engine import capabilities, envelope, spans

#: Longest error text kept in a tool call record.
MAX_RECORDED_ERROR_CHARS = 500
#: Separates the skills' contents and the system prompt.
SKILL_SEPARATOR = "\n\n---\n\n"
_NOT_KEY_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def build_messages(
    spec: agent_api.AgentSpec,
    prompt: str,
    stored: Sequence[dict[str, Any]] = (),
    attached: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Return the conversation an agent turn starts with (see module docstring).

    ``stored`` is the conversation of the turn's session (:mod:`agentflows.agents.sessions`):
    when there is one, it stands where the scripted history would, since it began with it.
    ``attached`` is the user turn holding the reference files (:func:`files.message`); it opens
    the pre-history, before the scripted ``history`` (a stored conversation holds it already).
    """
    turns = _system_turn(spec)
    if not stored:
        if attached is not None:
            turns.append(("user", attached["content"]))
        turns.extend((turn.role, turn.content) for turn in spec.history)
        if prompt:  # an empty prompt: the agent speaks first, from what it has
            turns.append(("user", prompt))
        return merge_turns(turns)
    messages = [*merge_turns(turns), *stored]
    last = messages[-1]
    if not prompt:
        return messages
    if last.get("role") == "user" and isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": f"{last['content']}\n\n{prompt}"}
    else:
        messages.append({"role": "user", "content": prompt})
    return messages


def opening_turns(spec: agent_api.AgentSpec) -> list[tuple[str, Any]]:
    """The Agent's own turns before any prompt: its system prompt and scripted history."""
    return [*_system_turn(spec), *((turn.role, turn.content) for turn in spec.history)]


def _system_turn(spec: agent_api.AgentSpec) -> list[tuple[str, Any]]:
    """The system turn: each skill's content, then the system prompt (none when both are empty)."""
    system = SKILL_SEPARATOR.join(
        part for part in [*(skill.content for skill in spec.skills), spec.system_prompt] if part
    )
    return [("system", system)] if system else []


def merge_turns(turns: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Messages from (role, content) turns, consecutive same-role turns joined by a blank line.

    A content may be a list of content parts (attached files): joined with another turn, both
    become one list of parts.
    """
    messages: list[dict[str, Any]] = []
    for role, content in turns:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] = _joined(messages[-1]["content"], content)
        else:
            messages.append({"role": role, "content": content})
    return messages


def _joined(first: Any, second: Any) -> Any:
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"

    def parts(content: Any) -> list[Any]:
        return list(content) if isinstance(content, list) else [{"type": "text", "text": content}]

    return [*parts(first), *parts(second)]


@dataclasses.dataclass
class Handoff:
    """The turn's Agent handed the conversation to ``agent`` (:mod:`agentflows.agents.handoff`).

    ``messages`` is the caller's conversation when it handed over; ``log`` goes on counting.
    """

    agent: str
    messages: list[dict[str, Any]]
    log: turn_state.TurnLog


async def run_turn(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    registry: tools.ToolRegistry,
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
    memory: sessions.Memory | None = None,
    access: files.FileAccess = files.NO_FILE_ACCESS,
    handed_over: tuple[turn_state.TurnState, turn_state.TurnLog] | None = None,
    stream: streaming.Writer | None = None,
) -> capabilities.NodeResult | capabilities.Pause | Handoff:
    """Run the agent's turn (an invoke_agent span): answer, pause for a human, or hand over.

    With a ``memory``, the turn continues its stored conversation and saves it at the end.
    ``access`` says where reference files may come from (:mod:`agentflows.agents.files`); a
    turn continuing a stored conversation does not attach them again. ``handed_over`` starts
    the turn of a handoff's recipient from the conversation it is given. With ``stream``, each
    model call's text goes to it as it is written (:mod:`agentflows.agents.streaming`).
    """
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": task.agent_name,
        "gen_ai.request.model": task.agent.model.name,
    }
    with spans.span(f"invoke_agent {task.agent_name}", attributes) as span:
        result = await _run_turn(
            task,
            ctx,
            registry,
            env=env,
            redactor=redactor,
            memory=memory,
            access=access,
            handed_over=handed_over,
            stream=stream,
        )
        usage = result.log.usage if isinstance(result, Handoff) else result.usage
        span.set(
            {
                "gen_ai.usage.input_tokens": usage.prompt_tokens,
                "gen_ai.usage.output_tokens": usage.completion_tokens,
                "agentflows.turn.paused": isinstance(result, capabilities.Pause),
            }
        )
        if isinstance(result, Handoff):
            span.set({"agentflows.turn.handed_to": result.agent})
        return result


async def _run_turn(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    registry: tools.ToolRegistry,
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
    memory: sessions.Memory | None,
    access: files.FileAccess,
    handed_over: tuple[turn_state.TurnState, turn_state.TurnLog] | None,
    stream: streaming.Writer | None,
) -> capabilities.NodeResult | capabilities.Pause | Handoff:
    spec = task.agent
    if ctx.resume is not None:
        state, log = turn_state.TurnState.from_json(ctx.resume.state)
        if state.asking:
            answer.resume(state, ctx.resume.request, task.agent_name)
        elif state.review is not None:
            ended = await _after_review(state, log, registry, ctx, redactor)
            if ended is not None:
                return ended
        else:
            decided = approval.rulings(ctx.resume.request, state.waiting)
            if state.confirming:
                confirmed = _after_confirmation(task, ctx, registry, state, log, decided)
                if confirmed is not None:
                    return confirmed
            target = await _run_round(state, log, registry, ctx, redactor, decided)
            if target is not None:
                return Handoff(target, state.messages, log)
    elif handed_over is not None:
        state, log = handed_over
    else:
        stored, base_turns = await memory.history() if memory is not None else ([], 0)
        declared = [] if stored else [*spec.files, *task.files]
        loaded = await files.load(declared, access, env, redactor)
        attached = files.message(loaded, spec.model)
        state = turn_state.TurnState(
            build_messages(spec, task.prompt, stored, attached), base_turns=base_turns
        )
        log = turn_state.TurnLog(files=[file.record() for file in loaded])
    schemas = registry.schemas()
    while True:
        if state.submitted is not None:  # the last round's submit_result call ends the turn
            output = answer.output(task, state)
            return await _finish(spec, state, log, memory, output, state.messages)
        _check_budget(ctx, log.usage)
        await _compress(spec, state, log, env, redactor)
        reply = await model_client.complete(
            spec.model, state.messages, env=env, redactor=redactor, tools=schemas, stream=stream
        )
        log.add_reply(reply, spec.model.name)
        if not reply.tool_calls and task.answer is not None:
            pause = answer.text_reply(task, ctx, state, log, reply)
            if pause is not None:
                return pause
            continue
        if not reply.tool_calls:
            final = [*state.messages, {"role": "assistant", "content": reply.content}]
            output = envelope.from_text(reply.content, raw=reply.raw)
            return await _finish(spec, state, log, memory, output, final)
        if state.rounds >= spec.max_tool_iterations:
            raise capabilities.CapabilityError(
                f"agent {task.agent_name}: the model still asked for tools after "
                f"maxToolIterations={spec.max_tool_iterations} rounds of tool calls; raise "
                "spec.maxToolIterations or instruct the agent to answer with fewer tool calls"
            )
        state.messages.append(reply.assistant_message())
        state.pending = list(reply.tool_calls)
        pause = _pause_for_review(task, ctx, registry, state, log, reply) or _pause_for_approval(
            task, ctx, registry, state, log, reply
        )
        if pause is not None:
            return pause
        target = await _run_round(state, log, registry, ctx, redactor, {})
        if target is not None:
            return Handoff(target, state.messages, log)


async def _compress(
    spec: agent_api.AgentSpec,
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> None:
    """Compress the conversation before a model call when it nears the context window."""
    result = await compression.compress(spec, state.messages, env=env, redactor=redactor)
    if result.reply is not None:
        log.add_reply(result.reply, spec.model.name)
    if result.record is not None:
        log.add_compression(result.record)
    state.messages = result.messages


async def _finish(
    spec: agent_api.AgentSpec,
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    memory: sessions.Memory | None,
    output: dict[str, Any],
    messages: list[dict[str, Any]],
) -> capabilities.NodeResult:
    """End the turn with ``output``, first saving the finished ``messages`` to the memory.

    The memory's compaction counts in the log like any model call, so it is in the detail.
    """
    saved = None
    if memory is not None:
        saved, compacted = await memory.save(messages, state.base_turns)
        if compacted is not None and compacted.reply is not None:
            log.add_reply(compacted.reply, spec.model.name)
        if compacted is not None and compacted.record is not None:
            log.add_compression({**compacted.record, "of": "memory"})
    detail = log.detail() | ({"agent": state.agent} if state.agent else {})
    if saved is not None:
        detail["memory"] = saved
    return capabilities.NodeResult(output=output, usage=log.usage, detail=detail)


def _pause_for_approval(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    registry: tools.ToolRegistry,
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    reply: model_client.ModelReply,
) -> capabilities.Pause | None:
    """Under supervised autonomy, pause when the reply calls tools that are not read-only."""
    waiting = [
        call
        for call in reply.tool_calls
        if approval.needs_approval(registry, call.name, ctx.autonomy)
    ]
    if not waiting:
        return None
    state.waiting = [call.id for call in waiting]
    # A client call to confirm is first asked as an approval (not yet for the caller to run).
    state.confirming = any((d := registry.get(c.name)) and d.confirm for c in waiting)
    client = frozenset(
        c.name for c in waiting if (d := registry.get(c.name)) and d.client and not state.confirming
    )
    request = approval.request_for_calls(
        ctx.node_key, task.agent_name, waiting, reply.content, task.agent.human_review, client
    )
    return capabilities.Pause(
        request=request,
        state=state.to_json(log),
        usage=log.usage,
        detail=log.detail(_pending_records(waiting)),
    )


def _after_confirmation(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    registry: tools.ToolRegistry,
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    decided: Mapping[str, approval.Ruling],
) -> capabilities.Pause | None:
    """After a confirmation: the client request for the confirmed client calls, or None.

    None when the human answered every call (a rejection): no client call is requested and
    the round gives the model the answers. Edited arguments replace the model's.
    """
    state.confirming = False
    if all(ruling.outcome is not None for ruling in decided.values()):
        return None
    state.pending = [
        dataclasses.replace(call, arguments=ruling.arguments)
        if (ruling := decided.get(call.id)) is not None and ruling.arguments is not None
        else call
        for call in state.pending
    ]
    clients = [
        call
        for call in state.pending
        if call.id in state.waiting and (d := registry.get(call.name)) and d.client
    ]
    state.waiting = [call.id for call in clients]
    request = approval.request_for_calls(
        ctx.node_key,
        task.agent_name,
        clients,
        "",
        task.agent.human_review,
        frozenset(call.name for call in clients),
    )
    return capabilities.Pause(
        request=request,
        state=state.to_json(log),
        usage=log.usage,
        detail=log.detail(_pending_records(clients)),
    )


def _pause_for_review(
    task: capabilities.AgentTask,
    ctx: capabilities.NodeContext,
    registry: tools.ToolRegistry,
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    reply: model_client.ModelReply,
) -> capabilities.Pause | None:
    """Pause for a human when the reply calls request_human_review with usable arguments."""
    if registry.get(review.REVIEW_TOOL) is None:
        return None
    for call in reply.tool_calls:
        if call.name != review.REVIEW_TOOL:
            continue
        args, refusal = registry.parse_arguments(call.name, call.arguments)
        if refusal is not None:
            return None  # the round runs, and the model is told what was wrong
        state.review = call.id
        state.waiting = [call.id]
        request = review.request(
            ctx.node_key, task.agent_name, args, reply.content, task.agent.human_review
        )
        return capabilities.Pause(
            request=request,
            state=state.to_json(log),
            usage=log.usage,
            detail=log.detail(_pending_records([call])),
        )
    return None


async def _after_review(
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    registry: tools.ToolRegistry,
    ctx: capabilities.NodeContext,
    redactor: secrets.Redactor,
) -> capabilities.NodeResult | None:
    """Answer the review call as the human decided; a rejection ends the turn with its result."""
    assert ctx.resume is not None and state.review is not None
    verdict = review.verdict(ctx.resume.request)
    answer: Any = verdict.answer
    review_call = next(call for call in state.pending if call.id == state.review)
    if verdict.action is not None:
        tool_name, args = verdict.action
        action = model_client.ToolCallRequest(
            id=f"{review_call.id}.action", name=tool_name, arguments=_json(args)
        )
        if tool_name == review.REVIEW_TOOL or registry.get(tool_name) is None:
            outcome = tools.ToolOutcome.failure(f"no tool named {tool_name!r} to run")
            record = _record(action, outcome, times.timestamp(), time.monotonic(), redactor)
        else:
            outcome, record = await _call_tool(registry, action, ctx, redactor, None)
        log.add_tool_call(record, outcome.usage)
        if outcome.status == "success":
            answer = {**verdict.answer, "result": outcome.value}
        else:
            answer = {**verdict.answer, "error": outcome.error, "status": outcome.status}
    elif verdict.ends_turn and ctx.resume.request.proposal:
        proposal = ctx.resume.request.proposal
        action = model_client.ToolCallRequest(
            id=f"{review_call.id}.action", name=str(proposal.get("tool")), arguments="{}"
        )
        cancelled = tools.ToolOutcome("cancelled", error="rejected in review")
        log.add_tool_call(_record(action, cancelled, times.timestamp(), time.monotonic(), redactor))
    rulings = {
        call.id: approval.Ruling(
            outcome=tools.ToolOutcome.success(answer)
            if call.id == state.review
            else review.not_run()
        )
        for call in state.pending
    }
    await _run_round(state, log, registry, ctx, redactor, rulings)
    state.review = None
    if not verdict.ends_turn:
        return None
    return capabilities.NodeResult(
        output=envelope.from_value(answer), usage=log.usage, detail=log.detail()
    )


def _pending_records(calls: Sequence[model_client.ToolCallRequest]) -> list[dict[str, Any]]:
    """Records of calls waiting for a human (shown while the run waits)."""
    now = times.timestamp()
    return [
        {"id": call.id[:128], "name": call.name[:128], "status": "pending", "startedAt": now}
        for call in calls
    ]


async def _run_round(
    state: turn_state.TurnState,
    log: turn_state.TurnLog,
    registry: tools.ToolRegistry,
    ctx: capabilities.NodeContext,
    redactor: secrets.Redactor,
    decided: Mapping[str, approval.Ruling],
) -> str | None:
    """Run the pending calls concurrently and append their results in the model's order.

    Return the Agent the first accepted handoff among them names, if any (none when a
    ``submit_result`` call among them succeeded: the turn ends with it, ``state.submitted``).
    """
    results = await asyncio.gather(
        *(_call_tool(registry, call, ctx, redactor, decided.get(call.id)) for call in state.pending)
    )
    target = None
    for call, (outcome, record) in zip(state.pending, results, strict=True):
        log.add_tool_call(record, outcome.usage)
        definition = registry.get(call.name)
        if target is None and definition and definition.handoff and outcome.status == "success":
            target = str(json.loads(call.arguments)["agent"])
        if definition and definition.submit and outcome.status == "success":
            state.submitted = json.loads(call.arguments or "{}") or {}
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
    return None if state.submitted is not None else target


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
    """Run one requested tool call (as a human ruled); return its outcome and its record.

    The call is an ``execute_tool`` span; its arguments and result go on it (redacted) only when
    the tracer captures content.
    """
    started_at = times.timestamp()
    started = time.monotonic()
    with tools.tool_span(call.name, call.id) as span:
        arguments = call.arguments
        if ruling is not None and ruling.outcome is not None:
            outcome = ruling.outcome
        else:
            if ruling and ruling.arguments is not None:
                arguments = ruling.arguments
            args, refusal = registry.parse_arguments(call.name, arguments)
            call_ctx = dataclasses.replace(ctx, node_key=f"{ctx.node_key}/{call_key(call.id)}")
            outcome = refusal or await registry.call(call.name, args, call_ctx)
        tools.record_on_span(span, outcome, arguments, redactor)
    return outcome, _record(call, outcome, started_at, started, redactor)


def call_key(call_id: str) -> str:
    """The status key segment of a tool call (sub-flows it runs are recorded under it)."""
    return _NOT_KEY_SAFE.sub("_", call_id)[:64] or "call"


def _record(
    call: model_client.ToolCallRequest,
    outcome: tools.ToolOutcome,
    started_at: str,
    started: float,
    redactor: secrets.Redactor,
) -> dict[str, Any]:
    """The bounded, redacted record of one tool call for the node's detail."""
    record: dict[str, Any] = {
        "id": call.id[:128],
        "name": call.name[:128],
        "status": outcome.status,
        "startedAt": started_at,
        "finishedAt": times.timestamp(),
        "durationMs": round((time.monotonic() - started) * 1000),
    }
    if outcome.error is not None:
        record["error"] = _truncate(redactor(outcome.error), MAX_RECORDED_ERROR_CHARS)
    if outcome.usage is not None and outcome.usage != common.Usage():
        record["usage"] = outcome.usage.to_wire()
    return record


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
