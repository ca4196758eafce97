"""An agent node's ``history``: turns from the run sent before its prompt (issue 22).

The importer gives an Agent Spec AgentNode the flow's conversation this way; the tests run a
Flow with the engine against the scripted model server.
"""

from __future__ import annotations

from typing import Any

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, run, store
from tests.support.model_server import Reply, ScriptedModelServer


async def run_flow(server: ScriptedModelServer, history: str) -> store.Outcome:
    agent = agent_api.AgentSpec(model=server.model_spec(), system_prompt="Be brief.")
    spec = flow_api.FlowSpec(
        nodes=[
            flow_api.Node(id="said", transform='="The user asked about " + .run.input.topic'),
            flow_api.Node(
                id="ask", agent=flow_api.AgentCall(name="helper", prompt="Go.", history=history)
            ),
        ],
    )
    resolver = graph.StaticResolver({"helper": agent}, {"f": spec})
    return await run.run_flow(
        graph.compile_flow(spec, resolver, name="f"),
        run_name="f-1",
        input_value={"topic": "kopf"},
        store_=store.MemoryStore(),
        caps=host.LiveCapabilities(resolver, server.env),
        resolver=resolver,
    )


def sent(server: ScriptedModelServer) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in server.requests[0].messages]


async def test_an_agent_node_s_history_turns_come_after_the_system_prompt_before_the_prompt(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(Reply.text("ok"))
    history = (
        '=[{"role": "assistant", "content": .nodes.said.json}, {"role": "user", "content": "Yes."}]'
    )
    outcome = await run_flow(model_server, history)
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    assert sent(model_server) == [
        ("system", "Be brief."),
        ("assistant", "The user asked about kopf"),
        ("user", "Yes.\n\nGo."),
    ]


async def test_a_history_that_is_not_a_list_of_turns_fails_the_node_saying_what_is_valid(
    model_server: ScriptedModelServer,
) -> None:
    outcome = await run_flow(model_server, '=[{"role": "narrator", "content": "x"}]')
    assert outcome.phase == flowrun_api.RunPhase.FAILED
    assert "agent.history: 0.role:" in (outcome.message or "")
    assert "a list of {role, content} turns, role user, assistant or system" in (
        outcome.message or ""
    )
    assert model_server.requests == []
