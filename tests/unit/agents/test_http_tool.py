"""The http tool: templated URLs, allowed hosts, bodies, headers, limits."""

from __future__ import annotations

from typing import Any

import pytest

from agentflows.agents import host, secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities

SECRET = common.SecretKeyRef(secret_key_ref=common.SecretKeySelector(name="tool-keys", key="token"))
TOKEN = "tok-very-secret-123456"


async def call(
    ctx: capabilities.NodeContext, args: Any, env: dict[str, str] | None = None, **http: Any
) -> capabilities.NodeResult:
    tool = agent_api.Tool(name="api", http=agent_api.HttpTool(**http))
    caps = host.LiveCapabilities(env=env or {})
    result = await caps.call_tool(capabilities.ToolTask(tool, "api", args), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


async def test_arguments_fill_the_url_template_percent_encoded(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    result = await call(
        ctx, {"city": "New York/..?x=1"}, url=endpoint.url + "/weather/{{ .args.city }}"
    )
    assert result.output["json"]["forecast"] == "sunny"
    assert endpoint.requests[0]["path"] == "/weather/New%20York%2F..%3Fx%3D1"
    assert endpoint.requests[0]["query"] == {}, "arguments used in the URL are not repeated"


async def test_get_sends_unused_arguments_as_query_parameters(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    await call(ctx, {"q": "kopf", "limit": 3}, url=endpoint.url + "/echo")
    assert endpoint.requests[0]["query"] == {"q": "kopf", "limit": "3"}


async def test_post_sends_the_arguments_as_json_body_and_secret_headers(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    env = {secrets.secret_env_name(SECRET): TOKEN}
    result = await call(
        ctx,
        {"title": "hi"},
        env=env,
        method="POST",
        url=endpoint.url + "/echo",
        headers={"X-Title": "{{ .args.title }}"},
        secret_headers={"Authorization": SECRET},
    )
    request = endpoint.requests[0]
    assert request["body"] == {"title": "hi"}
    assert request["headers"]["x-title"] == "hi"
    assert request["headers"]["authorization"] == TOKEN
    assert result.output["json"]["method"] == "POST"


async def test_body_template_shapes_the_request(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    await call(
        ctx,
        {"title": "hi", "tags": ["a"]},
        method="PUT",
        url=endpoint.url + "/echo",
        body={"name": "{{ .args.title }}!", "labels": "=.args.tags"},
    )
    assert endpoint.requests[0]["body"] == {"name": "hi!", "labels": ["a"]}


async def test_text_response_is_returned_as_text(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    result = await call(ctx, {}, url=endpoint.url + "/text")
    assert result.output["json"] == "plain words"


async def test_host_outside_allow_hosts_is_refused_before_any_request(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(capabilities.CapabilityError, match="host 'localhost' is not allowed"):
        await call(
            ctx,
            {"host": "localhost"},
            url="http://{{ .args.host }}:1/weather/x",
            allow_hosts=["127.0.0.1"],
        )
    assert endpoint.requests == []


async def test_templated_host_needs_allow_hosts(ctx: capabilities.NodeContext) -> None:
    with pytest.raises(capabilities.CapabilityError, match="URL template's host is templated"):
        await call(ctx, {"host": "127.0.0.1"}, url="http://{{ .args.host }}/x")


async def test_redirect_to_a_host_that_is_not_allowed_is_refused(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    target = endpoint.url.replace("127.0.0.1", "localhost") + "/text"
    with pytest.raises(capabilities.CapabilityError, match="host 'localhost' is not allowed"):
        await call(ctx, {"to": target}, url=endpoint.url + "/redirect")
    assert [r["path"] for r in endpoint.requests] == ["/redirect"]


async def test_error_status_fails_with_the_start_of_the_body(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(capabilities.CapabilityError, match=r"HTTP 503.*backend down"):
        await call(ctx, {}, url=endpoint.url + "/fail")


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (404, False), (409, False), (408, True), (425, True), (429, True), (502, True)],
)
async def test_an_error_status_is_retryable_only_when_the_same_request_may_pass_later(
    endpoint: Any, ctx: capabilities.NodeContext, status: int, retryable: bool
) -> None:
    with pytest.raises(capabilities.CapabilityError, match=f"HTTP {status}") as failure:
        await call(ctx, {}, url=f"{endpoint.url}/status/{status}")
    assert failure.value.retryable is retryable


async def test_response_larger_than_the_limit_is_refused(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(capabilities.CapabilityError, match="larger than maxResponseBytes=1000"):
        await call(ctx, {}, url=endpoint.url + "/big", max_response_bytes=1000)


async def test_slow_endpoint_times_out_and_may_be_retried(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(capabilities.CapabilityError, match=r"no response within 0\.3 s") as failure:
        await call(ctx, {}, url=endpoint.url + "/slow", timeout_seconds=0.3)
    assert failure.value.retryable


async def test_bad_template_is_reported_before_any_request(ctx: capabilities.NodeContext) -> None:
    with pytest.raises(capabilities.CapabilityError, match="tool api: http: jq syntax error"):
        await call(ctx, {}, url="http://127.0.0.1/{{ .args[ }}")


async def test_cloud_metadata_address_is_refused_even_when_written_in_the_url(
    ctx: capabilities.NodeContext,
) -> None:
    with pytest.raises(
        capabilities.CapabilityError, match="a cloud metadata address, which is never called"
    ):
        await call(ctx, {}, url="http://169.254.169.254/latest/meta-data/", timeout_seconds=2)


async def test_private_address_allowed_only_by_a_wildcard_is_refused(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(
        capabilities.CapabilityError, match="a loopback address; name the host exactly"
    ):
        await call(ctx, {}, url=endpoint.url + "/text", allow_hosts=["*.0.0.1"])
    assert endpoint.requests == []


async def test_host_named_exactly_connects_to_the_checked_address_with_its_host_header(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    url = endpoint.url.replace("127.0.0.1", "localhost")
    result = await call(ctx, {}, url=url + "/echo", method="POST", allow_hosts=["localhost"])
    assert result.output["json"]["headers"]["host"] == url.removeprefix("http://")


async def test_redirect_to_a_metadata_address_is_refused(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    with pytest.raises(capabilities.CapabilityError, match="cloud metadata"):
        await call(
            ctx,
            {"to": "http://169.254.169.254/latest/"},
            url=endpoint.url + "/redirect",
            allow_hosts=["127.0.0.1", "169.254.169.254"],
        )


@pytest.mark.parametrize(
    ("address", "explicit", "refused"),
    [
        ("8.8.8.8", False, None),
        ("10.1.2.3", False, "private"),
        ("10.1.2.3", True, None),
        ("127.0.0.1", True, None),
        ("100.64.0.1", False, "private"),
        ("169.254.169.254", True, "metadata"),
        ("::ffff:169.254.169.254", True, "metadata"),
        ("fe80::1", True, "link-local"),
        ("fd00:ec2::254", True, "metadata"),
        ("224.0.0.1", True, "multicast"),
        ("0.0.0.0", True, "unspecified"),
    ],
)
def test_address_rules(address: str, explicit: bool, refused: str | None) -> None:
    import ipaddress

    from agentflows.agents import egress

    refusal = egress.address_refusal(ipaddress.ip_address(address), explicit=explicit)
    assert (refusal is None) == (refused is None)
    if refused is not None:
        assert refusal is not None and refused in refusal


async def test_secret_headers_are_not_sent_to_another_host_after_a_redirect(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    elsewhere = endpoint.url.replace("127.0.0.1", "localhost") + "/echo"
    await call(
        ctx,
        {"to": elsewhere},
        env={secrets.secret_env_name(SECRET): TOKEN},
        url=endpoint.url + "/redirect",
        allow_hosts=["127.0.0.1", "localhost"],
        secret_headers={"Authorization": SECRET},
    )
    first, second = endpoint.requests
    assert first["headers"]["authorization"] == TOKEN
    assert second["path"] == "/echo" and "authorization" not in second["headers"]


async def test_redirect_target_gets_its_own_query_not_the_arguments_again(
    endpoint: Any, ctx: capabilities.NodeContext
) -> None:
    result = await call(ctx, {"to": "/echo?page=2"}, url=endpoint.url + "/redirect")
    assert result.output["json"]["query"] == {"page": "2"}
