"""Agent Spec documents run by ``agentflows run``, against the scripted model server over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import a2a_server, mcp_servers
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.agentspec.conftest import DATA, invoke, output_of, served


def test_branching_node_routes_on_the_llm_text_to_the_mapped_end(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("branching.yaml", tmp_path, model_server)
    model_server.script(Reply.text("BILLING"))
    state = str(tmp_path / "runs")
    code, out, err = invoke("run", str(spec), "--state-dir", state, "--input", "ticket=refund me")
    assert code == 0, err
    assert output_of(out) == {"label": "BILLING"}
    assert "↷ engineering (transform) skipped" in err
    assert model_server.requests[0].messages[-1]["content"] == (
        "Answer BILLING or OTHER. Ticket: refund me"
    )


def test_input_message_agent_tool_and_confirmation_pause_and_resume(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("order_desk.json", tmp_path, model_server)
    state = str(tmp_path / "runs")
    run = ("--state-dir", state)
    code, _out, err = invoke("run", str(spec), *run, "--name", "r1", "--input", "order_id=A7")
    assert code == 3, err
    assert "Why do you want a refund for order A7?" in err
    model_server.script(
        Reply.calls(ToolCall("lookup_order", {"order_id": "A7"})),
        Reply.calls(ToolCall("submit_result", {"decision": "approve"})),
    )
    code, _out, err = invoke("resume", "r1", *run, "--data", '"it arrived broken"')
    assert code == 3, err
    assert "Run refund?" in err
    system, *turns = model_server.requests[0].messages[:3]
    assert system["content"].startswith("You decide refunds for order <order_id>.")
    assert [(t["role"], t["content"]) for t in turns] == [
        ("assistant", "Why do you want a refund for order A7?"),  # the conversation so far,
        ("user", "it arrived broken\n\norder_id: A7\nreason: it arrived broken"),  # + inputs
    ]
    assert "delivered" in model_server.requests[1].messages[-1]["content"]
    code, out, err = invoke("resume", "r1", *run, "--decision", "approve")
    assert code == 0, err
    assert output_of(out) == {"decision": "approve", "refund_id": "R-A7"}


def test_a_rejected_confirmation_fails_the_run_without_calling_the_tool(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("order_desk.json", tmp_path, model_server)
    run = ("--state-dir", str(tmp_path / "runs"))
    invoke("run", str(spec), *run, "--name", "r2", "--input", "order_id=B1")
    model_server.script(Reply.calls(ToolCall("submit_result", {"decision": "deny"})))
    invoke("resume", "r2", *run, "--data", '"changed my mind"')
    code, out, err = invoke("resume", "r2", *run, "--decision", "reject")
    assert code == 1, err
    phases = {key: node["phase"] for key, node in json.loads(out)["nodes"].items()}
    assert phases["refund_confirm"] == "Failed"
    assert "refund" not in phases
    assert "rejected by" in err


def test_map_parallel_map_and_sub_flow_with_a_structured_llm_node(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("digest.yaml", tmp_path, model_server)
    model_server.script(
        Reply.text("Kopf runs operators."),
        Reply.text("jq filters JSON."),
        Reply.text('{"headline": "Two tools", "count": 2}'),
    )
    args = ("--state-dir", str(tmp_path / "runs"), "--input-json", '{"topics": ["kopf", "jq"]}')
    code, out, err = invoke("run", str(spec), *args)
    assert code == 0, err
    assert output_of(out) == {"headline": "Two tools", "count": 2, "topics": ["kopf", "jq"]}
    prompts = [r.messages[-1]["content"] for r in model_server.requests]
    assert prompts[:2] == ["One line on kopf.", "One line on jq."]
    assert prompts[2] == (
        'Write a headline and count these summaries: ["Kopf runs operators.", "jq filters JSON."]'
    )


def test_api_node_calls_the_endpoint_with_inputs_bound_by_name_and_defaults(
    endpoint: LoopbackEndpoint, tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    spec = served(
        "weather_api.yaml", tmp_path, model_server, **{"http://127.0.0.1:9": endpoint.url}
    )
    args = ("--state-dir", str(tmp_path / "runs"), "--input", "city=oslo")
    code, out, err = invoke("run", str(spec), *args)
    assert code == 0, err
    assert output_of(out) == {"response": {"city": "oslo", "forecast": "sunny"}}
    assert endpoint.requests[0]["query"] == {"units": "metric"}


def test_a_top_level_agent_runs_with_its_server_tool_and_input_default(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("assistant.yaml", tmp_path, model_server)
    model_server.script(Reply.calls(ToolCall("add", {"a": 2, "b": 3})), Reply.text("2 + 3 = 5"))
    args = ("--state-dir", str(tmp_path / "runs"), "--input", "message=What is 2 + 3?")
    code, out, err = invoke("run", str(spec), *args)
    assert code == 0, err
    assert output_of(out) == "2 + 3 = 5"
    first = model_server.requests[0].messages
    assert first[0]["content"].startswith("You are <persona>.")
    assert first[1]["content"] == "persona: a careful assistant\nWhat is 2 + 3?"
    assert model_server.requests[1].messages[-1]["content"] == "5"


def test_dry_run_of_an_agent_spec_file_uses_the_mock_model(tmp_path: Path) -> None:
    code, _out, err = invoke(
        "run", str(DATA / "branching.yaml"), "--dry-run", "--state-dir", str(tmp_path),
        "--input", "ticket=hello",
    )  # fmt: skip
    assert code == 0, err
    assert "flow ticket-router (mock model)" in err


def test_a_map_node_zips_its_iterated_inputs_and_applies_each_reducer(tmp_path: Path) -> None:
    args = ("--state-dir", str(tmp_path), "--input-json", '{"names": ["a", "b"], "scores": [2, 5]}')
    code, out, err = invoke("run", str(DATA / "pairs.yaml"), *args)
    assert code == 0, err
    assert output_of(out) == {"names": ["a", "b"], "total": 7}


def test_an_agent_calls_mcp_tools_of_a_tool_and_a_toolbox_under_their_own_names(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    command, args = mcp_servers.stdio_command()
    transport = {"component_type": "StdioTransport", "name": "t", "command": command, "args": args}
    doc = {
        "agentspec_version": "26.2.0", "component_type": "Agent", "name": "calc",
        "system_prompt": "Use the tools.",
        "llm_config": {
            "component_type": "OpenAiCompatibleConfig", "name": "m",
            "model_id": "scripted-model", "url": model_server.url,
        },
        "tools": [{"component_type": "MCPTool", "name": "add", "client_transport": transport}],
        "toolboxes": [
            {"component_type": "MCPToolBox", "name": "box", "tool_filter": ["echo"],
             "client_transport": transport},
        ],
    }  # fmt: skip
    spec = tmp_path / "calc.json"
    spec.write_text(json.dumps(doc))
    model_server.script(
        Reply.calls(ToolCall("add", {"a": 1, "b": 2}), ToolCall("echo", {"text": "hi"})),
        Reply.text("3 and hi"),
    )
    run = ("--state-dir", str(tmp_path / "runs"), "--input", "message=add 1 and 2, echo hi")
    code, out, err = invoke("run", str(spec), *run)
    assert code == 0, err
    assert output_of(out) == "3 and hi"
    offered = {t["function"]["name"] for t in model_server.requests[0].body["tools"]}
    assert offered == {"add", "echo"}
    results = [m["content"] for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert results == ["3", "hi"]


def test_a_flow_node_routes_on_the_end_branch_its_sub_flow_ended_on(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("triage.yaml", tmp_path, model_server)
    state = ("--state-dir", str(tmp_path / "runs"))
    model_server.script(Reply.text("URGENT"))
    code, out, err = invoke("run", str(spec), *state, "--input", "ticket=db down")
    assert code == 0, err
    assert output_of(out) == {"note": "URGENT"}
    assert "↷ queued (transform) skipped" in err
    model_server.script(Reply.text("ROUTINE"))
    code, out, err = invoke("run", str(spec), *state, "--input", "ticket=typo")
    assert code == 0, err
    assert output_of(out) == {"note": "ROUTINE"}
    assert "↷ page (transform) skipped" in err


def test_a_client_tool_node_waits_for_the_result_given_with_respond(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("client_tool_node.yaml", tmp_path, model_server)
    run = ("--state-dir", str(tmp_path / "runs"))
    code, _out, err = invoke("run", str(spec), *run, "--name", "s1", "--input", "document=a.pdf")
    assert code == 3, err
    assert "Run sign?" in err
    code, _out, err = invoke("resume", "s1", *run, "--decision", "approve")
    assert code == 3, err
    assert "Run client tool sign_document and respond with its result." in err
    assert "respond:  agentflows resume s1 --request sign" in err
    assert "--decision approve" not in err.split("Run client tool")[1]
    code, out, err = invoke("resume", "s1", *run, "--decision", "respond", "--data", '"sig-1"')
    assert code == 0, err
    assert output_of(out) == {"signature": "sig-1"}


def test_a_parallel_flow_node_runs_both_sub_flows_and_merges_their_outputs(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("parallel.yaml", tmp_path, model_server)
    args = ("--state-dir", str(tmp_path / "runs"), "--input", "word=kopf")
    code, out, err = invoke("run", str(spec), *args)
    assert code == 0, err
    assert output_of(out) == {"length": 4, "loud": "KOPF!"}
    phases = {key: node["phase"] for key, node in json.loads(out)["nodes"].items()}
    assert phases["both_1/count"] == phases["both_2/shout"] == "Succeeded"


def test_a_failure_inside_a_catch_exception_node_takes_the_caught_branch_with_defaults(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("guarded.yaml", tmp_path, model_server)
    state = ("--state-dir", str(tmp_path / "runs"))
    code, out, err = invoke("run", str(spec), *state, "--input", "n=8")
    assert code == 0, err
    assert output_of(out) == {"half": 4}
    assert "↷ warn (transform) skipped" in err
    code, out, err = invoke("run", str(spec), *state, "--input", "n=800")
    assert code == 0, err
    assert output_of(out) == {"half": -1}
    warning = json.loads(out)["nodes"]["warn"]["output"]["json"]
    assert warning.startswith("Could not halve: ") and "too big to halve" in warning
    assert "↷ done (transform) skipped" in err


def test_an_a2a_agent_is_sent_the_inputs_and_its_answer_is_the_node_output(
    a2a_agent: a2a_server.ScriptedA2AServer, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served(
        "remote_review.yaml", tmp_path, model_server, **{"http://127.0.0.1:9/": a2a_agent.url}
    )
    a2a_agent.script(a2a_server.task("Looks good."), a2a_server.message("Rename x."))
    state = ("--state-dir", str(tmp_path / "runs"))
    code, out, err = invoke("run", str(spec), *state, "--name", "r1", "--input", "code=x = 1")
    assert code == 0, err
    assert output_of(out) == {"verdict": "Looks good."}
    sent = a2a_agent.requests[0]
    assert sent["method"] == "message/send"
    assert sent["params"]["message"]["parts"] == [{"kind": "text", "text": "code: x = 1"}]
    assert sent["params"]["message"]["messageId"] == "r1-review"
    code, out, err = invoke("run", str(spec), *state, "--input", "code=x = 2")
    assert output_of(out) == {"verdict": "Rename x."}


def test_an_a2a_error_fails_the_node_with_the_agent_s_message(
    a2a_agent: a2a_server.ScriptedA2AServer, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served(
        "remote_review.yaml", tmp_path, model_server, **{"http://127.0.0.1:9/": a2a_agent.url}
    )
    a2a_agent.script(a2a_server.error(-32000, "reviewer is busy"))
    code, _out, err = invoke("run", str(spec), "--state-dir", str(tmp_path), "--input", "code=y")
    assert code == 1
    assert "A2A error: reviewer is busy" in err


@pytest.mark.parametrize("kind", ["StdioTransport", "SSETransport"])
def test_a_tool_node_calls_one_tool_of_an_mcp_server(
    model_server: ScriptedModelServer, tmp_path: Path, kind: str
) -> None:
    command, args = mcp_servers.stdio_command()
    transport: dict[str, object] = {"component_type": kind, "name": "t"}
    server = mcp_servers.HttpMcpServer(sse=True).start() if kind == "SSETransport" else None
    transport |= {"url": server.url} if server else {"command": command, "args": args}
    tool = {
        "component_type": "MCPTool", "name": "add", "client_transport": transport,
        "inputs": [{"title": "a", "type": "integer"}, {"title": "b", "type": "integer"}],
        "outputs": [{"title": "sum", "type": "integer"}],
    }  # fmt: skip
    doc = {
        "agentspec_version": "26.1.2", "component_type": "Flow", "name": "adder",
        "inputs": [{"title": "a", "type": "integer"}, {"title": "b", "type": "integer"}],
        "start_node": {"$component_ref": "start"},
        "nodes": [{"$component_ref": "start"}, {"$component_ref": "add"}, {"$component_ref": "end"}],
        "control_flow_connections": [
            {"component_type": "ControlFlowEdge", "name": "e1",
             "from_node": {"$component_ref": "start"}, "to_node": {"$component_ref": "add"}},
            {"component_type": "ControlFlowEdge", "name": "e2",
             "from_node": {"$component_ref": "add"}, "to_node": {"$component_ref": "end"}},
        ],
        "$referenced_components": {
            "start": {"component_type": "StartNode", "name": "start",
                      "outputs": [{"title": "a", "type": "integer"}, {"title": "b", "type": "integer"}]},
            "add": {"component_type": "ToolNode", "name": "add", "tool": tool},
            "end": {"component_type": "EndNode", "name": "end",
                    "outputs": [{"title": "sum", "type": "integer"}]},
        },
    }  # fmt: skip
    spec = tmp_path / "adder.json"
    spec.write_text(json.dumps(doc))
    run = ("--state-dir", str(tmp_path / "runs"), "--input-json", '{"a": 2, "b": 40}')
    try:
        code, out, err = invoke("run", str(spec), *run)
    finally:
        if server:
            server.stop()
    assert code == 0, err
    assert output_of(out) == {"sum": 42}
    code, first, err = invoke("import", str(spec))
    assert code == 0, err
    (tmp_path / "first.yaml").write_text(first)
    code, exported, err = invoke("export", str(tmp_path / "first.yaml"))
    assert code == 0, err
    (tmp_path / "again.yaml").write_text(exported)
    assert invoke("import", str(tmp_path / "again.yaml"))[1] == first


def test_an_agent_node_s_text_reply_waits_for_the_user_and_resume_gives_the_answer(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The node's agent declares an output, so its text reply is a message to the user (an
    # input request), as WayFlow 26.3.1 runs it; it finishes when it submits the output.
    spec = served("support_chat.yaml", tmp_path, model_server)
    run = ("--state-dir", str(tmp_path / "runs"))
    invoke("run", str(spec), *run, "--name", "q1")
    model_server.script(Reply.text("The blue jacket?"))
    code, _out, err = invoke("resume", "q1", *run, "--data", '"A7"')
    assert code == 3, err
    assert "waits for request 'helper' (input): The blue jacket?" in err
    model_server.script(
        Reply.calls(ToolCall("order_status", {"order": "A7"})),
        Reply.calls(ToolCall("submit_result", {"answer": "It has shipped."})),
    )
    code, _out, err = invoke("resume", "q1", *run, "--data", '"Yes"')
    assert code == 3, err
    assert model_server.requests[1].messages[-2:] == [
        {"role": "assistant", "content": "The blue jacket?"},
        {"role": "user", "content": "Yes"},
    ]
    code, out, err = invoke("resume", "q1", *run, "--data", '"shipped"')
    assert code == 0, err
    assert output_of(out) == {"answer": "It has shipped."}


def test_agent_spec_files_in_a_directory_are_found_and_run(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    (specs / "nested").mkdir(parents=True)
    served("branching.yaml", specs / "nested", model_server)
    (specs / "kustomization.yaml").write_text("resources: []\n")
    model_server.script(Reply.text("OTHER"))
    state = str(tmp_path / "runs")
    code, out, err = invoke("run", str(specs), "--state-dir", state, "--input", "ticket=hi")
    assert code == 0, err
    assert output_of(out) == {"label": "OTHER"}


def test_a_directory_mixing_agent_spec_json_and_resources_validates_each(
    tmp_path: Path,
) -> None:
    (tmp_path / "mcp_tools.json").write_text((DATA / "mcp_tools.json").read_text())
    code, out, err = invoke("import", str(DATA / "weather_api.yaml"))
    assert code == 0, err
    (tmp_path / "weather.yaml").write_text(out)
    mcp_resources = invoke("import", str(DATA / "mcp_tools.json"))[1].count("\nkind: ")
    weather_resources = out.count("\nkind: ")
    code, out, err = invoke("validate", str(tmp_path))
    assert code == 0, out + err
    assert f"{mcp_resources + weather_resources} resource(s) valid" in out + err
