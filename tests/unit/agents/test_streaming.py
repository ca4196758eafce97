"""Streamed model calls over real HTTP (SSE): same record as unstreamed, retried, redacted."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentflows.agents import host, secrets, streaming
from agentflows.agents import model as model_client
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

ANSWER = "The quick brown fox jumps over the lazy dog."


@dataclasses.dataclass
class Recorder:
    """A :class:`streaming.Listener` that keeps every event in order."""

    events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    def text(self, node: str, text: str) -> None:
        self.events.append(("text", node, text))

    def restart(self, node: str) -> None:
        self.events.append(("restart", node, ""))

    def end(self, node: str) -> None:
        self.events.append(("end", node, ""))

    def texts(self) -> list[str]:
        return [text for kind, _, text in self.events if kind == "text"]


async def _complete(
    caps: host.LiveCapabilities, server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> capabilities.NodeResult:
    task = capabilities.LlmTask(model=server.model_spec(retries=1), system="", prompt="hi")
    return await caps.complete(task, ctx)


async def test_a_streamed_completion_records_the_same_output_usage_and_cost_as_unstreamed(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text(ANSWER, prompt_tokens=21, completion_tokens=9))
    plain = await _complete(host.LiveCapabilities(env=model_server.env), model_server, ctx)
    model_server.script(Reply.text(ANSWER, prompt_tokens=21, completion_tokens=9))
    recorder = Recorder()
    caps = host.LiveCapabilities(env=model_server.env, listener=recorder)
    streamed = await _complete(caps, model_server, ctx)

    assert [r.body.get("stream") for r in model_server.requests] == [None, True]
    assert model_server.requests[1].body["stream_options"] == {"include_usage": True}
    assert "".join(recorder.texts()) == ANSWER
    assert len(recorder.texts()) > 1, "the answer came in several pieces"
    assert recorder.events[-1] == ("end", "node", "")
    assert streamed.output["text"] == plain.output["text"] == ANSWER
    assert streamed.usage == plain.usage
    assert streamed.usage.prompt_tokens == 21 and streamed.usage.completion_tokens == 9
    assert streamed.detail == plain.detail


async def test_no_listener_means_no_stream_is_asked_for(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text(ANSWER))
    await _complete(host.LiveCapabilities(env=model_server.env), model_server, ctx)
    assert "stream" not in model_server.requests[0].body


async def test_a_stream_that_breaks_mid_way_is_retried_and_the_listener_starts_over(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("lost words here", break_after=2), Reply.text(ANSWER))
    recorder = Recorder()
    caps = host.LiveCapabilities(env=model_server.env, listener=recorder)
    result = await _complete(caps, model_server, ctx)

    assert result.output["text"] == ANSWER
    assert len(model_server.requests) == 2
    kinds = [kind for kind, _, _ in recorder.events]
    assert kinds.count("restart") == 1 and kinds[-1] == "end"
    after = recorder.events[kinds.index("restart") + 1 :]
    assert "".join(text for kind, _, text in after if kind == "text") == ANSWER


async def test_a_stream_that_breaks_with_no_retry_left_fails_like_a_failed_request(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("lost words here", break_after=1))
    recorder = Recorder()
    caps = host.LiveCapabilities(env=model_server.env, listener=recorder)
    task = capabilities.LlmTask(model=model_server.model_spec(retries=0), system="", prompt="hi")
    with pytest.raises(capabilities.CapabilityError, match="stream ended") as failure:
        await caps.complete(task, ctx)
    assert failure.value.retryable
    assert recorder.events[-1] == ("end", "node", "")


async def test_streamed_tool_call_deltas_are_assembled_into_the_same_calls(
    model_server: ScriptedModelServer,
) -> None:
    calls = (
        ToolCall("get_weather", {"city": "Oslo", "unit": "celsius"}, id="call_a"),
        ToolCall("get_time", {"zone": "Europe/Oslo"}, id="call_b"),
    )
    schema = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    replies = []
    for listener in (None, Recorder()):
        model_server.script(Reply.calls(*calls))
        writer = streaming.Writer(listener, "n", secrets.Redactor([])) if listener else None
        replies.append(
            await model_client.complete(
                model_server.model_spec(),
                [{"role": "user", "content": "weather?"}],
                env=model_server.env,
                redactor=secrets.Redactor([]),
                tools=[schema],
                stream=writer,
            )
        )
    plain, streamed = replies
    assert model_server.requests[1].body["stream"] is True
    assert streamed.tool_calls == plain.tool_calls
    assert [json.loads(call.arguments) for call in streamed.tool_calls] == [
        {"city": "Oslo", "unit": "celsius"},
        {"zone": "Europe/Oslo"},
    ]
    assert streamed.assistant_message() == plain.assistant_message()
    assert (streamed.usage, streamed.finish_reason) == (plain.usage, plain.finish_reason)


async def test_an_agent_turn_streams_its_answer_after_running_a_streamed_tool_call(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    add = agent_api.Tool(
        name="add",
        python=agent_api.PythonTool(
            script="import json, sys\nargs = json.load(sys.stdin)\n"
            "print(json.dumps({'sum': args['a'] + args['b']}))"
        ),
    )
    model_server.script(Reply.calls(ToolCall("add", {"a": 2, "b": 3})), Reply.text("It is 5."))
    recorder = Recorder()
    caps = host.LiveCapabilities({}, env=model_server.env, listener=recorder)
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[add])
    result = await caps.run_agent(capabilities.AgentTask("helper", spec, "2+3?"), ctx)

    assert isinstance(result, capabilities.NodeResult)
    assert result.output["text"] == "It is 5."
    assert json.loads(model_server.requests[1].messages[-1]["content"]) == {"sum": 5}
    assert "".join(recorder.texts()) == "It is 5."


async def test_a_secret_split_across_two_streamed_chunks_never_reaches_the_listener(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    secret = "sk-live-stream-secret-9876543210"
    env = {**model_server.env, "OPENAI_API_KEY": secret}
    model_server.script(
        Reply.text(f"the key is {secret}.", pieces=["the key is ", secret[:12], secret[12:] + "."])
    )
    recorder = Recorder()
    caps = host.LiveCapabilities(env=env, listener=recorder)
    await _complete(caps, model_server, ctx)

    shown = "".join(recorder.texts())
    assert shown == "the key is [redacted]."
    assert all(secret[:12] not in text for text in recorder.texts())


async def test_a_litellm_provider_streams_with_the_same_usage_and_cost_and_retries_a_break(
    model_server: ScriptedModelServer,
) -> None:
    # azure goes through litellm (its own wire format), to the scripted server's real HTTP
    spec = model_server.model_spec(name="azure/gpt-4o", retries=1)
    hi = [{"role": "user", "content": "hi"}]
    model_server.script(
        Reply.text(ANSWER, prompt_tokens=5, completion_tokens=3),
        Reply.text("lost words here", break_after=2),
        Reply.text(ANSWER, prompt_tokens=5, completion_tokens=3),
    )
    redactor = secrets.Redactor([])
    plain = await model_client.complete(spec, hi, env=model_server.env, redactor=redactor)
    recorder = Recorder()
    streamed = await model_client.complete(
        spec,
        hi,
        env=model_server.env,
        redactor=redactor,
        stream=streaming.Writer(recorder, "n", redactor),
    )
    assert [r.body.get("stream") for r in model_server.requests] == [None, True, True]
    assert "/openai/deployments/" in model_server.requests[1].path
    assert streamed.content == plain.content == ANSWER
    assert streamed.usage == plain.usage
    assert (streamed.usage.prompt_tokens, streamed.usage.completion_tokens) == (5, 3)
    assert streamed.usage.cost_usd == plain.usage.cost_usd > 0
    kinds = [kind for kind, _, _ in recorder.events]
    assert kinds.count("restart") == 1 and kinds[-1] == "end"
    after = recorder.events[kinds.index("restart") + 1 :]
    assert "".join(text for kind, _, text in after if kind == "text") == ANSWER
