"""Conversations that persist: an agent turn's memory, loaded before it and saved after it.

Called by :class:`agentflows.agents.host.LiveCapabilities` (which :func:`bind` s a turn to its
memory) and :mod:`agentflows.agents.turn` (which loads the history and saves the conversation).
Where a session is kept is a :class:`Store`: a file per session under the local state directory
(:mod:`agentflows.agents.session_files`), or one ``AgentSession`` object per session on the
cluster (:mod:`agentflows.kube.session_store`). Both store the API's
:class:`~agentflows.api.agentsession.AgentSessionSpec`, so ``agentflows sessions`` shows either.

The rules:

- A turn has a memory when its node (else its Agent) sets a ``session`` that evaluates to a
  non-empty value, the host has a store, and ``memory.skip`` is false. The conversation's key is
  (memory, session, request): the memory is ``memory.shared`` or the Agent's name, so agents
  sharing one name share conversations; the request id separates parallel calls of one session
  (a ``map`` over items), each continuing its own conversation.
- What is kept is the conversation after the system prompt: the Agent's scripted history (on the
  first turn), each prompt, tool calls and results, summaries from compression, and the answer.
  The next turn is sent the current system prompt, then that conversation, then its prompt.
- Saving is one atomic read-modify-write of the session (a lock on the file locally; a
  resourceVersion-checked replace, retried, on the cluster). A turn that loaded the stored
  conversation at its ``turns`` count *n* replaces it when it is still at *n*; when another turn
  saved in between, its own part (its prompt and what followed) is appended to what that turn
  saved instead. So concurrent writers never lose a turn, and the latest write comes last.
- ``access: ReadOnly`` loads and never saves. Secret values are masked (the host's redactor)
  before anything is stored.
- Bounded size: a message body over :data:`MAX_BODY_CHARS` is cut, and a conversation whose JSON
  passes half of the Agent's ``memory.maxBytes`` is compacted through context compression (a
  summary written by the model, :func:`agentflows.agents.compression.compress_over`). If the
  session is still over ``maxBytes`` — the model failed, or many requests share the session —
  its least recently written conversations go first, then the oldest messages.
- Retention (:func:`enforce_retention`): sessions of the memory not written for
  ``memory.maxAgeSeconds`` are deleted, and beyond ``memory.maxSessions`` the least recently
  written go. Locally it runs after each write (:meth:`Store.retain`). On the cluster the
  operator runs it when a run ends, for every memory the run may write (:func:`memories`), with
  the strictest bounds of the Agents writing each: the runner's identity may not list or delete
  AgentSessions, so a run (or a tool holding its token) cannot read or remove the sessions of
  memories its Agents do not name.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agentflows.agents import compression, secrets
from agentflows.api import agent as agent_api
from agentflows.api import agentsession as agentsession_api
from agentflows.api import errors, times
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities

#: Longest message body kept in memory; the rest is cut with a note saying how much.
MAX_BODY_CHARS = 16_384
#: Longest session or request id (the AgentSession's ``spec.session`` holds as much).
MAX_KEY_CHARS = 4096
#: Share of ``memory.maxBytes`` one conversation may fill before it is compacted.
_COMPACT_SHARE = 0.5
#: Bytes of JSON per token, to turn a byte bound into compression's token threshold.
_BYTES_PER_TOKEN = 4


class StoreError(errors.AgentflowsError):
    """A store could not read or write a session; ``retryable`` says whether later may help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


#: The sessions retention retired after a write (None: the store leaves retention to another).
Retired = list[str] | None

Change = Callable[[agentsession_api.AgentSessionSpec | None], agentsession_api.AgentSessionSpec]


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """What a listing shows of a stored session (without its conversations)."""

    memory: str
    session: str
    turns: int
    updated_at: str
    #: The stored object's size (JSON bytes).
    size: int
    #: Where it is kept: a file path, or the AgentSession's name.
    where: str


class Store(Protocol):
    """Where sessions are kept; every method is safe to call concurrently."""

    async def read(self, memory: str, session: str) -> agentsession_api.AgentSessionSpec | None:
        """The stored session, or None."""
        ...

    async def update(self, memory: str, session: str, agent: str, change: Change) -> None:
        """Apply ``change`` to the stored session (None: none yet) atomically; store its result.

        ``agent`` is the Agent writing (the owner of a new session). Retried on conflicts.
        """
        ...

    async def list(self, memory: str | None = None) -> list[SessionInfo]:
        """The stored sessions (of ``memory`` only when given)."""
        ...

    async def delete(self, memory: str, session: str) -> bool:
        """Delete one session; False when there was none."""
        ...

    async def retain(self, memory: str, limits: agent_api.AgentMemory) -> Retired:
        """Apply the memory's retention after a write (:func:`enforce_retention`), or leave it."""
        ...


def size_of(record: agentsession_api.AgentSessionSpec) -> int:
    """JSON bytes of a stored session."""
    return len(json.dumps(record.model_dump(mode="json", by_alias=True)).encode())


