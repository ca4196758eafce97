"""What the runner asks of the API server: one read, and batched status writes.

The runner (:func:`agentflows.runner.main.run_attempt`) and its store
(:class:`agentflows.kube.status_store.StatusStore`) run against a fake FlowRun API on a
loopback HTTP server (tests/support/fake_flowrun_api.py) that records every request; model
calls go to the scripted model server on loopback. The same counts on the real API server are in
tests/cluster/test_runner_requests.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import store
from agentflows.kube import status_store
from agentflows.runner import main as runner_main
from agentflows.runner import stream_log
from tests.support.fake_flowrun_api import FakeFlowRunApi
from tests.support.fixtures import model_server  # noqa: F401  (fixture)
from tests.support.model_server import Reply, ScriptedModelServer

Phase = flowrun_api.NodePhase
#: The status the operator leaves for attempt 3's pod (controller/runstate.py reserve_attempt).
PREPARED = {"attempt": 3, "pod": "r-3", "phase": "Pending", "startTime": "2026-01-01T00:00:00Z"}


def llm_flow(server: ScriptedModelServer, *ids: str) -> dict[str, Any]:
    model = {"name": "openai/scripted-model", "apiBase": server.url, "retries": 0}
    return {"nodes": [{"id": i, "llm": {"model": model, "prompt": "Say hi"}} for i in ids]}


def prepared_run(flow: dict[str, Any], status: dict[str, Any] | None = None) -> FakeFlowRunApi:
    api = FakeFlowRunApi("team", "r", status=dict(status or PREPARED))
    api.snapshot(flow)
    return api


def written_paths(api: FakeFlowRunApi) -> list[list[str]]:
    """Per status write, the status paths it set."""
    return [[op["path"] for op in write.body] for write in api.writes()]


async def eventually(check: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


async def test_one_node_run_reads_its_flowrun_once_no_configmap_and_writes_twice(
    model_server: ScriptedModelServer,  # noqa: F811
) -> None:
    model_server.script(Reply.text("hi"))
    api = prepared_run(llm_flow(model_server, "ask"))
    async with api.client() as client:
        assert (
            await runner_main.run_attempt(client, "team", "r", attempt=3, configmaps=api.mounted)
            == 0
        )
    # the snapshot comes from the pod's volume: the runner's identity may not read ConfigMaps
    assert (api.requests[0].method, api.requests[0].path.rsplit("/", 2)[-2]) == ("GET", "flowruns")
    assert api.count("GET", "configmaps") == 0
    assert len(api.requests) == 3
    assert written_paths(api) == [
        ["/status/nodes", "/status/nodes/ask"],
        [
            "/status/output",
            "/status/outputRef",
            "/status/usage",
            "/status/currentNode",
            "/status/result",
        ],
    ]
    assert api.status["nodes"]["ask"]["phase"] == "Succeeded"
    assert api.status["result"]["phase"] == "Succeeded"


async def test_outcome_carries_the_attempt_the_runner_was_told_without_reading_again(
    model_server: ScriptedModelServer,  # noqa: F811
) -> None:
    model_server.script(Reply.text("hi"))
    api = prepared_run(llm_flow(model_server, "ask"))
    async with api.client() as client:
        assert (
            await runner_main.run_attempt(client, "team", "r", attempt=3, configmaps=api.mounted)
            == 0
        )
    assert api.count("GET", "flowruns") == 1
    assert api.status["result"]["attempt"] == 3
    assert api.status["attempt"] == 3  # the operator's key is untouched


async def test_a_finished_node_is_written_before_the_next_model_call(
    model_server: ScriptedModelServer,  # noqa: F811
) -> None:
    model_server.script(Reply.text("one"), Reply.text("two"))
    api = prepared_run(llm_flow(model_server, "first", "second"))
    async with api.client() as client:
        assert (
            await runner_main.run_attempt(client, "team", "r", attempt=3, configmaps=api.mounted)
            == 0
        )
    first_written = next(
        w.at for w in api.writes() if any(op["path"] == "/status/nodes/first" for op in w.body)
    )
    assert first_written < model_server.requests[1].received
    # one write per node, none of them a Running record, and the outcome
    assert [p[-1] for p in written_paths(api)] == [
        "/status/nodes/first",
        "/status/nodes/second",
        "/status/result",
    ]


async def test_sigterm_writes_the_running_record_of_the_node_in_flight_saying_it_was_interrupted(
    model_server: ScriptedModelServer,  # noqa: F811
) -> None:
    model_server.script(Reply.text("late", delay=5))
    api = prepared_run(llm_flow(model_server, "slow"))
    async with api.client() as client:
        attempt = asyncio.ensure_future(
            runner_main.run_attempt(client, "team", "r", attempt=3, configmaps=api.mounted)
        )
        await eventually(lambda: len(model_server.requests) == 1, "the model call")
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
    assert api.status["nodes"]["slow"]["phase"] == "Running"
    assert api.status["nodes"]["slow"]["attemptErrors"] == [
        "attempt 1: interrupted: the run stopped while the node ran; the next attempt runs it again"
    ]
    assert api.status["currentNode"] == "slow"
    assert "result" not in api.status


async def test_a_running_record_replaced_before_the_delay_is_never_sent() -> None:
    api = FakeFlowRunApi("team", "r", status=dict(PREPARED))
    async with api.client() as client:
        st = status_store.StatusStore(client, "team", "r", attempt=3, flowrun=api.flowrun)
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.RUNNING, attempts=1))
        st.save_current_node("a")
        assert api.requests == []
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, attempts=1))
    assert written_paths(api) == [["/status/nodes", "/status/nodes/a"]]
    assert api.status["nodes"]["a"]["phase"] == "Succeeded"
    assert "currentNode" not in api.status


async def test_a_node_running_longer_than_the_delay_is_recorded_running() -> None:
    api = FakeFlowRunApi("team", "r", status=dict(PREPARED))
    async with api.client() as client:
        st = status_store.StatusStore(
            client, "team", "r", attempt=3, flowrun=api.flowrun, running_delay=0.01
        )
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.RUNNING, attempts=1))
        st.save_current_node("a")
        await eventually(lambda: len(api.writes()) == 1, "the Running record")
    assert api.status["nodes"]["a"]["phase"] == "Running"
    assert api.status["currentNode"] == "a"


async def test_a_finished_record_takes_the_waiting_running_records_along() -> None:
    api = FakeFlowRunApi("team", "r", status=dict(PREPARED))
    async with api.client() as client:
        st = status_store.StatusStore(client, "team", "r", attempt=3, flowrun=api.flowrun)
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.RUNNING, attempts=1))
        await st.save_node("b", flowrun_api.NodeStatus(phase=Phase.RUNNING, attempts=1))
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, attempts=1))
    assert written_paths(api) == [["/status/nodes", "/status/nodes/a", "/status/nodes/b"]]
    assert {k: v["phase"] for k, v in api.status["nodes"].items()} == {
        "a": "Succeeded",
        "b": "Running",
    }


async def test_a_write_that_loses_a_race_is_tried_again() -> None:
    api = FakeFlowRunApi("team", "r", status=dict(PREPARED))
    api.refuse(409, 409)
    async with api.client() as client:
        st = status_store.StatusStore(client, "team", "r", attempt=3, flowrun=api.flowrun)
        await st.save_outcome(store.Outcome(flowrun_api.RunPhase.SUCCEEDED, output={"a": 1}))
    assert api.status["output"] == {"a": 1}
    assert api.status["result"]["attempt"] == 3


async def test_a_flowrun_read_without_status_nodes_gets_them_in_the_first_write() -> None:
    api = FakeFlowRunApi("team", "r", status=dict(PREPARED))
    async with api.client() as client:
        st = status_store.StatusStore(client, "team", "r", attempt=3, flowrun=api.flowrun)
        await st.save_node("a", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, output=[None]))
        await st.save_node("b", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED))
    assert written_paths(api) == [["/status/nodes", "/status/nodes/a"], ["/status/nodes/b"]]
    assert api.status["nodes"]["a"]["output"] == [None]
    assert sorted(api.status["nodes"]) == ["a", "b"]


def test_an_attempt_that_is_not_a_whole_number_is_named_in_the_error() -> None:
    assert runner_main.told_attempt({}) is None
    assert runner_main.told_attempt({"AGENTFLOWS_ATTEMPT": "2"}) == 2
    with pytest.raises(ValueError) as error:
        runner_main.told_attempt({"AGENTFLOWS_ATTEMPT": "two"})
    assert str(error.value) == "AGENTFLOWS_ATTEMPT='two': expected a whole number of at least 1"


async def test_the_runner_logs_a_streamed_answer_as_framed_json_lines_redacted_never_in_status(
    model_server: ScriptedModelServer,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "sk-runner-log-secret-0123456789"
    pieces = ["The key ", "is ", secret[:10], secret[10:], "."]
    model_server.script(Reply.text("".join(pieces), pieces=pieces))
    api = prepared_run(llm_flow(model_server, "ask"))
    os.environ["OPENAI_API_KEY"] = secret
    try:
        async with api.client() as client:
            assert (
                await runner_main.run_attempt(
                    client, "team", "r", attempt=3, configmaps=api.mounted
                )
                == 0
            )
    finally:
        del os.environ["OPENAI_API_KEY"]
    lines = capsys.readouterr().out.splitlines()
    events = [e for e in map(stream_log.parse, lines) if e is not None]
    assert "".join(e.get("delta", "") for e in events) == "The key is [redacted]."
    assert events[-1] == {"node": "ask", "end": True}
    assert {e["node"] for e in events} == {"ask"}
    others = [line for line in lines if stream_log.parse(line) is None]
    assert others and all(not line.startswith("{") for line in others), "log lines stay apart"
    assert secret[:10] not in "\n".join(lines)
    assert model_server.requests[0].body["stream"] is True
    assert not any("[redacted]" in json.dumps(w.body) for w in api.writes()), "not in status"
