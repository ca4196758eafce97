"""How runs execute: order, concurrency, branches, map, human gates, sub-flows and limits."""

from __future__ import annotations

import asyncio
import itertools

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, state, store

from .helpers import CountingHost, ManualClock, agents, chain, flow_spec, run_once

RunPhase = flowrun_api.RunPhase


async def test_chain_of_transforms_produces_the_last_value() -> None:
    outcome = await run_once(chain(5, kind="transform"), store.MemoryStore(), CountingHost())
    assert outcome.phase == RunPhase.SUCCEEDED and outcome.output == 4


async def test_a_chain_of_transforms_runs_in_the_run_task_without_a_task_per_node() -> None:
    tasks: list[asyncio.Task[object] | None] = []

    def observe(event: state.RunEvent) -> None:
        if event.kind == "started":
            tasks.append(asyncio.current_task())

    outcome = await run_once(
        chain(20, kind="transform"), store.MemoryStore(), CountingHost(), observer=observe
    )
    assert outcome.output == 19 and len(tasks) == 20
    assert set(tasks) == {asyncio.current_task()}


async def test_a_chain_of_transforms_lets_other_tasks_run_between_its_nodes() -> None:
    ticks = 0
    seen: list[int] = []

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    def observe(event: state.RunEvent) -> None:
        if event.kind == "started":
            seen.append(ticks)

    other = asyncio.create_task(ticker())
    try:
        await run_once(
            chain(20, kind="transform"), store.MemoryStore(), CountingHost(), observer=observe
        )
    finally:
        other.cancel()
    assert len(seen) == 20
    assert all(later > earlier for earlier, later in itertools.pairwise(seen))


async def test_successors_of_a_node_run_concurrently_and_the_join_sees_both() -> None:
    spec = flow_spec("""
nodes:
  - {id: start, transform: "=1"}
  - {id: left, tool: {python: {script: x}, args: {side: left}}}
  - {id: right, tool: {python: {script: x}, args: {side: right}}}
  - {id: join, transform: "=[.nodes.left.json.args.side, .nodes.right.json.args.side]"}
edges:
  - {from: start, to: left}
  - {from: start, to: right}
  - {from: left, to: join}
  - {from: right, to: join}
""")
    host = CountingHost(delay=0.2)
    outcome = await run_once(spec, store.MemoryStore(), host)
    assert outcome.output == ["left", "right"]
    assert host.max_active == 2


async def test_branch_skips_the_path_not_taken_and_the_join_still_runs() -> None:
    spec = flow_spec("""
nodes:
  - {id: pick, branch: {value: "=.run.input.x", cases: {"1": one}, default: other}}
  - {id: one, transform: '="one"'}
  - {id: other, transform: '="other"'}
  - {id: after_other, transform: '="after"'}
  - {id: join, transform: "=[.nodes.one.json, .nodes.after_other.json]"}
edges:
  - {from: other, to: after_other}
  - {from: one, to: join}
  - {from: after_other, to: join}
""")
    st = store.MemoryStore()
    outcome = await run_once(spec, st, CountingHost(), value={"x": 1})
    assert outcome.output == ["one", None]
    phases = {k: v.phase for k, v in st.checkpoint.nodes.items()}
    assert phases["other"] == "Skipped" and phases["after_other"] == "Skipped"
    assert phases["join"] == "Succeeded"


async def test_map_runs_items_with_bounded_concurrency_and_keeps_item_order() -> None:
    spec = flow_spec("""
nodes:
  - {id: list, transform: "=[range(10)]"}
  - id: each
    map:
      items: "=.nodes.list.json"
      concurrency: 3
      tool: {python: {script: x}, args: {n: "=.item"}}
  - {id: out, transform: "=[.nodes.each.items[].json.args.n]"}
""")
    host = CountingHost(delay=0.05)
    outcome = await run_once(spec, store.MemoryStore(), host)
    assert outcome.output == list(range(10))
    assert host.max_active == 3


async def test_failed_node_fails_the_run_with_its_error() -> None:
    spec = chain(3)
    outcome = await run_once(spec, store.MemoryStore(), CountingHost(fail_on="n1"))
    assert outcome.phase == RunPhase.FAILED
    assert outcome.message == 'node "n1" failed: n1 exploded'


async def test_invalid_input_fails_before_any_node_runs() -> None:
    spec = flow_spec("""
input: {type: object, properties: {topic: {type: string}}, required: [topic]}
nodes:
  - {id: a, tool: {python: {script: x}}}
""")
    host = CountingHost()
    outcome = await run_once(spec, store.MemoryStore(), host, value={"topic": 3})
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "InvalidInput"
    assert "input.topic: 3 is not of type 'string'" in (outcome.message or "")
    assert not host.calls


async def test_run_timeout_ends_the_run_with_a_clear_error() -> None:
    spec = flow_spec("""
nodes:
  - {id: slow, tool: {python: {script: x}}}
limits: {timeoutSeconds: 1}
""")
    outcome = await run_once(spec, store.MemoryStore(), CountingHost(delay=5))
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "Timeout"
    assert "limits.timeoutSeconds=1" in (outcome.message or "")


