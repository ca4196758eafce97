"""Agent Spec conformance: the same documents and model conversations on agentflows and WayFlow.

Each case is an Agent Spec document, a scripted model conversation, the user's messages and
the expected result; it runs on agentflows (``agentflows.agentspec.conversation``, in this
process) and on WayFlow (``wayflowcore``, through ``bench/agentspec_wayflow_driver.py`` in its
own environment), both pointed at one scripted OpenAI-compatible model server on loopback
(``tests/support/model_server.py``), and a small loopback HTTP server for ApiNodes. The
result of a run is what a user observes: whether the conversation finished, its outputs, and
the texts it showed the user while waiting for a message. A case passes on a runtime when that
equals the expected result and, where the case says so, the model was sent a given text.

    python bench/agentspec_conformance.py --wayflow-python WAYFLOW_VENV/bin/python
    python bench/agentspec_conformance.py -k agent_node -v   # some cases; show what differs

Prints one line per case (``ok``/``FAIL`` for each runtime) and the totals of each runtime
measured in this run. The expected results follow the specification; bench/README.md says,
for each case where the two runtimes disagree, which the specification supports.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tests.support.model_server import Reply, ScriptedModelServer, ToolCall  # noqa: E402

from agentflows.agentspec import conversation  # noqa: E402

MODEL_URL = "MODEL_URL"
API_URL = "API_URL"
VERSION = "25.4.2"
#: execute() calls before a conversation is stopped, on both runtimes.
MAX_STEPS = 20


# -- documents ------------------------------------------------------------------------------


def ref(cid: str) -> dict[str, str]:
    return {"$component_ref": cid}


def prop(title: str, type_: str = "string", **extra: Any) -> dict[str, Any]:
    return {"title": title, "type": type_, **extra}


def llm() -> dict[str, Any]:
    return {
        "component_type": "OpenAiCompatibleConfig",
        "name": "scripted",
        "model_id": "scripted-model",
        "url": MODEL_URL,
    }


def start(*inputs: dict[str, Any]) -> dict[str, Any]:
    return {"component_type": "StartNode", "name": "start", "inputs": list(inputs),
            "outputs": list(inputs)}  # fmt: skip


def end(*outputs: dict[str, Any], name: str = "end", branch: str | None = None) -> dict[str, Any]:
    node = {"component_type": "EndNode", "name": name, "inputs": list(outputs),
            "outputs": list(outputs)}  # fmt: skip
    return node | ({"branch_name": branch} if branch else {})


def server_tool(name: str, inputs: list[Any], outputs: list[Any], **extra: Any) -> dict[str, Any]:
    return {"component_type": "ServerTool", "name": name, "description": f"The {name} tool.",
            "inputs": inputs, "outputs": outputs, **extra}  # fmt: skip


def agent(name: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {"component_type": "Agent", "id": name, "name": name, "system_prompt": prompt,
            "llm_config": llm(), **extra}  # fmt: skip


def flow(
    name: str,
    nodes: dict[str, dict[str, Any]],
    control: list[tuple[str, ...]],
    data: list[tuple[str, str, str, str]] | None,
) -> dict[str, Any]:
    """A Flow whose nodes are referenced components (id = name); ``control`` edges are
    ``(from, to)`` or ``(from, to, branch)``, ``data`` edges ``(from, output, to, input)``.

    The ids of a sub-flow's nodes (a flow not named ``f``) are prefixed with its name: ids are
    unique across the document, at every level.
    """

    def cid(key: str) -> str:
        return key if name == "f" else f"{name}_{key}"

    for key, node in nodes.items():
        node.setdefault("name", key)
    doc: dict[str, Any] = {
        "component_type": "Flow", "id": name, "name": name, "start_node": ref(cid("start")),
        "nodes": [ref(cid(k)) for k in nodes],
        "control_flow_connections": [
            {"component_type": "ControlFlowEdge", "name": f"{name}_c{i}",
             "from_node": ref(cid(e[0])), "to_node": ref(cid(e[1]))}
            | ({"from_branch": e[2]} if len(e) > 2 else {})
            for i, e in enumerate(control)
        ],
        "$referenced_components": {cid(k): v for k, v in nodes.items()},
    }  # fmt: skip
    if data is not None:
        doc["data_flow_connections"] = [
            {"component_type": "DataFlowEdge", "name": f"{name}_d{i}",
             "source_node": ref(cid(s)), "source_output": o,
             "destination_node": ref(cid(d)), "destination_input": n}
            for i, (s, o, d, n) in enumerate(data)
        ]  # fmt: skip
    return doc


def iterated(title: str, type_: str) -> dict[str, Any]:
    """A MapNode input: one value for every item, or a list iterated over."""
    return {"title": title, "anyOf": [{"type": type_}, {"type": "array", "items": {"type": type_}}]}


def chain(*ids: str) -> list[tuple[str, ...]]:
    return list(itertools.pairwise(ids))


def submit(**values: Any) -> Reply:
    return Reply.calls(ToolCall("submit_result", values))


# -- cases ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """One document, its scripted conversation and what a user must observe."""

    name: str
    doc: dict[str, Any]
    script: list[Reply]
    expected: dict[str, Any]
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    messages: list[str] = dataclasses.field(default_factory=list)
    #: The first message is appended before the first execute() (the user speaks first).
    user_first: bool = False
    client_results: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Texts some model request must contain (what the model was shown).
    sent: list[str] = dataclasses.field(default_factory=list)
    #: The specification section the case checks.
    about: str = ""

    def wire(self, model_url: str, api_url: str) -> dict[str, Any]:
        text = json.dumps({"agentspec_version": VERSION, **self.doc})
        text = text.replace(MODEL_URL, model_url).replace(API_URL, api_url)
        return {"doc": text, "inputs": self.inputs, "messages": self.messages,
                "user_first": self.user_first, "client_results": self.client_results}  # fmt: skip


def done(**outputs: Any) -> dict[str, Any]:
    return {"finished": True, "outputs": outputs, "said": []}


def flow_cases() -> Iterator[Case]:
    s, e = "start", "end"
    gen = prop("generated_text")
    yield Case(
        "llm_text_output",
        flow("f", {s: start(prop("topic")), "write": {"component_type": "LlmNode",
             "llm_config": llm(), "prompt_template": "Write about {{topic}}.",
             "inputs": [prop("topic")], "outputs": [gen]}, e: end(gen)},
             chain(s, "write", e),
             [(s, "topic", "write", "topic"), ("write", "generated_text", e, "generated_text")]),
        [Reply.text("Kopf runs operators.")],
        done(generated_text="Kopf runs operators."),
        inputs={"topic": "kopf"},
        sent=["Write about kopf."],
        about="LlmNode, prompt placeholders",
    )  # fmt: skip
    two = [prop("title"), prop("score", "integer")]
    yield Case(
        "llm_two_structured_outputs",
        flow("f", {s: start(), "rate": {"component_type": "LlmNode", "llm_config": llm(),
             "prompt_template": "Rate it.", "outputs": two}, e: end(*two)},
             chain(s, "rate", e),
             [("rate", "title", e, "title"), ("rate", "score", e, "score")]),
        [Reply.text('{"title": "Good", "score": 4}')],
        done(title="Good", score=4),
        about="LlmNode structured generation",
    )  # fmt: skip
    count = prop("count", "integer")
    for name, reply in (("llm_one_integer_output_object", '{"count": 5}'),
                        ("llm_one_integer_output_bare_value", "5")):  # fmt: skip
        yield Case(
            name,
            flow("f", {s: start(), "n": {"component_type": "LlmNode", "llm_config": llm(),
                 "prompt_template": "How many?", "outputs": [count]}, e: end(count)},
                 chain(s, "n", e), [("n", "count", e, "count")]),
            [Reply.text(reply)],
            done(count=5),
            about="issue 22 §2: LlmNode with one typed output",
        )  # fmt: skip
    weather = prop("weather")
    tool = server_tool("get_weather", [prop("city")], [weather])
    yield Case(
        "tool_node_one_output_read_by_name",
        flow("f", {s: start(prop("city")), "t": {"component_type": "ToolNode", "tool": tool,
             "inputs": [prop("city")], "outputs": [weather]}, e: end(weather)},
             chain(s, "t", e), [(s, "city", "t", "city"), ("t", "weather", e, "weather")]),
        [], done(weather="Sunny in Oslo"), inputs={"city": "Oslo"},
        about="issue 22 §2: outputs mapped by name (ToolNode)",
    )  # fmt: skip
    parts = [prop("first"), prop("last")]
    yield Case(
        "tool_node_two_outputs",
        flow("f", {s: start(prop("name")), "t": {"component_type": "ToolNode",
             "tool": server_tool("split_name", [prop("name")], parts),
             "inputs": [prop("name")], "outputs": parts}, e: end(*parts)},
             chain(s, "t", e), [(s, "name", "t", "name"), ("t", "first", e, "first"),
                                ("t", "last", e, "last")]),
        [], done(first="Ada", last="Lovelace"), inputs={"name": "Ada Lovelace"},
        about="ToolNode, several outputs",
    )  # fmt: skip
    loud = prop("loud")
    yield Case(
        "tool_node_bare_result",
        flow("f", {s: start(prop("text")), "t": {"component_type": "ToolNode",
             "tool": server_tool("shout", [prop("text")], [loud]),
             "inputs": [prop("text")], "outputs": [loud]}, e: end(loud)},
             chain(s, "t", e), [(s, "text", "t", "text"), ("t", "loud", e, "loud")]),
        [], done(loud="HEY"), inputs={"text": "hey"},
        about="ToolNode, one output from a bare value",
    )  # fmt: skip
    yield Case(
        "tool_node_without_data_edges",
        flow("f", {s: start(prop("text")), "t": {"component_type": "ToolNode",
             "tool": server_tool("shout", [prop("text")], [loud]),
             "inputs": [prop("text")], "outputs": [loud]}, e: end(loud)},
             chain(s, "t", e), None),
        [], done(loud="HI"), inputs={"text": "hi"},
        about="data flow by name (no data_flow_connections)",
    )  # fmt: skip
    yield from branch_cases()
    yield from subflow_cases()
    yield from message_cases()


def branch_cases() -> Iterator[Case]:
    s = "start"
    for name, value, expected in (("branching_by_the_declared_input_name", "yes", "approved"),
                                  ("branching_default_branch", "maybe", "refused")):  # fmt: skip
        nodes = {
            s: start(prop("decision")),
            "route": {"component_type": "BranchingNode", "mapping": {"yes": "YES"},
                      "inputs": [prop("decision")]},
            "end_ok": end(prop("answer", default="approved"), name="end_ok"),
            "end_no": end(prop("answer", default="refused"), name="end_no"),
        }  # fmt: skip
        yield Case(
            name,
            flow("f", nodes, [(s, "route"), ("route", "end_ok", "YES"),
                              ("route", "end_no", "default")],
                 [(s, "decision", "route", "decision")]),
            [], {"finished": True, "outputs": {"answer": expected}, "said": []},
            inputs={"decision": value},
            about="issue 22 §2: BranchingNode reads its input by its declared name",
        )  # fmt: skip
    gen = prop("generated_text")
    nodes = {
        s: start(),
        "judge": {"component_type": "LlmNode", "llm_config": llm(),
                  "prompt_template": "Answer YES or NO.", "outputs": [gen]},
        "route": {"component_type": "BranchingNode", "mapping": {"YES": "YES"},
                  "inputs": [prop("branching_mapping_key")]},
        "end_yes": end(prop("verdict", default="yes"), name="end_yes"),
        "end_no": end(prop("verdict", default="no"), name="end_no"),
    }  # fmt: skip
    yield Case(
        "branching_on_an_llm_answer",
        flow("f", nodes, [(s, "judge"), ("judge", "route"), ("route", "end_yes", "YES"),
                          ("route", "end_no", "default")],
             [("judge", "generated_text", "route", "branching_mapping_key")]),
        [Reply.text("NO")], done(verdict="no"),
        about="BranchingNode after an LlmNode; EndNode output defaults",
    )  # fmt: skip


def subflow_cases() -> Iterator[Case]:
    s, e = "start", "end"
    doubled = prop("doubled", "integer")
    inner = flow(
        "inner",
        {
            s: start(prop("number", "integer")),
            "t": {
                "component_type": "ToolNode",
                "tool": server_tool("double", [prop("number", "integer")], [doubled]),
                "inputs": [prop("number", "integer")],
                "outputs": [doubled],
            },
            e: end(doubled),
        },
        chain(s, "t", e),
        [(s, "number", "t", "number"), ("t", "doubled", e, "doubled")],
    )
    numbers = prop("numbers", "array", items={"type": "integer"})
    collected = prop("collected_doubled", "array", items={"type": "integer"})
    for kind in ("MapNode", "ParallelMapNode"):
        yield Case(
            f"{kind.lower()}_over_a_list",
            flow("f", {s: start(numbers), "each": {"component_type": kind, "subflow": inner,
                 "inputs": [iterated("iterated_number", "integer")],
                 "outputs": [collected]}, e: end(collected)},
                 chain(s, "each", e), [(s, "numbers", "each", "iterated_number"),
                                       ("each", "collected_doubled", e, "collected_doubled")]),
            [], done(collected_doubled=[2, 4, 6]), inputs={"numbers": [1, 2, 3]},
            about="MapNode / ParallelMapNode, append reducer",
        )  # fmt: skip
    total = prop("collected_doubled", "integer")
    yield Case(
        "mapnode_sum_reducer",
        flow("f", {s: start(numbers), "each": {"component_type": "MapNode", "subflow": inner,
             "reducers": {"doubled": "sum"},
             "inputs": [iterated("iterated_number", "integer")],
             "outputs": [total]}, e: end(total)},
             chain(s, "each", e), [(s, "numbers", "each", "iterated_number"),
                                   ("each", "collected_doubled", e, "collected_doubled")]),
        [], done(collected_doubled=12), inputs={"numbers": [1, 2, 3]},
        about="MapNode sum reducer",
    )  # fmt: skip
    word = prop("word")
    pair = flow(
        "pair",
        {
            s: start(prop("number", "integer"), word),
            "say": {
                "component_type": "LlmNode",
                "llm_config": llm(),
                "prompt_template": "Say {{word}} {{number}}.",
                "inputs": [word, prop("number", "integer")],
                "outputs": [prop("generated_text")],
            },
            e: end(prop("generated_text")),
        },
        chain(s, "say", e),
        [
            (s, "word", "say", "word"),
            (s, "number", "say", "number"),
            ("say", "generated_text", e, "generated_text"),
        ],
    )
    said = prop("collected_generated_text", "array", items={"type": "string"})
    yield Case(
        "mapnode_scalar_iterated_input_is_broadcast",
        flow("f", {s: start(numbers, word), "each": {"component_type": "MapNode",
             "subflow": pair,
             "inputs": [iterated("iterated_number", "integer"),
                        iterated("iterated_word", "string")], "outputs": [said]}, e: end(said)},
             chain(s, "each", e), [(s, "numbers", "each", "iterated_number"),
                                   (s, "word", "each", "iterated_word"),
                                   ("each", "collected_generated_text", e,
                                    "collected_generated_text")]),
        [Reply.text("one"), Reply.text("two")], done(collected_generated_text=["one", "two"]),
        inputs={"numbers": [1, 2], "word": "item"},
        sent=["Say item 1.", "Say item 2."],
        about="issue 22 §2: a scalar iterated_ input goes to every item",
    )  # fmt: skip
    yield Case(
        "flownode_runs_a_sub_flow",
        flow("f", {s: start(prop("number", "integer")), "sub": {"component_type": "FlowNode",
             "subflow": inner, "inputs": [prop("number", "integer")], "outputs": [doubled]},
             e: end(doubled)},
             chain(s, "sub", e), [(s, "number", "sub", "number"),
                                  ("sub", "doubled", e, "doubled")]),
        [], done(doubled=14), inputs={"number": 7},
        about="FlowNode",
    )  # fmt: skip
    loud = prop("loud")
    shout = flow(
        "loud",
        {
            s: start(prop("text")),
            "t": {
                "component_type": "ToolNode",
                "tool": server_tool("shout", [prop("text")], [loud]),
                "inputs": [prop("text")],
                "outputs": [loud],
            },
            e: end(loud),
        },
        chain(s, "t", e),
        [(s, "text", "t", "text"), ("t", "loud", e, "loud")],
    )
    yield Case(
        "parallelflownode_runs_both_sub_flows",
        flow("f", {s: start(prop("number", "integer"), prop("text")),
             "both": {"component_type": "ParallelFlowNode", "subflows": [inner, shout],
                      "inputs": [prop("number", "integer"), prop("text")],
                      "outputs": [doubled, loud]}, e: end(doubled, loud)},
             chain(s, "both", e), [(s, "number", "both", "number"), (s, "text", "both", "text"),
                                   ("both", "doubled", e, "doubled"),
                                   ("both", "loud", e, "loud")]),
        [], done(doubled=4, loud="GO"), inputs={"number": 2, "text": "go"},
        about="ParallelFlowNode",
    )  # fmt: skip


def message_cases() -> Iterator[Case]:
    s, e = "start", "end"
    got = prop("user_input")
    yield Case(
        "input_and_output_messages",
        flow("f", {s: start(), "ask": {"component_type": "InputMessageNode",
             "message": "Your name?", "outputs": [got]},
             "greet": {"component_type": "OutputMessageNode", "message": "Hello {{name}}!",
                       "inputs": [prop("name")]},
             e: end(got)},
             chain(s, "ask", "greet", e), [("ask", "user_input", "greet", "name"),
                                           ("ask", "user_input", e, "user_input")]),
        [], {"finished": True, "outputs": {"user_input": "Ada"}, "said": ["Your name?"]},
        messages=["Ada"],
        about="InputMessageNode, OutputMessageNode",
    )  # fmt: skip
    nodes = {
        s: start(),
        "ask": {"component_type": "InputMessageNode", "message": "Say yes.", "outputs": [got]},
        "check": {"component_type": "BranchingNode", "mapping": {"yes": "DONE"},
                  "inputs": [prop("branching_mapping_key")]},
        e: end(got),
    }  # fmt: skip
    yield Case(
        "a_loop_asks_again_until_the_answer_is_right",
        flow("f", nodes, [(s, "ask"), ("ask", "check"), ("check", e, "DONE"),
                          ("check", "ask", "default")],
             [("ask", "user_input", "check", "branching_mapping_key"),
              ("ask", "user_input", e, "user_input")]),
        [], {"finished": True, "outputs": {"user_input": "yes"},
             "said": ["Say yes.", "Say yes."]},
        messages=["no", "yes"],
        about="a control loop through a BranchingNode",
    )  # fmt: skip
    yield from api_cases()


def api_cases() -> Iterator[Case]:
    s, e = "start", "end"
    weather = prop("weather")
    yield Case(
        "apinode_one_output_read_by_name",
        flow("f", {s: start(prop("city")), "api": {"component_type": "ApiNode",
             "url": API_URL + "/weather?city={{city}}", "http_method": "GET",
             "inputs": [prop("city")], "outputs": [weather]}, e: end(weather)},
             chain(s, "api", e), [(s, "city", "api", "city"),
                                  ("api", "weather", e, "weather")]),
        [], done(weather="Sunny"), inputs={"city": "Oslo"},
        about="issue 22 §2: outputs mapped by name (ApiNode)",
    )  # fmt: skip
    body = prop("body")
    yield Case(
        "apinode_raw_string_body_is_sent_as_it_is",
        flow("f", {s: start(prop("note")), "api": {"component_type": "ApiNode",
             "url": API_URL + "/echo", "http_method": "POST", "data": "note={{note}}",
             "headers": {"Content-Type": "text/plain"},
             "inputs": [prop("note")], "outputs": [body]}, e: end(body)},
             chain(s, "api", e), [(s, "note", "api", "note"), ("api", "body", e, "body")]),
        [], done(body="text/plain|note=hi"), inputs={"note": "hi"},
        about="issue 22 §2: a raw-string ApiNode body",
    )  # fmt: skip


def agent_node_cases() -> Iterator[Case]:
    s, e = "start", "end"
    city = prop("city")

    def one_agent(name: str, **extra: Any) -> dict[str, Any]:
        found = agent(name, "Find the user's city.", outputs=[city], **extra)
        return flow("f", {s: start(), "an": {"component_type": "AgentNode", "agent": found,
                    "outputs": [city]}, e: end(city)},
                    chain(s, "an", e), [("an", "city", e, "city")])  # fmt: skip

    yield Case(
        "agent_node_submits_its_outputs",
        one_agent("finder"),
        [submit(city="Oslo")],
        done(city="Oslo"),
        about="AgentNode with outputs: the agent fills them before it terminates",
    )
    yield Case(
        "agent_node_text_reply_waits_for_the_user",
        one_agent("finder"),
        [Reply.text("Which city do you live in?"), submit(city="Oslo")],
        {"finished": True, "outputs": {"city": "Oslo"}, "said": ["Which city do you live in?"]},
        messages=["Oslo"],
        sent=["Which city do you live in?"],
        about="answer contract: a text reply is a message to the user (human_in_the_loop)",
    )
    yield Case(
        "agent_node_without_human_in_the_loop_does_not_wait",
        one_agent("finder", human_in_the_loop=False),
        [Reply.text("Which city?"), submit(city="Paris")],
        done(city="Paris"),
        about="answer contract: human_in_the_loop false never waits for the user",
    )
    weather = prop("weather")
    tool = server_tool("get_weather", [prop("city")], [weather])
    yield Case(
        "agent_node_calls_a_server_tool_then_submits",
        flow("f", {s: start(), "an": {"component_type": "AgentNode",
             "agent": agent("forecaster", "Report the weather in Oslo.", outputs=[weather],
                            tools=[tool]),
             "outputs": [weather]}, e: end(weather)},
             chain(s, "an", e), [("an", "weather", e, "weather")]),
        [Reply.calls(ToolCall("get_weather", {"city": "Oslo"})),
         submit(weather="Sunny in Oslo")],
        done(weather="Sunny in Oslo"),
        sent=["Sunny in Oslo"],
        about="Agent with a ServerTool",
    )  # fmt: skip
    got = prop("user_input")
    yield Case(
        "agent_node_sees_the_flow_conversation",
        flow("f", {s: start(), "ask": {"component_type": "InputMessageNode",
             "message": "What is your order number?", "outputs": [got]},
             "an": {"component_type": "AgentNode",
                    "agent": agent("helper", "Help with the order.", outputs=[prop("reply")]),
                    "outputs": [prop("reply")]}, e: end(prop("reply"))},
             chain(s, "ask", "an", e), [("an", "reply", e, "reply")]),
        [submit(reply="Order A7 has shipped.")],
        {"finished": True, "outputs": {"reply": "Order A7 has shipped."},
         "said": ["What is your order number?"]},
        messages=["A7"],
        sent=["A7"],
        about="issue 22 §2: an AgentNode sees the flow's conversation",
    )  # fmt: skip
    yield Case(
        "agent_node_client_tool",
        flow("f", {s: start(), "an": {"component_type": "AgentNode",
             "agent": agent("signer", "Sign the lease.", outputs=[prop("status")],
                            tools=[{"component_type": "ClientTool", "name": "sign",
                                    "description": "Sign a document.",
                                    "inputs": [prop("document")]}]),
             "outputs": [prop("status")]}, e: end(prop("status"))},
             chain(s, "an", e), [("an", "status", e, "status")]),
        [Reply.calls(ToolCall("sign", {"document": "lease.pdf"})), submit(status="signed")],
        done(status="signed"),
        client_results={"sign": "signed by Ada"},
        sent=["signed by Ada"],
        about="ClientTool in an Agent: the host runs it",
    )  # fmt: skip
    yield Case(
        "agent_node_without_outputs_answers_with_text",
        flow("f", {s: start(), "an": {"component_type": "AgentNode",
             "agent": agent("talker", "Say hello."), "outputs": []}, e: end()},
             chain(s, "an", e), []),
        [Reply.text("Hello!")],
        done(),
        about="AgentNode without outputs: the agent terminates after its task",
    )  # fmt: skip


def root_agent_cases() -> Iterator[Case]:
    chat = agent("concierge", "You are a hotel concierge.")
    yield Case(
        "root_agent_speaks_first",
        chat, [Reply.text("Hello, I am the concierge."), Reply.text("Welcome, Ada.")],
        {"finished": False, "outputs": None,
         "said": ["Hello, I am the concierge.", "Welcome, Ada."]},
        messages=["Hi, I am Ada."],
        about="issue 22 §2: a root Agent's first turn",
    )  # fmt: skip
    yield Case(
        "root_agent_answers_the_user_s_first_message",
        chat, [Reply.text("Welcome, Ada."), Reply.text("Room 12.")],
        {"finished": False, "outputs": None, "said": ["Welcome, Ada.", "Room 12."]},
        messages=["Hi, I am Ada.", "Which room?"], user_first=True,
        sent=["Which room?"],
        about="root Agent, multi-turn conversation",
    )  # fmt: skip
    yield Case(
        "root_agent_with_inputs_in_its_system_prompt",
        agent("expert", "You are an expert in {{domain}}.", inputs=[prop("domain")]),
        [Reply.text("Ask me about kopf.")],
        {"finished": False, "outputs": None, "said": ["Ask me about kopf."]},
        inputs={"domain": "operators"},
        sent=["operators"],
        about="Agent inputs as system prompt placeholders",
    )  # fmt: skip
    weather = prop("weather")
    yield Case(
        "root_agent_uses_a_server_tool",
        agent("forecaster", "Report the weather.",
              tools=[server_tool("get_weather", [prop("city")], [weather])]),
        [Reply.calls(ToolCall("get_weather", {"city": "Oslo"})), Reply.text("Sunny in Oslo.")],
        {"finished": False, "outputs": None, "said": ["Sunny in Oslo."]},
        messages=["Weather in Oslo?"], user_first=True,
        sent=["Sunny in Oslo"],
        about="root Agent with a ServerTool",
    )  # fmt: skip
    yield Case(
        "root_agent_with_outputs_finishes_when_it_submits",
        agent("booker", "Find the date of the stay.", outputs=[prop("date")]),
        [Reply.text("For which date?"), submit(date="May 3")],
        {"finished": True, "outputs": {"date": "May 3"}, "said": ["For which date?"]},
        messages=["I want a room.", "May 3."], user_first=True,
        sent=["May 3."],
        about="answer contract at the root: text is a message, submitting finishes",
    )  # fmt: skip
    yield Case(
        "root_agent_submission_fills_a_default",
        agent("booker", "Find the date of the stay.",
              outputs=[prop("date"), prop("nights", "integer", default=1)]),
        [submit(date="May 3")],
        done(date="May 3", nights=1),
        messages=["A room on May 3."], user_first=True,
        about="answer contract: an output left out takes its default",
    )  # fmt: skip


def all_cases() -> list[Case]:
    return [*flow_cases(), *agent_node_cases(), *root_agent_cases()]


# -- the loopback API for ApiNodes ------------------------------------------------------------


class _Api(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply({"temperature": 22, "weather": "Sunny"})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        self._reply({"body": f"{self.headers.get('Content-Type')}|{raw}"})


# -- running ----------------------------------------------------------------------------------


def _tools() -> dict[str, Callable[..., Any]]:
    path = Path(__file__).with_name("agentspec_conformance_tools.py")
    spec = importlib.util.spec_from_file_location("agentspec_conformance_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    public = {n: f for n, f in vars(module).items() if not n.startswith("_")}
    mine = module.__name__
    return {n: f for n, f in public.items() if inspect.isfunction(f) and f.__module__ == mine}


def run_agentflows(
    wire: dict[str, Any], env: dict[str, str], tools: dict[str, Callable[..., Any]]
) -> dict[str, Any]:
    """Drive one case on agentflows' conversation API, as the WayFlow driver does."""
    kind = conversation.StatusKind
    try:
        conv = conversation.Conversation.load(wire["doc"], wire["inputs"], env, tools=tools)
    except Exception as exc:
        return {"finished": False, "outputs": None, "said": [], "error": repr(exc)[:600]}
    messages = list(wire["messages"])
    if wire["user_first"] and messages:
        conv.append_user_message(messages.pop(0))
    said: list[str] = []
    for _ in range(MAX_STEPS):
        status = conv.execute_sync()
        if status.kind == kind.FINISHED:
            return {"finished": True, "outputs": status.outputs, "said": said}
        if status.kind == kind.USER_INPUT:
            turn_answer = conv.is_agent and not conv.submits and status.outputs is not None
            said.append(str(status.outputs) if turn_answer else status.message)
            if not messages:
                return {"finished": False, "outputs": None, "said": said}
            conv.append_user_message(messages.pop(0))
        elif status.kind == kind.TOOL_REQUEST:
            for call in status.tool_requests:
                conv.post_tool_result(call.id, wire["client_results"].get(call.name))
        elif status.kind == kind.CONFIRMATION:
            conv.confirm(approve=True)
        else:
            return {"finished": False, "outputs": None, "said": said, "error": status.message}
    return {"finished": False, "outputs": None, "said": said, "error": "too many steps"}


