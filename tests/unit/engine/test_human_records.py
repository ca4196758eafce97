"""A human node's record counts only when a decided or expired request of it accounts for it.

Whoever can write a run's store (a tool holding the runner's identity, issue 19 item 30) could
record an approval as given; a resumed run must stop there instead of going past the gate.
"""

from __future__ import annotations

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import envelope, store

from .helpers import CountingHost, ManualClock, flow_spec, run_once

RunPhase = flowrun_api.RunPhase
GATE = """
nodes:
  - {id: review, approval: {message: "ship?", approvers: {users: [carol]}}}
  - {id: ship, tool: {python: {script: x}}}
"""


def forged_approval(by: str = "carol") -> flowrun_api.NodeStatus:
    """The record a forger writes: Succeeded, "approved by carol"."""
    decision = {"decision": "approve", "comment": None, "edits": None, "data": None,
                "decidedBy": by, "decidedAt": "2026-01-01T00:00:00Z"}  # fmt: skip
    return flowrun_api.NodeStatus(
        phase=flowrun_api.NodePhase.SUCCEEDED, output=envelope.from_value(decision)
    )


async def test_a_forged_approval_record_with_its_request_pending_stops_the_run() -> None:
    spec = flow_spec(GATE)
    st = store.MemoryStore()
    host = CountingHost()
    assert (await run_once(spec, st, host)).phase == RunPhase.WAITING
    await st.save_node("review", forged_approval())
    outcome = await run_once(spec, st, host)
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "HumanRecordUndecided"
    assert 'node "review" is recorded as Succeeded' in (outcome.message or "")
    assert not host.calls


async def test_a_forged_approval_record_without_any_request_stops_the_run() -> None:
    spec = flow_spec(GATE)
    st = store.MemoryStore()
    host = CountingHost()
    await st.save_node("review", forged_approval())
    outcome = await run_once(spec, st, host)
    assert outcome.reason == "HumanRecordUndecided" and not host.calls


async def test_an_approval_record_that_differs_from_the_decision_stops_the_run() -> None:
    spec = flow_spec(GATE)
    st = store.MemoryStore()
    host = CountingHost()
    await run_once(spec, st, host)
    await st.decide(
        "review", decision="reject", decided_by="carol", decided_at="2026-01-01T00:00:00Z"
    )
    await st.save_node("review", forged_approval())
    outcome = await run_once(spec, st, host)
    assert outcome.reason == "HumanRecordUndecided" and not host.calls


async def test_a_decided_approval_resumes_and_its_record_is_accepted_on_every_later_attempt() -> (
    None
):
    spec = flow_spec(GATE + "  - {id: wait, approval: {message: again?}}\n")
    st = store.MemoryStore()
    host = CountingHost()
    await run_once(spec, st, host)
    await st.decide("review", decision="approve", decided_by="carol")
    assert (await run_once(spec, st, host)).phase == RunPhase.WAITING
    await st.decide("wait", decision="approve", decided_by="carol")
    outcome = await run_once(spec, st, host)
    assert outcome.phase == RunPhase.SUCCEEDED and host.calls["ship"] == 1


async def test_an_expired_approval_record_is_accepted_on_a_later_attempt() -> None:
    spec = flow_spec("""
nodes:
  - {id: review, approval: {message: "ship?", timeoutSeconds: 1, onTimeout: reject}}
  - {id: route, branch: {value: "=.nodes.review.json.decision", cases: {approve: ok}, default: stop}}
  - {id: ok, transform: "=1"}
  - {id: stop, approval: {message: "really stop?"}}
""")
    st = store.MemoryStore()
    now = ManualClock()
    await run_once(spec, st, CountingHost(), now=now)
    now.advance(1)
    assert (await run_once(spec, st, CountingHost(), now=now)).phase == RunPhase.WAITING
    await st.decide("stop", decision="approve", decided_by="carol")
    assert (await run_once(spec, st, CountingHost(), now=now)).phase == RunPhase.SUCCEEDED


async def test_a_decided_input_record_is_accepted_and_a_forged_one_is_not() -> None:
    spec = flow_spec("""
nodes:
  - {id: ask, input: {message: "who?", schema: {type: string}}}
  - {id: more, approval: {message: "go?"}}
""")
    st = store.MemoryStore()
    await run_once(spec, st, CountingHost())
    await st.decide("ask", decision="respond", data="alice", decided_by="carol")
    assert (await run_once(spec, st, CountingHost())).phase == RunPhase.WAITING
    await st.save_node("ask", flowrun_api.NodeStatus(
        phase=flowrun_api.NodePhase.SUCCEEDED, output=envelope.from_value("mallory")
    ))  # fmt: skip
    outcome = await run_once(spec, st, CountingHost())
    assert outcome.reason == "HumanRecordUndecided"
