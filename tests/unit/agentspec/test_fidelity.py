"""Behaviours where agentflows follows the specification as its reference runtime does (issue 22).

Each runs a document with ``agentflows run`` (or ``validate``) against real HTTP on loopback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import mcp_servers
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.agentspec.conftest import DATA, DOCUMENT_MODEL_URL, invoke, output_of


def one_node_flow(node: dict[str, Any], inputs: list[str], output: str) -> dict[str, Any]:
    """start -> ``node`` (named ``step``) -> end, inputs and the end's output bound by name."""
    edges = [("start", "step"), ("step", "end")]
    return {
        "agentspec_version": "26.1.0", "component_type": "Flow", "name": "one-step",
        "start_node": {"$component_ref": "start"},
        "nodes": [{"$component_ref": n} for n in ("start", "step", "end")],
        "control_flow_connections": [
            {"component_type": "ControlFlowEdge", "name": f"{a}-{b}",
             "from_node": {"$component_ref": a}, "to_node": {"$component_ref": b}}
            for a, b in edges
        ],
        "$referenced_components": {
            "start": {"component_type": "StartNode", "name": "start",
                      "outputs": [{"title": t, "type": "string"} for t in inputs]},
            "step": {**node, "name": "step"},
            "end": {"component_type": "EndNode", "name": "end", "outputs": [{"title": output}]},
        },
    }  # fmt: skip


