"""Attack: a Flow author's URL — a model's apiBase, an MCP url, an http tool — reaches what the
one address guard (:mod:`agentflows.agents.egress`) should refuse.

Loopback is spelt the ways resolvers accept but allowHosts would compare as a name (hex,
decimal, octal, short, IPv4-mapped IPv6), against a real loopback endpoint that records every
request: each URL-naming field refuses them with a message that names the field, and the
endpoint sees nothing. Redirects: credentials never follow a hop to another port, and a model
endpoint's redirect is not followed. The http tool keeps the query written in its URL. An
endpoint's error reply is quoted in a bounded, one-line form.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from agentflows.agents import egress, host, mcp, model, secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer

SECRET = common.SecretKeyRef(secret_key_ref=common.SecretKeySelector(name="tool-keys", key="token"))
TOKEN = "tok-very-secret-123456"
#: 127.0.0.1 as resolvers also read it.
LOOPBACK_SPELLINGS = ["0x7f000001", "2130706433", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]"]


def spelt(endpoint: LoopbackEndpoint, spelling: str) -> str:
    """The endpoint's base URL with its host 127.0.0.1 written as ``spelling``."""
    return endpoint.url.replace("127.0.0.1", spelling, 1)


async def call_http_tool(
    ctx: capabilities.NodeContext, args: Any, env: dict[str, str] | None = None, **http: Any
) -> capabilities.NodeResult:
    tool = agent_api.Tool(name="api", http=agent_api.HttpTool(timeout_seconds=5, **http))
    caps = host.LiveCapabilities(env=env or {})
    result = await caps.call_tool(capabilities.ToolTask(tool, "api", args), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


@pytest.fixture
def second_endpoint() -> Any:
    server = LoopbackEndpoint().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
@pytest.mark.parametrize("name", ["openai/gpt-4o-mini", "anthropic/claude-sonnet-4"])
async def test_model_api_base_spelling_loopback_otherwise_is_refused_before_any_request(
    endpoint: LoopbackEndpoint, spelling: str, name: str
) -> None:
    spec = agent_api.ModelSpec(name=name, api_base=spelt(endpoint, spelling) + "/v1", retries=0)
    with pytest.raises(capabilities.CapabilityError, match=r"model\.apiBase: ") as error:
        await model.complete(
            spec, [{"role": "user", "content": "hi"}], env={}, redactor=_redactor()
        )
    assert not error.value.retryable
    assert endpoint.requests == []


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
async def test_mcp_url_spelling_loopback_otherwise_is_refused_before_any_request(
    endpoint: LoopbackEndpoint, spelling: str
) -> None:
    tool = agent_api.Tool(name="remote", mcp=agent_api.McpTool(url=spelt(endpoint, spelling)))
    with pytest.raises(mcp.McpUnavailable, match=r"(write an IPv4 address|IPv6 form never names)"):
        await mcp.discover_tools(tool, {}, timeout=10)
    assert endpoint.requests == []


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
async def test_http_tool_url_spelling_loopback_otherwise_is_refused_before_any_request(
    endpoint: LoopbackEndpoint, spelling: str, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(
        capabilities.CapabilityError, match=r"(write an IPv4 address|IPv6 form never names)"
    ):
        await call_http_tool(ctx, {}, url=spelt(endpoint, spelling) + "/text")
    assert endpoint.requests == []


async def test_http_tool_redirect_to_loopback_spelt_in_hex_is_refused(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    target = spelt(endpoint, "0x7f000001") + "/text"
    with pytest.raises(capabilities.CapabilityError, match="write an IPv4 address"):
        await call_http_tool(ctx, {"to": target}, url=endpoint.url + "/redirect")
    assert [r["path"] for r in endpoint.requests] == ["/redirect"]


@pytest.mark.parametrize(
    "address", ["168.63.129.16", "169.254.170.2", "100.100.100.200", "fd00:ec2::254"]
)
def test_cloud_host_agent_addresses_are_never_called(address: str) -> None:
    refusal = egress.address_refusal(ipaddress.ip_address(address), explicit=True)
    assert refusal == "a cloud metadata address, which is never called"


async def test_metadata_service_name_is_refused_before_it_is_resolved(
    ctx: capabilities.NodeContext,
) -> None:
    with pytest.raises(capabilities.CapabilityError, match="is a cloud metadata service"):
        await call_http_tool(ctx, {}, url="http://metadata.google.internal/computeMetadata/v1/")


async def test_secret_and_authorization_headers_are_dropped_on_a_redirect_to_another_port(
    endpoint: LoopbackEndpoint, second_endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    await call_http_tool(
        ctx,
        {"to": second_endpoint.url + "/echo"},
        env={secrets.secret_env_name(SECRET): TOKEN},
        url=endpoint.url + "/redirect",
        headers={"Authorization": "Bearer plain", "Cookie": "session=1", "X-Kept": "yes"},
        secret_headers={"X-Token": SECRET},
        allow_hosts=["127.0.0.1"],
    )
    [first], [second] = endpoint.requests, second_endpoint.requests
    assert first["headers"]["x-token"] == TOKEN
    assert first["headers"]["authorization"] == "Bearer plain"
    assert second["path"] == "/echo" and second["headers"]["x-kept"] == "yes"
    assert {"x-token", "authorization", "cookie"}.isdisjoint(second["headers"])


async def test_secret_header_follows_a_redirect_on_the_same_origin(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    await call_http_tool(
        ctx,
        {"to": "/echo"},
        env={secrets.secret_env_name(SECRET): TOKEN},
        url=endpoint.url + "/redirect",
        secret_headers={"X-Token": SECRET},
    )
    assert [r["headers"].get("x-token") for r in endpoint.requests] == [TOKEN, TOKEN]


async def test_http_tool_keeps_the_query_written_in_its_url_with_templated_values_encoded(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    await call_http_tool(
        ctx,
        {"q": "a b&lang=xx", "page": 2},
        url=endpoint.url + "/echo?format=json&lang=en&q={{ .args.q }}",
    )
    [request] = endpoint.requests
    assert request["path"] == "/echo"
    assert request["query"] == {"format": "json", "lang": "en", "q": "a b&lang=xx", "page": "2"}


async def test_http_tool_without_arguments_keeps_the_query_written_in_its_url(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    await call_http_tool(ctx, {}, url=endpoint.url + "/echo?format=json&lang=en")
    assert endpoint.requests[0]["query"] == {"format": "json", "lang": "en"}


async def test_model_endpoint_redirect_is_not_followed(
    endpoint: LoopbackEndpoint, second_endpoint: LoopbackEndpoint
) -> None:
    api_base = f"{endpoint.url}/redirect?to={second_endpoint.url}/v1"
    spec = agent_api.ModelSpec(name="openai/gpt-4o-mini", api_base=api_base, retries=0)
    with pytest.raises(capabilities.CapabilityError, match="redirect, which is not followed"):
        await model.complete(
            spec, [{"role": "user", "content": "hi"}], env={}, redactor=_redactor()
        )
    assert [r["path"] for r in endpoint.requests] == ["/redirect"]
    assert second_endpoint.requests == []


async def test_model_endpoint_error_reply_is_quoted_on_one_bounded_line(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(Reply.error(500, "internal\nsecret page " + "x" * 5000))
    with pytest.raises(capabilities.CapabilityError) as error:
        await model.complete(
            model_server.model_spec(),
            [{"role": "user", "content": "hi"}],
            env=model_server.env,
            redactor=_redactor(),
        )
    message = str(error.value)
    assert "\n" not in message and "internal secret page xxx" in message
    assert len(message) < 400


def _redactor() -> secrets.Redactor:
    return secrets.Redactor()


@pytest.mark.parametrize("name", ["anthropic/claude-sonnet-4", "ollama/llama3"])
async def test_litellm_model_endpoint_redirect_is_not_followed_with_the_api_key(
    endpoint: LoopbackEndpoint, second_endpoint: LoopbackEndpoint, name: str
) -> None:
    key_ref = common.SecretKeyRef(
        secret_key_ref=common.SecretKeySelector(name="llm-keys", key="key")
    )
    api_base = f"{endpoint.url}/redirect?to={second_endpoint.url}/v1"
    spec = agent_api.ModelSpec(name=name, api_base=api_base, api_key=key_ref, retries=0)
    with pytest.raises(capabilities.CapabilityError):
        await model.complete(
            spec,
            [{"role": "user", "content": "hi"}],
            env={secrets.secret_env_name(key_ref): TOKEN},
            redactor=_redactor(),
        )
    assert [r["path"] for r in endpoint.requests] == ["/redirect"]
    assert second_endpoint.requests == []
