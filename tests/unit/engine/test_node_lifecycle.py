"""One record lifecycle for every node: plain nodes, map items and sub-flow nodes alike.

An agent that pauses for a human spends tokens before the pause and after it; wherever the
agent runs, the run's usage counts them when they are spent (so limits hold across the pause),
the node's record keeps all of them, the observer hears of the node, and the record keeps the
time of the node's first start.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentflows.api import common, times
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, envelope, graph, state, store

from .helpers import ManualClock, agents, flow_spec, run_once

RunPhase = flowrun_api.RunPhase

PLAIN = """
nodes:
  - {id: ask, agent: {name: a, prompt: "go"}}
"""
MAP_ITEM = """
nodes:
  - {id: ask, map: {items: "=[1]", agent: {name: a, prompt: "go"}}}
"""
SUB_FLOW = """
nodes:
  - {id: ask, flow: {name: inner}}
"""
#: Where the pausing agent's record is, per placement.
AGENT_KEY = {PLAIN: "ask", MAP_ITEM: "ask[0]", SUB_FLOW: "ask/ask"}
PLACEMENTS = pytest.mark.parametrize(
    "flow", [PLAIN, MAP_ITEM, SUB_FLOW], ids=["plain", "map-item", "sub-flow"]
)


class PausingAgent:
    """An agent that spends 100 tokens and asks a human, then spends 7 more to finish."""

    async def run_agent(
        self, task: capabilities.AgentTask, ctx: capabilities.NodeContext
    ) -> capabilities.NodeResult | capabilities.Pause:
        if ctx.resume is None:
            return capabilities.Pause(
                request=flowrun_api.HumanRequest(
                    node=ctx.node_key, kind=flowrun_api.RequestKind.REVIEW, message="ok?"
                ),
                state={"turn": 1},
                usage=common.Usage(prompt_tokens=100, llm_calls=1),
            )
        return capabilities.NodeResult(
            envelope.from_value("done"), usage=common.Usage(prompt_tokens=7, llm_calls=1)
        )

    async def complete(self, task: Any, ctx: capabilities.NodeContext) -> Any:
        raise AssertionError("no llm nodes here")

    async def call_tool(self, task: Any, ctx: capabilities.NodeContext) -> Any:
        raise AssertionError("no tool nodes here")


def _resolver() -> graph.StaticResolver:
    return graph.StaticResolver(agents("a"), {"inner": flow_spec(PLAIN)})


async def _pause_and_approve(
    text: str, st: store.MemoryStore, **kwargs: Any
) -> tuple[store.Outcome, store.Outcome]:
    spec = flow_spec(text)
    paused = await run_once(spec, st, PausingAgent(), resolver=_resolver(), **kwargs)
    assert paused.phase == RunPhase.WAITING, paused.message
    (request_id,) = st.checkpoint.requests
    await st.decide(request_id, decision="approve", decided_by="carol")
    resumed = await run_once(spec, st, PausingAgent(), resolver=_resolver(), **kwargs)
    return paused, resumed


@PLACEMENTS
async def test_tokens_spent_before_a_pause_count_in_the_run_usage_while_it_waits(
    flow: str,
) -> None:
    outcome = await run_once(
        flow_spec(flow), store.MemoryStore(), PausingAgent(), resolver=_resolver()
    )
    assert outcome.phase == RunPhase.WAITING and outcome.usage.prompt_tokens == 100


@PLACEMENTS
async def test_max_tokens_stops_a_run_whose_agent_pauses_over_the_limit(flow: str) -> None:
    spec = flow_spec(flow + "limits: {maxTokens: 50}\n")
    outcome = await run_once(spec, store.MemoryStore(), PausingAgent(), resolver=_resolver())
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "TokenLimitExceeded"


@PLACEMENTS
async def test_a_resumed_agent_record_keeps_the_tokens_spent_before_its_pause(flow: str) -> None:
    st = store.MemoryStore()
    _, resumed = await _pause_and_approve(flow, st)
    record = st.checkpoint.nodes[AGENT_KEY[flow]]
    assert resumed.phase == RunPhase.SUCCEEDED
    assert record.usage is not None and record.usage.prompt_tokens == 107
    assert resumed.usage.prompt_tokens == 107


@PLACEMENTS
async def test_the_observer_hears_the_agent_start_wait_and_succeed(flow: str) -> None:
    heard: list[tuple[str, str]] = []

    def observe(event: state.RunEvent) -> None:
        if event.key == AGENT_KEY[flow]:
            heard.append((event.kind, event.node_kind))

    await _pause_and_approve(flow, store.MemoryStore(), observer=observe)
    assert heard == [
        ("started", "agent"),
        ("waiting", "agent"),
        ("started", "agent"),
        ("succeeded", "agent"),
    ]


@PLACEMENTS
async def test_a_resumed_agent_record_keeps_its_first_start_time(flow: str) -> None:
    now = ManualClock("2026-03-01T10:00:00Z")
    st = store.MemoryStore()
    spec = flow_spec(flow)
    await run_once(spec, st, PausingAgent(), resolver=_resolver(), now=now)
    (request_id,) = st.checkpoint.requests
    await st.decide(request_id, decision="approve", decided_by="carol")
    now.advance(3600)
    await run_once(spec, st, PausingAgent(), resolver=_resolver(), now=now)
    record = st.checkpoint.nodes[AGENT_KEY[flow]]
    assert record.started_at == times.timestamp(times.parse_time("2026-03-01T10:00:00Z"))
    assert record.finished_at == times.timestamp(times.parse_time("2026-03-01T11:00:00Z"))
    assert record.attempts == 2


async def test_an_approval_expires_by_the_run_clock_without_waiting() -> None:
    spec = flow_spec("""
nodes:
  - {id: review, approval: {message: "ship?", timeoutSeconds: 600, onTimeout: fail}}
""")
    now = ManualClock()
    st = store.MemoryStore()
    assert (await run_once(spec, st, PausingAgent(), now=now)).phase == RunPhase.WAITING
    now.advance(599)
    assert (await run_once(spec, st, PausingAgent(), now=now)).phase == RunPhase.WAITING
    now.advance(1)
    outcome = await run_once(spec, st, PausingAgent(), now=now)
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "RequestExpired"
    assert (
        outcome.message
        == 'node "review" failed: request "review" expired at 2026-01-01T00:10:00.000000Z'
    )
