"""An Agent Spec document imported with ``agentflows import`` runs on the real control plane.

Its InputMessageNode and its tool confirmation become FlowRun requests: the run waits with no
pod, the admin answers with ``agentflows respond`` and ``agentflows approve``, and a new runner
pod resumes it each time. A Swarm's handoff is part of the run's state: the pod that resumes a
run paused after a handoff goes on with the agent handed over to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

pytestmark = pytest.mark.cluster

SPEC = Path(__file__).parents[1] / "data" / "agentspec" / "refund_request.yaml"


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``agentflows ARGS`` with the admin's kubeconfig."""
    return subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig())},
    )


def waiting_on(runs: FlowRuns, name: str, request: str) -> dict[str, Any]:
    """Wait until the run waits on exactly ``request``; fail with its status if it does not."""

    def reached() -> dict[str, Any] | None:
        status = runs.status(name)
        if status.get("phase") == "Failed":
            pytest.fail(f"{name} failed: {status.get('message')}")
        pending = [k for k, r in (status.get("requests") or {}).items() if not r.get("decision")]
        return status if status.get("phase") == "Waiting" and pending == [request] else None

    try:
        return wait_for(reached, 180, f"{name} waiting on {request}")
    except pytest.fail.Exception:
        flow = runs.condition("flows", "refund-request", "Ready")
        pytest.fail(f"{name} never waited on {request}: status {runs.status(name)}, flow {flow}")


