"""Secret values: where they are read from, and that they never show in what we write."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentflows.agents import host, secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall


def ref(name: str, key: str) -> common.SecretKeyRef:
    return common.SecretKeyRef(secret_key_ref=common.SecretKeySelector(name=name, key=key))


def test_secret_env_name_is_upper_snake_case_with_a_prefix() -> None:
    assert secrets.secret_env_name(ref("llm-keys", "openai")) == "AGENTFLOWS_SECRET_LLM_KEYS_OPENAI"
    assert secrets.secret_env_name(ref("a.b", "x-y.z")) == "AGENTFLOWS_SECRET_A_B_X_Y_Z"


async def test_missing_api_key_secret_names_the_variable_to_export(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    caps = host.LiveCapabilities(env={})
    task = capabilities.LlmTask(model=model_server.model_spec(), system="", prompt="hi")
    with pytest.raises(capabilities.CapabilityError) as failure:
        await caps.complete(task, ctx)
    message = str(failure.value)
    assert "model.apiKey" in message
    assert "scripted-model/api-key" in message
    assert "AGENTFLOWS_SECRET_SCRIPTED_MODEL_API_KEY" in message
    assert model_server.requests == []


async def test_no_secret_value_appears_in_results_details_errors_or_model_messages(
    model_server: ScriptedModelServer, endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    header_ref = ref("tool-keys", "token")
    token = "tool-token-SHOULD-NOT-LEAK"
    env = {**model_server.env, secrets.secret_env_name(header_ref): token}
    # The endpoint echoes the request, secret header included, so the tool result would carry
    # the token to the model if nothing masked it; the model's 401 error quotes the API key.
    echo = agent_api.Tool(
        name="echo",
        http=agent_api.HttpTool(url=endpoint.url + "/echo", secret_headers={"X-Token": header_ref}),
    )
    model_server.script(
        Reply.calls(ToolCall("echo", {})),
        Reply.text("done"),
        Reply.error(401, f"invalid api key {API_KEY}"),
    )
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[echo])
    caps = host.LiveCapabilities(env=env)
    result = await caps.run_agent(capabilities.AgentTask("a", spec, "go"), ctx)
    assert isinstance(result, capabilities.NodeResult)
    assert endpoint.requests[0]["headers"]["x-token"] == token, "the endpoint did get it"

    written = json.dumps([result.output, result.detail, result.usage.to_wire()])
    sent = json.dumps([r.body for r in model_server.requests])
    for secret in (token, API_KEY):
        assert secret not in written
        assert secret not in sent
    assert "[redacted]" in sent

    with pytest.raises(capabilities.CapabilityError) as failure:
        await caps.run_agent(capabilities.AgentTask("a", spec, "go"), ctx)
    assert API_KEY not in str(failure.value)
    assert "HTTP 401" in str(failure.value)


def test_a_secret_split_across_two_streamed_pieces_is_still_masked() -> None:
    redactor = secrets.Redactor(["sk-stream-secret-0123"])
    stream = secrets.StreamRedactor(redactor)
    shown = stream.feed("the key is sk-stream-") + stream.feed("secret-0123, done") + stream.flush()
    assert shown == "the key is [redacted], done"
    assert "sk-stream" not in stream.feed("the key is sk-stream-")
