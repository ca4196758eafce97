"""Mock capabilities for dry runs: deterministic, schema-shaped, and when they are used."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from agentflows.agents import mock
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {"type": "array", "items": {"type": "string"}},
        "priority": {"enum": ["high", "low"]},
        "score": {"type": "number", "minimum": 5},
        "count": {"type": "integer"},
        "urgent": {"type": "boolean"},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name"],
        },
        "note": {"type": ["string", "null"]},
    },
}


def llm_task(prompt: str = "Plan a trip", schema: Any = None) -> capabilities.LlmTask:
    return capabilities.LlmTask(
        model=agent_api.ModelSpec(name="openai/gpt-4o-mini"),
        system="sys",
        prompt=prompt,
        output_schema=schema,
    )


async def test_llm_node_with_schema_gets_a_value_synthesized_from_it(
    ctx: capabilities.NodeContext,
) -> None:
    result = await mock.MockCapabilities().complete(llm_task(schema=SCHEMA), ctx)
    value = result.output["json"]
    assert value == {
        "questions": ["mock questions 1", "mock questions 2"],
        "priority": "high",
        "score": 5,
        "count": 1,
        "urgent": True,
        "owner": {"name": "mock name 1"},
        "note": "mock note 1",
    }
    jsonschema.validate(value, SCHEMA)


async def test_llm_node_without_schema_quotes_the_start_of_the_prompt(
    ctx: capabilities.NodeContext,
) -> None:
    prompt = "Summarise the following very long text about operators and controllers " * 3
    result = await mock.MockCapabilities().complete(llm_task(prompt), ctx)
    assert result.output["text"] == f"Mock reply to: {prompt[:60]}..."
    assert result.usage.llm_calls == 1
    assert result.usage.prompt_tokens == len("sys\n\n" + prompt) // 4
    assert result.usage.cost_usd == 0


async def test_same_input_gives_the_same_output(ctx: capabilities.NodeContext) -> None:
    caps = mock.MockCapabilities()
    spec = agent_api.AgentSpec(model=agent_api.ModelSpec(name="gpt-4o"), system_prompt="S")
    agent_task = capabilities.AgentTask("researcher", spec, "Find things")
    first = [
        await caps.run_agent(agent_task, ctx),
        await caps.complete(llm_task(schema=SCHEMA), ctx),
    ]
    second = [
        await mock.MockCapabilities().run_agent(agent_task, ctx),
        await mock.MockCapabilities().complete(llm_task(schema=SCHEMA), ctx),
    ]
    assert [r.output for r in first] == [r.output for r in second]
    assert [r.usage for r in first] == [r.usage for r in second]


async def test_agent_node_answers_json_with_agent_name_and_findings(
    ctx: capabilities.NodeContext,
) -> None:
    spec = agent_api.AgentSpec(model=agent_api.ModelSpec(name="gpt-4o"))
    result = await mock.MockCapabilities().run_agent(
        capabilities.AgentTask("researcher", spec, "What is kopf?"), ctx
    )
    answer = result.output["json"]
    assert answer["agent"] == "researcher"
    assert "What is kopf?" in answer["answer"]
    assert answer["findings"] == ["mock finding 1", "mock finding 2"]


async def test_tool_node_echoes_the_call_without_running_it(ctx: capabilities.NodeContext) -> None:
    tool = agent_api.Tool(name="rm", python=agent_api.PythonTool(script="raise SystemExit(1)"))
    result = await mock.MockCapabilities().call_tool(
        capabilities.ToolTask(tool, "rm", {"path": "/"}), ctx
    )
    assert result.output["json"] == {"tool": "rm", "args": {"path": "/"}, "mock": True}
    assert result.usage.tool_calls == 1


KEY_REF = common.SecretKeyRef(secret_key_ref=common.SecretKeySelector(name="k", key="openai"))


@pytest.mark.parametrize(
    ("model", "env", "expected"),
    [
        ({"name": "gpt-4o-mini"}, {}, True),
        ({"name": "gpt-4o-mini"}, {"OPENAI_API_KEY": "x"}, False),
        ({"name": "openai/gpt-4o-mini"}, {"ANTHROPIC_API_KEY": "x"}, True),
        ({"name": "anthropic/claude-sonnet-4"}, {"ANTHROPIC_API_KEY": "x"}, False),
        ({"name": "bedrock/claude"}, {"AWS_ACCESS_KEY_ID": "x"}, False),
        ({"name": "ollama/llama3", "api_base": "http://ollama:11434"}, {}, False),
        ({"name": "ollama/llama3"}, {}, True),
        ({"name": "gpt-4o", "api_key": KEY_REF}, {}, True),
        ({"name": "gpt-4o", "api_key": KEY_REF}, {"AGENTFLOWS_SECRET_K_OPENAI": "x"}, False),
    ],
)
def test_needs_mock_when_nothing_can_reach_a_model(
    model: dict[str, Any], env: dict[str, str], expected: bool
) -> None:
    assert mock.needs_mock(agent_api.ModelSpec(**model), env) is expected
