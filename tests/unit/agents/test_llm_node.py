"""``llm`` nodes: one completion, and JSON replies checked against the output schema."""

from __future__ import annotations

import pytest

from agentflows.agents import host
from agentflows.engine import capabilities
from tests.support.model_server import Reply, ScriptedModelServer

QUESTIONS = {
    "type": "object",
    "properties": {"questions": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["questions"],
}


async def complete(
    server: ScriptedModelServer, ctx: capabilities.NodeContext, schema: object = None
) -> capabilities.NodeResult:
    caps = host.LiveCapabilities(env=server.env)
    task = capabilities.LlmTask(
        model=server.model_spec(),
        system="Be brief.",
        prompt="Ask about kopf.",
        output_schema=schema,
    )
    return await caps.complete(task, ctx)


async def test_completion_sends_system_and_prompt_and_returns_the_text(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("Kopf is a framework.", prompt_tokens=5, completion_tokens=4))
    result = await complete(model_server, ctx)
    assert result.output["text"] == "Kopf is a framework."
    assert result.output["json"] is None
    assert model_server.requests[0].messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Ask about kopf."},
    ]
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (5, 4)
    assert result.usage.llm_calls == 1


async def test_reply_matching_the_output_schema_is_the_json_output(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text('```json\n{"questions": ["Why?", "How?"]}\n```'))
    result = await complete(model_server, ctx, QUESTIONS)
    assert result.output["json"] == {"questions": ["Why?", "How?"]}
    system = model_server.requests[0].messages[0]["content"]
    assert system.startswith("Be brief.")
    assert '"questions"' in system, "the schema is shown to the model"


async def test_reply_not_matching_the_output_schema_fails_naming_the_problem(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text('{"questions": []}'))
    with pytest.raises(capabilities.CapabilityError) as failure:
        await complete(model_server, ctx, QUESTIONS)
    message = str(failure.value)
    assert "does not match outputSchema at questions" in message
    assert "should be non-empty" in message
    assert failure.value.retryable


async def test_reply_that_is_not_json_fails_when_a_schema_is_set(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("Here are some questions: why, how."))
    with pytest.raises(capabilities.CapabilityError, match=r"not JSON.*outputSchema"):
        await complete(model_server, ctx, QUESTIONS)


async def test_invalid_output_schema_is_a_permanent_error(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("{}"))
    with pytest.raises(capabilities.CapabilityError, match="not a valid JSON Schema") as failure:
        await complete(model_server, ctx, {"type": "no-such-type"})
    assert not failure.value.retryable