def run(tmp_path: Path, doc: dict[str, Any], *inputs: str) -> tuple[int, str, str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    args = [a for i in inputs for a in ("--input", i)]
    return invoke("run", str(path), "--state-dir", str(tmp_path / "runs"), *args)


def test_a_server_tool_with_one_output_returns_that_key_of_its_json_object(
    tmp_path: Path,
) -> None:
    script = 'import json\nprint(json.dumps({"temperature": 22, "weather": "Sunny"}))\n'
    tool = {
        "component_type": "ServerTool", "name": "get_weather",
        "inputs": [{"title": "city", "type": "string"}],
        "outputs": [{"title": "weather", "type": "string"}],
        "metadata": {"agentflows": {"python": script}},
    }  # fmt: skip
    doc = one_node_flow({"component_type": "ToolNode", "tool": tool}, ["city"], "weather")
    code, out, err = run(tmp_path, doc, "city=oslo")
    assert code == 0, err
    assert output_of(out) == {"weather": "Sunny"}


def test_a_tool_with_one_output_whose_object_lacks_its_key_returns_the_whole_object(
    tmp_path: Path,
) -> None:
    script = 'import json\nprint(json.dumps({"temperature": 22}))\n'
    tool = {
        "component_type": "ServerTool", "name": "get_weather",
        "outputs": [{"title": "weather"}],
        "metadata": {"agentflows": {"python": script}},
    }  # fmt: skip
    doc = one_node_flow({"component_type": "ToolNode", "tool": tool}, [], "weather")
    code, out, err = run(tmp_path, doc)
    assert code == 0, err
    assert output_of(out) == {"weather": {"temperature": 22}}


def test_an_api_node_with_one_output_returns_that_key_of_the_json_response(
    endpoint: LoopbackEndpoint, tmp_path: Path
) -> None:
    node = {
        "component_type": "ApiNode", "url": f"{endpoint.url}/weather/{{{{city}}}}",
        "http_method": "GET", "url_allow_list": [endpoint.url],
        "outputs": [{"title": "forecast", "type": "string"}],
    }  # fmt: skip
    code, out, err = run(tmp_path, one_node_flow(node, ["city"], "forecast"), "city=oslo")
    assert code == 0, err
    assert output_of(out) == {"forecast": "sunny"}


def test_an_api_node_sends_a_string_body_as_it_is_with_its_content_type(
    endpoint: LoopbackEndpoint, tmp_path: Path
) -> None:
    node = {
        "component_type": "ApiNode", "url": f"{endpoint.url}/form", "http_method": "POST",
        "url_allow_list": [endpoint.url], "data": "city={{city}}&units=metric",
        "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        "outputs": [{"title": "units", "type": "string"}],
    }  # fmt: skip
    code, out, err = run(tmp_path, one_node_flow(node, ["city"], "units"), "city=oslo")
    assert code == 0, err
    assert output_of(out) == {"units": "metric"}
    assert endpoint.requests[-1]["body"] == "city=oslo&units=metric"


def test_an_api_node_sends_an_object_body_form_encoded_when_its_content_type_says_so(
    endpoint: LoopbackEndpoint, tmp_path: Path
) -> None:
    node = {
        "component_type": "ApiNode", "url": f"{endpoint.url}/form", "http_method": "POST",
        "url_allow_list": [endpoint.url], "data": {"city": "{{city}}", "days": 3},
        "headers": {"content-type": "application/x-www-form-urlencoded; charset=utf-8"},
        "outputs": [{"title": "days", "type": "string"}],
    }  # fmt: skip
    code, out, err = run(tmp_path, one_node_flow(node, ["city"], "days"), "city=são paulo")
    assert code == 0, err
    assert output_of(out) == {"days": "3"}
    assert endpoint.requests[-1]["body"] == "city=s%C3%A3o+paulo&days=3"


def test_a_remote_tool_sends_a_plain_text_body_as_it_is(
    endpoint: LoopbackEndpoint, tmp_path: Path
) -> None:
    tool = {
        "component_type": "RemoteTool", "name": "note", "url": f"{endpoint.url}/raw",
        "http_method": "POST", "url_allow_list": [endpoint.url],
        "data": "Weather for {{city}}", "headers": {"Content-Type": "text/plain"},
        "inputs": [{"title": "city", "type": "string"}], "outputs": [{"title": "text"}],
    }  # fmt: skip
    doc = one_node_flow({"component_type": "ToolNode", "tool": tool}, ["city"], "text")
    code, out, err = run(tmp_path, doc, "city=oslo")
    assert code == 0, err
    assert output_of(out) == {"text": "Weather for oslo"}


def test_a_branching_node_reads_its_input_by_the_name_the_document_gives_it(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    text = (DATA / "branching.yaml").read_text()
    text = text.replace("destination_input: branching_mapping_key", "destination_input: label")
    text = text.replace(
        "mapping: {billing: BILLING, BILLING: BILLING}",
        "mapping: {billing: BILLING, BILLING: BILLING}\n    inputs: [{title: label, type: string}]",
    )
    spec = tmp_path / "branching.yaml"
    spec.write_text(text.replace(DOCUMENT_MODEL_URL, model_server.url))
    model_server.script(Reply.text("BILLING"))
    state = str(tmp_path / "runs")
    code, out, err = invoke("run", str(spec), "--state-dir", state, "--input", "ticket=refund me")
    assert code == 0, err
    assert "↷ engineering (transform) skipped" in err
    assert output_of(out) == {"label": "BILLING"}


def test_parallel_sub_flows_typing_an_input_of_one_name_differently_are_refused_at_load(
    tmp_path: Path,
) -> None:
    text = (
        (DATA / "parallel.yaml")
        .read_text()
        .replace(
            "s_start: {component_type: StartNode, name: start, outputs: [{title: word, type: string}]}",
            "s_start: {component_type: StartNode, name: start, outputs: [{title: word, type: integer}]}",
        )
    )
    path = tmp_path / "parallel.yaml"
    path.write_text(text)
    for command in ("validate", "run"):
        code, out, err = invoke(command, str(path), *(["--input", "word=hi"] * (command == "run")))
        assert code == 2, (out, err)
        assert (
            "nodes[1].subflows[1]: input 'word' of ParallelFlowNode 'both' is "
            '{"type": "integer"} here but {"type": "string"} in subflows[0]; sub-flows run in '
            "parallel share their inputs by name: give the inputs one type or distinct names"
        ) in out + err


def test_an_llm_node_with_one_integer_output_accepts_a_bare_number_reply(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    node = {
        "component_type": "LlmNode", "prompt_template": "How many letters in {{word}}?",
        "llm_config": {"component_type": "OpenAiCompatibleConfig", "name": "m",
                       "model_id": "scripted-model", "url": model_server.url},
        "outputs": [{"title": "count", "type": "integer"}],
    }  # fmt: skip
    model_server.script(Reply.text("5"))
    code, out, err = run(tmp_path, one_node_flow(node, ["word"], "count"), "word=hello")
    assert code == 0, err
    assert output_of(out) == {"count": 5}


def test_an_llm_node_with_one_integer_output_still_accepts_a_json_object_reply(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    node = {
        "component_type": "LlmNode", "prompt_template": "How many letters in {{word}}?",
        "llm_config": {"component_type": "OpenAiCompatibleConfig", "name": "m",
                       "model_id": "scripted-model", "url": model_server.url},
        "outputs": [{"title": "count", "type": "integer"}],
    }  # fmt: skip
    model_server.script(Reply.text('{"count": 5}'))
    code, out, err = run(tmp_path, one_node_flow(node, ["word"], "count"), "word=hello")
    assert code == 0, err
    assert output_of(out) == {"count": 5}


def run_pairs(tmp_path: Path, text: str) -> object:
    """The output of pairs.yaml changed to ``text``, run with names [a, b] and scores 3."""
    path = tmp_path / "pairs.yaml"
    path.write_text(text)
    args = ("--state-dir", str(tmp_path), "--input-json", '{"names": ["a", "b"], "scores": 3}')
    code, out, err = invoke("run", str(path), *args)
    assert code == 0, err
    return output_of(out)


@pytest.mark.parametrize("kind", ["MapNode", "ParallelMapNode"])
def test_a_map_node_gives_a_single_iterated_value_to_every_item(kind: str, tmp_path: Path) -> None:
    text = (
        (DATA / "pairs.yaml")
        .read_text()
        .replace(
            "{title: scores, type: array, items: {type: number}}", "{title: scores, type: number}"
        )
        .replace("component_type: MapNode", f"component_type: {kind}")
    )
    assert run_pairs(tmp_path, text) == {"names": ["a", "b"], "total": 6}


@pytest.mark.parametrize("kind", ["MapNode", "ParallelMapNode"])
def test_a_map_node_input_named_as_the_sub_flow_s_is_given_to_every_item(
    kind: str, tmp_path: Path
) -> None:
    # pyagentspec infers a MapNode's inputs as iterated_<name>; a document that declares one
    # without the prefix (as WayFlow's converter maps it, name to name) means one value for all.
    text = (
        (DATA / "pairs.yaml")
        .read_text()
        .replace("destination_input: iterated_score", "destination_input: score")
        .replace(
            "{title: scores, type: array, items: {type: number}}", "{title: scores, type: number}"
        )
        .replace(
            "    reducers: {name: append, score: sum}\n",
            "    reducers: {name: append, score: sum}\n"
            "    inputs: [{title: iterated_name}, {title: score, type: number}]\n",
        )
        .replace("component_type: MapNode", f"component_type: {kind}")
    )
    assert run_pairs(tmp_path, text) == {"names": ["a", "b"], "total": 6}


def test_a_map_node_input_naming_no_sub_flow_input_is_refused(tmp_path: Path) -> None:
    text = (
        (DATA / "pairs.yaml")
        .read_text()
        .replace("destination_input: iterated_score", "destination_input: weight")
        .replace(
            "    reducers: {name: append, score: sum}\n",
            "    reducers: {name: append, score: sum}\n"
            "    inputs: [{title: iterated_name}, {title: weight}]\n",
        )
    )
    path = tmp_path / "pairs.yaml"
    path.write_text(text)
    code, out, err = invoke("validate", str(path))
    assert code == 2, (out, err)
    assert (
        "nodes[1].inputs[1].title: MapNode 'each' has input 'weight', but its sub-flow has no "
        "input 'weight'; name an input iterated_<sub-flow input> (iterated_name, iterated_score)"
    ) in out + err, out + err


def test_a_map_node_whose_sub_flow_takes_no_input_runs_it_once(tmp_path: Path) -> None:
    subflow = {
        "component_type": "Flow", "name": "constant",
        "start_node": {"$component_ref": "c_start"},
        "nodes": [{"$component_ref": "c_start"}, {"$component_ref": "c_end"}],
        "control_flow_connections": [
            {"component_type": "ControlFlowEdge", "name": "c1",
             "from_node": {"$component_ref": "c_start"}, "to_node": {"$component_ref": "c_end"}},
        ],
        "$referenced_components": {
            "c_start": {"component_type": "StartNode", "name": "start"},
            "c_end": {"component_type": "EndNode", "name": "end",
                      "outputs": [{"title": "n", "type": "number", "default": 1}]},
        },
    }  # fmt: skip
    node = {"component_type": "MapNode", "subflow": subflow, "reducers": {"n": "sum"}}
    code, out, err = run(tmp_path, one_node_flow(node, [], "collected_n"))
    assert code == 0, err
    assert output_of(out) == {"collected_n": 1}


def mcp_agent(model_url: str, tools: list[Any], toolboxes: list[Any]) -> dict[str, Any]:
    """A root Agent with these MCP tools and toolboxes, on the scripted model."""
    return {
        "agentspec_version": "26.2.0", "component_type": "Agent", "name": "calc",
        "system_prompt": "Use the tools.",
        "llm_config": {"component_type": "OpenAiCompatibleConfig", "name": "m",
                       "model_id": "scripted-model", "url": model_url},
        "tools": tools, "toolboxes": toolboxes,
    }  # fmt: skip


def stdio_transport(name: str) -> dict[str, Any]:
    command, args = mcp_servers.stdio_command()
    return {"component_type": "StdioTransport", "name": name, "command": command, "args": args}


def test_an_input_less_mcp_tool_called_with_null_arguments_is_sent_an_empty_object(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    tool = {"component_type": "MCPTool", "name": "whoami", "client_transport": stdio_transport("t")}
    model_server.script(Reply.calls(ToolCall("whoami", raw_arguments="null")), Reply.text("done"))
    code, _, err = run(tmp_path, mcp_agent(model_server.url, [tool], []), "message=who?")
    assert code == 0, err
    results = [m["content"] for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert results == ["stdio"]


def test_two_mcp_tools_of_one_name_on_different_servers_are_refused_at_load(
    tmp_path: Path,
) -> None:
    tools = [
        {"component_type": "MCPTool", "name": "add", "client_transport": stdio_transport(t)}
        for t in ("first", "second")
    ]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(mcp_agent("http://127.0.0.1:9/v1", tools, [])))
    code, out, err = invoke("validate", str(path))
    assert code != 0
    assert "tools[1]: 'add' is also the name of tools[0]" in out + err, out + err


def test_an_mcp_toolbox_offering_the_name_of_another_mcp_tool_fails_naming_both_servers(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    tool = {"component_type": "MCPTool", "name": "add", "client_transport": stdio_transport("t")}
    server = mcp_servers.HttpMcpServer().start()
    try:
        box = {"component_type": "MCPToolBox", "name": "box",
               "client_transport": {"component_type": "StreamableHTTPTransport", "name": "h",
                                    "url": server.url}}  # fmt: skip
        code, out, err = run(tmp_path, mcp_agent(model_server.url, [tool], [box]), "message=hi")
    finally:
        server.stop()
    assert code != 0
    assert "two tools are named 'add'" in out + err, out + err
    assert server.url in out + err and "command" in out + err, out + err
