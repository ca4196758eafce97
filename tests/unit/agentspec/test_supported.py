"""Supported matrix rows no other test runs with `agentflows run`: configs, tools, a crew.

Each runs with ``agentflows run`` against the scripted model server (real HTTP on loopback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import mcp_servers
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.agentspec.conftest import invoke, output_of, served


def root_agent(llm_config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "agentspec_version": "26.1.0", "component_type": "Agent", "name": "helper",
        "system_prompt": "Help.", "llm_config": llm_config, **fields,
    }  # fmt: skip


def run(tmp_path: Path, doc: dict[str, Any], message: str) -> tuple[int, str, str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    return invoke(
        "run", str(path), "--state-dir", str(tmp_path / "runs"), "--input", f"message={message}"
    )


@pytest.mark.parametrize(
    "kind", ["OpenAiConfig", "OpenAiCompatibleConfig", "VllmConfig", "OllamaConfig"]
)
def test_each_llm_config_runs_with_its_generation_parameters(
    model_server: ScriptedModelServer,
    tmp_path: Path,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    config = {
        "component_type": kind, "name": "m", "model_id": "scripted-model",
        "url": model_server.url,
        "default_generation_parameters": {"temperature": 0.2, "top_p": 0.9, "max_tokens": 64},
        "retry_policy": {"request_timeout": 30},
    }  # fmt: skip
    model_server.script(Reply.text("Hello."))
    code, out, err = run(tmp_path, root_agent(config), "Hi")
    assert code == 0, err
    assert output_of(out) == "Hello."
    sent = model_server.requests[0].body
    assert (sent["model"], sent["temperature"], sent["top_p"], sent["max_tokens"]) == (
        "scripted-model", 0.2, 0.9, 64,
    )  # fmt: skip


def test_an_agent_calls_a_remote_tool_with_its_url_template_and_headers(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint, tmp_path: Path
) -> None:
    config = {
        "component_type": "OpenAiCompatibleConfig", "name": "m", "model_id": "scripted-model",
        "url": model_server.url,
    }  # fmt: skip
    tool = {
        "component_type": "RemoteTool", "name": "forecast",
        "url": f"{endpoint.url}/weather/{{{{city}}}}", "http_method": "GET",
        "headers": {"X-Team": "ops"}, "url_allow_list": [endpoint.url],
        "inputs": [{"title": "city", "type": "string"}],
    }  # fmt: skip
    model_server.script(
        Reply.calls(ToolCall("forecast", {"city": "oslo"})), Reply.text("Sunny in Oslo.")
    )
    code, out, err = run(tmp_path, root_agent(config, tools=[tool]), "Weather in Oslo?")
    assert code == 0, err
    assert output_of(out) == "Sunny in Oslo."
    assert (endpoint.requests[0]["path"], endpoint.requests[0]["headers"]["x-team"]) == (
        "/weather/oslo", "ops",
    )  # fmt: skip
    result = json.loads(model_server.requests[1].messages[-1]["content"])
    assert result == {"city": "oslo", "forecast": "sunny"}


def test_an_agent_calls_an_mcp_tool_over_streamable_http(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    server = mcp_servers.HttpMcpServer().start()
    config = {
        "component_type": "OpenAiCompatibleConfig", "name": "m", "model_id": "scripted-model",
        "url": model_server.url,
    }  # fmt: skip
    transport = {
        "component_type": "StreamableHTTPTransport", "name": "t", "url": server.url,
        "session_parameters": {"read_timeout_seconds": 20},
    }  # fmt: skip
    tool = {"component_type": "MCPTool", "name": "add", "client_transport": transport}
    model_server.script(Reply.calls(ToolCall("add", {"a": 40, "b": 2})), Reply.text("42"))
    try:
        code, out, err = run(tmp_path, root_agent(config, tools=[tool]), "40 + 2?")
    finally:
        server.stop()
    assert code == 0, err
    assert output_of(out) == "42"
    assert model_server.requests[1].messages[-1]["content"] == "42"


def test_agentflows_run_gives_a_manager_s_task_to_a_specialised_worker(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("crew.yaml", tmp_path, model_server)
    model_server.script(
        Reply.calls(ToolCall("call_sub_agent", {"agent": "writer", "prompt": "haiku: rain"})),
        Reply.calls(ToolCall("syllables", {"line": "soft rain on the roof"})),
        Reply.text("soft rain on the roof"),
        Reply.text("Here it is: soft rain on the roof"),
    )
    args = ("--state-dir", str(tmp_path / "runs"), "--input", "message=A haiku about rain.")
    code, out, err = invoke("run", str(spec), *args)
    assert code == 0, err
    assert output_of(out) == "Here it is: soft rain on the roof"
    writer = model_server.requests[1].messages
    assert writer[0]["content"] == (
        "You write clear prose.\n\nWrite haiku only; count syllables with the tool."
    )
    assert model_server.requests[2].messages[-1]["content"] == "5"


def test_a_tool_node_calls_a_remote_tool_and_reads_its_one_output_by_name(
    endpoint: LoopbackEndpoint, tmp_path: Path
) -> None:
    tool = {
        "component_type": "RemoteTool", "name": "forecast",
        "url": f"{endpoint.url}/weather/{{{{city}}}}", "http_method": "GET",
        "inputs": [{"title": "city", "type": "string"}],
        "outputs": [{"title": "forecast", "type": "string"}],
    }  # fmt: skip
    edges = [("start", "fetch"), ("fetch", "end")]
    doc = {
        "agentspec_version": "25.4.1", "component_type": "Flow", "name": "weather",
        "start_node": {"$component_ref": "start"},
        "nodes": [{"$component_ref": n} for n in ("start", "fetch", "end")],
        "control_flow_connections": [
            {"component_type": "ControlFlowEdge", "name": f"{a}-{b}",
             "from_node": {"$component_ref": a}, "to_node": {"$component_ref": b}}
            for a, b in edges
        ],
        "$referenced_components": {
            "start": {"component_type": "StartNode", "name": "start",
                      "outputs": [{"title": "city", "type": "string"}]},
            "fetch": {"component_type": "ToolNode", "name": "fetch", "tool": tool},
            "end": {"component_type": "EndNode", "name": "end",
                    "outputs": [{"title": "forecast", "type": "string"}]},
        },
    }  # fmt: skip
    path = tmp_path / "weather.json"
    path.write_text(json.dumps(doc))
    code, out, err = invoke("run", str(path), "--state-dir", str(tmp_path), "--input", "city=oslo")
    assert code == 0, err
    assert output_of(out) == {"forecast": "sunny"}
    assert endpoint.requests[0]["path"] == "/weather/oslo"
