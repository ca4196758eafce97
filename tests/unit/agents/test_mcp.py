"""MCP tools against real MCP servers (mcp SDK): streamable HTTP on loopback, and stdio."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentflows.agents import host, mcp, secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.engine import capabilities
from tests.support import mcp_servers
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

TOKEN = "mcp-test-token-123456"
TOKEN_REF = common.SecretKeyRef(
    secret_key_ref=common.SecretKeySelector(name="mcp-auth", key="token")
)


@pytest.fixture(scope="module")
def http_server() -> Iterator[mcp_servers.HttpMcpServer]:
    server = mcp_servers.HttpMcpServer(token=TOKEN).start()
    try:
        yield server
    finally:
        server.stop()


def http_tool(server: mcp_servers.HttpMcpServer, **fields: Any) -> agent_api.Tool:
    options = {"url": server.url, "headers": {"Authorization": TOKEN_REF}, **fields}
    return agent_api.Tool(name="calc", mcp=agent_api.McpTool(**options))


def stdio_tool(**fields: Any) -> agent_api.Tool:
    command, args = mcp_servers.stdio_command()
    return agent_api.Tool(name="local", mcp=agent_api.McpTool(command=command, args=args, **fields))


def env_with_token(server: ScriptedModelServer) -> dict[str, str]:
    return {**server.env, secrets.secret_env_name(TOKEN_REF): f"Bearer {TOKEN}"}


async def run_agent(
    server: ScriptedModelServer, tool: agent_api.Tool, ctx: capabilities.NodeContext
) -> capabilities.NodeResult:
    caps = host.LiveCapabilities(env=env_with_token(server))
    spec = agent_api.AgentSpec(model=server.model_spec(), tools=[tool])
    result = await caps.run_agent(capabilities.AgentTask("mathy", spec, "Add 1 and 2."), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


def offered(server: ScriptedModelServer) -> dict[str, Any]:
    return {t["function"]["name"]: t["function"] for t in server.requests[0].body["tools"]}


def tool_results(server: ScriptedModelServer, request: int = 1) -> list[str]:
    return [m["content"] for m in server.requests[request].messages if m["role"] == "tool"]


async def test_http_server_tools_become_function_schemas_and_results_go_back(
    model_server: ScriptedModelServer,
    http_server: mcp_servers.HttpMcpServer,
    ctx: capabilities.NodeContext,
) -> None:
    model_server.script(
        Reply.calls(ToolCall("calc_add", {"a": 1, "b": 2}, id="c1")), Reply.text("3")
    )
    result = await run_agent(model_server, http_tool(http_server), ctx)

    functions = offered(model_server)
    assert sorted(functions) == sorted(f"calc_{n}" for n in mcp_servers.TOOL_NAMES)
    assert functions["calc_add"]["description"] == "Add two integers."
    assert functions["calc_add"]["parameters"]["required"] == ["a", "b"]
    assert tool_results(model_server) == ["3"]
    [record] = result.detail["toolCalls"]
    assert (record["id"], record["name"], record["status"]) == ("c1", "calc_add", "success")


async def test_stdio_server_runs_as_a_subprocess_of_the_runner(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.calls(ToolCall("local_whoami", {})), Reply.text("stdio it is"))
    result = await run_agent(model_server, stdio_tool(), ctx)
    assert tool_results(model_server) == ["stdio"]
    assert result.output["text"] == "stdio it is"


async def test_an_http_sse_server_is_reached_over_the_sse_transport(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    server = mcp_servers.HttpMcpServer(sse=True).start()
    try:
        tool = agent_api.Tool(name="old", mcp=agent_api.McpTool(url=server.url, sse=True))
        model_server.script(Reply.calls(ToolCall("old_whoami", {})), Reply.text("sse it is"))
        result = await run_agent(model_server, tool, ctx)
    finally:
        server.stop()
    assert tool_results(model_server) == ["sse"]
    assert result.output["text"] == "sse it is"


async def test_include_and_exclude_filter_the_offered_tools(
    model_server: ScriptedModelServer,
    http_server: mcp_servers.HttpMcpServer,
    ctx: capabilities.NodeContext,
) -> None:
    model_server.script(Reply.text("ok"))
    tool = http_tool(http_server, include=["add", "echo", "sleep"], exclude=["sleep"])
    await run_agent(model_server, tool, ctx)
    assert sorted(offered(model_server)) == ["calc_add", "calc_echo"]


async def test_call_past_the_timeout_is_a_timeout_result_for_the_model(
    model_server: ScriptedModelServer,
    http_server: mcp_servers.HttpMcpServer,
    ctx: capabilities.NodeContext,
) -> None:
    model_server.script(Reply.calls(ToolCall("calc_sleep", {"seconds": 5})), Reply.text("too slow"))
    result = await run_agent(model_server, http_tool(http_server, timeout_seconds=0.5), ctx)
    sent = json.loads(tool_results(model_server)[0])
    assert sent["status"] == "timeout"
    assert "timeoutSeconds=0.5" in sent["error"]
    assert result.detail["toolCalls"][0]["status"] == "timeout"


async def test_tool_error_is_an_error_result_and_the_turn_goes_on(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(
        Reply.calls(ToolCall("local_fail", {"message": "disk full"})), Reply.text("sorry")
    )
    result = await run_agent(model_server, stdio_tool(), ctx)
    sent = json.loads(tool_results(model_server)[0])
    assert sent["status"] == "error"
    assert sent["error"].startswith("fail:")
    assert result.detail["toolCalls"][0]["status"] == "error"


async def test_unreachable_server_fails_the_node_with_a_retryable_error(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    tool = agent_api.Tool(name="gone", mcp=agent_api.McpTool(url="http://127.0.0.1:9/mcp"))
    with pytest.raises(capabilities.CapabilityError, match=r"127\.0\.0\.1:9/mcp.*cannot connect"):
        await run_agent(model_server, tool, ctx)
    assert model_server.requests == []


async def test_discover_tools_lists_the_names_the_model_is_offered(
    http_server: mcp_servers.HttpMcpServer,
) -> None:
    env = {secrets.secret_env_name(TOKEN_REF): f"Bearer {TOKEN}"}
    names = await mcp.discover_tools(http_tool(http_server, exclude=["fail"]), env, timeout=10)
    assert names == ["calc_add", "calc_echo", "calc_sleep", "calc_whoami"]
    stdio = stdio_tool(include=["add"])
    assert await mcp.discover_tools(stdio, {}, timeout=20, run_stdio=True) == ["local_add"]
    with pytest.raises(mcp.McpUnavailable, match=r"stdio server .* not by the operator"):
        await mcp.discover_tools(stdio, {}, timeout=20)


async def test_discover_tools_without_the_secret_header_says_the_server_needs_it(
    http_server: mcp_servers.HttpMcpServer,
) -> None:
    with pytest.raises(
        mcp.McpUnavailable,
        match=r"requires authentication \(HTTP 401\).*"
        r"Authorization come from Secrets",
    ):
        await mcp.discover_tools(http_tool(http_server), {}, timeout=10)


async def test_discover_tools_of_an_unreachable_server_raises_within_the_timeout() -> None:
    tool = agent_api.Tool(name="gone", mcp=agent_api.McpTool(url="http://127.0.0.1:9/mcp"))
    with pytest.raises(mcp.McpUnavailable, match="cannot connect"):
        await mcp.discover_tools(tool, {}, timeout=5)
    # A server that accepts the connection but never answers: the timeout bounds the wait.
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        port = silent.getsockname()[1]
        quiet = agent_api.Tool(name="q", mcp=agent_api.McpTool(url=f"http://127.0.0.1:{port}/mcp"))
        with pytest.raises(mcp.McpUnavailable, match=r"no answer within 0\.5 s"):
            await mcp.discover_tools(quiet, {}, timeout=0.5)
    finally:
        silent.close()


async def test_tool_node_calls_one_server_tool_by_its_server_name(
    http_server: mcp_servers.HttpMcpServer, ctx: capabilities.NodeContext
) -> None:
    caps = host.LiveCapabilities(env={secrets.secret_env_name(TOKEN_REF): f"Bearer {TOKEN}"})
    task = capabilities.ToolTask(http_tool(http_server), "echo", {"text": "hi"})
    result = await caps.call_tool(task, ctx)
    assert isinstance(result, capabilities.NodeResult)
    assert result.output["json"] == "hi"


async def test_the_example_glossary_stdio_server_starts_and_lists_its_tools() -> None:
    from pathlib import Path

    from agentflows.api import documents

    path = Path(__file__).resolve().parents[3] / "examples" / "agents" / "agents.yaml"
    loaded = documents.load_paths([path])
    [researcher] = [r for r in loaded.resources if r.metadata.name == "glossary-researcher"]
    [glossary] = researcher.spec.tools
    assert await mcp.discover_tools(glossary, {}, timeout=30, run_stdio=True) == [
        "glossary_define",
        "glossary_list_terms",
    ]


async def test_readonly_autonomy_offers_server_tools_only_when_the_agent_marks_them_read_only(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    from agentflows.api import flow as flow_api

    ctx.autonomy = flow_api.Autonomy.READONLY
    model_server.script(Reply.text("nothing offered"), Reply.text("glossary offered"))
    await run_agent(model_server, stdio_tool(include=["add"]), ctx)
    assert "tools" not in model_server.requests[0].body, "the server's readOnlyHint is not trusted"
    await run_agent(
        model_server, stdio_tool(include=["add"]).model_copy(update={"read_only": True}), ctx
    )
    assert [t["function"]["name"] for t in model_server.requests[1].body["tools"]] == ["local_add"]


def test_declared_tool_names_cover_every_tool_but_mcp() -> None:
    from agentflows.agents import spec_tools

    spec = agent_api.AgentSpec(
        model=agent_api.ModelSpec(name="openai/x"),
        tools=[stdio_tool(), agent_api.Tool(name="py", python=agent_api.PythonTool(script="1"))],
        skills=[
            agent_api.Skill(name="s", content="c", script="print(1)"),
            agent_api.Skill(name="t", content="c"),
        ],
        sub_agents=["a"],
        sub_flows=["f"],
        human_review=agent_api.HumanReview(),
    )
    assert spec_tools.declared_tool_names(spec) == [
        "py",
        "skill_s",
        "call_sub_agent",
        "call_sub_flow",
        "request_human_review",
    ]


async def test_stdio_command_that_does_not_exist_is_named_in_the_error() -> None:
    tool = agent_api.Tool(name="x", mcp=agent_api.McpTool(command="no-such-command-xyz"))
    with pytest.raises(mcp.McpUnavailable, match="'no-such-command-xyz' is not found on PATH"):
        await mcp.discover_tools(tool, {}, timeout=10, run_stdio=True)
