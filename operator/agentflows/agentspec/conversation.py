"""Drive an Agent Spec document as a conversation: the Python API for hosts.

A host loads a document, starts a conversation with the inputs, and calls :meth:`execute` until
it finishes; whenever the conversation needs something, ``execute`` returns a :class:`Status`
saying what, the host gives it, and calls ``execute`` again::

    conv = conversation.Conversation.load(text, inputs={"order_id": "A7"})
    status = conv.execute_sync()
    while status.kind != conversation.StatusKind.FINISHED:
        if status.kind == conversation.StatusKind.USER_INPUT:
            conv.append_user_message(input(status.message))
        elif status.kind == conversation.StatusKind.TOOL_REQUEST:
            for call in status.tool_requests:
                conv.post_tool_result(call.id, run_my_tool(call.name, call.args))
        elif status.kind == conversation.StatusKind.CONFIRMATION:
            conv.confirm(approve=True)
        else:  # FAILED
            raise SystemExit(status.message)
        status = conv.execute_sync()
    print(conv.messages, status.outputs)

What waits is the engine's human request (the same one a FlowRun holds on a cluster):

- an InputMessageNode asks for a user message (an ``input`` request);
- a ClientTool call asks for its result (a ``tool`` request whose calls say ``client: true``),
  in an Agent or a ToolNode;
- a tool with ``requires_confirmation`` asks for a confirmation (a ``tool`` request in an Agent,
  an ``approval`` before a ToolNode).

A Flow runs as one engine run in memory; each answer is written as the request's decision and
the run resumes from its checkpoint, never re-running a finished node. :attr:`messages` lists
what the conversation said: InputMessageNode questions and the user's answers, OutputMessageNode
messages and AgentNode answers, in the order the nodes ran.

An Agent at the root is multi-turn: it answers a user message and waits for the next one.
Started before any user message, it speaks first (the model is asked with the system prompt
alone, as WayFlow does for an Agent Spec Agent), and then waits. Each turn is one run of the
imported one-agent Flow whose Agent carries the conversation so far as its ``history`` (user
and assistant messages), so the agent keeps its conversation between turns; client tools and
confirmations pause a turn the same way.

A Swarm at the root is such an Agent (its first agent) whose members reach each other through
``call_sub_agent`` (a message, answered to the caller) and ``handoff_conversation``: the engine's
agent turn hands the conversation over (:mod:`agentflows.agents.handoff`), and the recipient
answers in the caller's place. The Agent answering is the run's state (the node's record), so
the next turn starts with it (:attr:`Conversation.active_agent`) until it hands over in turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentflows.agents import host
from agentflows.agentspec import components, implementations, importer
from agentflows.api import agent as agent_api
from agentflows.api import errors, times
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.engine import graph, run, store

Kind = flowrun_api.RequestKind
#: Who decides a request answered through this API, recorded in ``decidedBy``.
USER = "user"


class ConversationError(errors.AgentflowsError):
    """The host asked for something the conversation is not waiting for."""


class StatusKind(enum.StrEnum):
    """Why :meth:`Conversation.execute` returned."""

    #: The flow reached an EndNode (``outputs`` holds its outputs).
    FINISHED = "finished"
    #: A user message is needed: an InputMessageNode, or an Agent awaiting its next turn.
    USER_INPUT = "user_input"
    #: Client tools were called: post each result with :meth:`Conversation.post_tool_result`.
    TOOL_REQUEST = "tool_request"
    #: A tool call waits for a confirmation: :meth:`Conversation.confirm`.
    CONFIRMATION = "confirmation"
    #: The run failed (``message`` says why); the conversation cannot go on.
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """One tool call waiting for the host: the call id, the tool's name and its arguments."""

    id: str
    name: str
    args: Any


@dataclasses.dataclass(frozen=True)
class Message:
    """One message of the conversation."""

    role: str
    content: str


@dataclasses.dataclass(frozen=True)
class Status:
    """What the conversation needs next, or how it ended."""

    kind: StatusKind
    #: The question asked, the confirmation message, or why the run failed.
    message: str = ""
    tool_requests: list[ToolRequest] = dataclasses.field(default_factory=list)
    #: The flow's outputs once FINISHED (an Agent's: its last answer).
    outputs: Any = None