async def test_max_node_executions_ends_the_run() -> None:
    spec = chain(5, kind="transform").model_copy(
        update={
            "limits": flow_spec(
                "nodes: [{id: a, transform: '=1'}]\nlimits: {maxNodeExecutions: 3}"
            ).limits
        }
    )
    outcome = await run_once(spec, store.MemoryStore(), CountingHost())
    assert outcome.reason == "NodeExecutionLimitExceeded"
    assert outcome.message == "run exceeded limits.maxNodeExecutions=3"


async def test_token_and_cost_limits_stop_the_run() -> None:
    spec = flow_spec("""
nodes:
  - {id: a, llm: {model: {name: m}, prompt: p}}
  - {id: b, llm: {model: {name: m}, prompt: p}}
  - {id: c, llm: {model: {name: m}, prompt: p}}
limits: {maxTokens: 20}
""")
    outcome = await run_once(spec, store.MemoryStore(), CountingHost())
    assert outcome.reason == "TokenLimitExceeded"
    assert outcome.usage.prompt_tokens + outcome.usage.completion_tokens == 30


async def test_rejection_routes_through_the_branch() -> None:
    spec = flow_spec("""
nodes:
  - {id: review, approval: {message: "ship?"}}
  - {id: route, branch: {value: "=.nodes.review.json.decision", cases: {approve: ship}, default: stop}}
  - {id: ship, transform: '="shipped"'}
  - {id: stop, transform: '="stopped: \\(.nodes.review.json.comment)"'}
output: "=.nodes.ship.json // .nodes.stop.json"
""")
    st = store.MemoryStore()
    assert (await run_once(spec, st, CountingHost())).phase == RunPhase.WAITING
    await st.decide("review", decision="reject", comment="not yet", decided_by="carol")
    outcome = await run_once(spec, st, CountingHost())
    assert outcome.output == "stopped: not yet"


async def test_expired_approval_applies_on_timeout_reject() -> None:
    spec = flow_spec("""
nodes:
  - {id: review, approval: {message: "ship?", timeoutSeconds: 1, onTimeout: reject}}
  - {id: route, branch: {value: "=.nodes.review.json.decision", cases: {approve: ok}, default: stop}}
  - {id: ok, transform: "=1"}
  - {id: stop, transform: "=0"}
output: "=.nodes.review.json"
""")
    st = store.MemoryStore()
    now = ManualClock()
    assert (await run_once(spec, st, CountingHost(), now=now)).phase == RunPhase.WAITING
    now.advance(1)
    outcome = await run_once(spec, st, CountingHost(), now=now)
    assert (
        outcome.output["decision"] == "reject"
        and outcome.output["decidedBy"] == "agentflows:timeout"
    )


async def test_expired_input_with_on_timeout_fail_fails_the_run() -> None:
    spec = flow_spec("""
nodes:
  - {id: ask, input: {message: "who?", timeoutSeconds: 1, onTimeout: fail}}
""")
    st = store.MemoryStore()
    now = ManualClock()
    await run_once(spec, st, CountingHost(), now=now)
    now.advance(1)
    outcome = await run_once(spec, st, CountingHost(), now=now)
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "RequestExpired"


async def test_input_request_data_becomes_the_node_output() -> None:
    spec = flow_spec("""
nodes:
  - {id: ask, input: {message: "who?", schema: {type: object, required: [owner]}}}
output: "=.nodes.ask.json.owner"
""")
    st = store.MemoryStore()
    await run_once(spec, st, CountingHost())
    await st.decide("ask", decision="respond", data={"owner": "alice"}, decided_by="alice")
    assert (await run_once(spec, st, CountingHost())).output == "alice"


async def test_two_approvals_on_parallel_branches_both_wait_and_both_resume() -> None:
    spec = flow_spec("""
nodes:
  - {id: start, transform: "=1"}
  - {id: legal, approval: {message: "legal?"}}
  - {id: security, approval: {message: "security?"}}
  - {id: done, transform: "=[.nodes.legal.json.decision, .nodes.security.json.decision]"}
edges:
  - {from: start, to: legal}
  - {from: start, to: security}
  - {from: legal, to: done}
  - {from: security, to: done}
""")
    st = store.MemoryStore()
    first = await run_once(spec, st, CountingHost())
    assert first.phase == RunPhase.WAITING and set(st.checkpoint.requests) == {"legal", "security"}
    await st.decide("legal", decision="approve", decided_by="a")
    assert (await run_once(spec, st, CountingHost())).phase == RunPhase.WAITING
    await st.decide("security", decision="approve", decided_by="b")
    assert (await run_once(spec, st, CountingHost())).output == ["approve", "approve"]


