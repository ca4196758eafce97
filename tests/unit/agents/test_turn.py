"""Agent turns against the scripted model server: the conversation and the tool loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall


def agent_spec(server: ScriptedModelServer, **fields: Any) -> agent_api.AgentSpec:
    return agent_api.AgentSpec(model=server.model_spec(), **fields)


def python_tool(name: str, script: str, **fields: Any) -> agent_api.Tool:
    return agent_api.Tool(name=name, python=agent_api.PythonTool(script=script), **fields)


async def run(
    server: ScriptedModelServer,
    spec: agent_api.AgentSpec,
    ctx: capabilities.NodeContext,
    prompt: str = "Go.",
) -> capabilities.NodeResult:
    caps = host.LiveCapabilities({}, env=server.env)
    result = await caps.run_agent(capabilities.AgentTask("helper", spec, prompt), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


async def test_system_prompt_and_merged_history_reach_the_model(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("done"))
    spec = agent_spec(
        model_server,
        system_prompt="You are terse.",
        history=[
            agent_api.HistoryTurn(role="user", content="Example question."),
            agent_api.HistoryTurn(role="user", content="Second part."),
            agent_api.HistoryTurn(role="assistant", content="Example answer."),
        ],
    )
    await run(model_server, spec, ctx, prompt="Real question.")
    assert model_server.requests[0].messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Example question.\n\nSecond part."},
        {"role": "assistant", "content": "Example answer."},
        {"role": "user", "content": "Real question."},
    ]


async def test_final_answer_becomes_the_output_envelope(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text('```json\n{"findings": ["a"]}\n```'))
    result = await run(model_server, agent_spec(model_server), ctx)
    assert result.output["json"] == {"findings": ["a"]}
    assert result.output["text"].startswith("```json")
    assert result.output["raw"]["choices"][0]["message"]["content"] == result.output["text"]


async def test_api_key_from_secret_env_is_sent_to_the_model(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("ok"))
    await run(model_server, agent_spec(model_server), ctx)
    [key] = model_server.env.values()
    assert model_server.requests[0].headers["authorization"] == f"Bearer {key}"


async def test_http_tool_result_is_sent_back_and_the_model_answers(
    model_server: ScriptedModelServer, endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    weather = agent_api.Tool(
        name="weather",
        description="Forecast for a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        http=agent_api.HttpTool(url=endpoint.url + "/weather/{{ .args.city }}"),
    )
    model_server.script(
        Reply.calls(ToolCall("weather", {"city": "Oslo"}, id="c1")),
        Reply.text("Sunny in Oslo."),
    )
    result = await run(model_server, agent_spec(model_server, tools=[weather]), ctx)

    assert result.output["text"] == "Sunny in Oslo."
    offered = model_server.requests[0].body["tools"]
    assert [t["function"]["name"] for t in offered] == ["weather"]
    assert offered[0]["function"]["description"] == "Forecast for a city."
    second = model_server.requests[1].messages
    assert second[-2]["tool_calls"][0]["function"]["name"] == "weather"
    assert second[-1]["role"] == "tool"
    assert second[-1]["tool_call_id"] == "c1"
    assert json.loads(second[-1]["content"]) == {"city": "Oslo", "forecast": "sunny"}
    [record] = result.detail["toolCalls"]
    assert record["name"] == "weather"
    assert record["status"] == "success"
    assert record["durationMs"] >= 0
    assert record["startedAt"].endswith("Z")


async def test_python_tool_result_is_sent_back(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    add = python_tool(
        "add",
        "import json, sys\nargs = json.load(sys.stdin)\n"
        "print(json.dumps({'sum': args['a'] + args['b']}))",
    )
    model_server.script(Reply.calls(ToolCall("add", {"a": 2, "b": 3})), Reply.text("5"))
    result = await run(model_server, agent_spec(model_server, tools=[add]), ctx)
    assert result.output["json"] == 5
    assert json.loads(model_server.requests[1].messages[-1]["content"]) == {"sum": 5}


async def test_two_tool_calls_in_one_reply_run_concurrently_and_both_results_go_back_in_order(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    sleepy = python_tool(
        "sleepy",
        "import json, sys, time\nargs = json.load(sys.stdin)\nstart = time.time()\n"
        "time.sleep(args['s'])\nprint(json.dumps({'slept': args['s'], 'start': start, "
        "'end': time.time()}))",
    )
    model_server.script(
        Reply.calls(ToolCall("sleepy", {"s": 2.0}, id="a"), ToolCall("sleepy", {"s": 0.1}, id="b")),
        Reply.text("both done"),
    )
    result = await run(model_server, agent_spec(model_server, tools=[sleepy]), ctx)

    tool_messages = [m for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["a", "b"]
    a, b = (json.loads(m["content"]) for m in tool_messages)
    assert (a["slept"], b["slept"]) == (2.0, 0.1)
    # each tool says when it ran: b ran while a slept (one after the other they never overlap)
    assert b["start"] < a["end"] and a["start"] < b["end"], (a, b)
    assert [r["id"] for r in result.detail["toolCalls"]] == ["a", "b"]
    assert result.usage.tool_calls == 2


async def test_more_tool_rounds_than_max_tool_iterations_fails_with_a_clear_error(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    noop = python_tool("noop", "print('{}')")
    model_server.script(*[Reply.calls(ToolCall("noop", {})) for _ in range(3)])
    spec = agent_spec(model_server, tools=[noop], max_tool_iterations=2)
    with pytest.raises(capabilities.CapabilityError, match=r"maxToolIterations=2") as failure:
        await run(model_server, spec, ctx)
    assert not failure.value.retryable
    assert len(model_server.requests) == 3


async def test_failing_tool_is_reported_to_the_model_and_the_turn_goes_on(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    broken = python_tool("broken", "raise SystemExit('database is on fire')")
    model_server.script(Reply.calls(ToolCall("broken", {})), Reply.text("Sorry, it failed."))
    result = await run(model_server, agent_spec(model_server, tools=[broken]), ctx)

    assert result.output["text"] == "Sorry, it failed."
    sent = json.loads(model_server.requests[1].messages[-1]["content"])
    assert sent["status"] == "error"
    assert "database is on fire" in sent["error"]
    [record] = result.detail["toolCalls"]
    assert record["status"] == "error"
    assert "database is on fire" in record["error"]


async def test_unknown_tool_and_bad_arguments_are_reported_to_the_model(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    typed = python_tool(
        "typed",
        "print('{}')",
        parameters={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    )
    model_server.script(
        Reply.calls(
            ToolCall("nope", {}, id="x"),
            ToolCall("typed", raw_arguments="{not json", id="y"),
            ToolCall("typed", {"n": "three"}, id="z"),
        ),
        Reply.text("ok"),
    )
    result = await run(model_server, agent_spec(model_server, tools=[typed]), ctx)
    errors = [
        json.loads(m["content"])["error"]
        for m in model_server.requests[1].messages
        if m["role"] == "tool"
    ]
    assert "no tool named 'nope'" in errors[0]
    assert "not valid JSON" in errors[1]
    assert "do not match its schema at n" in errors[2]
    assert [r["status"] for r in result.detail["toolCalls"]] == ["error"] * 3


async def test_usage_sums_every_model_call_of_the_turn(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    noop = python_tool("noop", "print('{}')")
    model_server.script(
        Reply.calls(ToolCall("noop", {}), prompt_tokens=100, completion_tokens=10),
        Reply.calls(
            ToolCall("noop", {}), ToolCall("noop", {}), prompt_tokens=200, completion_tokens=20
        ),
        Reply.text("done", prompt_tokens=300, completion_tokens=30),
    )
    result = await run(model_server, agent_spec(model_server, tools=[noop]), ctx)
    assert result.usage.prompt_tokens == 600
    assert result.usage.completion_tokens == 60
    assert result.usage.llm_calls == 3
    assert result.usage.tool_calls == 3
    assert result.detail["llmCalls"] == 3
    # The scripted model is not in litellm's price table: it costs 0, and says so.
    assert result.usage.cost_usd == 0
    assert result.detail["costKnown"] is False


async def test_readonly_autonomy_offers_only_read_only_tools(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    from agentflows.api import flow as flow_api

    tools = [
        python_tool("look", "print('1')", read_only=True),
        python_tool("change", "print('2')"),
    ]
    model_server.script(Reply.text("ok"))
    ctx.autonomy = flow_api.Autonomy.READONLY
    await run(model_server, agent_spec(model_server, tools=tools), ctx)
    assert [t["function"]["name"] for t in model_server.requests[0].body["tools"]] == ["look"]


async def test_model_http_errors_fail_the_node_and_say_whether_a_retry_may_help(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.error(503, "overloaded"), Reply.error(400, "bad request body"))
    with pytest.raises(capabilities.CapabilityError, match="overloaded") as unavailable:
        await run(model_server, agent_spec(model_server), ctx)
    assert unavailable.value.retryable
    with pytest.raises(capabilities.CapabilityError, match="bad request body") as bad:
        await run(model_server, agent_spec(model_server), ctx)
    assert not bad.value.retryable


async def test_skill_contents_lead_the_system_prompt_joined_by_rules_and_scripts_are_tools(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    skill = agent_api.Skill(
        name="dates", content="Dates are ISO 8601.", script="print('\"2026-01-01\"')"
    )
    tone = agent_api.Skill(name="tone", content="Be brief.")
    model_server.script(Reply.calls(ToolCall("skill_dates", {})), Reply.text("ok"))
    spec = agent_spec(model_server, system_prompt="You plan.", skills=[skill, tone])
    await run(model_server, spec, ctx)
    first = model_server.requests[0]
    assert first.messages[0] == {
        "role": "system",
        "content": "Dates are ISO 8601.\n\n---\n\nBe brief.\n\n---\n\nYou plan.",
    }
    assert [t["function"]["name"] for t in first.body["tools"]] == ["skill_dates"]
    assert model_server.requests[1].messages[-1]["content"] == "2026-01-01"


async def test_turn_stops_when_the_run_token_budget_runs_out(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    noop = python_tool("noop", "print('{}')")
    model_server.script(*[Reply.calls(ToolCall("noop", {})) for _ in range(3)])
    ctx.tokens_left = 30  # each scripted reply uses 18 tokens
    with pytest.raises(capabilities.CapabilityError, match=r"limits\.maxTokens"):
        await run(model_server, agent_spec(model_server, tools=[noop]), ctx)
    assert len(model_server.requests) == 2


async def test_two_tools_with_one_name_fail_before_the_model_is_called(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    spec = agent_spec(
        model_server,
        tools=[python_tool("skill_dates", "print(1)")],
        skills=[agent_api.Skill(name="dates", content="", script="print(2)")],
    )
    with pytest.raises(capabilities.CapabilityError, match="two tools are named 'skill_dates'"):
        await run(model_server, spec, ctx)
    assert model_server.requests == []
