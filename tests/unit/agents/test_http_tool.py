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