def test_an_imported_flow_pauses_for_input_and_confirmation_and_resumes(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    imported = cli(control_plane, "import", str(SPEC))
    assert imported.returncode == 0, imported.stderr
    documents = list(yaml.safe_load_all(imported.stdout))
    assert [d["kind"] for d in documents] == ["Flow"]
    runs.apply(*documents)
    runs.apply(
        {
            "kind": "FlowRun",
            "metadata": {"name": "refund-1"},
            "spec": {"flow": "refund-request", "input": {"order_id": "A7"}},
        }
    )
    status = waiting_on(runs, "refund-1", "ask")
    assert status["requests"]["ask"]["message"] == "Why refund order A7?"
    wait_for(
        lambda: not [p for p in runs.pods("refund-1") if p.status.phase == "Running"],
        120,
        "no running pod",
    )

    answered = cli(
        control_plane, "respond", "refund-1", "ask", "-n", runs.namespace, "--data", '"broken"'
    )
    assert answered.returncode == 0, answered.stderr
    status = waiting_on(runs, "refund-1", "refund_confirm")
    assert status["requests"]["refund_confirm"]["message"] == "Run refund?"

    approved = cli(control_plane, "approve", "refund-1", "-n", runs.namespace)
    assert approved.returncode == 0, approved.stderr
    status = runs.wait_phase("refund-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"refund_id": "R-A7: broken"}
    assert [p.metadata.name for p in runs.pods("refund-1")] == [
        "refund-1-1", "refund-1-2", "refund-1-3",
    ]  # fmt: skip


def test_a_client_tool_waits_as_a_request_and_respond_gives_its_result(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    spec = Path(__file__).parents[1] / "data" / "agentspec" / "client_tool_node.yaml"
    imported = cli(control_plane, "import", str(spec))
    assert imported.returncode == 0, imported.stderr
    runs.apply(*yaml.safe_load_all(imported.stdout))
    runs.apply(
        {
            "kind": "FlowRun",
            "metadata": {"name": "sign-1"},
            "spec": {"flow": "signer", "input": {"document": "lease.pdf"}},
        }
    )
    waiting_on(runs, "sign-1", "sign_confirm")
    approved = cli(control_plane, "approve", "sign-1", "-n", runs.namespace)
    assert approved.returncode == 0, approved.stderr
    status = waiting_on(runs, "sign-1", "sign")
    assert status["requests"]["sign"]["proposal"]["calls"] == [
        {"id": "sign_document", "tool": "sign_document", "args": {"document": "lease.pdf"},
         "client": True}
    ]  # fmt: skip
    answered = cli(
        control_plane, "respond", "sign-1", "sign", "-n", runs.namespace, "--data", '"sig-9"'
    )
    assert answered.returncode == 0, answered.stderr
    status = runs.wait_phase("sign-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"signature": "sig-9"}


def apply_swarm(
    cluster: Cluster,
    runs: FlowRuns,
    server: ScriptedModelServer,
    tmp: Path,
    handoff: str = "optional",
) -> None:
    """Import and apply the helpdesk Swarm, its billing agent with a client tool ``ledger``."""
    doc = yaml.safe_load((SPEC.parent / "swarm.yaml").read_text())
    doc["handoff"] = handoff
    doc["$referenced_components"]["model"]["url"] = server.url
    doc["$referenced_components"]["billing"]["tools"] = [
        {"component_type": "ClientTool", "name": "ledger",
         "inputs": [{"title": "invoice", "type": "integer"}]}
    ]  # fmt: skip
    path = tmp / "swarm.yaml"
    path.write_text(yaml.safe_dump(doc))
    imported = cli(cluster, "import", str(path))
    assert imported.returncode == 0, imported.stderr
    runs.apply(*yaml.safe_load_all(imported.stdout))


def desk_run(name: str) -> dict[str, Any]:
    return {
        "kind": "FlowRun",
        "metadata": {"name": name},
        "spec": {"flow": "helpdesk", "input": {"message": "Was invoice 42 paid?"}},
    }


def test_a_swarm_run_paused_after_a_handoff_resumes_in_a_new_pod_with_the_recipient(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    apply_swarm(control_plane, runs, pod_model_server, tmp_path)
    pod_model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.calls(ToolCall("ledger", {"invoice": 42}, id="c1")),
    )
    runs.apply(desk_run("desk-1"))
    status = waiting_on(runs, "desk-1", "agent")
    assert status["requests"]["agent"]["message"] == "Agent billing wants to call ledger."
    wait_for(
        lambda: not [p for p in runs.pods("desk-1") if p.status.phase == "Running"],
        120,
        "no running pod",
    )

    pod_model_server.script(Reply.text("Invoice 42 was paid on May 2."))
    answered = cli(
        control_plane, "respond", "desk-1", "agent", "-n", runs.namespace, "--data", '"paid"'
    )
    assert answered.returncode == 0, answered.stderr
    status = runs.wait_phase("desk-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == "Invoice 42 was paid on May 2."
    assert status["nodes"]["agent"]["detail"]["agent"] == "billing"
    resumed = pod_model_server.requests[2].messages
    assert (resumed[0]["content"], resumed[-1]["content"]) == ("You handle billing.", "paid")
    assert [p.metadata.name for p in runs.pods("desk-1")] == ["desk-1-1", "desk-1-2"]


def test_a_runner_pod_killed_after_a_handoff_is_followed_by_one_that_asks_the_recipient(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # handoff: always, so billing is reached only through front's handoffs (no sub-agents):
    # the run's snapshot holds it all the same
    apply_swarm(control_plane, runs, pod_model_server, tmp_path, handoff="always")
    pod_model_server.script(
        Reply.calls(ToolCall("handoff_conversation", {"agent": "billing"})),
        Reply.text("never received: its pod is deleted first", delay=60),
        Reply.text("Invoice 42 was paid on May 2."),
    )
    runs.apply(desk_run("desk-2"))
    try:
        wait_for(lambda: len(pod_model_server.requests) == 2, 180, "billing asked in the first pod")
    except pytest.fail.Exception:
        pytest.fail(f"billing never asked: {runs.status('desk-2')}, {pod_model_server.requests}")

    def kept() -> dict[str, Any] | None:
        record = (runs.status("desk-2").get("nodes") or {}).get("agent") or {}
        return (record.get("detail") or {}).get("progress")

    assert wait_for(kept, 30, "the handoff kept in the run's status")["agent"] == "billing"

    control_plane.core().delete_namespaced_pod("desk-2-1", runs.namespace)
    status = runs.wait_phase("desk-2", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == "Invoice 42 was paid on May 2."
    systems = [r.messages[0]["content"] for r in pod_model_server.requests]
    assert systems == ["You are the front desk.", "You handle billing.", "You handle billing."]
    assert [p.metadata.name for p in runs.pods("desk-2")] == ["desk-2-2"]


def test_llm_nodes_a_map_a_parallel_map_and_a_sub_flow_run_as_imported_flows(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    path = tmp_path / "digest.yaml"
    text = (SPEC.parent / "digest.yaml").read_text()
    path.write_text(text.replace("http://127.0.0.1:8000/v1", pod_model_server.url))
    imported = cli(control_plane, "import", str(path))
    assert imported.returncode == 0, imported.stderr
    documents = list(yaml.safe_load_all(imported.stdout))
    assert sorted(d["kind"] for d in documents).count("Flow") > 1, "sub-flows are Flows"
    runs.apply(*documents)
    pod_model_server.script(
        Reply.text("Kopf runs operators."),
        Reply.text("jq filters JSON."),
        Reply.text('{"headline": "Two tools", "count": 2}'),
    )
    root = yaml.safe_load(text)["name"]
    runs.apply(
        {
            "kind": "FlowRun",
            "metadata": {"name": "digest-1"},
            "spec": {"flow": root, "input": {"topics": ["kopf", "jq"]}},
        }
    )
    status = runs.wait_phase("digest-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"headline": "Two tools", "count": 2, "topics": ["kopf", "jq"]}
