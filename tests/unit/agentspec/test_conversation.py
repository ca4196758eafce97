"""The conversation API: a host drives an Agent Spec document step by step, over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflows.agents import answer
from agentflows.agentspec import conversation
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.agentspec.conftest import served

Kind = conversation.StatusKind


def _load(
    name: str, tmp_path: Path, server: ScriptedModelServer, **inputs: object
) -> conversation.Conversation:
    return conversation.Conversation.from_file(served(name, tmp_path, server), inputs, server.env)


def sent(server: ScriptedModelServer, request: int) -> list[tuple[str, object]]:
    """(role, content) of each message of the model request numbered ``request``."""
    return [(m["role"], m.get("content")) for m in server.requests[request].messages]


def test_a_flow_asks_the_user_calls_the_host_s_client_tool_and_finishes_with_its_messages(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("support_chat.yaml", tmp_path, model_server)
    status = conv.execute_sync()
    assert (status.kind, status.message) == (Kind.USER_INPUT, "What is your order number?")
    conv.append_user_message("A7")
    model_server.script(
        Reply.calls(ToolCall("order_status", {"order": "A7"}, id="c1")),
        Reply.calls(ToolCall("submit_result", {"answer": "Order A7 has shipped."})),
    )
    status = conv.execute_sync()
    assert status.kind == Kind.TOOL_REQUEST
    assert status.tool_requests == [conversation.ToolRequest("c1", "order_status", {"order": "A7"})]
    conv.post_tool_result("c1", {"status": "shipped"})
    status = conv.execute_sync()
    assert status.kind == Kind.FINISHED
    assert status.outputs == {"answer": "Order A7 has shipped."}
    assert model_server.requests[1].messages[-1]["content"] == '{"status": "shipped"}'
    assert [(m.role, m.content) for m in conv.messages] == [
        ("assistant", "What is your order number?"),
        ("user", "A7"),
        ("assistant", "Looking up order A7."),
        ("assistant", "Answer: Order A7 has shipped."),  # the agent submitted, said nothing
    ]


def test_an_agent_node_sees_the_flow_s_conversation_so_far(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # As WayFlow 26.3.1 gives an AgentNode the flow's messages: the question asked, the user's
    # answer and the OutputMessageNode's message come before the node's own input lines.
    conv = _load("support_chat.yaml", tmp_path, model_server)
    conv.execute_sync()
    conv.append_user_message("A7")
    model_server.script(Reply.calls(ToolCall("submit_result", {"answer": "It has shipped."})))
    assert conv.execute_sync().kind == Kind.FINISHED
    assert sent(model_server, 0) == [
        ("system", "You answer questions about order <order>."),
        ("assistant", "What is your order number?"),
        ("user", "A7"),
        ("assistant", "Looking up order A7."),
        ("user", "order: A7"),
    ]


def test_a_root_agent_keeps_its_conversation_between_turns(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("chat_agent.yaml", tmp_path, model_server)
    conv.append_user_message("Hi, I am Ada.")  # the user speaks first
    model_server.script(Reply.text("Welcome, Ada."))
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.USER_INPUT, "Welcome, Ada.")
    conv.append_user_message("Is a room free on May 3?")
    model_server.script(
        Reply.calls(ToolCall("room_free", {"date": "May 3"}, id="r1")),
        Reply.text("Yes, Ada, a room is free on May 3."),
    )
    status = conv.execute_sync()
    assert status.kind == Kind.TOOL_REQUEST
    assert status.tool_requests[0].name == "room_free"
    conv.post_tool_result("r1", True)
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.USER_INPUT, "Yes, Ada, a room is free on May 3.")
    second_turn = sent(model_server, 1)
    assert second_turn == [
        ("system", "You are a hotel concierge."),
        ("user", "Hi, I am Ada."),
        ("assistant", "Welcome, Ada."),
        ("user", "Is a room free on May 3?"),
    ]
    assert [m.content for m in conv.messages][-2:] == [
        "Is a room free on May 3?",
        "Yes, Ada, a room is free on May 3.",
    ]


def test_a_root_agent_started_before_any_user_message_speaks_first(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # As WayFlow 26.3.1 does for an Agent Spec Agent (no initial_message): the model is asked
    # with the system prompt alone, its answer opens the conversation, then the user replies.
    conv = _load("chat_agent.yaml", tmp_path, model_server)
    model_server.script(Reply.text("Hello, I am the concierge."), Reply.text("Welcome, Ada."))
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.USER_INPUT, "Hello, I am the concierge.")
    first = sent(model_server, 0)
    assert first == [("system", "You are a hotel concierge.")]
    conv.append_user_message("Hi, I am Ada.")
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.USER_INPUT, "Welcome, Ada.")
    second = sent(model_server, 1)
    assert second == [
        ("system", "You are a hotel concierge."),
        ("assistant", "Hello, I am the concierge."),
        ("user", "Hi, I am Ada."),
    ]
    assert [(m.role, m.content) for m in conv.messages] == [
        ("assistant", "Hello, I am the concierge."),
        ("user", "Hi, I am Ada."),
        ("assistant", "Welcome, Ada."),
    ]


def test_a_confirmed_client_tool_node_asks_to_confirm_then_for_the_result(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("client_tool_node.yaml", tmp_path, model_server, document="lease.pdf")
    status = conv.execute_sync()
    assert (status.kind, status.message) == (Kind.CONFIRMATION, "Run sign?")
    conv.confirm()
    status = conv.execute_sync()
    assert status.kind == Kind.TOOL_REQUEST
    assert status.tool_requests == [
        conversation.ToolRequest("sign_document", "sign_document", {"document": "lease.pdf"})
    ]
    conv.post_tool_result("sign_document", "sig-42")
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.FINISHED, {"signature": "sig-42"})


def test_an_agent_s_client_tool_requiring_confirmation_is_confirmed_then_requested(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    path = served("chat_agent.yaml", tmp_path, model_server)
    path.write_text(path.read_text() + "    requires_confirmation: true\n")
    conv = conversation.Conversation.from_file(path, {}, model_server.env)
    conv.append_user_message("Book May 3")
    model_server.script(
        Reply.calls(ToolCall("room_free", {"date": "May 3"}, id="r1")),
        Reply.text("Yes."),
        Reply.calls(ToolCall("room_free", {"date": "May 4"}, id="r2")),
        Reply.text("I was not allowed to check May 4."),
    )
    status = conv.execute_sync()
    assert status.kind == Kind.CONFIRMATION
    conv.confirm()
    status = conv.execute_sync()
    assert status.kind == Kind.TOOL_REQUEST
    assert status.tool_requests == [conversation.ToolRequest("r1", "room_free", {"date": "May 3"})]
    conv.post_tool_result("r1", True)
    assert conv.execute_sync().outputs == "Yes."
    conv.append_user_message("And May 4?")
    assert conv.execute_sync().kind == Kind.CONFIRMATION
    conv.confirm(approve=False, comment="not today")
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.USER_INPUT, "I was not allowed to check May 4.")
    told = model_server.requests[3].messages[-1]["content"]
    assert "rejected this call: not today" in told


def test_a_rejected_confirmation_fails_the_conversation(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("client_tool_node.yaml", tmp_path, model_server, document="lease.pdf")
    conv.execute_sync()
    conv.confirm(approve=False, comment="not this one")
    status = conv.execute_sync()
    assert status.kind == Kind.FAILED
    assert "rejected by user: not this one" in status.message


def test_an_answer_the_conversation_is_not_waiting_for_is_refused(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("client_tool_node.yaml", tmp_path, model_server, document="lease.pdf")
    conv.execute_sync()
    with pytest.raises(conversation.ConversationError, match="it is confirmation"):
        conv.append_user_message("hello")
    with pytest.raises(conversation.ConversationError, match="no client tool call 'x'"):
        conv.post_tool_result("x", 1)


def test_an_output_message_after_a_sub_flow_branch_is_in_the_messages(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("triage.yaml", tmp_path, model_server, ticket="db down")
    model_server.script(Reply.text("URGENT"))
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.FINISHED, {"note": "URGENT"})
    assert [(m.role, m.content) for m in conv.messages] == [("assistant", "Paging on-call: URGENT")]


def test_a_manager_hands_a_task_to_a_specialised_worker_that_uses_its_added_tool(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("crew.yaml", tmp_path, model_server)
    conv.append_user_message("A haiku about rain, please.")
    model_server.script(
        Reply.calls(ToolCall("call_sub_agent", {"agent": "writer", "prompt": "haiku: rain"})),
        Reply.calls(ToolCall("syllables", {"line": "soft rain on the roof"})),
        Reply.text("soft rain on the roof"),
        Reply.text("Here it is: soft rain on the roof"),
    )
    status = conv.execute_sync()
    assert status.outputs == "Here it is: soft rain on the roof"
    lead, writer = model_server.requests[0].messages, model_server.requests[1].messages
    assert lead[0]["content"] == "You lead a small writing team; give the drafting to the writer."
    assert writer[0]["content"] == (
        "You write clear prose.\n\nWrite haiku only; count syllables with the tool."
    )
    assert model_server.requests[2].messages[-1]["content"] == "5"


def test_two_client_calls_in_one_reply_each_get_their_own_result(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("chat_agent.yaml", tmp_path, model_server)
    conv.append_user_message("Any room on May 3 or May 4?")
    model_server.script(
        Reply.calls(
            ToolCall("room_free", {"date": "May 3"}, id="a"),
            ToolCall("room_free", {"date": "May 4"}, id="b"),
        ),
        Reply.text("Only May 4."),
    )
    status = conv.execute_sync()
    assert [c.id for c in status.tool_requests] == ["a", "b"]
    conv.post_tool_result("a", False)
    status = conv.execute_sync()
    assert (status.kind, [c.id for c in status.tool_requests]) == (Kind.TOOL_REQUEST, ["b"])
    conv.post_tool_result("b", True)
    assert conv.execute_sync().outputs == "Only May 4."
    results = [m["content"] for m in model_server.requests[1].messages if m["role"] == "tool"]
    assert results == ["false", "true"]


def _offered(request: object) -> list[str]:
    return [t["function"]["name"] for t in getattr(request, "body", {}).get("tools") or []]


def test_an_agent_node_that_must_submit_shows_a_text_reply_to_the_user_and_goes_on(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The node's agent declares an output: as in WayFlow 26.3.1, a text reply does not finish
    # the node, it is shown to the user and the agent goes on with the user's next message.
    conv = _load("support_chat.yaml", tmp_path, model_server)
    conv.execute_sync()
    conv.append_user_message("A7")
    model_server.script(Reply.text("The blue jacket?"))
    status = conv.execute_sync()
    assert (status.kind, status.message) == (Kind.USER_INPUT, "The blue jacket?")
    conv.append_user_message("Yes, the blue one.")
    model_server.script(
        Reply.calls(ToolCall("submit_result", {"answer": "The blue jacket has shipped."}))
    )
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (
        Kind.FINISHED,
        {"answer": "The blue jacket has shipped."},
    )
    assert _offered(model_server.requests[0]) == ["order_status", "submit_result"]
    assert sent(model_server, 1)[-2:] == [
        ("assistant", "The blue jacket?"),
        ("user", "Yes, the blue one."),
    ]
    assert [(m.role, m.content) for m in conv.messages][2:] == [
        ("assistant", "Looking up order A7."),
        ("assistant", "The blue jacket?"),
        ("user", "Yes, the blue one."),
        ("assistant", "Answer: The blue jacket has shipped."),
    ]


def test_an_agent_node_without_human_in_the_loop_is_reminded_to_submit_instead_of_asking(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    path = served("support_chat.yaml", tmp_path, model_server)
    path.write_text(
        path.read_text().replace(
            "name: order-helper", "name: order-helper\n      human_in_the_loop: false"
        )
    )
    conv = conversation.Conversation.from_file(path, {}, model_server.env)
    conv.execute_sync()
    conv.append_user_message("A7")
    model_server.script(
        Reply.text("Which item?"),
        Reply.calls(ToolCall("submit_result", {"answer": "Order A7 has shipped."})),
    )
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.FINISHED, {"answer": "Order A7 has shipped."})
    assert _offered(model_server.requests[0]) == ["order_status", "submit_result"]
    assert sent(model_server, 1)[-2:] == [
        ("assistant", "Which item?"),
        ("user", answer.REMINDER),
    ]


def test_a_submission_that_does_not_match_the_outputs_is_refused_and_the_agent_goes_on(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("support_chat.yaml", tmp_path, model_server)
    conv.execute_sync()
    conv.append_user_message("A7")
    model_server.script(
        Reply.calls(ToolCall("submit_result", {"status": "shipped"})),
        Reply.calls(ToolCall("submit_result", {"answer": "Shipped."})),
    )
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.FINISHED, {"answer": "Shipped."})
    refused = model_server.requests[1].messages[-1]
    assert refused["role"] == "tool"
    assert "arguments of submit_result do not match its schema" in refused["content"]
    assert "'answer' is a required property" in refused["content"]


def test_a_root_agent_with_outputs_converses_until_it_submits_them_then_finishes(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # WayFlow 26.3.1: a root Agent that declares outputs answers text as a message (the
    # conversation waits for the user) and finishes, with the outputs, when it submits them.
    path = served("chat_agent.yaml", tmp_path, model_server)
    path.write_text(path.read_text() + "outputs: [{title: date, type: string}]\n")
    conv = conversation.Conversation.from_file(path, {}, model_server.env)
    conv.append_user_message("I want a room.")
    model_server.script(
        Reply.text("For which date?"),
        Reply.calls(ToolCall("submit_result", {"date": "May 3"})),
    )
    status = conv.execute_sync()
    assert (status.kind, status.message) == (Kind.USER_INPUT, "For which date?")
    conv.append_user_message("May 3, please.")
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.FINISHED, {"date": "May 3"})
    assert conv.execute_sync() == status  # finished: nothing more runs
    assert sent(model_server, 1) == [
        ("system", "You are a hotel concierge."),
        ("user", "I want a room."),
        ("assistant", "For which date?"),
        ("user", "May 3, please."),
    ]
    assert [(m.role, m.content) for m in conv.messages] == [
        ("user", "I want a room."),
        ("assistant", "For which date?"),
        ("user", "May 3, please."),
    ]
    with pytest.raises(conversation.ConversationError):
        conv.append_user_message("And a taxi?")


def test_messages_of_a_loop_include_every_iteration_s_question_answer_and_message(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    conv = _load("guess_loop.yaml", tmp_path, model_server)
    for guess in ("7", "13"):
        assert conv.execute_sync().kind == Kind.USER_INPUT
        conv.append_user_message(guess)
    assert conv.execute_sync().kind == Kind.USER_INPUT
    conv.append_user_message("42")
    status = conv.execute_sync()
    assert (status.kind, status.outputs) == (Kind.FINISHED, {"guess": "42"})
    assert [(m.role, m.content) for m in conv.messages] == [
        ("assistant", "Guess the number."),
        ("user", "7"),
        ("assistant", "7 is wrong."),
        ("assistant", "Guess the number."),
        ("user", "13"),
        ("assistant", "13 is wrong."),
        ("assistant", "Guess the number."),
        ("user", "42"),
    ]