async def test_sub_flow_nodes_are_stored_under_a_prefix_and_nesting_is_bounded() -> None:
    child = flow_spec("""
nodes:
  - {id: double, transform: "=.run.input.n * 2"}
""")
    parent = flow_spec("""
nodes:
  - {id: call, flow: {name: child, input: {n: 21}}}
output: "=.nodes.call.json"
""")
    resolver = graph.StaticResolver(agents(), {"child": child, "parent": parent})
    st = store.MemoryStore()
    outcome = await run_once(parent, st, CountingHost(), resolver=resolver)
    assert outcome.output == 42
    assert "call/double" in st.checkpoint.nodes
    looping = flow_spec("""
nodes:
  - {id: again, flow: {name: loop}}
""")
    resolver = graph.StaticResolver(agents(), {"loop": looping})
    outcome = await run_once(looping, store.MemoryStore(), CountingHost(), resolver=resolver)
    assert outcome.phase == RunPhase.FAILED
    assert "nest deeper than 5 levels" in (outcome.message or "")


async def test_finished_run_is_returned_as_it_is() -> None:
    st = store.MemoryStore()
    host = CountingHost()
    await run_once(chain(2), st, host)
    again = await run_once(chain(2), st, host)
    assert again.phase == RunPhase.SUCCEEDED and sum(host.calls.values()) == 2


async def test_each_node_is_checkpointed_before_its_dependants_start() -> None:
    st = store.MemoryStore()
    seen: list[set[str]] = []

    class Spy(CountingHost):
        async def call_tool(self, task, ctx):  # type: ignore[no-untyped-def]
            seen.append({k for k, v in st.checkpoint.nodes.items() if v.phase == "Succeeded"})
            return await super().call_tool(task, ctx)

    await run_once(chain(4), st, Spy())
    assert seen == [set(), {"n0"}, {"n0", "n1"}, {"n0", "n1", "n2"}]


async def test_rejection_with_no_branch_ends_the_run_failed_with_reason_rejected() -> None:
    spec = flow_spec("""
nodes:
  - {id: review, approval: {message: "ship?"}}
  - {id: ship, tool: {python: {script: x}}}
""")
    st = store.MemoryStore()
    host = CountingHost()
    await run_once(spec, st, host)
    await st.decide("review", decision="reject", comment="too risky", decided_by="dave")
    outcome = await run_once(spec, st, host)
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "Rejected"
    assert outcome.message == 'node "review" failed: rejected by dave: too risky'
    assert not host.calls


async def test_expired_approval_with_no_branch_ends_the_run_rejected() -> None:
    spec = flow_spec("""
nodes:
  - {id: review, approval: {message: "ship?", timeoutSeconds: 1, onTimeout: reject}}
""")
    st = store.MemoryStore()
    now = ManualClock()
    await run_once(spec, st, CountingHost(), now=now)
    now.advance(1)
    outcome = await run_once(spec, st, CountingHost(), now=now)
    assert outcome.reason == "Rejected" and "agentflows:timeout" in (outcome.message or "")


async def test_a_sub_flow_failure_is_the_output_of_a_flow_node_that_catches_errors() -> None:
    child = flow_spec("""
nodes:
  - {id: check, transform: '=if .run.input.n > 1 then error("too big") else . end'}
""")
    parent = flow_spec("""
nodes:
  - {id: call, flow: {name: child, input: {n: 2}, catchErrors: true}}
  - {id: after, transform: "=.nodes.call.json.caughtError"}
""")
    resolver = graph.StaticResolver(agents(), {"child": child, "parent": parent})
    st = store.MemoryStore()
    outcome = await run_once(parent, st, CountingHost(), resolver=resolver)
    assert outcome.phase == RunPhase.SUCCEEDED
    assert 'node "call/check" failed' in outcome.output and "too big" in outcome.output
    assert st.checkpoint.nodes["call/check"].phase == flowrun_api.NodePhase.FAILED
    uncaught = parent.model_copy(deep=True)
    assert uncaught.nodes[0].flow is not None
    uncaught.nodes[0].flow.catch_errors = False
    outcome = await run_once(uncaught, store.MemoryStore(), CountingHost(), resolver=resolver)
    assert outcome.phase == RunPhase.FAILED and "too big" in (outcome.message or "")


async def test_a_limit_hit_inside_a_sub_flow_is_not_caught() -> None:
    child = flow_spec("""
nodes:
  - {id: a, transform: "=1"}
  - {id: b, transform: "=2"}
  - {id: c, transform: "=3"}
""")
    parent = flow_spec("""
nodes:
  - {id: call, flow: {name: child, catchErrors: true}}
limits: {maxNodeExecutions: 2}
""")
    resolver = graph.StaticResolver(agents(), {"child": child, "parent": parent})
    outcome = await run_once(parent, store.MemoryStore(), CountingHost(), resolver=resolver)
    assert outcome.phase == RunPhase.FAILED
    assert outcome.reason == flowrun_api.RunReason.NODE_EXECUTION_LIMIT_EXCEEDED
