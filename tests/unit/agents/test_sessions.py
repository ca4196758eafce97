"""Conversations that persist across runs, against the scripted model server and local files.

Each run is a real engine run with :class:`~agentflows.agents.host.LiveCapabilities` and the
local :class:`~agentflows.agents.session_files.FileStore`, as ``agentflows run`` builds them;
what the model was sent is read back from the server's recorded requests.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from agentflows.agents import compression, files, host, session_files
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, graph, run, store
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall


def _agent(server: ScriptedModelServer, **fields: Any) -> agent_api.AgentSpec:
    return agent_api.AgentSpec.model_validate(
        {
            "model": server.model_spec().model_dump(by_alias=True, exclude_none=True),
            "systemPrompt": "You help with tickets.",
            **fields,
        }
    )


async def _run(
    nodes: list[dict[str, Any]],
    agents: dict[str, agent_api.AgentSpec],
    sessions: session_files.FileStore,
    server: ScriptedModelServer,
    value: Any,
) -> store.Checkpoint:
    spec = flow_api.FlowSpec.model_validate({"nodes": nodes})
    checkpoints = store.MemoryStore()
    resolver = graph.StaticResolver(agents)
    outcome = await run.run_flow(
        graph.compile_flow(spec, resolver),
        run_name="r",
        input_value=value,
        store_=checkpoints,
        caps=host.LiveCapabilities(resolver, env=server.env, session_store=sessions),
        resolver=resolver,
    )
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    return checkpoints.checkpoint


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in messages]


TICKET_NODE = {
    "id": "answer",
    "agent": {
        "name": "helper",
        "prompt": "{{ .run.input.text }}",
        "session": "={{ .run.input.ticket }}",
    },
}


async def test_a_session_continues_over_three_runs_and_the_model_sees_the_earlier_turns(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {"helper": _agent(model_server)}
    model_server.script(Reply.text("Restart it."), Reply.text("Then reinstall."), Reply.text("Ok."))
    for text in ("My app crashes.", "Restarting did not help.", "Thanks, that worked."):
        await _run([TICKET_NODE], agents, sessions, model_server, {"ticket": "T-1", "text": text})
    assert _texts(model_server.requests[2].messages) == [
        ("system", "You help with tickets."),
        ("user", "My app crashes."),
        ("assistant", "Restart it."),
        ("user", "Restarting did not help."),
        ("assistant", "Then reinstall."),
        ("user", "Thanks, that worked."),
    ]
    stored = await sessions.read("helper", "T-1")
    assert stored is not None and stored.turns == 3
    model_server.script(Reply.text("Hello."))
    await _run([TICKET_NODE], agents, sessions, model_server, {"ticket": "T-2", "text": "New."})
    assert _texts(model_server.requests[3].messages)[1:] == [("user", "New.")]


async def test_fifty_parallel_map_items_on_one_session_keep_every_turn_by_request_id(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {"helper": _agent(model_server)}
    node = {
        "id": "each",
        "map": {
            "items": "=.run.input.items",
            "concurrency": 50,
            "agent": {
                "name": "helper",
                "prompt": "item {{ .item }}",
                "session": "batch-7",
                "request": "={{ .item }}",
            },
        },
    }
    items = list(range(50))
    for _ in range(2):
        model_server.script(*(Reply.text("noted") for _ in items))
        await _run([node], agents, sessions, model_server, {"items": items})
    stored = await sessions.read("helper", "batch-7")
    assert stored is not None and stored.turns == 100
    by_request = {c.request: c for c in stored.conversations}
    assert sorted(by_request) == sorted(str(i) for i in items)
    for item in items:
        assert _texts(by_request[str(item)].messages) == [
            ("user", f"item {item}"),
            ("assistant", "noted"),
            ("user", f"item {item}"),
            ("assistant", "noted"),
        ]


async def test_parallel_turns_on_one_session_without_request_ids_lose_no_turn(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    node = {
        "id": "each",
        "map": {
            "items": "=.run.input.items",
            "concurrency": 10,
            "agent": {"name": "helper", "prompt": "note {{ .item }}", "session": "shared"},
        },
    }
    model_server.script(*(Reply.text("noted") for _ in range(10)))
    await _run(
        [node], {"helper": _agent(model_server)}, sessions, model_server, {"items": list(range(10))}
    )
    stored = await sessions.read("helper", "shared")
    assert stored is not None
    (conversation,) = stored.conversations
    prompts = {m["content"] for m in conversation.messages if m["role"] == "user"}
    assert conversation.turns == 10 and prompts == {f"note {i}" for i in range(10)}


async def test_a_second_agent_reads_shared_memory_and_read_only_never_writes_it(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {
        "writer": _agent(model_server),
        "reader": _agent(
            model_server,
            systemPrompt="You review tickets.",
            memory={"shared": "writer", "access": "ReadOnly"},
        ),
    }
    nodes = [
        {
            "id": "write",
            "agent": {"name": "writer", "prompt": "Customer is on plan Gold.", "session": "c-9"},
        },
        {"id": "read", "agent": {"name": "reader", "prompt": "Which plan?", "session": "c-9"}},
    ]
    model_server.script(Reply.text("Noted: Gold."), Reply.text("Gold."))
    checkpoint = await _run(nodes, agents, sessions, model_server, None)
    assert _texts(model_server.requests[1].messages) == [
        ("system", "You review tickets."),
        ("user", "Customer is on plan Gold."),
        ("assistant", "Noted: Gold."),
        ("user", "Which plan?"),
    ]
    stored = await sessions.read("writer", "c-9")
    assert stored is not None and stored.turns == 1
    assert checkpoint.nodes["read"].detail["memory"] == {
        "memory": "writer",
        "session": "c-9",
        "saved": False,
        "reason": "access is ReadOnly",
    }
    assert await sessions.list("reader") == []


async def test_memory_skip_stores_nothing_and_loads_nothing(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {"helper": _agent(model_server, session="fixed", memory={"skip": True})}
    node = {"id": "once", "agent": {"name": "helper", "prompt": "hello"}}
    model_server.script(Reply.text("hi"), Reply.text("hi again"))
    for _ in range(2):
        await _run([node], agents, sessions, model_server, None)
    assert _texts(model_server.requests[1].messages)[1:] == [("user", "hello")]
    assert await sessions.list() == [] and not any(tmp_path.rglob("*.json"))


async def test_secrets_never_reach_stored_memory(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    node = {
        "id": "a",
        "agent": {"name": "helper", "prompt": f"my key is {API_KEY}", "session": "s"},
    }
    model_server.script(Reply.text(f"I will not repeat {API_KEY}"))
    await _run([node], {"helper": _agent(model_server)}, sessions, model_server, None)
    text = "".join(p.read_text() for p in tmp_path.rglob("*.json"))
    assert API_KEY not in text and text.count("[redacted]") == 2


async def test_a_node_can_offer_its_agent_no_tools(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    tool = {"name": "lookup", "http": {"url": "http://127.0.0.1:9/x"}}
    node = {"id": "a", "agent": {"name": "helper", "prompt": "hi", "tools": {"skip": True}}}
    model_server.script(Reply.text("hello"))
    await _run(
        [node],
        {"helper": _agent(model_server, tools=[tool])},
        session_files.FileStore(tmp_path),
        model_server,
        None,
    )
    assert not model_server.requests[0].body.get("tools")


async def test_a_session_over_its_bound_is_compacted_through_compression(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {"helper": _agent(model_server, memory={"maxBytes": 8192})}
    reply = Reply.text("summary so far: " + "x" * 200)  # an answer, or a summary when compacting
    sizes, compacting = [], []
    for turn in range(100):
        model_server.script(reply, reply)
        value = {"ticket": "T", "text": f"question {turn} " + "y" * 200}
        node = (await _run([TICKET_NODE], agents, sessions, model_server, value)).nodes["answer"]
        sizes.append(sum(p.stat().st_size for p in tmp_path.rglob("*.json")))
        if node.detail["memory"]["compacted"]:
            compacting.append(node)
    # the summary is a model call of the turn that compacted: counted in its usage and detail
    assert compacting and all(n.usage.llm_calls == 2 for n in compacting)
    assert all(n.detail["compressions"][-1]["of"] == "memory" for n in compacting)
    stored = await sessions.read("helper", "T")
    assert stored is not None and stored.turns == 100 and max(sizes) <= 8192
    (conversation,) = stored.conversations
    assert conversation.compactions > 0
    assert conversation.messages[1]["content"].startswith(compression.SUMMARY_PREFIX)
    print(f"stored session after 100 turns: {sizes[-1]} bytes (largest {max(sizes)})")


async def test_a_submitted_answer_counts_its_memory_s_compaction_in_its_detail(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {"helper": _agent(model_server, memory={"maxBytes": 8192})}
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    submitting = {**TICKET_NODE, "agent": {**TICKET_NODE["agent"], "answer": {"schema": schema}}}
    submit = Reply.calls(ToolCall("submit_result", {"answer": "shipped " + "x" * 200}))
    compacting = []
    for turn in range(100):
        model_server.script(submit, Reply.text("summary so far: " + "x" * 200))
        value = {"ticket": "T", "text": f"question {turn} " + "y" * 200}
        node = (await _run([submitting], agents, sessions, model_server, value)).nodes["answer"]
        model_server.drop_script()  # the summary is left over when the memory was not compacted
        assert node.output["json"] == {"answer": "shipped " + "x" * 200}
        if node.detail["memory"]["compacted"]:
            compacting.append(node)
    # the summary is a model call of the turn that submitted: in its usage and in its detail
    assert compacting and all(n.usage.llm_calls == 2 for n in compacting)
    assert all(n.detail["llmCalls"] == 2 for n in compacting)
    assert all(n.detail["compressions"][-1]["of"] == "memory" for n in compacting)


async def test_retention_keeps_the_most_recently_written_sessions_up_to_max_sessions(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    agents = {"helper": _agent(model_server, memory={"maxSessions": 2})}
    for ticket in ("T-1", "T-2", "T-3"):
        model_server.script(Reply.text("ok"))
        await _run([TICKET_NODE], agents, sessions, model_server, {"ticket": ticket, "text": "hi"})
    assert [info.session for info in await sessions.list("helper")] == ["T-2", "T-3"]


async def test_a_bad_session_expression_on_the_agent_fails_the_node_naming_the_field(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "a", "agent": {"name": "helper", "prompt": "hi"}}]}
    )
    resolver = graph.StaticResolver({"helper": _agent(model_server, session="=.[")})
    outcome = await run.run_flow(
        graph.compile_flow(spec, resolver),
        run_name="r",
        input_value=None,
        store_=store.MemoryStore(),
        caps=host.LiveCapabilities(
            resolver, env=model_server.env, session_store=session_files.FileStore(tmp_path)
        ),
        resolver=resolver,
    )
    assert outcome.phase == flowrun_api.RunPhase.FAILED
    assert 'Agent "helper" spec.session: ' in (outcome.message or "")
    assert model_server.requests == []


async def test_a_turn_resumed_after_approval_in_a_new_host_keeps_a_turn_saved_while_it_waited(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    sessions = session_files.FileStore(tmp_path)
    script = "import json, sys\nprint(json.dumps({'done': json.load(sys.stdin)}))"
    spec = _agent(
        model_server,
        systemPrompt="",
        tools=[{"name": "delete", "python": {"script": script}}],
        humanReview={"approvers": {"groups": ["ops"]}},
    )
    task = capabilities.AgentTask("janitor", spec, "Clean /tmp", session="box-1")
    supervised = capabilities.NodeContext(
        run_name="r", node_key="fix", depth=0, autonomy=flow_api.Autonomy.SUPERVISED
    )
    model_server.script(
        Reply.calls(ToolCall("delete", {"path": "/tmp/x"}, id="d1")), Reply.text("Disk is fine.")
    )
    first = host.LiveCapabilities(env=model_server.env, session_store=sessions)
    pause = await first.run_agent(task, supervised)
    assert isinstance(pause, capabilities.Pause)
    other = dataclasses.replace(task, prompt="Check the disk")
    await first.run_agent(other, dataclasses.replace(supervised, node_key="disk"))

    model_server.script(Reply.text("Cleaned."))
    request = pause.request.model_copy(update={"decision": "approve"})
    resume = capabilities.Resume(state=json.loads(json.dumps(pause.state)), request=request)
    second = host.LiveCapabilities(env=model_server.env, session_store=sessions)
    await second.run_agent(task, dataclasses.replace(supervised, resume=resume))

    stored = await sessions.read("janitor", "box-1")
    assert stored is not None
    (conversation,) = stored.conversations
    assert conversation.turns == 2
    assert [(m["role"], m.get("content")) for m in conversation.messages] == [
        ("user", "Check the disk"),
        ("assistant", "Disk is fine."),
        ("user", "Clean /tmp"),
        ("assistant", None),
        ("tool", json.dumps({"done": {"path": "/tmp/x"}})),
        ("assistant", "Cleaned."),
    ]


async def test_reference_files_open_a_session_once_and_are_not_attached_again(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    (tmp_path / "faq.txt").write_text("Restart first.")
    sessions = session_files.FileStore(tmp_path / "sessions")
    resolver = graph.StaticResolver({"helper": _agent(model_server, files=[{"path": "faq.txt"}])})
    access = files.FileAccess(root=tmp_path)
    model_server.script(Reply.text("Restart it."), Reply.text("Then reinstall."))
    details = []
    for text in ("My app crashes.", "Restarting did not help."):
        checkpoints = store.MemoryStore()
        outcome = await run.run_flow(
            graph.compile_flow(
                flow_api.FlowSpec.model_validate({"nodes": [TICKET_NODE]}), resolver
            ),
            run_name="r",
            input_value={"ticket": "T-9", "text": text},
            store_=checkpoints,
            caps=host.LiveCapabilities(
                resolver, env=model_server.env, session_store=sessions, file_access=access
            ),
            resolver=resolver,
        )
        assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
        details.append(checkpoints.checkpoint.nodes["answer"].detail)
    assert _texts(model_server.requests[1].messages) == [
        ("system", "You help with tickets."),
        ("user", '<file name="faq.txt">\nRestart first.\n</file>\n\nMy app crashes.'),
        ("assistant", "Restart it."),
        ("user", "Restarting did not help."),
    ]
    assert [len(d.get("files", [])) for d in details] == [1, 0]
