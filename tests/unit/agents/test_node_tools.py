"""Flow nodes offered to an agent as tools (``agent.nodeTools``), through the real engine.

The model is the scripted server on loopback and the http node calls a loopback endpoint: the
tests look at what the model was offered and sent back, what the endpoint received, and the
records the run stored.
"""

from __future__ import annotations

import json
from typing import Any

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, run, store
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall


def resolver_for(server: ScriptedModelServer, **agent_fields: Any) -> graph.StaticResolver:
    return graph.StaticResolver(
        {"helper": agent_api.AgentSpec(model=server.model_spec(), **agent_fields)}
    )


async def run_spec(
    server: ScriptedModelServer, spec: dict[str, Any], resolver: graph.StaticResolver
) -> tuple[store.Outcome, store.Checkpoint]:
    flow = flow_api.FlowSpec.model_validate(spec)
    memory = store.MemoryStore()
    outcome = await run.run_flow(
        graph.compile_flow(flow, resolver),
        run_name="r",
        input_value=None,
        store_=memory,
        caps=host.LiveCapabilities(resolver, env=server.env),
        resolver=resolver,
    )
    return outcome, await memory.load()


def lookup_flow(endpoint: LoopbackEndpoint) -> dict[str, Any]:
    """ask (agent) offers lookup (http, units fixed) and echo (transform); then done."""
    return {
        "nodes": [
            {
                "id": "ask",
                "agent": {
                    "name": "helper",
                    "prompt": "Find the weather.",
                    "nodeTools": [
                        {"node": "lookup", "fields": ["city"]},
                        {"node": "echo", "fields": ["word"], "description": "Repeat a word."},
                    ],
                },
            },
            {
                "id": "lookup",
                "description": "Look a city up.",
                "tool": {
                    "http": {"method": "POST", "url": f"{endpoint.url}/echo"},
                    "args": {"units": "metric", "city": "nowhere"},
                },
            },
            {"id": "echo", "transform": "={said: .args.word, run: .run.name}"},
            {"id": "done", "transform": "={answer: .nodes.ask.text}"},
        ]
    }


def tool_results(server: ScriptedModelServer, index: int) -> dict[str, Any]:
    return {
        m["tool_call_id"]: json.loads(m["content"])
        for m in server.requests[index].messages
        if m["role"] == "tool"
    }


async def test_node_tools_offer_only_their_fields_and_run_the_node_once_per_call(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint
) -> None:
    model_server.script(
        Reply.calls(
            ToolCall("lookup", {"city": "Oslo"}, id="c1"),
            ToolCall("echo", {"word": "hi"}, id="c2"),
        ),
        Reply.calls(ToolCall("lookup", {"city": "Rome"}, id="c3")),
        Reply.text("Oslo and Rome looked up"),
    )
    outcome, checkpoint = await run_spec(
        model_server, lookup_flow(endpoint), resolver_for(model_server)
    )

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    offered = {t["function"]["name"]: t["function"] for t in model_server.requests[0].body["tools"]}
    assert offered["lookup"]["parameters"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    assert offered["lookup"]["description"] == "Look a city up."
    assert offered["echo"]["description"] == "Repeat a word."
    assert [r["body"] for r in endpoint.requests] == [
        {"units": "metric", "city": "Oslo"},
        {"units": "metric", "city": "Rome"},
    ], "one request per call, the agent's field merged over the configured args"
    first = tool_results(model_server, 1)
    assert first["c1"]["body"] == {"units": "metric", "city": "Oslo"}
    assert first["c2"] == {"said": "hi", "run": "r"}
    assert tool_results(model_server, 2)["c3"]["body"]["city"] == "Rome"
    nodes = checkpoint.nodes
    for key in ("ask/c1/lookup", "ask/c2/echo", "ask/c3/lookup"):
        assert nodes[key].phase == flowrun_api.NodePhase.SUCCEEDED
        assert nodes[key].attempts == 1
    assert "lookup" not in nodes and "echo" not in nodes, "tool nodes never run on their own"
    assert nodes["done"].output is not None
    assert nodes["done"].output["json"] == {"answer": "Oslo and Rome looked up"}
    calls = nodes["ask"].detail["toolCalls"]
    assert [(c["id"], c["name"], c["status"]) for c in calls] == [
        ("c1", "lookup", "success"),
        ("c2", "echo", "success"),
        ("c3", "lookup", "success"),
    ]


async def test_a_node_tool_named_like_an_agent_tool_is_suffixed(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint
) -> None:
    clash = agent_api.Tool(name="lookup", http=agent_api.HttpTool(url=f"{endpoint.url}/text"))
    model_server.script(
        Reply.calls(ToolCall("lookup_2", {"city": "Oslo"}, id="c1")), Reply.text("ok")
    )
    outcome, checkpoint = await run_spec(
        model_server, lookup_flow(endpoint), resolver_for(model_server, tools=[clash])
    )

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    names = [t["function"]["name"] for t in model_server.requests[0].body["tools"]]
    assert names == ["lookup", "lookup_2", "echo"]
    assert endpoint.requests[0]["path"] == "/echo", "lookup_2 ran the flow node, not the tool"
    assert checkpoint.nodes["ask/c1/lookup"].phase == flowrun_api.NodePhase.SUCCEEDED


async def test_an_llm_node_tool_takes_its_prompt_from_the_agent(
    model_server: ScriptedModelServer,
) -> None:
    spec = {
        "nodes": [
            {
                "id": "ask",
                "agent": {
                    "name": "helper",
                    "prompt": "Summarise.",
                    "nodeTools": [{"node": "summarise", "fields": ["prompt"]}],
                },
            },
            {
                "id": "summarise",
                "llm": {
                    "model": model_server.model_spec().to_wire(),
                    "system": "You summarise.",
                    "prompt": "configured prompt",
                },
            },
        ]
    }
    model_server.script(
        Reply.calls(ToolCall("summarise", {"prompt": "say it short"}, id="c1")),
        Reply.text("short"),
        Reply.text("it was short"),
    )
    outcome, checkpoint = await run_spec(model_server, spec, resolver_for(model_server))

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    [tool] = model_server.requests[0].body["tools"]
    assert tool["function"]["parameters"]["properties"] == {"prompt": {"type": "string"}}
    inner = model_server.requests[1].messages
    assert inner == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "say it short"},
    ]
    assert tool_results_text(model_server, 2) == {"c1": "short"}
    record = checkpoint.nodes["ask/c1/summarise"]
    assert record.usage is not None and record.usage.llm_calls == 1
    assert outcome.usage is not None and outcome.usage.llm_calls == 3


