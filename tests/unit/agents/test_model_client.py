"""The model client: lazy litellm import, retries of transient errors only, timeouts, keys."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from agentflows.agents import host, secrets
from agentflows.agents import model as model_client
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer

#: A provider key in the environment of whoever runs the Flow.
ENV_KEY = "sk-env-0123456789abcdef"


def test_importing_the_agents_layer_does_not_import_litellm() -> None:
    code = (
        "import sys\n"
        "from agentflows.agents import host, mock, turn, tools, model\n"
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_retries_from_the_model_spec_recover_from_a_transient_error(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.error(500, "flaky"), Reply.text("recovered"))
    caps = host.LiveCapabilities(env=model_server.env)
    task = capabilities.LlmTask(model=model_server.model_spec(retries=1), system="", prompt="hi")
    result = await caps.complete(task, ctx)
    assert result.output["text"] == "recovered"
    assert len(model_server.requests) == 2


async def test_slow_model_times_out_with_a_retryable_error(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("late", delay=2))
    caps = host.LiveCapabilities(env=model_server.env)
    task = capabilities.LlmTask(
        model=model_server.model_spec(timeout_seconds=0.3), system="", prompt="hi"
    )
    with pytest.raises(capabilities.CapabilityError, match="scripted-model") as failure:
        await caps.complete(task, ctx)
    assert failure.value.retryable
    # the client gave up while the server was still holding its 2 s reply
    assert model_server.in_flight == 1


async def test_errors_that_a_retry_cannot_fix_are_not_retried(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.error(401, "invalid key"), Reply.text("unreachable"))
    caps = host.LiveCapabilities(env=model_server.env)
    task = capabilities.LlmTask(model=model_server.model_spec(retries=3), system="", prompt="hi")
    with pytest.raises(capabilities.CapabilityError, match=r"HTTP 401.*invalid key") as failure:
        await caps.complete(task, ctx)
    assert not failure.value.retryable
    assert len(model_server.requests) == 1


def test_openai_compatible_endpoint_is_called_without_importing_litellm(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(Reply.text("direct"))
    code = (
        "import asyncio, sys\n"
        "from agentflows.agents import host\n"
        "from agentflows.api import agent\n"
        "from agentflows.engine import capabilities\n"
        "from agentflows.api import flow\n"
        f"m = agent.ModelSpec(name='openai/scripted-model', apiBase={model_server.url!r})\n"
        "ctx = capabilities.NodeContext('r', 'n', 0, flow.Autonomy.FULL)\n"
        "task = capabilities.LlmTask(model=m, system='', prompt='hi')\n"
        "result = asyncio.run(host.LiveCapabilities(env={}).complete(task, ctx))\n"
        "print(result.output['text'], 'litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["direct", "False"]
    assert model_server.requests[0].body["model"] == "scripted-model"


def test_which_models_take_the_direct_path() -> None:
    from agentflows.agents import openai_compat

    assert openai_compat.handles("openai", None)
    assert openai_compat.handles("hosted_vllm", "http://vllm:8000/v1")
    assert not openai_compat.handles("hosted_vllm", None)
    assert not openai_compat.handles("anthropic", "http://proxy/v1")


async def test_other_providers_go_through_litellm(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    caps = host.LiveCapabilities(env={"ANTHROPIC_API_KEY": "sk-ant-test-0000"})
    model = model_server.model_spec(name="anthropic/claude-test", api_key=None)
    with pytest.raises(capabilities.CapabilityError, match="anthropic/claude-test"):
        await caps.complete(capabilities.LlmTask(model=model, system="", prompt="hi"), ctx)
    # litellm spoke Anthropic's wire format: POST /v1/messages, not /chat/completions.
    assert model_server.requests[0].path.endswith("/messages")


async def test_api_base_gets_only_the_key_its_api_key_secret_names(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("ok"))
    caps = host.LiveCapabilities(env={**model_server.env, "OPENAI_API_KEY": ENV_KEY})
    task = capabilities.LlmTask(model=model_server.model_spec(), system="", prompt="hi")
    await caps.complete(task, ctx)
    assert model_server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_the_env_key_still_goes_to_the_providers_own_endpoint() -> None:
    spec = agent_api.ModelSpec(name="openai/gpt-4o-mini")
    redactor = secrets.Redactor()
    key = model_client.api_key_for(spec, {"OPENAI_API_KEY": ENV_KEY}, redactor)
    assert key == ENV_KEY
    assert redactor(f"key {ENV_KEY}") == "key [redacted]"


async def test_a_rate_limited_call_waits_what_retry_after_asks_before_the_next_try(
    model_server: ScriptedModelServer,
    ctx: capabilities.NodeContext,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentflows.agents.model")
    model_server.script(
        Reply.error(429, "slow down", headers={"Retry-After": "2"}), Reply.text("after the wait")
    )
    caps = host.LiveCapabilities(env=model_server.env)
    task = capabilities.LlmTask(model=model_server.model_spec(retries=1), system="", prompt="hi")
    result = await caps.complete(task, ctx)
    assert result.output["text"] == "after the wait"
    waits = [
        r.getMessage().split("retrying in ", 1)[1]
        for r in caplog.records
        if "retrying" in r.message
    ]
    assert waits == ["2.0s (Retry-After: 2s)"]


async def test_a_provider_asking_to_wait_longer_than_a_minute_fails_the_call_at_once(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(
        Reply.error(429, "quota", headers={"Retry-After": "3600"}), Reply.text("unreachable")
    )
    caps = host.LiveCapabilities(env=model_server.env)
    task = capabilities.LlmTask(model=model_server.model_spec(retries=3), system="", prompt="hi")
    asked = r"HTTP 429.*quota; the provider asked to wait 3600s \(Retry-After\), more than the 60s"
    with pytest.raises(capabilities.CapabilityError, match=asked) as failure:
        await caps.complete(task, ctx)
    assert failure.value.retryable
    assert len(model_server.requests) == 1
