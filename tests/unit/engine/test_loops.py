"""Loops: an approval inside a loop pauses per iteration and its decision routes the loop."""

from __future__ import annotations

import json
import re
from pathlib import Path

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import expressions, scope, store

from .helpers import CountingHost, flow_spec, run_once

REVIEW = """
nodes:
  - id: draft
    tool:
      python: {script: x}
      args: {comment: "{{ .nodes.review.json.comment }}"}
  - {id: review, approval: {message: "ok?"}}
  - id: decide
    branch: {value: "=.nodes.review.json.decision", cases: {approve: done}, default: draft}
  - {id: done, transform: "=.iterations.draft | map(.json.args.comment)"}
"""


async def test_rejection_comment_reaches_the_next_iteration_and_each_iteration_asks_anew(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.json"
    spec = flow_spec(REVIEW)
    host = CountingHost()
    assert (await run_once(spec, store.FileStore(path), host)).phase.value == "Waiting"
    reject = flowrun_api.Decision.REJECT
    await store.FileStore(path).decide("review", decision=reject, comment="shorter", decided_by="b")
    assert (await run_once(spec, store.FileStore(path), host)).phase.value == "Waiting"
    checkpoint = await store.FileStore(path).load()
    assert sorted(checkpoint.requests) == ["review", "review#2"]
    approve = flowrun_api.Decision.APPROVE
    await store.FileStore(path).decide("review#2", decision=approve, decided_by="b")
    outcome = await run_once(spec, store.FileStore(path), host)
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    assert outcome.output == ["", "shorter"]
    assert host.calls == {"draft": 1, "draft#2": 1}


EDITS = """
nodes:
  - {id: draft, tool: {python: {script: x}}}
  - {id: review, approval: {message: "ok?"}}
  - id: decide
    branch: {value: "=.nodes.review.json.decision", cases: {approve: done, edit: done}, default: draft}
  - {id: done, transform: "=.iterations.review | map(.json | {decision, comment, edits})"}
"""


async def test_an_edit_in_iteration_2_routes_and_records_like_a_decision_of_iteration_1(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.json"
    spec = flow_spec(EDITS)
    host = CountingHost()
    await run_once(spec, store.FileStore(path), host)
    reject, edit = flowrun_api.Decision.REJECT, flowrun_api.Decision.EDIT
    await store.FileStore(path).decide("review", decision=reject, comment="no", decided_by="b")
    assert (await run_once(spec, store.FileStore(path), host)).phase.value == "Waiting"
    await store.FileStore(path).decide(
        "review#2", decision=edit, edits={"title": "mine"}, decided_by="b"
    )
    outcome = await run_once(spec, store.FileStore(path), host)
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    assert outcome.output == [
        {"decision": "reject", "comment": "no", "edits": None},
        {"decision": "edit", "comment": None, "edits": {"title": "mine"}},
    ]
    checkpoint = await store.FileStore(path).load()
    assert checkpoint.nodes["review#2"].output["json"]["edits"] == {"title": "mine"}
    assert checkpoint.nodes["decide#2"].output["json"]["next"] == "done"
    assert host.calls == {"draft": 1, "draft#2": 1}


MAPPED = """
nodes:
  - id: each
    map: {items: "=[1, 2]", tool: {python: {script: x}, args: {n: "=.item"}}}
  - id: check
    branch: {value: "=.iterations.each | length", cases: {"2": done}, default: each}
  - {id: done, transform: "=[.iterations.each[].json[].tool]"}
"""


async def test_a_map_item_s_tool_is_named_after_its_node_in_every_iteration() -> None:
    host = CountingHost()
    outcome = await run_once(flow_spec(MAPPED), store.MemoryStore(), host)
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    assert sorted(host.calls) == ["each#2[0]", "each#2[1]", "each[0]", "each[1]"]
    assert outcome.output == ["each"] * 4


def test_only_programs_that_say_iterations_are_handed_a_loops_earlier_outputs() -> None:
    builder = scope.ScopeBuilder({"name": "r"})
    for n in (1, 2):
        builder.add("draft", {"json": n}, n)
    built = builder.scope()
    plain = expressions.referenced_nodes(".nodes.draft.json + 1")
    looped = expressions.referenced_nodes(".iterations.draft | length")
    assert '"iterations"' not in built.json_for(plain)
    assert json.loads(built.json_for(looped))["iterations"] == {"draft": [{"json": 1}, {"json": 2}]}
    assert json.loads(built.json_for(None))["iterations"]["draft"][-1] == {"json": 2}


LONG_MAPPED = """
nodes:
  - {id: count, maxIterations: 15, transform: "=(.nodes.count.json // 0) + 1"}
  - id: each
    map: {items: "=[1, 2]", tool: {python: {script: x}, args: {n: "=.item"}}}
  - id: check
    branch: {value: "=.nodes.count.json", cases: {"15": done}, default: count}
  - {id: done, transform: "=.iterations.each | length"}
"""


async def test_a_fold_takes_in_the_map_items_of_the_iterations_it_folds() -> None:
    memory = store.MemoryStore()
    outcome = await run_once(flow_spec(LONG_MAPPED), memory, CountingHost())
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    assert outcome.output == 1 + flowrun_api.ITERATIONS_KEPT  # 1 and 6-15
    nodes = memory.checkpoint.nodes
    kept = sorted({flowrun_api.node_of_key(k)[1] for k in nodes if k.startswith("each#")})
    assert kept == [2, *range(6, 16)]  # 2: the fold each#2-5
    assert [k for k in nodes if k.startswith("each#2-")] == ["each#2-5"]
    assert not [k for k in nodes if re.match(r"each#[2-5]\[", k)]
    assert sorted(k for k in nodes if k.startswith("each#6")) == [
        "each#6",
        "each#6[0]",
        "each#6[1]",
    ]
    folded = nodes["each#2-5"]
    # four iterations, each the map node and its two items
    assert (folded.attempts, folded.detail) == (12, {"folded": {"succeeded": 4}})
