"""Context compression before model calls: when, what is kept, and what a failure leaves."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from agentflows.agents import compression, costs, host
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

#: A tool answering 1200 characters (about 300 tokens by the characters / 4 estimate).
BIG = agent_api.Tool(
    name="big", read_only=True, python=agent_api.PythonTool(script="print('x' * 1200)")
)


def spec(server: ScriptedModelServer, **compression_fields: Any) -> agent_api.AgentSpec:
    return agent_api.AgentSpec(
        model=server.model_spec(context_window=1000),
        system_prompt="You dig.",
        tools=[BIG],
        context_compression=agent_api.ContextCompression(threshold_ratio=0.5, **compression_fields),
    )


async def dig(
    server: ScriptedModelServer, ctx: capabilities.NodeContext, *replies: Reply, **fields: Any
) -> capabilities.NodeResult:
    """Two rounds of the big tool: the second pushes the conversation over 500 tokens."""
    server.script(
        Reply.calls(ToolCall("big", {}, id="b1")),
        Reply.calls(ToolCall("big", {}, id="b2")),
        *replies,
    )
    caps = host.LiveCapabilities(env=server.env)
    result = await caps.run_agent(
        capabilities.AgentTask("digger", spec(server, **fields), "Dig."), ctx
    )
    assert isinstance(result, capabilities.NodeResult)
    return result


async def test_long_conversation_is_summarised_keeping_system_first_user_and_last_round(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    result = await dig(
        model_server, ctx, Reply.text("found x twice"), Reply.text("done", prompt_tokens=50)
    )

    summary_request = model_server.requests[2]
    assert summary_request.messages[0]["content"] == compression.SUMMARY_INSTRUCTION
    assert "big" in summary_request.messages[1]["content"]
    sent = model_server.requests[3].messages
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "assistant", "tool"]
    assert sent[0]["content"] == "You dig." and sent[1]["content"] == "Dig."
    assert sent[2]["content"] == compression.SUMMARY_PREFIX + "found x twice"
    assert sent[3]["tool_calls"][0]["id"] == "b2" and sent[4]["tool_call_id"] == "b2"
    [record] = result.detail["compressions"]
    assert record["status"] == "compressed"
    assert record["messagesSummarised"] == 2
    assert record["tokensBefore"] > record["threshold"] == 500 > record["tokensAfter"]
    assert result.usage.llm_calls == 4, "the summary is a model call of the node"


async def test_failed_summary_keeps_the_original_conversation_and_says_so(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    result = await dig(
        model_server, ctx, Reply.error(400, "summaries not allowed"), Reply.text("ok")
    )

    sent = model_server.requests[3].messages
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    [record] = result.detail["compressions"]
    assert record["status"] == "failed"
    assert "summaries not allowed" in record["error"]
    assert result.output["text"] == "ok"


async def test_short_conversation_and_disabled_compression_are_left_alone(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    result = await dig(model_server, ctx, Reply.text("done"), enabled=False)
    assert len(model_server.requests) == 3
    assert "compressions" not in result.detail


def test_split_keeps_the_last_user_message_and_the_last_round() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t", "function": {}}]},
        {"role": "tool", "tool_call_id": "t", "content": "r"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "v", "function": {}}]},
        {"role": "tool", "tool_call_id": "v", "content": "r2"},
    ]
    head, middle, tail = compression.split(messages)
    assert head == messages[:2]
    assert middle == [messages[2], messages[4], messages[5]]
    assert tail == [messages[3], messages[6], messages[7]]


def test_unknown_model_is_estimated_as_characters_over_four_without_importing_litellm() -> None:
    code = (
        "import sys\n"
        "from agentflows.agents import compression\n"
        "from agentflows.api import agent\n"
        "m = agent.ModelSpec(name='openai/not-a-real-model')\n"
        "print(compression.estimate_tokens(m, [{'role': 'user', 'content': 'x' * 4000}], 10),"
        " 'litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1001", "False"]
    assert costs.context_window("openai/not-a-real-model", None) == costs.DEFAULT_CONTEXT_WINDOW
    assert costs.context_window("openai/gpt-4o-mini", None) == 128_000
