"""Review inside a turn: ``request_human_review`` pauses, and the decision continues the turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.engine import capabilities
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

DEPLOY = "import json, sys\nprint(json.dumps({'deployed': json.load(sys.stdin)['version']}))"
PROPOSE = ToolCall(
    "request_human_review",
    {"message": "Deploy v2 to prod?", "tool": "deploy", "args": {"version": "v2"}},
    id="r1",
)


def context(resume: capabilities.Resume | None = None) -> capabilities.NodeContext:
    return capabilities.NodeContext(
        run_name="run-1",
        node_key="ship",
        depth=0,
        autonomy=flow_api.Autonomy.FULL,
        resume=resume,
    )


def spec(server: ScriptedModelServer) -> agent_api.AgentSpec:
    return agent_api.AgentSpec(
        model=server.model_spec(),
        tools=[agent_api.Tool(name="deploy", python=agent_api.PythonTool(script=DEPLOY))],
        human_review=agent_api.HumanReview(
            guidelines="Ask before deploying.", approvers={"groups": ["release"]}
        ),
    )


async def propose(
    server: ScriptedModelServer,
) -> tuple[host.LiveCapabilities, capabilities.AgentTask, capabilities.Pause]:
    caps = host.LiveCapabilities(env=server.env)
    task = capabilities.AgentTask("shipper", spec(server), "Ship v2.")
    server.script(Reply.calls(PROPOSE, content="v2 passed its checks."))
    pause = await caps.run_agent(task, context())
    assert isinstance(pause, capabilities.Pause)
    return caps, task, pause


def decided(pause: capabilities.Pause, **decision: Any) -> capabilities.Resume:
    request = pause.request.model_copy(update=decision)
    return capabilities.Resume(state=json.loads(json.dumps(pause.state)), request=request)


async def test_review_request_pauses_the_turn_with_the_proposed_action(
    model_server: ScriptedModelServer,
) -> None:
    _, _, pause = await propose(model_server)

    offered = {t["function"]["name"]: t for t in model_server.requests[0].body["tools"]}
    assert "Ask before deploying." in offered["request_human_review"]["function"]["description"]
    request = pause.request
    assert request.kind == flowrun_api.RequestKind.REVIEW
    assert request.message == "Deploy v2 to prod?"
    assert request.summary == "v2 passed its checks."
    assert request.proposal == {"tool": "deploy", "args": {"version": "v2"}}
    assert request.approvers.groups == ["release"]
    assert pause.state["messages"][-1]["tool_calls"][0]["id"] == "r1"
    assert [(r["id"], r["status"]) for r in pause.detail["toolCalls"]] == [("r1", "pending")]


async def test_approved_review_runs_the_action_and_the_turn_goes_on(
    model_server: ScriptedModelServer,
) -> None:
    caps, task, pause = await propose(model_server)
    model_server.script(Reply.text("Deployed v2."))
    result = await caps.run_agent(task, context(decided(pause, decision="approve")))

    assert isinstance(result, capabilities.NodeResult)
    assert result.output["text"] == "Deployed v2."
    answer = json.loads(model_server.requests[1].messages[-1]["content"])
    assert answer["decision"] == "approve"
    assert answer["result"] == {"deployed": "v2"}
    statuses = [(r["name"], r["status"]) for r in result.detail["toolCalls"]]
    assert statuses == [("deploy", "success"), ("request_human_review", "success")]


async def test_edited_review_replaces_the_proposed_arguments(
    model_server: ScriptedModelServer,
) -> None:
    caps, task, pause = await propose(model_server)
    model_server.script(Reply.text("Deployed v1."))
    resume = decided(pause, decision="edit", edits={"version": "v1"}, decided_by="bob")
    await caps.run_agent(task, context(resume))
    answer = json.loads(model_server.requests[1].messages[-1]["content"])
    assert answer["result"] == {"deployed": "v1"}
    assert answer["decidedBy"] == "bob"


async def test_rejected_review_ends_the_turn_with_the_refusal_and_runs_nothing(
    model_server: ScriptedModelServer,
) -> None:
    caps, task, pause = await propose(model_server)
    resume = decided(pause, decision="reject", comment="freeze week", decided_by="carol")
    result = await caps.run_agent(task, context(resume))

    assert isinstance(result, capabilities.NodeResult)
    assert len(model_server.requests) == 1, "no model call after a rejection"
    assert result.output["json"]["rejected"] is True
    assert result.output["json"]["comment"] == "freeze week"
    assert result.output["json"]["proposal"] == {"tool": "deploy", "args": {"version": "v2"}}
    statuses = [(r["name"], r["status"]) for r in result.detail["toolCalls"]]
    assert statuses == [("deploy", "cancelled"), ("request_human_review", "success")]


async def test_other_calls_in_the_reply_that_asks_for_review_are_not_run(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    task = capabilities.AgentTask("shipper", spec(model_server), "Ship v2.")
    model_server.script(
        Reply.calls(PROPOSE, ToolCall("deploy", {"version": "v3"}, id="d1")),
        Reply.text("Deployed v2 only."),
    )
    pause = await caps.run_agent(task, context())
    assert isinstance(pause, capabilities.Pause)
    result = await caps.run_agent(task, context(decided(pause, decision="approve")))
    assert isinstance(result, capabilities.NodeResult)
    [_, skipped] = [m for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert json.loads(skipped["content"])["status"] == "cancelled"


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_local_run_pauses_for_review_and_agentflows_resume_continues_the_turn(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    files = tmp_path / "ship.yaml"
    files.write_text(
        textwrap.dedent(f"""
            apiVersion: agentflows.io/v1alpha1
            kind: Agent
            metadata: {{name: shipper}}
            spec:
              model: {{name: openai/scripted-model, apiBase: "{model_server.url}", retries: 0}}
              tools:
                - name: deploy
                  python: {{script: {json.dumps(DEPLOY)}}}
              humanReview: {{guidelines: Ask before deploying.}}
            ---
            apiVersion: agentflows.io/v1alpha1
            kind: Flow
            metadata: {{name: ship}}
            spec:
              nodes:
                - id: ship
                  agent: {{name: shipper, prompt: Ship v2.}}
        """)
    )
    env = {**os.environ, "AGENTFLOWS_STATE_DIR": str(tmp_path / "runs")}
    model_server.script(Reply.calls(PROPOSE))
    started = _cli(["run", str(files), "--name", "ship-1", "-q"], tmp_path, env)
    assert started.returncode == 3, started.stderr
    waiting = json.loads(started.stdout)
    assert waiting["requests"]["ship"]["kind"] == "review"
    assert waiting["requests"]["ship"]["proposal"] == {"tool": "deploy", "args": {"version": "v2"}}
    saved = waiting["nodes"]["ship"]["detail"]["state"]["messages"]
    assert saved[0] == {"role": "user", "content": "Ship v2."}

    # edits that are not the action's arguments are refused before anything runs (the
    # operator's and the console's check, now the local CLI's too)
    refused = _cli(
        ["resume", "ship-1", "--decision", "edit", "--edits", '"v1"', "-q"], tmp_path, env
    )
    assert refused.returncode == 2, refused.stderr
    assert "edits: they replace the arguments of deploy, so give a JSON object" in refused.stderr
    assert len(model_server.requests) == 1

    model_server.script(Reply.text("Deployed v1."))
    edits = json.dumps({"version": "v1"})
    resumed = _cli(
        ["resume", "ship-1", "--decision", "edit", "--edits", edits, "-q"], tmp_path, env
    )
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(resumed.stdout)
    assert final["phase"] == "Succeeded"
    assert final["nodes"]["ship"]["output"]["text"] == "Deployed v1."
    answer = json.loads(model_server.requests[1].messages[-1]["content"])
    assert answer["result"] == {"deployed": "v1"}


def test_edits_of_a_proposed_action_that_are_not_its_arguments_are_named_as_a_problem() -> None:
    asked = flowrun_api.HumanRequest(
        node="fix", kind="review", proposal={"tool": "delete", "args": {"path": "/x"}}
    )
    wrong = asked.model_copy(update={"edits": "/y"})
    assert human_requests.edits_problem(wrong) == (
        "edits: they replace the arguments of delete, so give a JSON object"
    )
    assert human_requests.edits_problem(asked.model_copy(update={"edits": {"path": "/y"}})) is None
