"""Attack: an http tool (or an MCP url) reaches an address the guard should refuse.

IPv6 forms that wrap an IPv4 address (6to4, NAT64, mapped, compatible, Teredo) and the older
IPv6 private ranges (site-local) are tried against the one classification function, through the
tool as the model would call it, and against the operator's MCP discovery. Ports from the
model's arguments that are not ports are tool errors, not crashes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from agentflows.agents import egress, host, mcp
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall


async def call(ctx: capabilities.NodeContext, args: Any, **http: Any) -> capabilities.NodeResult:
    tool = agent_api.Tool(name="api", http=agent_api.HttpTool(timeout_seconds=5, **http))
    caps = host.LiveCapabilities(env={})
    result = await caps.call_tool(capabilities.ToolTask(tool, "api", args), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


@pytest.fixture
def endpoint6() -> Iterator[LoopbackEndpoint]:
    server = LoopbackEndpoint("::1").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("address", "what"),
    [
        ("2002:a9fe:a9fe::", "a cloud metadata address (169.254.169.254)"),
        ("2002:a9fe:1::1", "a link-local address (169.254.0.1)"),
        ("64:ff9b::a9fe:a9fe", "a cloud metadata address (169.254.169.254)"),
        ("::ffff:169.254.169.254", "a cloud metadata address (169.254.169.254)"),
        ("::169.254.169.254", "a cloud metadata address (169.254.169.254)"),
        ("2001:0:4136:e378:8000:63bf:5601:5601", "a cloud metadata address (169.254.169.254)"),
        ("2002:e000:1::", "a multicast address (224.0.0.1)"),
        ("2002::1", "an unspecified address (0.0.0.0)"),
        ("ff02::1", "a multicast address"),
        ("::", "an unspecified address"),
        ("0.1.2.3", "an unspecified address"),
        ("240.0.0.1", "a reserved address"),
    ],
)
def test_wrapped_or_special_address_is_never_called_even_when_named_exactly(
    address: str, what: str
) -> None:
    refusal = egress.address_refusal(ipaddress.ip_address(address), explicit=True)
    assert refusal == f"{what}, which is never called"


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("2002:7f00:1::", egress.AddressClass.LOOPBACK),
        ("2002:a00:1::", egress.AddressClass.PRIVATE),
        ("64:ff9b::7f00:1", egress.AddressClass.LOOPBACK),
        ("::ffff:10.0.0.1", egress.AddressClass.PRIVATE),
        ("fec0::1", egress.AddressClass.SITE_LOCAL),
        ("fd12:3456::1", egress.AddressClass.UNIQUE_LOCAL),
        ("::1", egress.AddressClass.LOOPBACK),
        ("100.64.0.1", egress.AddressClass.PRIVATE),
        ("2606:4700::1111", egress.AddressClass.PUBLIC),
        ("2002:808:808::", egress.AddressClass.PUBLIC),
    ],
)
def test_non_public_address_passes_only_when_named_exactly(
    address: str, kind: egress.AddressClass
) -> None:
    parsed = ipaddress.ip_address(address)
    assert egress.classify(parsed)[0] is kind
    refused = egress.address_refusal(parsed, explicit=False)
    assert (refused is None) == (kind is egress.AddressClass.PUBLIC)
    reached = egress.classify(parsed)[1]
    named = egress.address_refusal(parsed, explicit=True)
    if reached == parsed or kind is egress.AddressClass.PUBLIC:
        assert named is None
    else:  # an IPv6 wrapper never names the non-public IPv4 address it reaches
        assert named == f"{kind.value} ({reached}); an IPv6 form never names it: write {reached}"


@pytest.mark.parametrize(
    "url",
    [
        "http://[2002:a9fe:a9fe::]/latest/meta-data/",
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
        "http://[::ffff:a9fe:a9fe]/latest/meta-data/",
    ],
)
async def test_metadata_behind_an_ipv6_wrapper_is_refused_by_the_tool(
    url: str, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(
        capabilities.CapabilityError, match=r"a cloud metadata address \(169\.254\.169\.254\)"
    ):
        await call(ctx, {}, url=url)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", "0:0::1"])
async def test_names_and_literals_of_loopback_are_judged_alike(host: str) -> None:
    with pytest.raises(egress.HostNotAllowed, match="a loopback address; name the host"):
        await egress.resolve_allowed(host, 80, explicit=False)
    [address] = await egress.resolve_allowed(host, 80, explicit=True)
    assert address.is_loopback


async def test_explicitly_listed_ipv6_loopback_is_allowed_like_ipv4_loopback(
    endpoint: LoopbackEndpoint, endpoint6: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    four = await call(ctx, {}, url=endpoint.url + "/text", allow_hosts=["127.0.0.1"])
    six = await call(ctx, {}, url=endpoint6.url + "/text", allow_hosts=["[::1]"])
    assert four.output["json"] == six.output["json"] == "plain words"


async def test_ipv6_loopback_written_in_the_url_template_is_allowed(
    endpoint6: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    result = await call(ctx, {}, url=endpoint6.url + "/text")
    assert result.output["json"] == "plain words"


async def test_ipv6_loopback_listed_in_another_spelling_is_the_same_host(
    endpoint6: LoopbackEndpoint, ctx: capabilities.NodeContext
) -> None:
    result = await call(ctx, {}, url=endpoint6.url + "/text", allow_hosts=["[0:0::1]"])
    assert result.output["json"] == "plain words"


@pytest.mark.parametrize("port", ["abc", "99999", "0", "-1", "8o80"])
async def test_bad_port_from_tool_arguments_is_a_tool_error_with_a_message(
    port: str, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(capabilities.CapabilityError) as error:
        await call(
            ctx,
            {"port": port},
            url="http://127.0.0.1:{{ .args.port }}/x",
            allow_hosts=["127.0.0.1"],
        )
    message = str(error.value)
    assert f"has port {port!r}; a port is a number from 1 to 65535" in message
    assert "ValueError" not in message


async def test_agent_sending_a_bad_port_gets_an_error_result_and_the_turn_goes_on(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    tool = agent_api.Tool(
        name="api",
        http=agent_api.HttpTool(
            url="http://127.0.0.1:{{ .args.port }}/x", allow_hosts=["127.0.0.1"]
        ),
    )
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[tool])
    model_server.script(Reply.calls(ToolCall("api", {"port": "abc"})), Reply.text("sorry"))
    caps = host.LiveCapabilities(env=model_server.env)
    result = await caps.run_agent(capabilities.AgentTask("a", spec, "go"), ctx)
    assert isinstance(result, capabilities.NodeResult)
    [sent] = [m["content"] for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert "a port is a number from 1 to 65535" in sent


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/mcp",
        "http://[2002:a9fe:a9fe::]/mcp",
        "http://[fd00:ec2::254]/mcp",
    ],
)
async def test_operator_mcp_discovery_never_connects_to_a_metadata_address(url: str) -> None:
    tool = agent_api.Tool(name="remote", mcp=agent_api.McpTool(url=url))
    with pytest.raises(
        mcp.McpUnavailable,
        match=r"a cloud metadata address( \(169\.254\.169\.254\))?, which is never called",
    ):
        await mcp.discover_tools(tool, {}, timeout=10)


async def test_agent_with_an_mcp_url_on_a_link_local_address_fails_without_retrying(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    tool = agent_api.Tool(name="remote", mcp=agent_api.McpTool(url="http://[fe80::1]:8080/mcp"))
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[tool])
    caps = host.LiveCapabilities(env=model_server.env)
    with pytest.raises(capabilities.CapabilityError, match="a link-local address") as error:
        await caps.run_agent(capabilities.AgentTask("a", spec, "go"), ctx)
    assert not error.value.retryable
    assert model_server.requests == []
