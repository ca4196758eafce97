"""Supervised autonomy: tool calls that change things wait for a human, then go on."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.engine import capabilities, graph, run, store
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

ECHO = "import json, sys\nprint(json.dumps({'got': json.load(sys.stdin)}))"


def supervised(resume: capabilities.Resume | None = None) -> capabilities.NodeContext:
    return capabilities.NodeContext(
        run_name="run-1",
        node_key="fix",
        depth=0,
        autonomy=flow_api.Autonomy.SUPERVISED,
        resume=resume,
    )


def tools() -> list[agent_api.Tool]:
    return [
        agent_api.Tool(name="look", read_only=True, python=agent_api.PythonTool(script=ECHO)),
        agent_api.Tool(name="delete", python=agent_api.PythonTool(script=ECHO)),
    ]


def decided(pause: capabilities.Pause, **decision: Any) -> capabilities.Resume:
    request = pause.request.model_copy(update=decision)
    # The engine stores the state as JSON; make sure it survives that.
    return capabilities.Resume(state=json.loads(json.dumps(pause.state)), request=request)


async def pause_on_delete(
    server: ScriptedModelServer, caps: host.LiveCapabilities
) -> tuple[capabilities.AgentTask, capabilities.Pause]:
    server.script(
        Reply.calls(
            ToolCall("look", {"path": "/tmp"}, id="l1"),
            ToolCall("delete", {"path": "/tmp/x"}, id="d1"),
            content="I will clean up.",
        )
    )
    spec = agent_api.AgentSpec(
        model=server.model_spec(),
        tools=tools(),
        human_review=agent_api.HumanReview(approvers={"groups": ["ops"]}),
    )
    task = capabilities.AgentTask("janitor", spec, "Clean /tmp")
    pause = await caps.run_agent(task, supervised())
    assert isinstance(pause, capabilities.Pause)
    return task, pause


async def test_call_to_a_tool_that_is_not_read_only_pauses_the_turn_with_a_request(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    _, pause = await pause_on_delete(model_server, caps)
    request = pause.request
    assert request.kind == flowrun_api.RequestKind.TOOL
    assert request.node == "fix"
    assert request.message == "Agent janitor wants to call delete."
    assert request.summary == "I will clean up."
    assert request.proposal == {
        "calls": [{"id": "d1", "tool": "delete", "args": {"path": "/tmp/x"}}]
    }
    assert request.approvers.groups == ["ops"]
    assert pause.usage.llm_calls == 1
    assert len(model_server.requests) == 1, "nothing ran while waiting"


async def test_approved_calls_run_and_the_turn_continues_from_the_saved_conversation(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    task, pause = await pause_on_delete(model_server, caps)
    model_server.script(Reply.text("Cleaned."))
    result = await caps.run_agent(task, supervised(decided(pause, decision="approve")))

    assert isinstance(result, capabilities.NodeResult)
    assert result.output["text"] == "Cleaned."
    sent = model_server.requests[1].messages
    assert sent[0] == {"role": "user", "content": "Clean /tmp"}
    tool_results = [json.loads(m["content"]) for m in sent if m["role"] == "tool"]
    assert tool_results == [{"got": {"path": "/tmp"}}, {"got": {"path": "/tmp/x"}}]
    assert [r["id"] for r in result.detail["toolCalls"]] == ["l1", "d1"]
    assert result.detail["llmCalls"] == 2
    assert result.usage.llm_calls == 1, "usage counts only what ran after the pause"


async def test_rejected_call_is_reported_to_the_model_with_the_comment(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    task, pause = await pause_on_delete(model_server, caps)
    model_server.script(Reply.text("Understood, nothing deleted."))
    resume = decided(pause, decision="reject", decided_by="alice", comment="not on Fridays")
    result = await caps.run_agent(task, supervised(resume))

    assert isinstance(result, capabilities.NodeResult)
    tool_messages = [m for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert json.loads(tool_messages[0]["content"]) == {"got": {"path": "/tmp"}}
    rejection = json.loads(tool_messages[1]["content"])
    assert rejection["error"] == "a human (alice) rejected this call: not on Fridays"


async def test_edited_arguments_replace_the_models(model_server: ScriptedModelServer) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    task, pause = await pause_on_delete(model_server, caps)
    model_server.script(Reply.text("Done."))
    resume = decided(pause, decision="edit", edits={"path": "/tmp/x.bak"})
    await caps.run_agent(task, supervised(resume))
    last = model_server.requests[1].messages[-1]
    assert json.loads(last["content"]) == {"got": {"path": "/tmp/x.bak"}}


async def test_read_only_calls_do_not_pause(model_server: ScriptedModelServer) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    model_server.script(Reply.calls(ToolCall("look", {})), Reply.text("Looked."))
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=tools())
    result = await caps.run_agent(capabilities.AgentTask("a", spec, "look"), supervised())
    assert isinstance(result, capabilities.NodeResult)


async def test_tool_node_waits_for_approval_and_fails_when_rejected() -> None:
    caps = host.LiveCapabilities(env={"PATH": "/usr/bin:/bin"})
    task = capabilities.ToolTask(tools()[1], "delete", {"path": "/x"})
    pause = await caps.call_tool(task, supervised())
    assert isinstance(pause, capabilities.Pause)
    assert pause.request.proposal == {
        "calls": [{"id": "delete", "tool": "delete", "args": {"path": "/x"}}]
    }

    approved = await caps.call_tool(task, supervised(decided(pause, decision="approve")))
    assert isinstance(approved, capabilities.NodeResult)
    assert approved.output["json"] == {"got": {"path": "/x"}}

    with pytest.raises(capabilities.CapabilityError, match="rejected this call: no"):
        await caps.call_tool(task, supervised(decided(pause, decision="reject", comment="no")))


async def test_a_client_tool_call_waits_whatever_the_autonomy_and_respond_gives_its_result(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    client = agent_api.Tool(name="locate", client=agent_api.ClientTool())
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[client])
    task = capabilities.AgentTask("guide", spec, "Where am I?")
    model_server.script(Reply.calls(ToolCall("locate", {}, id="c1")), Reply.text("In Oslo."))
    full = dataclasses.replace(supervised(), autonomy=flow_api.Autonomy.FULL)
    pause = await caps.run_agent(task, full)
    assert isinstance(pause, capabilities.Pause)
    assert pause.request.proposal == {
        "calls": [{"id": "c1", "tool": "locate", "args": {}, "client": True}]
    }
    resume = decided(pause, decision="respond", data={"city": "Oslo"})
    result = await caps.run_agent(task, dataclasses.replace(full, resume=resume))
    assert isinstance(result, capabilities.NodeResult) and result.output["text"] == "In Oslo."
    assert model_server.requests[1].messages[-1]["content"] == '{"city": "Oslo"}'


async def test_a_client_tool_requiring_confirmation_is_confirmed_before_it_is_requested(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    client = agent_api.Tool(name="pay", client=agent_api.ClientTool(confirm=True))
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[client])
    task = capabilities.AgentTask("cashier", spec, "Pay 5")
    model_server.script(Reply.calls(ToolCall("pay", {"eur": 5}, id="p1")), Reply.text("Paid."))
    full = dataclasses.replace(supervised(), autonomy=flow_api.Autonomy.FULL)
    confirmation = await caps.run_agent(task, full)
    assert isinstance(confirmation, capabilities.Pause)
    assert confirmation.request.proposal == {
        "calls": [{"id": "p1", "tool": "pay", "args": {"eur": 5}}]
    }
    approved = decided(confirmation, decision="edit", edits={"eur": 4})
    request = await caps.run_agent(task, dataclasses.replace(full, resume=approved))
    assert isinstance(request, capabilities.Pause)
    assert request.request.proposal == {
        "calls": [{"id": "p1", "tool": "pay", "args": {"eur": 4}, "client": True}]
    }
    assert len(model_server.requests) == 1
    answered = decided(request, decision="respond", data="receipt 7")
    result = await caps.run_agent(task, dataclasses.replace(full, resume=answered))
    assert isinstance(result, capabilities.NodeResult) and result.output["text"] == "Paid."
    assert model_server.requests[1].messages[-1]["content"] == "receipt 7"


async def test_a_rejected_confirmation_never_requests_the_client_tool_and_tells_the_agent(
    model_server: ScriptedModelServer,
) -> None:
    caps = host.LiveCapabilities(env=model_server.env)
    client = agent_api.Tool(name="pay", client=agent_api.ClientTool(confirm=True))
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=[client])
    task = capabilities.AgentTask("cashier", spec, "Pay 5")
    model_server.script(Reply.calls(ToolCall("pay", {"eur": 5}, id="p1")), Reply.text("Not paid."))
    full = dataclasses.replace(supervised(), autonomy=flow_api.Autonomy.FULL)
    confirmation = await caps.run_agent(task, full)
    assert isinstance(confirmation, capabilities.Pause)
    rejected = decided(confirmation, decision="reject", comment="too much")
    result = await caps.run_agent(task, dataclasses.replace(full, resume=rejected))
    assert isinstance(result, capabilities.NodeResult) and result.output["text"] == "Not paid."
    told = model_server.requests[1].messages[-1]["content"]
    assert "rejected this call: too much" in told


async def test_a_waiting_agent_is_not_run_again_while_its_request_is_undecided(
    model_server: ScriptedModelServer,
) -> None:
    spec = agent_api.AgentSpec(model=model_server.model_spec(), tools=tools())
    flow = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "fix", "agent": {"name": "janitor", "prompt": "Clean"}}],
         "autonomy": "supervised"}
    )  # fmt: skip
    resolver = graph.StaticResolver({"janitor": spec}, {"f": flow})
    st = store.MemoryStore()
    model_server.script(Reply.calls(ToolCall("delete", {"path": "/x"}, id="d1")))
    for _ in range(2):
        outcome = await run.run_flow(
            graph.compile_flow(flow, resolver),
            run_name="r",
            input_value=None,
            store_=st,
            caps=host.LiveCapabilities(resolver, model_server.env),
            resolver=resolver,
        )
        assert outcome.phase == flowrun_api.RunPhase.WAITING
    assert len(model_server.requests) == 1, "the turn was not run again"
    assert list(st.checkpoint.requests) == ["fix"]


def test_edits_that_would_be_ignored_or_are_not_arguments_are_named_as_problems() -> None:
    calls = [{"id": "d1", "tool": "delete", "args": {}}, {"id": "d2", "tool": "delete", "args": {}}]
    two = flowrun_api.HumanRequest(node="fix", kind="tool", proposal={"calls": calls})
    ignored = two.model_copy(update={"edits": {"path": "/y"}})
    assert human_requests.edits_problem(ignored) == (
        "edits: 2 calls wait, so give an object keyed by call id (valid: d1, d2) "
        "with each call's new arguments"
    )
    assert human_requests.edits_problem(two.model_copy(update={"edits": {"d2": "/y"}})) == (
        "edits.d2: a call's arguments are a JSON object"
    )
    assert (
        human_requests.edits_problem(two.model_copy(update={"edits": {"d2": {"path": "/y"}}}))
        is None
    )
