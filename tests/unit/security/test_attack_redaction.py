"""Attack: a server echoes the secret it was sent, and the run stores it in the clear.

The http tool sends a secret header to a real loopback service whose ``/echo`` answers 200 with
the request it got; an MCP server answers a call with a secret value. What the run keeps (the
node output, the tool result the model reads) must show ``[redacted]`` instead.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from agentflows.agents import host, secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities
from tests.support import mcp_servers
from tests.support.endpoint import LoopbackEndpoint

TOKEN_REF = common.SecretKeyRef(
    secret_key_ref=common.SecretKeySelector(name="tool-keys", key="token")
)
TOKEN = "tok-very-secret-123456"
ENV = {secrets.secret_env_name(TOKEN_REF): TOKEN}


def echo_tool(endpoint: LoopbackEndpoint, **fields: Any) -> agent_api.Tool:
    http = {"url": endpoint.url + "/echo", "secret_headers": {"Authorization": TOKEN_REF}}
    return agent_api.Tool(name="api", http=agent_api.HttpTool(**{**http, **fields}))


async def call_tool(
    ctx: capabilities.NodeContext, tool: agent_api.Tool, args: Any, env: dict[str, str]
) -> capabilities.NodeResult:
    caps = host.LiveCapabilities(env=env)
    result = await caps.call_tool(capabilities.ToolTask(tool, tool.name, args), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


async def test_http_200_response_echoing_a_secret_header_is_stored_redacted(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    result = await call_tool(ctx, echo_tool(endpoint, method="POST"), {"q": 1}, ENV)
    assert endpoint.requests[0]["headers"]["authorization"] == TOKEN
    assert result.output["json"]["headers"]["authorization"] == "[redacted]"
    assert TOKEN not in json.dumps(result.output)


async def test_http_response_echoing_a_secret_inside_a_longer_string_and_a_key_is_redacted(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    tool = echo_tool(endpoint, headers={"X-Note": "key={{ .args.note }}"})
    # The secret comes back in a header value and as the name of a query parameter.
    result = await call_tool(ctx, tool, {"note": f"<{TOKEN}>", TOKEN: "1"}, ENV)
    echoed = result.output["json"]
    assert echoed["headers"]["x-note"] == "key=<[redacted]>"
    assert echoed["query"] == {"note": "<[redacted]>", "[redacted]": "1"}
    assert TOKEN not in json.dumps(result.output)


async def test_http_response_echoing_the_env_provider_key_is_redacted(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    # The key was never sent: the redactor knows every secret of the environment.
    key = "sk-victim-0123456789abcdef"
    result = await call_tool(
        ctx, echo_tool(endpoint), {"leak": key}, {**ENV, "OPENAI_API_KEY": key}
    )
    assert key not in json.dumps(result.output)


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[mcp_servers.HttpMcpServer]:
    server = mcp_servers.HttpMcpServer().start()
    try:
        yield server
    finally:
        server.stop()


async def test_mcp_result_carrying_a_secret_header_value_is_redacted(
    mcp_server: mcp_servers.HttpMcpServer, ctx: capabilities.NodeContext
) -> None:
    tool = agent_api.Tool(
        name="calc",
        mcp=agent_api.McpTool(url=mcp_server.url, headers={"X-Token": TOKEN_REF}),
    )
    task = capabilities.ToolTask(tool, "echo", {"text": f"you sent {TOKEN}"})
    result = await host.LiveCapabilities(env=ENV).call_tool(task, ctx)
    assert isinstance(result, capabilities.NodeResult)
    assert result.output["json"] == "you sent [redacted]"


QUOTED_TOKEN = 'sk-canary-"quoted"-\\back/slash +&=?-6666'
QUOTED_ENV = {secrets.secret_env_name(TOKEN_REF): QUOTED_TOKEN}


def runner_encodings(value: str) -> dict[str, str]:
    """Every encoding of ``value`` the runner itself can produce, by name."""
    raw = value.encode()
    once = json.dumps(value)[1:-1]
    std, urlsafe = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    return {
        "json-escaped": once,
        "json-escaped-ascii-off": json.dumps(value, ensure_ascii=False)[1:-1],
        "json-escaped-twice": json.dumps(once)[1:-1],
        "url-quote": urllib.parse.quote(value),
        "url-quote-safe-empty": urllib.parse.quote(value, safe=""),
        "url-quote-plus": urllib.parse.quote_plus(value),
        "base64": std,
        "base64-unpadded": std.rstrip("="),
        "base64-urlsafe": urlsafe,
        "base64-urlsafe-unpadded": urlsafe.rstrip("="),
    }


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value (keys too), and its serialisation."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)


def shows(value: Any, form: str) -> bool:
    """Whether ``form`` can be read in ``value`` as stored or as printed."""
    printed = (json.dumps(value), json.dumps(value, ensure_ascii=False))
    return any(form in text for text in (*strings(value), *printed))


async def test_secret_with_quotes_echoed_inside_json_is_redacted_in_its_escaped_form(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    result = await call_tool(ctx, echo_tool(endpoint, method="POST"), {"q": 1}, QUOTED_ENV)
    assert endpoint.requests[0]["headers"]["authorization"] == QUOTED_TOKEN
    assert "[redacted]" in json.dumps(result.output)
    for name, form in runner_encodings(QUOTED_TOKEN).items():
        assert not shows(result.output, form), name


@pytest.mark.parametrize("name", sorted(runner_encodings(QUOTED_TOKEN)))
async def test_every_runner_encoding_of_a_secret_echoed_back_is_redacted(
    endpoint: LoopbackEndpoint, ctx: capabilities.NodeContext, name: str
) -> None:
    form = runner_encodings(QUOTED_TOKEN)[name]
    tool = echo_tool(endpoint, method="POST")
    result = await call_tool(ctx, tool, {"note": f"<{form}>"}, QUOTED_ENV)
    assert endpoint.requests[0]["body"]
    assert not shows(result.output, form), name
