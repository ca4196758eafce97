"""A Swarm: agents that message each other and hand the user's conversation over, over HTTP."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflows.agentspec import conversation
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.agentspec.conftest import DATA, invoke, output_of, served

Kind = conversation.StatusKind


def _start(tmp_path: Path, server: ScriptedModelServer, text: str) -> conversation.Conversation:
    conv = conversation.Conversation.from_file(
        served("swarm.yaml", tmp_path, server), {}, server.env
    )
    conv.append_user_message(text)  # the user speaks first
    return conv


def _system(request: Any) -> str:
    return str(request.messages[0]["content"])


def _tools(request: Any) -> dict[str, list[str]]:
    """Tool name -> the agents its ``agent`` argument may name, as the model was offered."""
    offered = {}
    for tool in request.body.get("tools") or []:
        function = tool["function"]
        agent = function["parameters"].get("properties", {}).get("agent", {})
        offered[function["name"]] = agent.get("enum", [])
    return offered


def test_a_handoff_makes_the_recipient_answer_this_and_the_next_user_turn(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _start(tmp_path, model_server, "Why was invoice 42 charged twice?")
    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.text("Invoice 42 was charged once; the second line is a hold."),
        Reply.text("The hold is released within 3 days."),
    )
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (
        Kind.USER_INPUT,
        "Invoice 42 was charged once; the second line is a hold.",
    )
    assert conv.active_agent == "billing"
    conv.append_user_message("When does the hold go?")
    status = conv.execute_sync()
    assert status.outputs == "The hold is released within 3 days."
    front, billing, next_turn = model_server.requests
    assert [_system(r) for r in (front, billing, next_turn)] == [
        "You are the front desk.",
        "You handle billing.",
        "You handle billing.",
    ]
    assert billing.messages[-1] == {"role": "user", "content": "Why was invoice 42 charged twice?"}
    assert [(m["role"], m["content"]) for m in next_turn.messages[1:]] == [
        ("user", "Why was invoice 42 charged twice?"),
        ("assistant", "Invoice 42 was charged once; the second line is a hold."),
        ("user", "When does the hold go?"),
    ]


def test_a_message_to_a_recipient_returns_its_answer_to_the_caller_who_keeps_the_user(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _start(tmp_path, model_server, "Is invoice 42 paid?")
    model_server.script(
        Reply.calls(ToolCall("call_sub_agent", {"agent": "billing", "prompt": "Invoice 42 paid?"})),
        Reply.text("Yes, on May 2."),
        Reply.text("Billing says invoice 42 was paid on May 2."),
    )
    status = conv.execute_sync()
    assert status.outputs == "Billing says invoice 42 was paid on May 2."
    assert conv.active_agent == "front"
    asked, answered = model_server.requests[1], model_server.requests[2]
    assert (_system(asked), asked.messages[-1]["content"]) == (
        "You handle billing.",
        "Invoice 42 paid?",
    )
    assert answered.messages[-1] == {
        "role": "tool",
        "tool_call_id": answered.messages[-1]["tool_call_id"],
        "name": "call_sub_agent",
        "content": "Yes, on May 2.",
    }


def test_only_the_relationships_listed_are_offered_as_tools(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _start(tmp_path, model_server, "Refund me.")
    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.text("Billing here."),
    )
    conv.execute_sync()
    front, billing = model_server.requests
    assert _tools(front) == {"call_sub_agent": ["billing"], "handoff_conversation": ["billing"]}
    assert _tools(billing) == {
        "call_sub_agent": ["front", "refunds"],
        "handoff_conversation": ["front", "refunds"],
    }


def test_a_handoff_to_an_agent_not_related_is_answered_with_an_error_and_the_caller_goes_on(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _start(tmp_path, model_server, "Refund me.")
    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "refunds"})),
        Reply.text("I cannot refund; billing can help."),
    )
    status = conv.execute_sync()
    assert (status.outputs, conv.active_agent) == ("I cannot refund; billing can help.", "front")
    error = json.loads(model_server.requests[1].messages[-1]["content"])["error"]
    assert error == (
        "arguments of handoff_conversation do not match its schema at agent: "
        "'refunds' is not one of ['billing']"
    )


@pytest.mark.parametrize(
    ("handoff", "offered"),
    [("never", {"call_sub_agent"}), ("always", {"handoff_conversation"})],
)
def test_the_handoff_setting_decides_which_tools_the_agents_get(
    model_server: ScriptedModelServer, tmp_path: Path, handoff: str, offered: set[str]
) -> None:
    doc = yaml.safe_load(served("swarm.yaml", tmp_path, model_server).read_text())
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump({**doc, "handoff": handoff}))
    conv = conversation.Conversation.from_file(path, {}, model_server.env)
    conv.append_user_message("Hello")
    model_server.script(Reply.text("Hi."))
    conv.execute_sync()
    assert set(_tools(model_server.requests[0])) == offered


def _refused(doc: dict[str, Any], tmp_path: Path) -> str:
    path = tmp_path / "swarm.json"
    path.write_text(json.dumps(doc))
    code, out, err = invoke("validate", str(path))
    assert code == 2, out + err
    return out


def test_an_unknown_agent_in_relationships_is_refused_at_its_path(tmp_path: Path) -> None:
    doc = yaml.safe_load((DATA / "swarm.yaml").read_text())
    doc["relationships"][2][1] = {"$component_ref": "payroll"}
    assert "relationships[2][1].$component_ref: unresolved reference 'payroll'" in _refused(
        doc, tmp_path
    )


def test_a_swarm_whose_pairs_cannot_run_is_refused_with_each_pair_s_path(tmp_path: Path) -> None:
    doc = yaml.safe_load((DATA / "swarm.yaml").read_text())
    refs = doc["$referenced_components"]
    refs["imposter"] = {**copy.deepcopy(refs["refunds"]), "id": "imposter", "name": "billing"}
    doc["relationships"] = [
        [{"$component_ref": "billing"}, {"$component_ref": "billing"}],
        [{"$component_ref": "billing"}, {"$component_ref": "imposter"}],
        [{"$component_ref": "billing"}, {"$component_ref": "imposter"}],
    ]
    out = _refused(doc, tmp_path)
    assert "relationships[0]: 'billing' talks to itself" in out
    assert "relationships[1][1]: two different agents are named 'billing'" in out
    assert "relationships[2]: 'billing' -> 'billing' is listed twice" in out
    assert "first_agent: 'front' is in no relationship" in out


def test_agentflows_run_gives_a_swarm_s_first_agent_the_message_and_its_recipients(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    path = served("swarm.yaml", tmp_path, model_server)
    model_server.script(
        Reply.calls(ToolCall("call_sub_agent", {"agent": "billing", "prompt": "Invoice 42?"})),
        Reply.text("Paid."),
        Reply.text("Invoice 42 is paid."),
    )
    code, out, err = invoke(
        "run", str(path), "--input", "message=Is invoice 42 paid?", "--state-dir", str(tmp_path)
    )
    assert code == 0, err
    assert output_of(out) == "Invoice 42 is paid."


def _billing_with_ledger(tmp_path: Path, server: ScriptedModelServer) -> Path:
    """The swarm whose billing agent looks invoices up with a client tool ``ledger``."""
    doc = yaml.safe_load(served("swarm.yaml", tmp_path, server).read_text())
    doc["$referenced_components"]["billing"]["tools"] = [
        {"component_type": "ClientTool", "name": "ledger",
         "inputs": [{"title": "invoice", "type": "integer"}]}
    ]  # fmt: skip
    path = tmp_path / "ledger.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_agentflows_run_hands_the_conversation_over_and_resumes_with_the_recipient(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    path = _billing_with_ledger(tmp_path, model_server)
    run = ("--state-dir", str(tmp_path / "runs"))
    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.calls(ToolCall("ledger", {"invoice": 42})),
    )
    code, _out, err = invoke("run", str(path), *run, "--name", "h1", "--input", "message=Paid?")
    assert code == 3, err
    assert "Agent billing wants to call ledger." in err
    model_server.script(Reply.text("Invoice 42 was paid on May 2."))
    code, out, err = invoke("resume", "h1", *run, "--data", '"paid 2 May"')
    assert code == 0, err
    assert output_of(out) == "Invoice 42 was paid on May 2."
    resumed = model_server.requests[2]
    assert (_system(resumed), resumed.messages[-1]["content"]) == (
        "You handle billing.",
        "paid 2 May",
    )
    state = json.loads(next((tmp_path / "runs").rglob("*.json")).read_text())
    assert state["nodes"]["agent"]["detail"]["agent"] == "billing"


def test_a_swarm_in_an_agent_node_is_refused_at_its_path(tmp_path: Path) -> None:
    swarm = yaml.safe_load((DATA / "swarm.yaml").read_text())
    refs = swarm.pop("$referenced_components")
    del swarm["agentspec_version"]

    def edge(name: str, source: str, target: str) -> dict[str, Any]:
        return {
            "component_type": "ControlFlowEdge", "name": name,
            "from_node": {"$component_ref": source}, "to_node": {"$component_ref": target},
        }  # fmt: skip

    doc = {
        "agentspec_version": "26.2.0", "component_type": "Flow", "name": "desk",
        "start_node": {"$component_ref": "start"},
        "nodes": [{"$component_ref": n} for n in ("start", "team", "end")],
        "control_flow_connections": [edge("a", "start", "team"), edge("b", "team", "end")],
        "$referenced_components": {
            **refs,
            "start": {"component_type": "StartNode", "id": "start", "name": "start"},
            "team": {"component_type": "AgentNode", "id": "team", "name": "team", "agent": swarm},
            "end": {"component_type": "EndNode", "id": "end", "name": "end"},
        },
    }  # fmt: skip
    assert (
        "$referenced_components.team.agent: a Swarm runs only at the root of a document"
        in _refused(doc, tmp_path)
    )
