"""Context compression: summarise the middle of a conversation before it overflows the window.

Called by :mod:`agentflows.agents.turn` before every model call of an agent turn. The
conversation's size is estimated first as characters / 4 (cheap); only when that estimate reaches
half the threshold, and litellm's table knows the model, is litellm's token counter used (it
imports litellm, which takes seconds: short conversations never pay for it). When the estimate
is above ``contextCompression.thresholdRatio`` times the context window (``model.contextWindow``,
else litellm's table, else 128000), the conversation becomes:

- the leading system message(s) and the first user message, unchanged;
- one assistant message holding a summary of everything in between, written by the same model;
- the last user message (when it is not the first) and the last round of tool calls (the last
  assistant message asking for tools and their results), unchanged, so the model can go on.

If the summary call fails, or there is nothing in the middle, the conversation is kept as it
is. Each attempt is returned as a record for the node's ``detail.compressions``; the summary's
tokens count in the node's usage like any model call. Each attempt is also a
``compress_context`` span (:mod:`agentflows.engine.spans`) with the record's figures, parent of
the summary's model call span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentflows.agents import costs, secrets
from agentflows.api import agent as agent_api
from agentflows.api import times
from agentflows.engine import capabilities, spans

if TYPE_CHECKING:  # imported where a summary is asked for: a session store is built before
    # a local run's first node, which may call no model (tests/unit/test_cli_start_path.py)
    from agentflows.agents import model as model_client

#: Prefix of the assistant message that replaces the summarised middle.
SUMMARY_PREFIX = "[Summary of the earlier conversation]\n"
#: The instruction given to the model that writes the summary.
SUMMARY_INSTRUCTION = (
    "You compress the middle of an agent's conversation so it can go on in less space. Write a "
    "concise summary of the transcript you are given: facts learned, tool results that matter "
    "(with exact values), decisions made and what is still open. Answer with the summary only."
)
#: Share of the context window the transcript sent for summarising may fill.
_TRANSCRIPT_SHARE = 0.5


@dataclasses.dataclass
class Compression:
    """The result of one check: the (maybe) new conversation, a record, and the model reply."""

    messages: list[dict[str, Any]]
    record: dict[str, Any] | None = None
    reply: model_client.ModelReply | None = None


def estimate_tokens(
    model: agent_api.ModelSpec, messages: Sequence[Mapping[str, Any]], threshold: float
) -> int:
    """Tokens in ``messages``: characters / 4, refined by litellm's counter near ``threshold``."""
    rough = costs.rough_tokens(messages)
    if rough < threshold / 2:
        return rough
    return costs.count_tokens(model.name, messages)


async def compress(
    spec: agent_api.AgentSpec,
    messages: list[dict[str, Any]],
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> Compression:
    """Compress ``messages`` when they are over the Agent's threshold (see module docstring)."""
    settings = spec.context_compression
    if not settings.enabled:
        return Compression(messages)
    window = costs.context_window(spec.model.name, spec.model.context_window)
    return await compress_over(
        spec, messages, settings.threshold_ratio * window, env=env, redactor=redactor
    )


async def compress_over(
    spec: agent_api.AgentSpec,
    messages: list[dict[str, Any]],
    threshold: float,
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> Compression:
    """Compress ``messages`` when they are over ``threshold`` tokens, whatever the settings.

    :func:`compress` calls it with the Agent's threshold; a session too big to store
    (:mod:`agentflows.agents.sessions`) with its own.
    """
    window = costs.context_window(spec.model.name, spec.model.context_window)
    before = estimate_tokens(spec.model, messages, threshold)
    if before <= threshold:
        return Compression(messages)
    with spans.span("compress_context", {"gen_ai.request.model": spec.model.name}) as span:
        result = await _summarise(spec, messages, before, threshold, window, env, redactor)
        record = result.record or {}
        span.set(
            {
                f"agentflows.compression.{name}": value
                for name, value in record.items()
                if isinstance(value, int | str) and name != "at"
            }
        )
        if record.get("status") == "failed":
            span.fail(str(record.get("error")))
        return result


async def _summarise(
    spec: agent_api.AgentSpec,
    messages: list[dict[str, Any]],
    before: int,
    threshold: float,
    window: int,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> Compression:
    """Summarise the middle of ``messages`` with one model call."""
    from agentflows.agents import model as model_client

    head, middle, tail = split(messages)
    record: dict[str, Any] = {
        "at": times.timestamp(),
        "tokensBefore": before,
        "threshold": int(threshold),
        "contextWindow": window,
        "messagesSummarised": len(middle),
    }
    if not middle:
        return Compression(
            messages, {**record, "status": "skipped", "reason": "nothing to summarise"}
        )
    transcript = _transcript(middle, int(window * _TRANSCRIPT_SHARE * costs.CHARS_PER_TOKEN))
    try:
        reply = await model_client.complete(
            spec.model,
            [
                {"role": "system", "content": SUMMARY_INSTRUCTION},
                {"role": "user", "content": transcript},
            ],
            env=env,
            redactor=redactor,
        )
    except capabilities.CapabilityError as exc:
        failed = {**record, "status": "failed", "error": str(exc)[:500]}
        return Compression(messages, failed)
    if not reply.content.strip():
        failed = {**record, "status": "failed", "error": "the summary was empty"}
        return Compression(messages, failed, reply)
    summary = {"role": "assistant", "content": SUMMARY_PREFIX + reply.content.strip()}
    compressed = [*head, summary, *tail]
    record.update(
        status="compressed",
        tokensAfter=estimate_tokens(spec.model, compressed, threshold),
    )
    return Compression(compressed, record, reply)


def split(
    messages: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept head, middle to summarise, kept tail) of a conversation (see module docstring)."""
    users = [i for i, message in enumerate(messages) if message.get("role") == "user"]
    if not users:
        return list(messages), [], []
    first_user = users[0]
    keep = set(range(first_user + 1))
    last_user = users[-1]
    keep.add(last_user)
    rounds = [
        i
        for i, message in enumerate(messages)
        if message.get("role") == "assistant" and message.get("tool_calls")
    ]
    if rounds and rounds[-1] > last_user:
        keep.update(range(rounds[-1], len(messages)))
    else:
        keep.update(range(last_user, len(messages)))
    head = [messages[i] for i in range(first_user + 1)]
    middle = [m for i, m in enumerate(messages) if i not in keep]
    tail = [m for i, m in enumerate(messages) if i in keep and i > first_user]
    return head, middle, tail


def _transcript(messages: Sequence[Mapping[str, Any]], limit: int) -> str:
    lines = []
    for message in messages:
        role = str(message.get("role"))
        if message.get("content"):
            lines.append(f"{role}: {message['content']}")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            lines.append(f"{role} calls {function.get('name')}({function.get('arguments')})")
    text = "\n".join(lines)
    if len(text) > limit:
        # The latest part of the middle matters most to what comes next.
        text = "[... earlier part cut ...]\n" + text[-limit:]
    return text
