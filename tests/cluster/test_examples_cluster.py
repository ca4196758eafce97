"""The repository's examples/*.yaml, applied as they ship and run by the operator on the cluster.

The only change made when applying them: every model (an Agent's ``spec.model`` and an ``llm``
node's ``model``) gets ``apiBase`` pointed at the scripted model server and an ``apiKey`` from a
Secret in the test's namespace. Runs are started with ``agentflows start`` and human requests
answered with ``agentflows approve`` / ``agentflows respond``, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall

pytestmark = pytest.mark.cluster

KEY_REF = {"secretKeyRef": {"name": "scripted-model", "key": "api-key"}}


def point_at(model: dict[str, Any], server: ScriptedModelServer) -> None:
    model.update(apiBase=server.url, apiKey=KEY_REF, retries=0)


def apply_example(
    control_plane: Cluster, runs: FlowRuns, server: ScriptedModelServer, name: str
) -> None:
    """Apply examples/NAME.yaml with its models pointed at ``server``; wait for Ready."""
    control_plane.core().create_namespaced_secret(
        runs.namespace,
        {"metadata": {"name": "scripted-model"}, "stringData": {"api-key": API_KEY}},
    )
    documents = [d for d in yaml.safe_load_all((REPO / f"examples/{name}.yaml").read_text()) if d]
    for document in documents:
        if document["kind"] == "Agent":
            point_at(document["spec"]["model"], server)
        if document["kind"] == "Flow":
            for node in document["spec"]["nodes"]:
                if "llm" in node:
                    point_at(node["llm"]["model"], server)
    runs.apply(*documents)
    for document in documents:
        plural = {"Agent": "agents", "Flow": "flows"}[document["kind"]]
        name_ = document["metadata"]["name"]
        wait_for(
            lambda p=plural, n=name_: (
                (c := runs.condition(p, n, "Ready")) and c["status"] == "True"
            ),
            60,
            f"{plural}/{name_} Ready",
        )


def cli(
    control_plane: Cluster, namespace: str, *args: str, user: str = "admin"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "agentflows.cli.main", *args,
            "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig(user)),
        ],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def start(control_plane: Cluster, runs: FlowRuns, flow: str, *inputs: str) -> dict[str, Any]:
    """``agentflows start FLOW --input ... --wait``: the final JSON (ended or waiting)."""
    args = [a for value in inputs for a in ("--input", value)]
    done = cli(control_plane, runs.namespace, "start", flow, *args, "--wait", "--timeout", "200")
    assert done.returncode in (0, 3), done.stdout + done.stderr
    name, _, rest = done.stdout.partition("\n")
    info: dict[str, Any] = json.loads(rest)
    assert info["name"] == name
    return info


def grant_deciders(control_plane: Cluster, namespace: str) -> None:
    """Let alice (group editors) read runs and decide their requests in ``namespace``."""
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "deciders", "namespace": namespace},
            "rules": [
                {"apiGroups": ["agentflows.io"], "resources": ["flowruns"], "verbs": ["get", "list"]},
                {"apiGroups": ["agentflows.io"], "resources": ["flowruns/status"], "verbs": ["get", "patch"]},
            ],
        }
    )  # fmt: skip
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "deciders", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deciders"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "editors"}],
        }
    )  # fmt: skip


def test_hello_example_greets_and_counts(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    apply_example(control_plane, runs, pod_model_server, "hello")
    info = start(control_plane, runs, "hello", "name=Ada", "loud=true")
    assert info["phase"] == "Succeeded", info["message"]
    assert info["output"] == {"greeting": "HELLO, ADA", "stats": {"letters": 10, "words": 2}}
    assert info["nodes"]["keep"]["phase"] == "Skipped"
    assert pod_model_server.requests == []


def test_triage_example_classifies_finds_the_runbook_and_pages(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    pod_model_server.script(
        Reply.text('{"severity": "sev1", "service": "api"}'),
        Reply.calls(ToolCall("find_runbook", {"keyword": "api"})),
        Reply.text('{"runbook": "runbooks/api-latency.md", "steps": ["scale out"]}'),
    )
    apply_example(control_plane, runs, pod_model_server, "triage")
    info = start(control_plane, runs, "triage", "title=API latency above SLO")
    assert info["phase"] == "Succeeded", info["message"]
    assert info["output"] == {
        "severity": "sev1",
        "runbook": {"runbook": "runbooks/api-latency.md", "steps": ["scale out"]},
        "action": {"action": "page", "who": "on-call"},
    }
    assert info["nodes"]["ticket"]["phase"] == "Skipped"
    tool_result = [m for m in pod_model_server.requests[2].messages if m["role"] == "tool"]
    assert json.loads(tool_result[0]["content"]) == {"runbook": "runbooks/api-latency.md"}
    assert pod_model_server.pending == 0


def test_research_example_waits_for_an_editor_and_publishes_after_approval(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    pod_model_server.script(
        Reply.text('{"questions": ["What is kopf?", "Who uses it?", "How does it scale?"]}'),
        *(Reply.text('{"findings": ["a finding"]}') for _ in range(3)),
    )
    apply_example(control_plane, runs, pod_model_server, "research")
    grant_deciders(control_plane, runs.namespace)
    info = start(control_plane, runs, "research", "topic=kopf")
    assert info["phase"] == "Waiting", info["message"]
    [(request_id, request)] = info["requests"].items()
    assert request["message"] == "Publish findings on kopf?"
    assert request["summary"] == "3 findings"

    # The request names its approvers (group editors): admin is not one of them.
    denied = cli(control_plane, runs.namespace, "approve", info["name"], request_id)
    assert denied.returncode == 2, denied.stderr  # refused: exit 2, like any bad input
    approved = cli(control_plane, runs.namespace, "approve", info["name"], user="alice")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.strip() == f"{info['name']} {request_id}: approve by alice"

    status = runs.wait_phase(info["name"], "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"topic": "kopf", "findings": ["a finding"] * 3}
    assert status["attempt"] == 2
    assert status["nodes"]["done"]["phase"] == "Skipped"
    assert pod_model_server.pending == 0


def test_onboarding_example_asks_for_data_and_writes_a_welcome(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    pod_model_server.script(Reply.text("Welcome, platform!\nalice is in #platform."))
    apply_example(control_plane, runs, pod_model_server, "onboarding")
    info = start(control_plane, runs, "onboarding", "team=platform")
    assert info["phase"] == "Waiting", info["message"]
    [(request_id, request)] = info["requests"].items()
    assert request["kind"] == "input"

    wrong = cli(control_plane, runs.namespace, "respond", info["name"], "--data", '{"owner": "a"}')
    assert wrong.returncode == 2 and "does not match the schema" in wrong.stderr
    data = json.dumps({"owner": "alice", "slack": "#platform"})
    answered = cli(control_plane, runs.namespace, "respond", info["name"], "--data", data)
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip() == f"{info['name']} {request_id}: respond by admin"

    status = runs.wait_phase(info["name"], "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {
        "team": "platform",
        "owner": "alice",
        "note": "Welcome, platform!\nalice is in #platform.",
    }
    [request] = pod_model_server.requests
    assert "owner alice, channel #platform" in request.messages[-1]["content"]