def tool_results_text(server: ScriptedModelServer, index: int) -> dict[str, str]:
    return {
        m["tool_call_id"]: m["content"]
        for m in server.requests[index].messages
        if m["role"] == "tool"
    }


async def test_a_failing_node_tool_is_an_error_result_for_the_model(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint
) -> None:
    spec = lookup_flow(endpoint)
    spec["nodes"][1]["tool"]["http"]["url"] = f"{endpoint.url}/fail"
    model_server.script(
        Reply.calls(ToolCall("lookup", {"city": "Oslo"}, id="c1")), Reply.text("gave up")
    )
    outcome, checkpoint = await run_spec(model_server, spec, resolver_for(model_server))

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    result = tool_results(model_server, 1)["c1"]
    assert result["status"] == "error"
    assert 'node "lookup" failed' in result["error"] and "503" in result["error"]
    assert checkpoint.nodes["ask/c1/lookup"].phase == flowrun_api.NodePhase.FAILED
    assert checkpoint.nodes["ask"].detail["toolCalls"][0]["status"] == "error"


async def test_sub_flow_and_agent_nodes_run_as_tools_with_typed_fields(
    model_server: ScriptedModelServer,
) -> None:
    doubler = flow_api.FlowSpec.model_validate(
        {
            "input": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "nodes": [{"id": "double", "transform": "={twice: (.run.input.n * 2)}"}],
        }
    )
    resolver = resolver_for(model_server)
    resolver.flows["doubler"] = doubler
    spec = {
        "nodes": [
            {
                "id": "ask",
                "agent": {
                    "name": "helper",
                    "prompt": "Work it out.",
                    "nodeTools": [
                        {"node": "double", "fields": ["n"]},
                        {"node": "expert", "fields": ["prompt"]},
                    ],
                },
            },
            {"id": "double", "flow": {"name": "doubler", "input": {"n": 0}}},
            {"id": "expert", "agent": {"name": "helper", "prompt": "configured"}},
        ]
    }
    model_server.script(
        Reply.calls(
            ToolCall("double", {"n": 21}, id="c1"),
            ToolCall("expert", {"prompt": "is 42 even?"}, id="c2"),
        ),
        Reply.text("yes"),
        Reply.text("42, and it is even"),
    )
    outcome, checkpoint = await run_spec(model_server, spec, resolver)

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    offered = {t["function"]["name"]: t["function"] for t in model_server.requests[0].body["tools"]}
    assert offered["double"]["parameters"]["properties"] == {"n": {"type": "integer"}}
    assert offered["expert"]["parameters"]["properties"] == {"prompt": {"type": "string"}}
    assert model_server.requests[1].messages[-1] == {"role": "user", "content": "is 42 even?"}
    assert tool_results_text(model_server, 2) == {"c1": '{"twice": 42}', "c2": "yes"}
    nodes = checkpoint.nodes
    assert nodes["ask/c1/double/double"].phase == flowrun_api.NodePhase.SUCCEEDED
    assert nodes["ask/c2/expert"].phase == flowrun_api.NodePhase.SUCCEEDED
    assert [c["name"] for c in nodes["ask"].detail["toolCalls"]] == ["double", "expert"]