def _text(value: Any) -> str:
    """A value as a message shows it (a string as it is, else JSON), as ``{{ }}`` renders."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class Conversation:
    """One conversation over an imported Agent Spec document (see module docstring)."""

    def __init__(
        self,
        imported: importer.Imported,
        inputs: Mapping[str, Any] | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self.imported = imported
        self.inputs = dict(inputs or {})
        self.env = env
        self.store = store.MemoryStore()
        self.status: Status | None = None
        #: The turns of a root Agent's finished runs (a Flow's messages come from its run).
        self._turns: list[Message] = []
        self._pending_message: str | None = None
        self._turn = 0
        #: Request id -> the client tool results posted so far (sent once all are in).
        self._results: dict[str, dict[str, Any]] = {}
        #: The Agent a Swarm's last turn ended with, read from the run (None: the first agent).
        self._active: str | None = None

    @classmethod
    def load(
        cls,
        text: str,
        inputs: Mapping[str, Any] | None = None,
        env: Mapping[str, str] = os.environ,
        tools: Mapping[str, Callable[..., Any]] | None = None,
    ) -> Conversation:
        """A conversation over an Agent Spec document (SpecInvalid when it cannot run).

        ``tools`` implements ServerTools by name (``{"get_weather": get_weather}``): each
        function, sync or async, defined at the top level of a module, is called with the
        tool's inputs as keyword arguments; its return value is the tool's result (an object
        holding the outputs by name, or the one output's value). ModuleError for another
        callable.
        """
        impl = implementations.Implementations.of_callables(tools or {})
        return cls(importer.import_text(text, impl), inputs, env)

    @classmethod
    def from_file(
        cls,
        path: Path,
        inputs: Mapping[str, Any] | None = None,
        env: Mapping[str, str] = os.environ,
        tools: Mapping[str, Callable[..., Any]] | None = None,
    ) -> Conversation:
        """A conversation over the Agent Spec document in ``path``."""
        return cls.load(path.read_text(encoding="utf-8"), inputs, env, tools)

    @property
    def is_agent(self) -> bool:
        """True when the document's root is an Agent (a multi-turn conversation)."""
        return self.imported.root == "Agent"

    @property
    def submits(self) -> bool:
        """True for a root Agent that declares outputs: it finishes when it submits them."""
        call = self.imported.flows[self.imported.flow].spec.nodes[0].agent
        return self.is_agent and call is not None and call.answer is not None

    @property
    def active_agent(self) -> str | None:
        """The Agent that answers the next user message (a Swarm's changes on a handoff)."""
        if not self.is_agent:
            return None
        if self._active is not None:
            return self._active
        call = self.imported.flows[self.imported.flow].spec.nodes[0].agent
        return call.name if call is not None else None

    # -- running -------------------------------------------------------------------------

    async def execute(self) -> Status:
        """Run until the conversation finishes or needs something; return what.

        While a request is still unanswered (a client tool result not yet posted) nothing runs:
        the status says again what is missing.
        """
        pending = self._pending()
        if pending is not None:
            self.status = self._waiting(pending[0], pending[1])
            return self.status
        if self.submits and self.status is not None and self.status.kind == StatusKind.FINISHED:
            return self.status
        if self.is_agent and not self._in_turn():
            if self._pending_message is None and (self._turns or self._turn):
                self.status = Status(StatusKind.USER_INPUT, "Your message:")
                return self.status
            if self._pending_message is None:  # started before any user message
                self._pending_message = ""
            self._turn += 1
            self.store = store.MemoryStore()
        outcome = await self._run()
        self._active = self._answering() or self._active
        self.status = self._status(outcome)
        if self.is_agent and not self.submits and outcome.phase == flowrun_api.RunPhase.SUCCEEDED:
            assert self._pending_message is not None
            if self._pending_message:
                self._turns += [Message("user", self._pending_message)]
            self._turns += [Message("assistant", _text(outcome.output))]
            self._pending_message = None
            self.status = Status(StatusKind.USER_INPUT, "Your message:", outputs=outcome.output)
        return self.status

    def _answering(self) -> str | None:
        """The Agent a handoff made answer in the run, as its node's record says (or None)."""
        if not self.is_agent:
            return None
        node = self.imported.flows[self.imported.flow].spec.nodes[0].id
        record = self.store.checkpoint.nodes.get(node)
        detail = record.detail if record is not None else None
        if not isinstance(detail, dict):
            return None
        saved = detail.get("state")
        agent = saved.get("agent") if isinstance(saved, dict) else detail.get("agent")
        return str(agent) if agent else None

    def execute_sync(self) -> Status:
        """:meth:`execute` for callers without an event loop."""
        return asyncio.run(self.execute())

    def _in_turn(self) -> bool:
        outcome = self.store.checkpoint.outcome
        return outcome is not None and outcome.phase == flowrun_api.RunPhase.WAITING

    async def _run(self) -> store.Outcome:
        resolver = self._resolver()
        name = self.imported.flow
        spec = resolver.flow(name)
        assert spec is not None
        compiled = graph.compile_flow(spec, resolver, name=name)
        value = dict(self.inputs)
        if self.is_agent:
            value["message"] = self._pending_message
        return await run.run_flow(
            compiled,
            run_name=f"{name}-{self._turn}",
            input_value=value,
            store_=self.store,
            caps=host.LiveCapabilities(resolver, self.env),
            resolver=resolver,
        )

    def _resolver(self) -> graph.StaticResolver:
        agents = {n: a.spec for n, a in self.imported.agents.items()}
        flows = {n: f.spec for n, f in self.imported.flows.items()}
        if self.is_agent and (self._turns or self._active):
            flows[self.imported.flow], agents = self._next_turn(flows[self.imported.flow], agents)
        return graph.StaticResolver(agents, flows)

    def _next_turn(
        self, spec: flow_api.FlowSpec, agents: dict[str, agent_api.AgentSpec]
    ) -> tuple[flow_api.FlowSpec, dict[str, agent_api.AgentSpec]]:
        """A later (or handed-over) turn: the active Agent carries the conversation so far.

        After the first turn the prompt is the message alone, the first turn (with the input
        lines) being in the history; when the agent spoke first, the lines open the history.
        """
        call = spec.nodes[0].agent
        assert call is not None
        name = self.active_agent or call.name
        update: dict[str, Any] = {"name": name}
        if self._turns:
            lines = [f"{k}: {_text(v)}" for k, v in self._inputs_shown().items()]
            turns = list(self._turns)
            if turns[0].role == "user":
                turns[0] = Message("user", "\n".join([*lines, turns[0].content]))
            elif lines:  # the agent spoke first, given the input lines alone
                turns.insert(0, Message("user", "\n".join(lines)))
            history = [agent_api.HistoryTurn(role=t.role, content=t.content) for t in turns]
            agents = {**agents, name: agents[name].model_copy(update={"history": history})}
            update["prompt"] = "{{ .run.input.message }}"
        node = spec.nodes[0].model_copy(update={"agent": call.model_copy(update=update)})
        return spec.model_copy(update={"nodes": [node]}), agents

    def _inputs_shown(self) -> dict[str, Any]:
        """The Agent's inputs as its first prompt gave them (given, else their defaults)."""
        schema = self.imported.flows[self.imported.flow].spec.input or {}
        shown = {}
        for title, prop in (schema.get("properties") or {}).items():
            if title == "message":
                continue
            shown[title] = self.inputs.get(title, (prop or {}).get("default"))
        return shown

    # -- what the conversation waits for ---------------------------------------------------

    def _pending(self) -> tuple[str, flowrun_api.HumanRequest] | None:
        checkpoint = self.store.checkpoint
        waiting = human_requests.pending_in(checkpoint.requests, checkpoint.nodes)
        return next(iter(waiting.items()), None)

    def _status(self, outcome: store.Outcome) -> Status:
        if outcome.phase == flowrun_api.RunPhase.SUCCEEDED:
            return Status(StatusKind.FINISHED, outputs=outcome.output)
        if outcome.phase != flowrun_api.RunPhase.WAITING:
            return Status(StatusKind.FAILED, outcome.message or "")
        pending = self._pending()
        assert pending is not None
        return self._waiting(*pending)

    def _waiting(self, request_id: str, request: flowrun_api.HumanRequest) -> Status:
        """The status of an unanswered request (client calls already answered left out)."""
        if request.kind == Kind.INPUT:
            return Status(StatusKind.USER_INPUT, request.message)
        calls = _calls(request)
        asked = [ToolRequest(str(c["id"]), str(c["tool"]), c.get("args")) for c in calls]
        if asked and all(c.get("client") for c in calls):
            given = self._results.get(request_id, {})
            left = [call for call in asked if call.id not in given]
            question = _question(left)
            if question is not None:
                return Status(StatusKind.USER_INPUT, _text((question.args or {}).get("question")))
            return Status(StatusKind.TOOL_REQUEST, request.message, left)
        return Status(StatusKind.CONFIRMATION, request.message, asked)

    # -- answers -------------------------------------------------------------------------

    def append_user_message(self, text: str) -> None:
        """Answer an InputMessageNode, or give a root Agent its next message."""
        pending = self._pending()
        if pending is not None and pending[1].kind == Kind.INPUT:
            self._decide(pending[0], decision=flowrun_api.Decision.RESPOND, data=text)
            return
        if pending is not None:
            given = self._results.get(pending[0], {})
            question = _question(
                [ToolRequest(str(c["id"]), str(c["tool"]), None) for c in _calls(pending[1])
                 if c.get("client") and str(c["id"]) not in given]
            )  # fmt: skip
            if question is not None:
                self.post_tool_result(question.id, text)
                return
        if self.is_agent and pending is None and self._pending_message is None:
            self._pending_message = text
            return
        raise ConversationError(
            f"the conversation is not waiting for a user message ({self._waits()})"
        )

    def post_tool_result(self, call_id: str, result: Any) -> None:
        """Give the result of one client tool call; the request is answered once all are."""
        pending = self._pending()
        calls = _calls(pending[1]) if pending is not None else []
        ids = [str(c["id"]) for c in calls if c.get("client")]
        if pending is None or call_id not in ids:
            raise ConversationError(f"no client tool call {call_id!r} is waiting ({self._waits()})")
        given = self._results.setdefault(pending[0], {})
        given[call_id] = result
        if set(given) == set(ids):
            data = result if len(ids) == 1 else given
            self._decide(pending[0], decision=flowrun_api.Decision.RESPOND, data=data)

    def confirm(self, approve: bool = True, comment: str = "") -> None:
        """Confirm (or reject) the tool call that waits for a confirmation."""
        pending = self._pending()
        if pending is None or pending[1].kind not in (Kind.APPROVAL, Kind.TOOL, Kind.REVIEW):
            raise ConversationError(f"no tool call waits for a confirmation ({self._waits()})")
        decision = flowrun_api.Decision.APPROVE if approve else flowrun_api.Decision.REJECT
        self._decide(pending[0], decision=decision, comment=comment or None)

    def _decide(self, request_id: str, **fields: Any) -> None:
        fields.update(decided_by=USER, decided_at=times.timestamp(times.now()))
        request = self.store.checkpoint.requests[request_id]
        self.store.checkpoint.requests[request_id] = store.with_decision(request, fields)

    def _waits(self) -> str:
        return f"it is {self.status.kind.value}" if self.status else "execute() has not run"

    # -- what was said -------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """The conversation so far (see module docstring)."""
        if self.submits:
            return self._root_run_messages()
        if self.is_agent:
            return list(self._turns)
        said: list[Message] = []
        requests = {r.node: r for r in self.store.checkpoint.requests.values()}
        for key, record in self.store.checkpoint.nodes.items():
            kind = self._kind_of(key)
            output = record.output or {}
            if kind == "AgentNode":
                for request in self.store.checkpoint.requests.values():
                    said += _exchanges(request) if request.node == key else []
            if kind == "InputMessageNode" and key in requests:
                request = requests[key]
                if request.message:
                    said.append(Message("assistant", request.message))
                if request.decision == flowrun_api.Decision.RESPOND:
                    said.append(Message("user", _text(request.data)))
            elif record.phase != flowrun_api.NodePhase.SUCCEEDED:
                continue
            elif kind == "OutputMessageNode":
                said.append(Message("assistant", _text(output.get("json"))))
            elif kind == "AgentNode" and not self._submitted_at(key):
                said.append(Message("assistant", str(output.get("text") or "")))
        return said

    def _root_run_messages(self) -> list[Message]:
        """A submitting root Agent's one run: the first message, the agent's and the user's."""
        node = self.imported.flows[self.imported.flow].spec.nodes[0].id
        first = self._first_message()
        opened = [Message("user", first)] if first else []
        requests = self.store.checkpoint.requests.values()
        return opened + [m for r in requests if r.node == node for m in _exchanges(r)]

    def _first_message(self) -> str:
        """The message a root Agent's run started with ("" when the agent spoke first)."""
        run_record = self.store.checkpoint.run
        value = run_record.input if run_record is not None else None
        message = value.get("message") if isinstance(value, dict) else None
        return message if isinstance(message, str) else ""

    def _submitted_at(self, key: str) -> bool:
        """True when the AgentNode recorded at ``key`` submits values (not a text message)."""
        *outer, last = key.split("/")
        if outer:
            return False
        node = _node(self.imported, self.imported.flow, flowrun_api.node_of_key(last)[0])
        return node is not None and node.agent is not None and node.agent.answer is not None

    def _kind_of(self, key: str) -> str | None:
        """The Agent Spec component type of the node recorded at ``key`` (None: a map item).

        Each segment of the key names a node of its flow, with a loop iteration (``ask#2``)
        that :func:`~agentflows.api.flowrun.node_of_key` strips.
        """
        flow = self.imported.flow
        *outer, last = key.split("/")
        for segment in outer:
            node = _node(self.imported, flow, flowrun_api.node_of_key(segment)[0])
            call = node.flow if node and node.flow else node.map.flow if node and node.map else None
            if call is None:
                return None
            flow = call.name
        if "[" in last:
            return None
        return self.imported.kinds.get(flow, {}).get(flowrun_api.node_of_key(last)[0])


def _node(imported: importer.Imported, flow: str, node_id: str) -> flow_api.Node | None:
    resource = imported.flows.get(flow)
    nodes = resource.spec.nodes if resource else []
    return next((n for n in nodes if n.id == node_id), None)


def _question(calls: list[ToolRequest]) -> ToolRequest | None:
    """The first ``ask_user`` call among client calls still waiting, if any."""
    return next((c for c in calls if c.name == components.ASK_USER_TOOL), None)


def _exchanges(request: flowrun_api.HumanRequest) -> list[Message]:
    """What an agent said to the user in ``request``, and the user's answers.

    A text reply of an agent that must submit values waits as an ``input`` request; a question
    asked with ``ask_user`` as a client tool call.
    """
    if request.kind == Kind.INPUT:
        said = [Message("assistant", request.message)]
        if request.decision == flowrun_api.Decision.RESPOND:
            said.append(Message("user", _text(request.data)))
        return said
    client = [c for c in _calls(request) if c.get("client")]
    said = []
    for call in client:
        if call["tool"] != components.ASK_USER_TOOL:
            continue
        said.append(Message("assistant", _text((call.get("args") or {}).get("question"))))
        if request.decision == flowrun_api.Decision.RESPOND:
            data = request.data
            answer = (
                data.get(str(call["id"])) if len(client) > 1 and isinstance(data, dict) else data
            )
            said.append(Message("user", _text(answer)))
    return said


def _calls(request: flowrun_api.HumanRequest) -> list[dict[str, Any]]:
    proposal = request.proposal if isinstance(request.proposal, dict) else {}
    calls = proposal.get("calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