def _on_wayflow(driver: subprocess.Popen[str] | None, wire: dict[str, Any]) -> dict[str, Any]:
    """One case through the WayFlow driver subprocess (a line of JSON each way)."""
    assert driver is not None and driver.stdin is not None and driver.stdout is not None
    driver.stdin.write(json.dumps(wire) + "\n")
    driver.stdin.flush()
    result: dict[str, Any] = json.loads(driver.stdout.readline())
    return result


def _normal(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in ("finished", "outputs", "said")}


def _sent_all(server: ScriptedModelServer, texts: list[str]) -> bool:
    bodies = [json.dumps(r.body, ensure_ascii=False) for r in server.requests]
    return all(any(t in b for b in bodies) for t in texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--wayflow-python",
        default=os.environ.get("WAYFLOW_PYTHON"),
        help="python of an environment with wayflowcore 26.3.1 (default: $WAYFLOW_PYTHON)",
    )
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument(
        "--agentflows-only", action="store_true", help="run agentflows alone (no WayFlow)"
    )
    parser.add_argument("-v", action="store_true", help="print each result that differs")
    args = parser.parse_args()
    if not args.wayflow_python and not args.agentflows_only:
        parser.error("give --wayflow-python (or WAYFLOW_PYTHON): see bench/README.md")
    cases = [c for c in all_cases() if args.k in c.name]
    tools = _tools()
    server = ScriptedModelServer().start()
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    api_url = f"http://127.0.0.1:{api.server_address[1]}"
    runtimes = ["agentflows"] if args.agentflows_only else ["agentflows", "wayflow"]
    driver = None
    if not args.agentflows_only:
        driver = subprocess.Popen(
            [args.wayflow_python, str(Path(__file__).with_name("agentspec_wayflow_driver.py"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "OPENAI_API_KEY": "sk-unused"},
        )  # fmt: skip
    passed = {"agentflows": 0, "wayflow": 0}
    try:
        for case in cases:
            wire = case.wire(server.url, api_url)
            verdicts = {"wayflow": "-   "}
            for runtime in runtimes:
                server.requests.clear()
                server.script(*case.script)
                if runtime == "agentflows":
                    result = run_agentflows(wire, server.env, tools)
                else:
                    result = _on_wayflow(driver, wire)
                ok = _normal(result) == case.expected and _sent_all(server, case.sent)
                passed[runtime] += ok
                verdicts[runtime] = "ok  " if ok else "FAIL"
                if not ok and args.v:
                    print(f"    {runtime}: {json.dumps(result, default=str)[:400]}")
                server.drop_script()  # replies a runtime did not ask for
            print(f"{case.name:<52} agentflows {verdicts['agentflows']}  "
                  f"wayflow {verdicts['wayflow']}  ({case.about})")  # fmt: skip
    finally:
        if driver is not None and driver.stdin is not None:
            driver.stdin.close()
            driver.wait(timeout=60)
        server.stop()
        api.shutdown()
    total = len(cases)
    if args.agentflows_only:
        print(f"\n{total} cases: agentflows {passed['agentflows']}/{total} passed")
    else:
        print(
            f"\n{total} cases: agentflows {passed['agentflows']}/{total} passed, wayflowcore "
            f"26.3.1 {passed['wayflow']}/{total} passed (same run, same model script)"
        )
    sys.exit(0 if passed["agentflows"] == total else 1)


if __name__ == "__main__":
    main()