async def test_a_tool_node_needing_approval_is_an_error_result_and_leaves_no_request(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint
) -> None:
    spec = lookup_flow(endpoint) | {"autonomy": "supervised"}
    model_server.script(
        Reply.calls(ToolCall("lookup", {"city": "Oslo"}, id="c1")), Reply.text("could not")
    )
    outcome, checkpoint = await run_spec(model_server, spec, resolver_for(model_server))

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    result = tool_results(model_server, 1)["c1"]
    assert result["error"] == (
        'node "lookup" failed: it needs a human\'s decision under autonomy supervised, which '
        "a node called as a tool cannot wait for"
    )
    assert endpoint.requests == [], "the endpoint was never called"
    assert checkpoint.requests == {}, "no request is left that nothing waits for"


async def test_each_map_item_agent_calls_node_tools_under_its_own_key(
    model_server: ScriptedModelServer,
) -> None:
    spec = {
        "nodes": [
            {
                "id": "fan",
                "map": {
                    "items": '=["a", "b"]',
                    "concurrency": 1,
                    "agent": {
                        "name": "helper",
                        "prompt": "{{ .item }}",
                        "nodeTools": [{"node": "echo", "fields": ["word"]}],
                    },
                },
            },
            {"id": "echo", "transform": "={said: .args.word}"},
        ]
    }
    model_server.script(
        Reply.calls(ToolCall("echo", {"word": "a"}, id="c1")),
        Reply.text("did a"),
        Reply.calls(ToolCall("echo", {"word": "b"}, id="c1")),
        Reply.text("did b"),
    )
    outcome, checkpoint = await run_spec(model_server, spec, resolver_for(model_server))

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    assert checkpoint.nodes["fan[0]/c1/echo"].output == {
        "json": {"said": "a"},
        "text": '{"said": "a"}',
        "raw": None,
    }
    assert checkpoint.nodes["fan[1]/c1/echo"].output is not None
    assert checkpoint.nodes["fan[1]/c1/echo"].output["json"] == {"said": "b"}
    fan = checkpoint.nodes["fan"].output
    assert fan is not None
    assert [item["text"] for item in fan["items"]] == ["did a", "did b"]


async def test_an_agent_tool_node_takes_field_types_from_the_tool_parameters(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint
) -> None:
    forecast = agent_api.Tool(
        name="forecast",
        http=agent_api.HttpTool(method="POST", url=f"{endpoint.url}/echo"),
        parameters={
            "type": "object",
            "properties": {"days": {"type": "integer", "minimum": 1}, "city": {"type": "string"}},
        },
    )
    resolver = resolver_for(model_server)
    resolver.agents["toolbox"] = agent_api.AgentSpec(
        model=model_server.model_spec(), tools=[forecast]
    )
    spec = {
        "nodes": [
            {
                "id": "ask",
                "agent": {
                    "name": "helper",
                    "prompt": "Plan the week.",
                    "nodeTools": [{"node": "week", "fields": ["days"]}],
                },
            },
            {
                "id": "week",
                "tool": {"agent": "toolbox", "name": "forecast", "args": {"city": "Oslo"}},
            },
        ]
    }
    model_server.script(Reply.calls(ToolCall("week", {"days": 7}, id="c1")), Reply.text("planned"))
    outcome, checkpoint = await run_spec(model_server, spec, resolver)

    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    [tool] = model_server.requests[0].body["tools"]
    assert tool["function"]["parameters"]["properties"] == {
        "days": {"type": "integer", "minimum": 1}
    }
    assert endpoint.requests[0]["body"] == {"city": "Oslo", "days": 7}
    assert checkpoint.nodes["ask/c1/week"].phase == flowrun_api.NodePhase.SUCCEEDED
