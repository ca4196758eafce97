"""Which memories a run may write, and their bounds: what the operator's retention applies.

On the cluster the runner may not list or delete AgentSessions, so the operator retires
sessions when a run ends, for the memories :func:`sessions.memories` finds in its snapshot.
"""

from __future__ import annotations

from typing import Any

from agentflows.agents import sessions
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api


def _agent(**fields: Any) -> agent_api.AgentSpec:
    return agent_api.AgentSpec.model_validate({"model": {"name": "openai/m"}, **fields})


def _flow(*agent_calls: dict[str, Any]) -> flow_api.FlowSpec:
    nodes = [{"id": f"n{i}", "agent": call} for i, call in enumerate(agent_calls)]
    return flow_api.FlowSpec.model_validate({"nodes": nodes})


def _bounds(found: dict[str, agent_api.AgentMemory]) -> dict[str, tuple[int, int]]:
    return {name: (m.max_sessions, m.max_age_seconds) for name, m in found.items()}


def test_an_agent_with_a_session_writes_its_own_memory_with_its_own_bounds() -> None:
    agents = {
        "support": _agent(session="=.run.input.t", memory={"maxSessions": 5}),
        "plain": _agent(),
    }
    found = sessions.memories({"f": _flow({"name": "support", "prompt": "p"})}, agents)
    assert _bounds(found) == {"support": (5, 30 * 86400)}


def test_a_session_set_only_on_the_node_still_writes_the_agents_memory() -> None:
    agents = {"plain": _agent(memory={"maxAgeSeconds": 600})}
    flow = _flow({"name": "plain", "prompt": "p", "session": "s"})
    assert _bounds(sessions.memories({"f": flow}, agents)) == {"plain": (1000, 600)}


def test_agents_sharing_a_memory_give_it_the_smallest_bounds_of_theirs() -> None:
    agents = {
        "a": _agent(session="s", memory={"shared": "team", "maxSessions": 3}),
        "b": _agent(session="s", memory={"shared": "team", "maxAgeSeconds": 120}),
    }
    assert _bounds(sessions.memories({}, agents)) == {"team": (3, 120)}


def test_a_node_may_point_a_turn_at_another_memory_or_skip_it() -> None:
    agents = {"a": _agent(session="s", memory={"maxSessions": 7})}
    flow = _flow(
        {"name": "a", "prompt": "p", "memory": {"shared": "elsewhere"}},
        {"name": "a", "prompt": "p", "memory": {"skip": True}},
    )
    assert _bounds(sessions.memories({"f": flow}, agents)) == {
        "a": (7, 30 * 86400),
        "elsewhere": (7, 30 * 86400),
    }


def test_a_skipped_memory_and_an_agent_the_snapshot_lacks_write_nothing() -> None:
    agents = {"quiet": _agent(session="s", memory={"skip": True})}
    flow = _flow({"name": "quiet", "prompt": "p"}, {"name": "missing", "prompt": "p"})
    assert sessions.memories({"f": flow}, agents) == {}
