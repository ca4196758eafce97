"""The checkpoint store contract: every backend (memory, file, FlowRun status) passes it.

A backend's test module subclasses :class:`StoreContract` and provides two fixtures:
``backend`` (an object with ``new_store()`` returning a fresh store over the same durable
state, as a new runner would get) and ``decide`` is ``backend.decide(store, request_id, **fields)``
(how a human writes a decision in that backend).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, state, store

from .helpers import CountingHost, chain, run_once

Phase = flowrun_api.NodePhase


class StoreContract:
    @pytest.fixture
    def backend(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def test_new_store_loads_an_empty_checkpoint(self, backend: Any) -> None:
        checkpoint = await backend.new_store().load()
        assert checkpoint.run is None and checkpoint.nodes == {} and checkpoint.outcome is None

    async def test_run_record_survives_a_new_store(self, backend: Any) -> None:
        await backend.new_store().save_run(
            store.RunRecord("r", {"topic": "x"}, {"type": "manual"}, "2026-01-01T00:00:00Z")
        )
        loaded = await backend.new_store().load()
        assert loaded.run is not None and loaded.run.input == {"topic": "x"}

    async def test_node_record_round_trips_and_last_write_wins(self, backend: Any) -> None:
        st = backend.new_store()
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.RUNNING, attempts=1))
        await st.save_node(
            "a",
            flowrun_api.NodeStatus(
                phase=Phase.SUCCEEDED,
                attempts=1,
                output={"json": {"ü": [1, 2]}, "text": "t", "raw": None},
            ),
        )
        loaded = await backend.new_store().load()
        assert loaded.nodes["a"].phase == Phase.SUCCEEDED
        assert loaded.nodes["a"].output["json"] == {"ü": [1, 2]}

    async def test_large_output_round_trips(self, backend: Any) -> None:
        big = "x" * (1024 * 1024)
        await backend.new_store().save_node(
            "big",
            flowrun_api.NodeStatus(
                phase=Phase.SUCCEEDED, output={"json": big, "text": big, "raw": None}
            ),
        )
        loaded = await backend.new_store().load()
        assert loaded.nodes["big"].output["json"] == big

    async def test_a_fold_of_offloaded_iterations_keeps_the_latest_output_readable(
        self, backend: Any
    ) -> None:
        big = "y" * (300 * 1024)
        st = backend.new_store()
        for n in (2, 3):
            output = {"json": f"{n}{big}", "text": "", "raw": None}
            record = flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, attempts=1, output=output)
            await st.save_node(f"draft#{n}", record)
        # a new runner folds what it loaded, as the engine does past ITERATIONS_KEPT
        resumed = backend.new_store()
        loaded = await resumed.load()
        folded = flowrun_api.NodeStatus(
            phase=Phase.SUCCEEDED,
            attempts=2,
            output=loaded.nodes["draft#3"].output,
            detail={"folded": {"succeeded": 2}},
        )
        await resumed.fold_nodes({"draft#2-3": folded}, ["draft#2", "draft#3"])
        again = await backend.new_store().load()
        assert sorted(again.nodes) == ["draft#2-3"]
        assert again.nodes["draft#2-3"].output["json"] == f"3{big}"

    async def test_concurrent_node_saves_lose_nothing(self, backend: Any) -> None:
        st = backend.new_store()
        await asyncio.gather(
            *(
                st.save_node(
                    f"n{i}", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, output={"json": i})
                )
                for i in range(30)
            )
        )
        loaded = await backend.new_store().load()
        assert sorted(loaded.nodes) == sorted(f"n{i}" for i in range(30))

    async def test_human_decision_is_seen_and_not_overwritten_by_the_runner(
        self, backend: Any
    ) -> None:
        st = backend.new_store()
        request = flowrun_api.HumanRequest(
            node="review", kind=flowrun_api.RequestKind.APPROVAL, message="ok?"
        )
        await st.save_request("review", request)
        await backend.decide(
            st, "review", decision=flowrun_api.Decision.APPROVE, decided_by="alice"
        )
        await backend.new_store().save_request("review", request)
        loaded = await backend.new_store().load()
        assert loaded.requests["review"].decision == flowrun_api.Decision.APPROVE
        assert loaded.requests["review"].decided_by == "alice"

    async def test_outcome_round_trips(self, backend: Any) -> None:
        outcome = store.Outcome(flowrun_api.RunPhase.SUCCEEDED, output={"a": 1}, reason="Succeeded")
        await backend.new_store().save_outcome(outcome)
        loaded = await backend.new_store().load()
        assert loaded.outcome is not None and loaded.outcome.output == {"a": 1}

    @pytest.mark.parametrize("stop_after", [1, 3, 5])
    async def test_run_stopped_after_node_k_resumes_without_rerunning_nodes_1_to_k(
        self, backend: Any, stop_after: int
    ) -> None:
        spec = chain(6)
        host = CountingHost()
        await _killed_after(f"n{stop_after - 1}", spec, backend, host)
        assert sum(host.calls.values()) == stop_after
        outcome = await run_once(spec, backend.new_store(), host)
        assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED
        assert all(count == 1 for count in host.calls.values()), host.calls
        assert sorted(host.calls) == [f"n{i}" for i in range(6)]

    async def test_waiting_run_resumes_after_the_decision(self, backend: Any) -> None:
        from .helpers import flow_spec

        spec = flow_spec("""
