"""An Agent's ``handoffs``: the turn goes on with the recipient, which answers in its place."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, graph, run, store
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall


def desk(server: ScriptedModelServer, **extra: agent_api.AgentSpec) -> host.LiveCapabilities:
    """``front`` hands over to ``billing``, which hands back; ``lead`` messages ``billing``."""
    model = server.model_spec()
    agents = {
        "front": agent_api.AgentSpec(model=model, system_prompt="Front.", handoffs=["billing"]),
        "billing": agent_api.AgentSpec(
            model=model,
            system_prompt="Billing.",
            handoffs=["front"],
            tools=[agent_api.Tool(name="ledger", client=agent_api.ClientTool())],
        ),
        "lead": agent_api.AgentSpec(model=model, system_prompt="Lead.", sub_agents=["billing"]),
        **extra,
    }
    return host.LiveCapabilities(agents, env=server.env)


class _Killed(BaseException):
    """The runner is killed (nothing in the run catches it)."""


class _KilledAfterHandoff(store.FileStore):
    """The run's file store, whose runner is killed as soon as a handoff is kept."""

    async def save_node(self, key: str, status: flowrun_api.NodeStatus) -> None:
        await super().save_node(key, status)
        if isinstance(status.detail, dict) and "progress" in status.detail:
            raise _Killed


async def _run(
    compiled: graph.CompiledFlow, caps: host.LiveCapabilities, store_: store.CheckpointStore
) -> store.Outcome:
    return await run.run_flow(
        compiled,
        run_name="desk-1",
        input_value={},
        store_=store_,
        caps=caps,
        resolver=caps.resolver,
    )


def task(caps: host.LiveCapabilities, name: str, prompt: str) -> capabilities.AgentTask:
    spec = caps.resolver.agent(name)
    assert spec is not None
    return capabilities.AgentTask(name, spec, prompt)


def offered(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools") or []]


async def test_the_recipient_answers_the_prompt_given_the_dialogue_and_the_node_records_it(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    caps = desk(model_server)
    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"}), content="One moment."),
        Reply.text("Invoice 42 is paid."),
    )
    result = await caps.run_agent(task(caps, "front", "Is invoice 42 paid?"), ctx)

    assert isinstance(result, capabilities.NodeResult)
    assert result.output["text"] == "Invoice 42 is paid."
    assert result.detail["agent"] == "billing"
    assert [(m["role"], m["content"]) for m in model_server.requests[1].messages] == [
        ("system", "Billing."),
        ("user", "Is invoice 42 paid?"),
        ("assistant", "One moment."),
    ]
    assert offered(model_server.requests[1]) == ["ledger", "handoff_conversation"]
    assert result.usage.llm_calls == 2, "both agents' model calls count in the node's usage"


async def test_a_turn_paused_after_a_handoff_resumes_with_the_recipient(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    caps = desk(model_server)
    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.calls(ToolCall("ledger", {"invoice": 42}, id="c1")),
    )
    front = task(caps, "front", "Is invoice 42 paid?")
    pause = await caps.run_agent(front, ctx)
    assert isinstance(pause, capabilities.Pause)
    assert pause.state["agent"] == "billing"

    request = pause.request.model_copy(update={"decision": "respond", "data": "paid May 2"})
    saved = json.loads(json.dumps(pause.state))  # as the engine stores it
    model_server.script(Reply.text("Paid on May 2."))
    resumed = dataclasses.replace(ctx, resume=capabilities.Resume(state=saved, request=request))
    result = await caps.run_agent(front, resumed)

    assert isinstance(result, capabilities.NodeResult)
    assert (result.output["text"], result.detail["agent"]) == ("Paid on May 2.", "billing")
    last = model_server.requests[2]
    assert last.messages[0] == {"role": "system", "content": "Billing."}
    assert last.messages[-1]["content"] == "paid May 2"


async def test_agents_handing_over_more_than_five_times_in_a_turn_fail_the_node(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    caps = desk(model_server)
    model_server.script(
        *[
            Reply.calls(ToolCall("handoff_conversation", {"agent": to}))
            for to in ["billing", "front"] * 3
        ]
    )
    with pytest.raises(capabilities.CapabilityError) as failed:
        await caps.run_agent(task(caps, "front", "Hello"), ctx)
    assert str(failed.value) == (
        "the agents handed the conversation over more than 5 times in one turn without answering"
    )


async def test_a_sub_agent_answers_its_caller_and_is_not_offered_the_handoff(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    caps = desk(model_server)
    model_server.script(
        Reply.calls(ToolCall("call_sub_agent", {"agent": "billing", "prompt": "Invoice 42?"})),
        Reply.text("Paid."),
        Reply.text("Billing says paid."),
    )
    result = await caps.run_agent(task(caps, "lead", "Is invoice 42 paid?"), ctx)

    assert isinstance(result, capabilities.NodeResult)
    assert result.output["text"] == "Billing says paid."
    assert offered(model_server.requests[1]) == ["ledger"]
    assert "agent" not in result.detail


async def test_a_run_killed_after_a_handoff_goes_on_with_the_recipient_without_asking_the_caller(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    caps = desk(model_server)
    flow = flow_api.FlowSpec(
        nodes=[flow_api.Node(id="desk", agent=flow_api.AgentCall(name="front", prompt="Paid?"))]
    )
    compiled = graph.compile_flow(flow, caps.resolver, name="desk")
    path = tmp_path / "run.json"

    model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.text("Paid on May 2."),
    )
    with pytest.raises(_Killed):
        await _run(compiled, caps, _KilledAfterHandoff(path))
    assert store.FileStore(path).read().nodes["desk"].phase == "Running"
    outcome = await _run(compiled, caps, store.FileStore(path))

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    record = store.FileStore(path).read().nodes["desk"]
    assert (record.output or {})["text"] == "Paid on May 2."
    assert record.detail["agent"] == "billing"
    systems = [r.messages[0]["content"] for r in model_server.requests]
    assert systems == ["Front.", "Billing."], "the new runner did not ask front again"
    assert model_server.requests[1].messages[1:] == [{"role": "user", "content": "Paid?"}]
