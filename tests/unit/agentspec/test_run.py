"""Agent Spec documents run by ``agentflows run``, against the scripted model server over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.agentspec.conftest import invoke, output_of, served


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
        Reply.calls(ToolCall("lookup_order", {"order_id": "A7"})), Reply.text("approve")
    )
    code, _out, err = invoke("resume", "r1", *run, "--data", '"it arrived broken"')
    assert code == 3, err
    assert "Run refund?" in err
    system, user = model_server.requests[0].messages[:2]
    assert system["content"].startswith("You decide refunds for order <order_id>.")
    assert user["content"] == "order_id: A7\nreason: it arrived broken"
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
    model_server.script(Reply.text("deny"))
    invoke("resume", "r2", *run, "--data", '"changed my mind"')
    code, out, err = invoke("resume", "r2", *run, "--decision", "reject")
    assert code == 1, err
    phases = {key: node["phase"] for key, node in json.loads(out)["nodes"].items()}
    assert phases["refund_confirm"] == "Failed"
    assert "refund" not in phases
    assert "rejected by" in err