nodes:
  - {id: before, tool: {python: {script: x}}}
  - {id: gate, approval: {message: "go?"}}
  - {id: after, tool: {python: {script: x}}}
""")
        host = CountingHost()
        first = await run_once(spec, backend.new_store(), host)
        assert first.phase == flowrun_api.RunPhase.WAITING
        st = backend.new_store()
        await backend.decide(st, "gate", decision=flowrun_api.Decision.APPROVE, decided_by="bob")
        second = await run_once(spec, backend.new_store(), host)
        assert second.phase == flowrun_api.RunPhase.SUCCEEDED
        assert host.calls == {"before": 1, "after": 1}

    async def test_loop_stopped_in_iteration_k_resumes_without_rerunning_finished_iterations(
        self, backend: Any
    ) -> None:
        from .helpers import flow_spec

        spec = flow_spec(LOOP)
        host = CountingHost()
        await _killed_after("draft#3", spec, backend, host)
        assert host.calls == {"draft": 1, "draft#2": 1, "draft#3": 1}
        outcome = await run_once(spec, backend.new_store(), host)
        assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
        assert host.calls == {"draft": 1, "draft#2": 1, "draft#3": 1, "draft#4": 1}
        loaded = await backend.new_store().load()
        assert loaded.nodes["check#4"].output["json"]["next"] == "done"
        assert outcome.output == 4

    async def test_loop_over_its_bound_fails_the_run_naming_the_loop(self, backend: Any) -> None:
        from .helpers import flow_spec

        spec = flow_spec(LOOP.replace("{id: draft,", "{id: draft, maxIterations: 2,"))
        host = CountingHost()
        outcome = await run_once(spec, backend.new_store(), host)
        assert outcome.phase == flowrun_api.RunPhase.FAILED
        assert outcome.reason == flowrun_api.RunReason.LOOP_ITERATION_LIMIT_EXCEEDED
        assert outcome.message == (
            "loop draft -> check -> draft would start iteration 3, over the maxIterations=2 of "
            'node "draft"'
        )
        assert host.calls == {"draft": 1, "draft#2": 1}

    async def test_a_loop_without_an_exit_is_refused_naming_its_path_before_anything_runs(
        self, backend: Any
    ) -> None:
        from .helpers import flow_spec

        spec = flow_spec(LOOP.replace('cases: {"4": done}, default: draft', "default: draft"))
        spec.nodes.pop()  # done: nothing leads there any more
        host = CountingHost()
        with pytest.raises(graph.FlowInvalid) as refused:
            await run_once(spec, backend.new_store(), host)
        assert [str(p) for p in refused.value.problems] == [
            "spec.edges: loop draft -> check -> draft has no exit: a loop must pass through a "
            "branch node with a case or default leading out of it"
        ]
        assert host.calls == {}
        loaded = await backend.new_store().load()
        assert loaded.nodes == {} and loaded.outcome is None

    async def test_a_loop_of_1000_iterations_stays_small_and_resumes_after_a_kill_in_500(
        self, backend: Any
    ) -> None:
        from .helpers import flow_spec

        spec = flow_spec(LONG_LOOP)
        host = CountingHost()
        await _killed_after("draft#500", spec, backend, host)
        assert len(host.calls) == 500
        stopped = await backend.new_store().load()
        assert _iterations_kept(stopped, "draft") == [1, *range(491, 501)]
        outcome = await run_once(spec, backend.new_store(), host)
        assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
        assert outcome.output == {"count": 1000, "kept": 1 + KEPT}
        assert len(host.calls) == 1000 and set(host.calls.values()) == {1}
        loaded = await backend.new_store().load()
        assert _iterations_kept(loaded, "draft") == [1, *range(991, 1001)]
        assert sorted(k for k in loaded.nodes if "-" in k) == [
            "check#2-990",
            "count#2-990",
            "draft#2-990",
        ]
        folded = loaded.nodes["draft#2-990"]
        assert (folded.phase, folded.attempts, folded.detail) == (
            Phase.SUCCEEDED,
            989,
            {"folded": {"succeeded": 989}},
        )
        assert loaded.nodes["count#2-990"].output["json"] == 990
        assert len(loaded.nodes) == 3 * (1 + KEPT) + 3 + 1  # kept, folded, and done
        assert len(json.dumps(loaded.to_json())) < 16_384

    async def test_a_loop_that_reaches_its_bound_fails_with_its_reason_and_stays_small(
        self, backend: Any
    ) -> None:
        from .helpers import flow_spec

        spec = flow_spec(LONG_LOOP.replace('"1000": done', '"never": done'))
        host = CountingHost()
        outcome = await run_once(spec, backend.new_store(), host)
        assert outcome.phase == flowrun_api.RunPhase.FAILED
        assert outcome.reason == flowrun_api.RunReason.LOOP_ITERATION_LIMIT_EXCEEDED
        assert outcome.message == (
            "loop count -> draft -> check -> count would start iteration 1001, over the "
            'maxIterations=1000 of node "count"'
        )
        assert len(host.calls) == 1000
        loaded = await backend.new_store().load()
        assert len(loaded.nodes) == 3 * (1 + KEPT) + 3
        assert sum(r.attempts for r in loaded.nodes.values()) == 3 * 1000

    async def test_node_executions_of_folded_iterations_still_count_after_a_resume(
        self, backend: Any
    ) -> None:
        from .helpers import flow_spec

        spec = flow_spec(LONG_LOOP.replace("1000}", "1000, maxNodeExecutions: 240}"))
        host = CountingHost()
        await _killed_after("draft#50", spec, backend, host)
        outcome = await run_once(spec, backend.new_store(), host)
        assert outcome.phase == flowrun_api.RunPhase.FAILED
        assert outcome.reason == flowrun_api.RunReason.NODE_EXECUTION_LIMIT_EXCEEDED
        # three executions an iteration: the 241st is count#81
        assert len(host.calls) == 80 and set(host.calls.values()) == {1}


KEPT = flowrun_api.ITERATIONS_KEPT


async def _killed_after(key: str, spec: Any, backend: Any, host: CountingHost) -> None:
    """Run until node ``key`` has succeeded, then stop the run there, as a killed runner."""
    task: asyncio.Task[Any] | None = None

    def stop(event: state.RunEvent) -> None:
        if event.kind == "succeeded" and event.key == key and task is not None:
            task.cancel()

    task = asyncio.ensure_future(run_once(spec, backend.new_store(), host, observer=stop))
    with pytest.raises(asyncio.CancelledError):
        await task


def _iterations_kept(checkpoint: store.Checkpoint, node_id: str) -> list[int]:
    found = [flowrun_api.node_of_key(k) for k in checkpoint.nodes if "-" not in k]
    return sorted(n for base, n in found if base == node_id)


#: Counts its iterations (``.nodes.count`` is the previous one's count) and exits after 1,000.
LONG_LOOP = """
limits: {maxIterations: 1000}
nodes:
  - {id: count, transform: "=(.nodes.count.json // 0) + 1"}
  - {id: draft, tool: {python: {script: x}}}
  - id: check
    branch: {value: "=.nodes.count.json", cases: {"1000": done}, default: count}
  - {id: done, transform: "={count: .nodes.count.json, kept: (.iterations.draft | length)}"}
"""

#: Drafts until the fourth iteration; ``.iterations.draft`` lists every iteration's output.
LOOP = """
nodes:
  - {id: draft, tool: {python: {script: x}}}
  - id: check
    branch: {value: "=.iterations.draft | length", cases: {"4": done}, default: draft}
  - {id: done, transform: "=.iterations.draft | length"}
"""
