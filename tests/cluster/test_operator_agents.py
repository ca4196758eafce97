"""Agent tool discovery through the operator on a real control plane.

The operator (its ServiceAccount's token, config/rbac as it ships) lists the tools of an Agent's
HTTP MCP servers into ``status.tools``; here the server is the test MCP server of
tests/support/mcp_servers.py on the node's bridge address, which the operator's pod reaches like
any URL.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator, pod_host
from tests.support import mcp_servers

pytestmark = pytest.mark.cluster


@pytest.fixture
def mcp_server(control_plane: Cluster) -> Iterator[mcp_servers.HttpMcpServer]:
    """The test MCP server where the operator reaches it (its pod, on the real node)."""
    server = mcp_servers.HttpMcpServer(host=pod_host(control_plane)).start()
    try:
        yield server
    finally:
        server.stop()


def agent(name: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "openai/scripted-model", "apiBase": "http://127.0.0.1:9"},
            "systemPrompt": "You help.",
            "tools": tools,
        },
    }


def python_tool(name: str) -> dict[str, Any]:
    return {"name": name, "python": {"script": "print('{}')"}}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def discovered(runs: FlowRuns, name: str) -> dict[str, Any] | None:
    """The ToolsDiscovered condition once it has a verdict (True or False)."""
    condition = runs.condition("agents", name, "ToolsDiscovered")
    return condition if condition and condition["status"] in ("True", "False") else None


def test_an_agent_with_an_http_mcp_tool_lists_the_servers_tools_in_its_status(
    runs: FlowRuns, mcp_server: mcp_servers.HttpMcpServer
) -> None:
    command, args = mcp_servers.stdio_command()
    runs.apply(
        agent(
            "calculator",
            [
                python_tool("lookup"),
                {"name": "calc", "mcp": {"url": mcp_server.url, "exclude": ["whoami"]}},
                {"name": "local", "mcp": {"command": command, "args": args}},
            ],
        )
    )

    condition = wait_for(lambda: discovered(runs, "calculator"), 60, "ToolsDiscovered")
    assert condition["status"] == "True", condition
    # The stdio server is not started by the operator: its tools come when a run starts it.
    assert "local" in condition["message"]
    agent_obj = runs.get("agents", "calculator")
    assert agent_obj is not None
    expected = ["lookup"] + [f"calc_{n}" for n in mcp_servers.TOOL_NAMES if n != "whoami"]
    assert sorted(agent_obj["status"]["tools"]) == sorted(expected)
    assert runs.condition("agents", "calculator", "Ready") is not None


def test_an_unreachable_mcp_server_is_a_condition_and_the_operator_keeps_running(
    runs: FlowRuns, operator: Operator
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    runs.apply(agent("stranded", [python_tool("lookup"), {"name": "gone", "mcp": {"url": url}}]))

    condition = wait_for(lambda: discovered(runs, "stranded"), 60, "ToolsDiscovered")
    assert condition["status"] == "False", condition
    assert condition["reason"] == "McpUnavailable"
    assert condition["message"].startswith("gone: ")
    assert "127.0.0.1" in condition["message"]
    agent_obj = runs.get("agents", "stranded")
    assert agent_obj is not None
    assert agent_obj["status"]["tools"] == ["lookup"]
    ready = runs.condition("agents", "stranded", "Ready")
    assert ready is not None and ready["status"] == "True", ready
    assert operator.alive