def find(
    record: agentsession_api.AgentSessionSpec | None, request: str | None
) -> agentsession_api.Conversation | None:
    """The conversation of ``request`` in a stored session, or None."""
    if record is None:
        return None
    return next((c for c in record.conversations if c.request == request), None)


def bind(
    store: Store | None,
    task: capabilities.AgentTask,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> Memory | None:
    """The memory of an agent turn, or None when it has none (see module docstring)."""
    if store is None or task.session is None:
        return None
    settings = task.memory or task.agent.memory
    if settings.skip:
        return None
    for field, value in (("session", task.session), ("request", task.request)):
        if value is not None and len(value) > MAX_KEY_CHARS:
            raise capabilities.CapabilityError(
                f"agent {task.agent_name}: {field} evaluates to {len(value)} characters; at most "
                f"{MAX_KEY_CHARS} are allowed (use an id, not a document)"
            )
    return Memory(
        store=store,
        memory=settings.shared or task.agent_name,
        session=task.session,
        request=task.request,
        agent_name=task.agent_name,
        agent=task.agent,
        read_only=settings.access == agent_api.MemoryAccess.READ_ONLY,
        env=env,
        redactor=redactor,
    )


@dataclasses.dataclass
class Memory:
    """One turn's memory: its key, its rights and bounds, and the store behind it."""

    store: Store
    memory: str
    session: str
    request: str | None
    agent_name: str
    agent: agent_api.AgentSpec
    read_only: bool
    env: Mapping[str, str]
    redactor: secrets.Redactor

    async def history(self) -> tuple[list[dict[str, Any]], int]:
        """The stored conversation's messages and its ``turns`` count (empty, 0: none yet)."""
        try:
            stored = await self.store.read(self.memory, self.session)
        except StoreError as exc:
            raise self._failed("load", exc) from None
        conversation = find(stored, self.request)
        if conversation is None:
            return [], 0
        return [dict(m) for m in conversation.messages if isinstance(m, dict)], conversation.turns

    async def save(
        self, messages: Sequence[dict[str, Any]], base_turns: int
    ) -> tuple[dict[str, Any], compression.Compression | None]:
        """Store the conversation after a turn (see module docstring).

        Returns a record for the node's detail, and the compaction when there was one (its
        summary is a model call: the turn counts it).
        """
        record = {"memory": self.memory, "session": self.redactor(self.session)}
        if self.request is not None:
            record["request"] = self.redactor(self.request)
        if self.read_only:
            return {**record, "saved": False, "reason": "access is ReadOnly"}, None
        limit = min(MAX_BODY_CHARS, self.agent.memory.max_bytes // 4)
        kept = [_bounded(self.redactor.value(m), limit) for m in _without_system(messages)]
        compacted = await self._compacted(kept)
        if compacted is not None:
            kept = compacted.messages
        done = compacted is not None and (compacted.record or {}).get("status") == "compressed"
        turn = _Turn(self.request, kept, base_turns, int(done), times.timestamp())
        max_bytes = self.agent.memory.max_bytes

        def change(
            stored: agentsession_api.AgentSessionSpec | None,
        ) -> agentsession_api.AgentSessionSpec:
            session = (
                stored.model_copy(deep=True)
                if stored is not None
                else agentsession_api.AgentSessionSpec(
                    memory=self.memory, session=self.session, agent=self.agent_name
                )
            )
            conversation = turn.apply(find(session, self.request))
            session.conversations = [
                *(c for c in session.conversations if c.request != self.request),
                conversation,
            ]
            session.turns += 1
            session.updated_at = turn.at
            _fit(session, conversation, max_bytes)
            return session

        try:
            await self.store.update(self.memory, self.session, self.agent_name, change)
            retired = await self.store.retain(self.memory, self.agent.memory)
        except StoreError as exc:
            raise self._failed("save", exc) from None
        saved = {**record, "saved": True, "compacted": done}
        if retired is not None:
            saved["retired"] = len(retired)
        return saved, compacted

    def _failed(self, action: str, exc: StoreError) -> capabilities.CapabilityError:
        return capabilities.CapabilityError(
            self.redactor(f"agent {self.agent_name}: cannot {action} memory {self.memory}: {exc}"),
            retryable=exc.retryable,
        )

    async def _compacted(self, messages: list[dict[str, Any]]) -> compression.Compression | None:
        """The compaction of ``messages`` when they are over their share of maxBytes."""
        budget = self.agent.memory.max_bytes * _COMPACT_SHARE
        if _json_bytes(messages) <= budget:
            return None
        # Aim at half the share, so the next turns do not compact again at once.
        return await compression.compress_over(
            self.agent,
            messages,
            budget / _BYTES_PER_TOKEN / 2,
            env=self.env,
            redactor=self.redactor,
        )


@dataclasses.dataclass
class _Turn:
    """What one turn saves into its conversation."""

    request: str | None
    messages: list[dict[str, Any]]
    #: The stored conversation's ``turns`` when the turn loaded it.
    base_turns: int
    compacted: int
    at: str

    def apply(self, stored: agentsession_api.Conversation | None) -> agentsession_api.Conversation:
        """The conversation after this turn: replaced, or appended to when it moved on."""
        if stored is None:
            stored = agentsession_api.Conversation(request=self.request)
        if stored.turns == self.base_turns:
            messages = self.messages
        else:  # another turn saved since we loaded: keep it, and add ours after it
            messages = [*stored.messages, *_own_part(self.messages)]
        return agentsession_api.Conversation(
            request=self.request,
            messages=messages,
            turns=stored.turns + 1,
            compactions=stored.compactions + self.compacted,
            updated_at=self.at,
        )


async def enforce_retention(store: Store, memory: str, limits: agent_api.AgentMemory) -> list[str]:
    """Delete the memory's sessions past ``maxAgeSeconds`` or beyond ``maxSessions``."""
    sessions = await store.list(memory)
    cutoff = times.timestamp(times.now() - datetime.timedelta(seconds=limits.max_age_seconds))
    newest_first = sorted(sessions, key=lambda info: info.updated_at, reverse=True)
    retired = [
        info
        for index, info in enumerate(newest_first)
        if info.updated_at < cutoff or index >= limits.max_sessions
    ]
    for info in retired:
        await store.delete(memory, info.session)
    return [info.session for info in retired]


def memories(
    flows: Mapping[str, flow_api.FlowSpec], agents: Mapping[str, agent_api.AgentSpec]
) -> dict[str, agent_api.AgentMemory]:
    """The memories a run's turns may write, each with the strictest bounds of its writers.

    A turn writes the memory of its node's ``memory`` (else its Agent's): ``shared``, or the
    Agent's name; not when ``skip``, nor without a ``session`` (the node's, else the Agent's).
    Its bounds are its Agent's ``memory``; where several Agents write one memory, the smallest
    ``maxSessions`` and ``maxAgeSeconds`` of theirs apply (locally each write applies its own).
    """
    found: dict[str, agent_api.AgentMemory] = {}

    def add(name: str, settings: agent_api.Memory | None, session: str | None) -> None:
        agent = agents.get(name)
        if agent is None:
            return
        chosen = settings or agent.memory
        if chosen.skip or (session or agent.session) is None:
            return
        memory = chosen.shared or name
        found[memory] = strictest(found.get(memory), agent.memory)

    for name in agents:  # sub-agents' and handoffs' turns use their Agent's own settings
        add(name, None, None)
    for flow in flows.values():
        for node in flow.nodes:
            for body in (node, node.map):
                if body is not None and body.agent is not None:
                    add(body.agent.name, body.agent.memory, body.agent.session)
    return found


def strictest(
    kept: agent_api.AgentMemory | None, limits: agent_api.AgentMemory
) -> agent_api.AgentMemory:
    """``limits`` with the smaller ``maxSessions`` and ``maxAgeSeconds`` of the two."""
    if kept is None:
        return limits
    return kept.model_copy(
        update={
            "max_sessions": min(kept.max_sessions, limits.max_sessions),
            "max_age_seconds": min(kept.max_age_seconds, limits.max_age_seconds),
        }
    )


def _without_system(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation after its leading system messages (the system prompt is not kept)."""
    start = 0
    while start < len(messages) and messages[start].get("role") == "system":
        start += 1
    return [dict(m) for m in messages[start:]]


def _own_part(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A turn's own messages: its prompt (the last user message) and what followed it."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return list(messages[users[-1] :]) if users else list(messages)


def _bounded(message: Any, limit: int) -> Any:
    """``message`` with a body over ``limit`` characters cut, saying how much was cut."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str) or len(content) <= limit:
        return message
    cut = len(content) - limit
    return {**message, "content": f"{content[:limit]}\n[... {cut} characters not kept in memory]"}


def _fit(
    session: agentsession_api.AgentSessionSpec,
    current: agentsession_api.Conversation,
    max_bytes: int,
) -> None:
    """Bring ``session`` under ``max_bytes``: older conversations go first, then old messages."""
    excess = size_of(session) - max_bytes
    others = sorted(
        (c for c in session.conversations if c is not current), key=lambda c: c.updated_at
    )
    while excess > 0 and others:
        dropped = others.pop(0)
        session.conversations.remove(dropped)
        excess -= _json_bytes(dropped.model_dump(mode="json", by_alias=True)) + 1
    cut = 0
    while excess > 0 and cut < len(current.messages):
        excess -= _json_bytes(current.messages[cut]) + 1
        cut += 1
    # a tool result without the assistant message that asked for it is refused by providers
    while cut < len(current.messages) and _role(current.messages[cut]) == "tool":
        cut += 1
    current.messages = current.messages[cut:]


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value).encode())
