"""The operator on a real control plane, installed from config/ as it ships.

The operator runs as a subprocess with its ServiceAccount's token (config/rbac), runner pods run
in containers on the real node with their pod-bound tokens (config/rbac/runner), and the
admission policy of config/policies is on. Python tools in these flows append to files on the
test's board (:mod:`tests.support.tool_board`), which is how the tests see what ran and how
often; slow tools wait for a "release" file the test writes there.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agentflows.kube import client as kube_client
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator, python_tool
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer
from tests.support.tool_board import CLIENT, BoardFile, ToolBoard

pytestmark = pytest.mark.cluster

# The tools count their calls and wait for the release on the test's board (their pods cannot
# see the test's files): a count outlives the pod that wrote it.
COUNT = (
    CLIENT
    + """
import json, sys
args = json.load(sys.stdin)
append(args["count"], "ran\\n")
print(json.dumps({"text": args.get("text", "").upper()}))
"""
)

SLOW = (
    CLIENT
    + """
import json, sys, time
args = json.load(sys.stdin)
append(args["count"], "ran\\n")
deadline = time.time() + 150
while not exists(args["release"]) and time.time() < deadline:
    time.sleep(0.1)
print(json.dumps({"released": exists(args["release"])}))
"""
)


def flow(name: str, nodes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"kind": "Flow", "metadata": {"name": name}, "spec": {"nodes": nodes, **spec}}


def flowrun(name: str, flow_name: str, value: Any = None) -> dict[str, Any]:
    return {
        "kind": "FlowRun",
        "metadata": {"name": name},
        "spec": {"flow": flow_name, "input": value},
    }


def slow_flow(name: str, tool_board: ToolBoard, **spec: Any) -> dict[str, Any]:
    """first (counted) -> wait (counted, waits for the release file) -> last."""
    return flow(
        name,
        [
            {"id": "first", "tool": python_tool(COUNT, {"count": str(tool_board / "first.count")})},
            {
                "id": "wait",
                "tool": python_tool(
                    SLOW,
                    {
                        "count": str(tool_board / "wait.count"),
                        "release": str(tool_board / "release"),
                    },
                    timeout=300,
                ),
            },
            {"id": "last", "transform": "={released: .nodes.wait.json.released}"},
        ],
        output="=.nodes.last.json",
        retry={"maxAttempts": 3, "backoffSeconds": 1},
        **spec,
    )


def kubectl_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def runner_patch(
    kubeconfig: Path, namespace: str, run: str, status: dict[str, Any]
) -> kube_client.ApiError | None:
    """Merge-patch a FlowRun's status with a runner pod's token; the refusal, if any."""

    async def patch() -> kube_client.ApiError | None:
        async with kube_client.Client.from_env(str(kubeconfig), retry_seconds=0) as api:
            try:
                path = kube_client.path_of("flowruns", namespace, run, sub="status")
                await api.merge_patch(path, {"status": status})
            except kube_client.ApiError as exc:
                return exc
        return None

    return asyncio.run(patch())


def lines(path: BoardFile) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# ----- a run from start to finish ---------------------------------------------------------------


def test_flow_with_transform_and_python_tool_succeeds_with_status_columns_and_events(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(
        flow(
            "shout",
            [
                {"id": "greet", "transform": '={greeting: ("hello " + .run.input.name)}'},
                {
                    "id": "loud",
                    "tool": python_tool(
                        COUNT,
                        {
                            "count": str(tool_board / "loud.count"),
                            "text": "{{ .nodes.greet.json.greeting }}",
                        },
                    ),
                },
            ],
            output="=.nodes.loud.json",
        ),
        flowrun("shout-1", "shout", {"name": "world"}),
    )
    waited = control_plane.kubectl(
        "wait",
        "-n",
        runs.namespace,
        "--for=condition=Succeeded",
        "flowrun/shout-1",
        "--timeout=180s",
    )
    assert "condition met" in waited.stdout

    status = runs.status("shout-1")
    assert status["phase"] == "Succeeded"
    assert status["output"] == {"text": "HELLO WORLD"}
    assert {k: v["phase"] for k, v in status["nodes"].items()} == {
        "greet": "Succeeded",
        "loud": "Succeeded",
    }
    assert status["attempt"] == 1 and status["pod"] == "shout-1-1"
    assert status["startTime"] and status["completionTime"] and status["duration"]
    waiting = runs.condition("flowruns", "shout-1", "Waiting")
    assert waiting is not None and waiting["status"] == "False"

    table = control_plane.kubectl(
        "get", "flowruns", "-n", runs.namespace, "--no-headers"
    ).stdout.split()
    assert table[:3] == ["shout-1", "shout", "Succeeded"]
    assert "1" in table[3:5]  # Attempt (the Node column is empty once finished)

    selected = control_plane.kubectl(
        "get", "flowruns", "-n", runs.namespace, "--field-selector=spec.flow=shout", "-o", "name"
    ).stdout.split()
    assert selected == ["flowrun.agentflows.io/shout-1"]
    snapshot = control_plane.core().read_namespaced_config_map("shout-1-snapshot", runs.namespace)
    assert json.loads(snapshot.data["snapshot.json"])["flow"] == "shout"

    reasons = wait_for(
        lambda: (
            {e.reason for e in runs.events("shout-1")} >= {"Succeeded"}
            and {e.reason for e in runs.events("shout-1")}
        ),
        60,
        "phase-change Events",
    )
    assert "Succeeded" in reasons

    [pod] = runs.pods("shout-1")
    container = pod.spec.containers[0]
    assert container.command == [
        "agentflows",
        "runner",
        "--namespace",
        runs.namespace,
        "--flowrun",
        "shout-1",
    ]
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.service_account_name == "agentflows-runner"
    assert pod.metadata.owner_references[0].kind == "FlowRun"

    flow_status = wait_for(
        lambda: (
            (runs.get("flows", "shout") or {}).get("status", {}).get("lastRun") == "shout-1"
            and (runs.get("flows", "shout") or {}).get("status", {}).get("activeRuns") == 0
            and runs.get("flows", "shout")
        ),
        60,
        "the Flow's summary (written at most once a second)",
    )
    assert flow_status["status"]["activeRuns"] == 0


def test_agent_node_calls_the_scripted_model_with_the_key_from_a_secret_ref(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    control_plane.core().create_namespaced_secret(
        runs.namespace,
        {"metadata": {"name": "scripted-model"}, "stringData": {"api-key": API_KEY}},
    )
    pod_model_server.script(Reply.text("Hi, world!"))
    runs.apply(
        {
            "kind": "Agent",
            "metadata": {"name": "greeter"},
            "spec": {
                "model": {
                    "name": "openai/scripted-model",
                    "apiBase": pod_model_server.url,
                    "apiKey": {"secretKeyRef": {"name": "scripted-model", "key": "api-key"}},
                    "retries": 0,
                },
                "systemPrompt": "You greet people.",
            },
        },
        flow(
            "greet",
            [
                {
                    "id": "ask",
                    "agent": {"name": "greeter", "prompt": "Greet {{ .run.input.name }}"},
                },
                {"id": "done", "transform": "={answer: .nodes.ask.text}"},
            ],
            output="=.nodes.done.json",
        ),
    )
    ready = wait_for(
        lambda: (c := runs.condition("agents", "greeter", "Ready")) and c["status"] == "True" and c,
        60,
        "Agent Ready",
    )
    assert ready["reason"] == "Valid"
    runs.apply(flowrun("greet-1", "greet", {"name": "world"}))
    status = runs.wait_phase("greet-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"answer": "Hi, world!"}
    [request] = pod_model_server.requests
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["authorization"] == f"Bearer {API_KEY}"
    [pod] = runs.pods("greet-1")
    # The key reaches the pod as a file of its secrets volume, in no environment variable.
    assert not [e for e in pod.spec.containers[0].env or [] if e.value_from]
    [volume] = [v for v in pod.spec.volumes if v.name == "secrets"]
    [source] = volume.projected.sources
    assert source.secret.name == "scripted-model"
    assert [(i.key, i.path) for i in source.secret.items] == [("api-key", "scripted-model/api-key")]


# ----- validation -------------------------------------------------------------------------------


def test_invalid_flow_and_agent_are_not_ready_with_path_named_messages(
    control_plane: Cluster, runs: FlowRuns, operator: Operator
) -> None:
    runs.apply(
        flow(
            "broken",
            [
                {"id": "bad", "transform": "=.foo | "},
                {"id": "ask", "agent": {"name": "ghost", "prompt": "hi"}},
            ],
        )
    )
    ready = wait_for(
        lambda: (c := runs.condition("flows", "broken", "Ready")) and c["status"] == "False" and c,
        60,
        "Flow Ready=False",
    )
    assert "spec.nodes[0].transform" in ready["message"]
    assert 'spec.nodes[1].agent.name: no Agent "ghost"' in ready["message"]

    # An Agent the Flow uses appears: the Flow is validated again (the transform stays wrong).
    runs.apply(
        {
            "kind": "Agent",
            "metadata": {"name": "ghost"},
            "spec": {
                "model": {
                    "name": "openai/x",
                    "apiKey": {"secretKeyRef": {"name": "no-such-secret", "key": "k"}},
                }
            },
        }
    )
    agent_ready = wait_for(
        lambda: (c := runs.condition("agents", "ghost", "Ready")) and c["status"] == "False" and c,
        60,
        "Agent Ready=False",
    )
    assert (
        agent_ready["message"]
        == 'spec.model.apiKey.secretKeyRef: Secret "no-such-secret" does not exist'
    )
    message = wait_for(
        lambda: (
            "ghost"
            not in (c := runs.condition("flows", "broken", "Ready") or {}).get("message", "x")
            and c["message"]
        ),
        60,
        "the Flow re-validated",
    )
    assert "spec.nodes[0].transform" in message

    runs.apply(flowrun("broken-1", "broken"))
    status = runs.wait_phase("broken-1", "Failed")
    assert status["reason"] == "FlowInvalid"
    assert runs.pods("broken-1") == []

    runs.apply(flow("broken", [{"id": "bad", "transform": "=.run.input"}]))
    wait_for(
        lambda: (c := runs.condition("flows", "broken", "Ready")) and c["status"] == "True",
        60,
        "Flow Ready=True after the fix",
    )
    assert operator.alive


# ----- attempts, cancellation, restarts ---------------------------------------------------------


def test_deleted_runner_pod_gets_a_next_attempt_and_finished_nodes_do_not_run_again(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(slow_flow("resume", tool_board), flowrun("resume-1", "resume"))
    runs.wait_node("resume-1", "first", "Succeeded")
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the slow node started")

    control_plane.core().delete_namespaced_pod("resume-1-1", runs.namespace)
    wait_for(lambda: runs.status("resume-1").get("attempt") == 2, 120, "attempt 2")
    wait_for(lambda: lines(tool_board / "wait.count") == 2, 120, "the slow node started again")
    (tool_board / "release").touch()

    status = runs.wait_phase("resume-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"released": True}
    assert lines(tool_board / "first.count") == 1  # finished before the pod was deleted
    assert [p.metadata.name for p in runs.pods("resume-1")] == ["resume-1-2"]
    assert "AttemptLost" in {e.reason for e in runs.events("resume-1")}


def test_cancel_deletes_the_pod_and_the_run_is_cancelled(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(slow_flow("cancel", tool_board), flowrun("cancel-1", "cancel"))
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the slow node started")
    runs.apply({**flowrun("cancel-1", "cancel"), "spec": {"flow": "cancel", "cancel": True}})

    status = runs.wait_phase("cancel-1", "Cancelled")
    assert status["reason"] == "Cancelled"
    succeeded = runs.condition("flowruns", "cancel-1", "Succeeded")
    assert succeeded is not None and succeeded["status"] == "False"
    wait_for(lambda: runs.pods("cancel-1") == [], 120, "the runner pod gone")


def test_restarted_operator_never_creates_a_second_pod_for_an_attempt(
    control_plane: Cluster, runs: FlowRuns, operator: Operator, tool_board: ToolBoard
) -> None:
    runs.apply(slow_flow("restart", tool_board), flowrun("restart-1", "restart"))
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the slow node started")

    operator.restart()
    # Let the restarted operator go through its initial listing while the pod still runs.
    wait_for(lambda: 'flow="restart"' in operator.metrics(), 60, "the run seen again")
    operator.stop()
    (tool_board / "release").touch()
    wait_for(
        lambda: (runs.status("restart-1").get("result") or {}).get("phase") == "Succeeded",
        120,
        "the runner's result written while the operator is down",
    )
    operator.start()

    status = runs.wait_phase("restart-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["attempt"] == 1
    assert [p.metadata.name for p in runs.pods("restart-1")] == ["restart-1-1"]
    assert lines(tool_board / "wait.count") == 1


def test_concurrency_forbid_cancels_a_run_while_another_is_active(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(
        slow_flow("single", tool_board, concurrency={"policy": "Forbid", "max": 1}),
        flowrun("single-1", "single"),
    )
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the first run is active")
    runs.apply(flowrun("single-2", "single"))

    second = runs.wait_phase("single-2", "Cancelled")
    assert second["reason"] == "ConcurrencyForbid"
    assert runs.pods("single-2") == []
    (tool_board / "release").touch()
    assert runs.wait_phase("single-1", "Succeeded", "Failed")["phase"] == "Succeeded"


# ----- the runner's token is confined to its run ------------------------------------------------


def test_runner_token_may_patch_its_own_run_but_not_another(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(
        slow_flow("confined", tool_board),
        flowrun("confined-1", "confined"),
        flowrun("other-1", "no-such-flow"),
    )
    runs.wait_phase("other-1", "Failed")
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the slow node started")
    kubeconfig = runs.pod_kubeconfig("confined-1-1")
    assert kubeconfig.exists()

    denied = runner_patch(kubeconfig, runs.namespace, "other-1", {"currentNode": "hijack"})
    assert denied is not None and denied.status == 403
    assert "may write only the FlowRun whose status.pod is confined-1-1" in denied.message
    assert runs.status("other-1").get("currentNode") != "hijack"

    assert runner_patch(kubeconfig, runs.namespace, "confined-1", {"currentNode": "wait"}) is None

    stolen = kubectl_as(
        kubeconfig,
        "create",
        "configmap",
        "other-1-out-x",
        "-n",
        runs.namespace,
        "--from-literal=a=b",
    )
    assert stolen.returncode != 0 and "may write only ConfigMaps" in stolen.stderr
    with pytest.raises(client.ApiException):
        control_plane.core().read_namespaced_config_map("other-1-out-x", runs.namespace)
    (tool_board / "release").touch()
    assert runs.wait_phase("confined-1", "Succeeded", "Failed")["phase"] == "Succeeded"


# ----- humans, queues, limits -------------------------------------------------------------------


def test_waiting_run_starts_the_next_attempt_when_a_request_is_decided(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    runs.apply(
        flow(
            "gate",
            [
                {"id": "review", "approval": {"message": "Ship it?"}},
                {"id": "after", "transform": "={decision: .nodes.review.json.decision}"},
            ],
            output="=.nodes.after.json",
        ),
        flowrun("gate-1", "gate"),
    )
    status = runs.wait_phase("gate-1", "Waiting", "Failed")
    assert status["phase"] == "Waiting", status.get("message")
    waiting = runs.condition("flowruns", "gate-1", "Waiting")
    assert waiting is not None and waiting["status"] == "True"
    [request_id] = status["requests"]
    assert status["attempt"] == 1

    decision = {"status": {"requests": {request_id: {"decision": "approve", "decidedBy": "admin"}}}}
    control_plane.kubectl(
        "patch", "flowrun", "gate-1", "-n", runs.namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps(decision),
    )  # fmt: skip
    status = runs.wait_phase("gate-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["attempt"] == 2
    assert status["output"] == {"decision": "approve"}
    assert [p.metadata.name for p in runs.pods("gate-1")] == ["gate-1-1", "gate-1-2"]


def test_queued_run_starts_when_the_active_run_finishes(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(
        slow_flow("line", tool_board, concurrency={"policy": "Queue", "max": 1}),
        flowrun("line-1", "line"),
    )
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the first run is active")
    runs.apply(flowrun("line-2", "line"))
    assert runs.wait_phase("line-2", "Queued")["reason"] == "Queued"
    assert runs.pods("line-2") == []

    (tool_board / "release").touch()
    assert runs.wait_phase("line-1", "Succeeded", "Failed")["phase"] == "Succeeded"
    assert runs.wait_phase("line-2", "Succeeded", "Failed")["phase"] == "Succeeded"


def test_timeout_fails_the_run_and_deletes_its_pod(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(
        slow_flow("late", tool_board, limits={"timeoutSeconds": 5}), flowrun("late-1", "late")
    )
    status = runs.wait_phase("late-1", "Failed", "Succeeded")
    assert status["phase"] == "Failed"
    assert status["reason"] == "Timeout"
    wait_for(lambda: runs.pods("late-1") == [], 120, "the runner pod gone")


def test_lost_attempts_beyond_max_attempts_fail_the_run(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    spec = slow_flow("fragile", tool_board)
    spec["spec"]["retry"] = {"maxAttempts": 1, "backoffSeconds": 1}
    runs.apply(spec, flowrun("fragile-1", "fragile"))
    wait_for(lambda: lines(tool_board / "wait.count") == 1, 120, "the slow node started")
    control_plane.core().delete_namespaced_pod("fragile-1-1", runs.namespace)

    status = runs.wait_phase("fragile-1", "Failed")
    assert status["reason"] == "RetriesExhausted"
    assert "fragile-1-1" in status["message"]


def test_a_runner_pod_deleted_before_it_ever_ran_is_a_lost_attempt_not_created_again(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    # No node has the label, so the pod stays Pending: what the API shows of any pod until its
    # kubelet reports it running, which can be seconds after its container started. The
    # operator records status.podCreated only once the pod runs.
    runs.apply(
        flow(
            "stuck",
            [{"id": "only", "transform": "=1"}],
            retry={"maxAttempts": 1, "backoffSeconds": 1},
            runner={"nodeSelector": {"agentflows.io/test-node": "none"}},
        ),
        flowrun("stuck-1", "stuck"),
    )
    wait_for(
        lambda: [p.status.phase for p in runs.pods("stuck-1")] == ["Pending"], 120, "a Pending pod"
    )
    control_plane.core().delete_namespaced_pod("stuck-1-1", runs.namespace)

    status = runs.wait_phase("stuck-1", "Failed", "Succeeded")
    assert (status["phase"], status["reason"]) == ("Failed", "RetriesExhausted"), status
    assert "runner pod stuck-1-1 is gone" in status["message"]
    assert runs.pods("stuck-1") == []
    assert status.get("podCreated", 0) == 0


def test_finished_runs_are_deleted_after_their_ttl_and_beyond_history_limits(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    runs.apply(
        flow("brief", [{"id": "only", "transform": "=1"}], ttlSecondsAfterFinished=2),
        flow("kept", [{"id": "only", "transform": "=1"}], successfulRunsHistoryLimit=1),
        flowrun("brief-1", "brief"),
        flowrun("kept-1", "kept"),
    )
    runs.wait_phase("kept-1", "Succeeded")
    runs.apply(flowrun("kept-2", "kept"))
    wait_for(lambda: runs.get("flowruns", "brief-1") is None, 120, "brief-1 deleted (TTL)")
    wait_for(lambda: runs.get("flowruns", "kept-1") is None, 120, "kept-1 deleted (history)")
    assert runs.wait_phase("kept-2", "Succeeded")["phase"] == "Succeeded"


def test_metrics_count_runs_by_flow_and_phase_without_run_names(
    control_plane: Cluster, runs: FlowRuns, operator: Operator
) -> None:
    runs.apply(
        flow("counted", [{"id": "only", "transform": "=1"}]), flowrun("counted-1", "counted")
    )
    runs.wait_phase("counted-1", "Succeeded")
    text = wait_for(
        lambda: (
            (m := operator.metrics())
            and 'agentflows_run_duration_seconds_count{flow="counted"' in m
            and m
        ),
        60,
        "run metrics",
    )
    line = f'agentflows_runs{{flow="counted",namespace="{runs.namespace}",phase="Succeeded"}} 1.0'
    assert line in text
    assert (
        f'agentflows_pod_attempts_total{{flow="counted",namespace="{runs.namespace}"}} 1.0' in text
    )
    assert 'node_type="transform"' in text
    assert "counted-1" not in text
