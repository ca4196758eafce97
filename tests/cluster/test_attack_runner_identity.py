"""What the runner's identity can write (issue 19, items 23, 28, 29 and 30).

The runner's ServiceAccount is within reach of two kinds of attacker: a namespace ``edit`` user
mints its tokens (``kubectl create token agentflows-runner``, a TokenRequest with no pod
binding), and a python tool inside a run reads its pod's token. Each test tries one forgery the
issue reproduced, through the API server with the shipped admission policies
(config/policies) and the operator running; the tenant ``mallory`` holds the built-in ``edit``
role in the test's namespace. The last one shows what a human's real decision still does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflows.kube import client as kube_client
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.kube_fixtures import grant_deciders
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, python_tool
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.tool_board import CLIENT, ToolBoard

pytestmark = pytest.mark.cluster

EDITOR = "mallory"
RUNNER = "agentflows-runner"
COUNT = (
    CLIENT
    + """
import json, sys
args = json.load(sys.stdin)
append(args["count"], "ran\\n")
print(json.dumps({"shipped": True}))
"""
)
# Holds the first attempt while the test forges with the attempt's pod token; a later attempt
# passes at once. (A contained tool cannot read that token itself: the test stands for whoever
# holds it, e.g. someone allowed to exec into the pod.)
HOLD_ONCE = (
    CLIENT
    + """
import json, sys, time
args = json.load(sys.stdin)
if exists(args["started"]):
    print(json.dumps({"again": True}))
    sys.exit(0)
append(args["started"])
while not exists(args["release"]):
    time.sleep(0.1)
print(json.dumps({"released": True}))
"""
)
SLOW = (
    CLIENT
    + """
import json, sys, time
args = json.load(sys.stdin)
append(args["started"])
while not exists(args["release"]):
    time.sleep(0.1)
print(json.dumps({"released": True}))
"""
)


def flow(name: str, nodes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"kind": "Flow", "metadata": {"name": name}, "spec": {"nodes": nodes, **spec}}


def flowrun(name: str, flow_name: str) -> dict[str, Any]:
    return {"kind": "FlowRun", "metadata": {"name": name}, "spec": {"flow": flow_name}}


def gate_flow(name: str, tool_board: ToolBoard, approvers: dict[str, Any] | None) -> dict[str, Any]:
    """review (approval) -> ship (a counted python tool)."""
    approval: dict[str, Any] = {"message": "Ship it?"}
    if approvers is not None:
        approval["approvers"] = approvers
    ship = python_tool(COUNT, {"count": str(tool_board / f"{name}.shipped")})
    return flow(name, [{"id": "review", "approval": approval}, {"id": "ship", "tool": ship}])


def shipped(tool_board: ToolBoard, name: str) -> int:
    path = tool_board / f"{name}.shipped"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def editor(control_plane: Cluster, runs: FlowRuns) -> str:
    """mallory, bound to the built-in edit role in the test's namespace."""
    control_plane.kubectl("apply", "-k", str(Path(__file__).parents[2] / "config/rbac/users"))
    control_plane.kubectl(
        "create", "rolebinding", "mallory-edit", "--clusterrole=edit", f"--user={EDITOR}",
        "-n", runs.namespace,
    )  # fmt: skip

    def can_mint() -> bool:
        answer = control_plane.kubectl(
            "auth", "can-i", "create", "serviceaccounts/token", "-n", runs.namespace,
            f"--as={EDITOR}", check=False,
        )  # fmt: skip
        return answer.stdout.strip() == "yes"

    wait_for(can_mint, 30, "mallory may mint service-account tokens")
    return EDITOR


def minted_kubeconfig(cluster: Cluster, namespace: str, path: Path) -> Path:
    """A kubeconfig holding a runner token mallory minted (a TokenRequest with no pod binding)."""
    token = cluster.core(EDITOR).create_namespaced_service_account_token(
        RUNNER, namespace, {"spec": {"expirationSeconds": 600}}
    )
    admin = yaml.safe_load(cluster.kubeconfig().read_text())
    entry = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [{"name": "minted", "user": {"token": token.status.token}}],
        "contexts": [{"name": "minted", "context": {"cluster": entry["name"], "user": "minted"}}],
        "current-context": "minted",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def call_as(kubeconfig: Path, method: str, path: str, body: Any) -> kube_client.ApiError | None:
    """One request with ``kubeconfig``'s token; the API server's refusal, if it refused."""

    async def send() -> kube_client.ApiError | None:
        async with kube_client.Client.from_env(str(kubeconfig), retry_seconds=0) as api:
            try:
                if method == "merge":
                    await api.merge_patch(path, body)
                elif method == "get":
                    await api.get(path)
                elif method == "delete":
                    await api.delete(path)
                elif method == "put":
                    await api.request("PUT", path, body)
                elif method == "dry-run patch":  # how a confined runner reads a session
                    await api.request(
                        "PATCH",
                        path,
                        {},
                        params={"dryRun": "All"},
                        content_type=kube_client.MERGE_PATCH,
                    )
                else:
                    await api.create(path, body)
            except kube_client.ApiError as exc:
                return exc
        return None

    return asyncio.run(send())


def status_path(namespace: str, run: str) -> str:
    return kube_client.path_of("flowruns", namespace, run, sub="status")


def forged_approval() -> dict[str, Any]:
    return {
        "phase": "Succeeded",
        "output": {"json": {"decision": "approve", "decidedBy": "carol"}, "text": "by carol"},
    }


# ----- item 23: a token an editor minted ---------------------------------------------------------


def test_a_runner_token_minted_by_an_editor_can_neither_record_an_approval_nor_decide(
    control_plane: Cluster, runs: FlowRuns, editor: str, tool_board: ToolBoard, tmp_path: Path
) -> None:
    runs.apply(
        gate_flow("gated", tool_board, {"users": ["carol"]}),
        gate_flow("open", tool_board, None),
        flowrun("gated-1", "gated"),
        flowrun("open-1", "open"),
    )
    runs.wait_phase("gated-1", "Waiting")
    runs.wait_phase("open-1", "Waiting")
    minted = minted_kubeconfig(control_plane, runs.namespace, tmp_path / "minted")

    record = {"status": {"nodes": {"review": forged_approval()}}}
    refused = call_as(minted, "merge", status_path(runs.namespace, "gated-1"), record)
    assert refused is not None and refused.status == 403, refused
    assert "token without pod claims" in refused.message

    me = f"system:serviceaccount:{runs.namespace}:{RUNNER}"
    decision = {"status": {"requests": {"review": {"decision": "approve", "decidedBy": me}}}}
    refused = call_as(minted, "merge", status_path(runs.namespace, "open-1"), decision)
    # both policies refuse it; the API server names the first one that did
    assert refused is not None and refused.status in (403, 422), refused
    assert any(
        why in refused.message
        for why in ("a runner cannot decide a request", "token without pod claims")
    )

    for run in ("gated-1", "open-1"):
        status = runs.status(run)
        assert status["nodes"]["review"]["phase"] == "Waiting"
        assert "decision" not in status["requests"]["review"]
    assert shipped(tool_board, "gated") == shipped(tool_board, "open") == 0


# ----- item 30: a tool approving its own run -----------------------------------------------------


def test_the_runs_own_pod_token_can_neither_approve_its_run_nor_delete_its_request(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    grant_deciders(control_plane, runs.namespace)
    hold = python_tool(
        HOLD_ONCE,
        {"started": str(tool_board / "self.started"), "release": str(tool_board / "release")},
        timeout=300,
    )
    ship = python_tool(COUNT, {"count": str(tool_board / "self.shipped")})
    runs.apply(
        flow(
            "self",
            [
                {"id": "start", "transform": "=1"},
                {
                    "id": "review",
                    "approval": {"message": "Ship?", "approvers": {"users": ["alice"]}},
                },
                {"id": "sneak", "tool": hold},
                {"id": "ship", "tool": ship},
            ],
            edges=[
                {"from": "start", "to": "review"},
                {"from": "start", "to": "sneak"},
                {"from": "review", "to": "ship"},
            ],
            retry={"maxAttempts": 3, "backoffSeconds": 1},
        ),
        flowrun("self-1", "self"),
    )
    wait_for((tool_board / "self.started").exists, 120, "the first attempt's tool runs")
    wait_for(lambda: "review" in (runs.status("self-1").get("requests") or {}), 120, "the request")
    pod_token = runs.pod_kubeconfig("self-1-1")
    path = status_path(runs.namespace, "self-1")
    refused = call_as(
        pod_token, "merge", path, {"status": {"nodes": {"review": forged_approval()}}}
    )
    assert refused is not None and refused.status == 403, refused
    assert "may not record node(s) review as Succeeded" in refused.message
    refused = call_as(pod_token, "merge", path, {"status": {"requests": {"review": None}}})
    assert refused is not None and refused.status == 403, refused
    assert "may not remove a request" in refused.message

    # the runner is killed: the attempt is lost, and the next one resumes from status
    control_plane.core().delete_namespaced_pod("self-1-1", runs.namespace, grace_period_seconds=0)
    wait_for(lambda: runs.status("self-1").get("attempt", 0) >= 2, 120, "attempt 2")
    status = runs.wait_phase("self-1", "Waiting", "Succeeded", "Failed")
    assert status["phase"] == "Waiting", status.get("message")
    assert "decision" not in status["requests"]["review"]
    assert shipped(tool_board, "self") == 0

    # a real decision by the approver still ships, once
    alice = control_plane.kubectl(
        "patch", "flowrun", "self-1", "-n", runs.namespace, "--subresource=status",
        "--type=merge", "-p",
        json.dumps({"status": {"requests": {"review": {"decision": "approve", "decidedBy": "alice"}}}}),
        user="alice", check=False,
    )  # fmt: skip
    assert alice.returncode == 0, alice.stderr
    (tool_board / "release").touch()
    status = runs.wait_phase("self-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert shipped(tool_board, "self") == 1


def test_a_waiting_run_whose_request_was_deleted_fails_with_request_missing(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(gate_flow("lost", tool_board, None), flowrun("lost-1", "lost"))
    runs.wait_phase("lost-1", "Waiting")
    control_plane.kubectl(
        "patch", "flowrun", "lost-1", "-n", runs.namespace, "--subresource=status",
        "--type=json", "-p", json.dumps([{"op": "remove", "path": "/status/requests/review"}]),
    )  # fmt: skip
    status = runs.wait_phase("lost-1", "Failed", timeout=60)
    assert status["reason"] == "RequestMissing"
    assert "review (review) wait for a request that was deleted" in status["message"]
    assert shipped(tool_board, "lost") == 0


# ----- items 28 and 29: operator keys and operator-owned ConfigMaps ------------------------------


def slow_flow(name: str, tool_board: ToolBoard) -> dict[str, Any]:
    args = {"started": str(tool_board / f"{name}.started"), "release": str(tool_board / "release")}
    return flow(name, [{"id": "wait", "tool": python_tool(SLOW, args, timeout=300)}])


def test_a_runner_pod_cannot_write_operator_keys_nor_configmaps_the_operator_owns(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    runs.apply(slow_flow("spend", tool_board), flowrun("spend-1", "spend"))
    wait_for((tool_board / "spend.started").exists, 120, "the tool runs")
    pod_token = runs.pod_kubeconfig("spend-1-1")
    run = runs.run("spend-1")

    for keys in ({"budgetCharged": {"promptTokens": 10**9}}, {"phase": "Succeeded"}):
        refused = call_as(
            pod_token, "merge", status_path(runs.namespace, "spend-1"), {"status": keys}
        )
        assert refused is not None and refused.status == 403, refused
        assert f"may not write the operator's status keys: {next(iter(keys))}" in refused.message
    assert "budgetCharged" not in runs.status("spend-1")

    owner = {"apiVersion": "agentflows.io/v1alpha1", "kind": "FlowRun", "name": "spend-1",
             "uid": run["metadata"]["uid"]}  # fmt: skip
    planted = {
        "metadata": {
            "name": "future-1-snapshot",
            "labels": {"agentflows.io/run": "spend-1"},
            "ownerReferences": [owner],
        },
        "data": {"snapshot.json": "{}"},
    }
    configmaps = kube_client.path_of("configmaps", runs.namespace)
    refused = call_as(pod_token, "create", configmaps, planted)
    assert refused is not None and refused.status == 403, refused
    assert "may write only ConfigMaps named spend-1-out-" in refused.message
    own_snapshot = kube_client.path_of("configmaps", runs.namespace, "spend-1-snapshot")
    refused = call_as(pod_token, "merge", own_snapshot, {"data": {"snapshot.json": "{}"}})
    assert refused is not None and refused.status == 403, refused

    # the runner's own keys and offloaded values stay writable
    assert call_as(pod_token, "merge", status_path(runs.namespace, "spend-1"),
                   {"status": {"currentNode": "wait"}}) is None  # fmt: skip
    offloaded = {**planted, "metadata": {**planted["metadata"], "name": "spend-1-out-x-0"}}
    assert call_as(pod_token, "create", configmaps, offloaded) is None
    (tool_board / "release").touch()
    assert runs.wait_phase("spend-1", "Succeeded", "Failed")["phase"] == "Succeeded"


# ----- item 24: the runner's reach -------------------------------------------------------------


def test_a_runner_pod_token_reads_no_configmap_of_the_namespace_not_even_its_runs_own(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    # RBAC's get cannot be confined by admission: the runner gets no get, and its pod is given
    # the ConfigMaps its run reads as a volume instead
    control_plane.core().create_namespaced_config_map(
        runs.namespace, {"metadata": {"name": "team-settings"}, "data": {"db": "password"}}
    )
    runs.apply(slow_flow("peek", tool_board), flowrun("peek-1", "peek"))
    wait_for((tool_board / "peek.started").exists, 120, "the tool runs")
    pod_token = runs.pod_kubeconfig("peek-1-1")
    for name in ("team-settings", "peek-1-snapshot"):
        path = kube_client.path_of("configmaps", runs.namespace, name)
        refused = call_as(pod_token, "get", path, None)
        assert refused is not None and refused.status == 403, (name, refused)
    listed = call_as(pod_token, "get", kube_client.path_of("configmaps", runs.namespace), None)
    assert listed is not None and listed.status == 403, listed
    (tool_board / "release").touch()
    assert runs.wait_phase("peek-1", "Succeeded", "Failed")["phase"] == "Succeeded"


def test_a_runner_pod_token_may_neither_list_nor_delete_agentsessions(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    # a list would show every memory's conversations of the namespace, a delete would remove
    # them: retention, which needs both, is the operator's (controller/retention.py)
    other = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "AgentSession",
        "metadata": {"name": "payroll-s-1"},
        "spec": {"memory": "payroll", "session": "S-1", "agent": "payroll"},
    }
    runs.custom.create_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "agentsessions", other
    )
    runs.apply(slow_flow("nosy", tool_board), flowrun("nosy-1", "nosy"))
    wait_for((tool_board / "nosy.started").exists, 120, "the tool runs")
    pod_token = runs.pod_kubeconfig("nosy-1-1")
    sessions = kube_client.path_of("agentsessions", runs.namespace)
    listed = call_as(pod_token, "get", sessions, None)
    assert listed is not None and listed.status == 403, listed
    deleted = call_as(pod_token, "delete", f"{sessions}/payroll-s-1", None)
    assert deleted is not None and deleted.status == 403, deleted
    assert runs.get("agentsessions", "payroll-s-1") is not None
    (tool_board / "release").touch()
    assert runs.wait_phase("nosy-1", "Succeeded", "Failed")["phase"] == "Succeeded"


def _agentsession(name: str, memory: str, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "AgentSession",
        "metadata": {"name": name, **metadata},
        "spec": {"memory": memory, "session": "S-1", "agent": memory},
    }


def test_a_runner_pod_token_writes_only_sessions_of_the_memories_its_runs_agents_name(
    control_plane: Cluster,
    runs: FlowRuns,
    tool_board: ToolBoard,
    pod_model_server: ScriptedModelServer,
) -> None:
    agent = {
        "kind": "Agent",
        "metadata": {"name": "support"},
        "spec": {
            "model": {
                "name": "openai/scripted-model",
                "apiBase": pod_model_server.url,
                "retries": 0,
            },
            "session": "T-1",
        },
    }
    slow = slow_flow("mem", tool_board)
    slow["spec"]["nodes"].append({"id": "reply", "agent": {"name": "support", "prompt": "hi"}})
    pod_model_server.script(Reply.text("noted"))
    runs.apply(agent, slow, flowrun("mem-1", "mem"))
    wait_for((tool_board / "mem.started").exists, 120, "the tool runs")
    pod_token = runs.pod_kubeconfig("mem-1-1")
    sessions = kube_client.path_of("agentsessions", runs.namespace)

    refused = call_as(pod_token, "create", sessions, _agentsession("payroll-s-2", "payroll"))
    assert refused is not None and refused.status == 403, refused
    assert "may write only the AgentSessions of the memories its run's Agents name" in (
        refused.message
    )
    assert "not memory payroll" in refused.message
    runs.custom.create_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "agentsessions",
        _agentsession("payroll-s-1", "payroll"),
    )  # fmt: skip
    stored = runs.get("agentsessions", "payroll-s-1")
    assert stored is not None
    forged = {**stored, "spec": {**stored["spec"], "turns": 99}}
    refused = call_as(pod_token, "put", f"{sessions}/payroll-s-1", forged)
    assert refused is not None and refused.status == 403, refused
    # nor read it: no get (admission never sees one), and the read it has is confined
    refused = call_as(pod_token, "get", f"{sessions}/payroll-s-1", None)
    assert refused is not None and refused.status == 403, refused
    refused = call_as(pod_token, "dry-run patch", f"{sessions}/payroll-s-1", None)
    assert refused is not None and refused.status == 403, refused
    assert "not memory payroll" in refused.message
    # a session of its own memory it may write; the grant is the run's own Role
    assert call_as(pod_token, "create", sessions, _agentsession("support-s-1", "support")) is None
    assert call_as(pod_token, "dry-run patch", f"{sessions}/support-s-1", None) is None
    role = json.loads(
        control_plane.kubectl(
            "get", "role", "mem-1-agentflows-sessions", "-n", runs.namespace, "-o", "json"
        ).stdout
    )
    assert role["rules"][0]["resourceNames"] == ["mem-1/support"]
    assert role["metadata"]["ownerReferences"][0]["name"] == "mem-1"

    (tool_board / "release").touch()
    assert runs.wait_phase("mem-1", "Succeeded", "Failed")["phase"] == "Succeeded"
    saved = [
        item["spec"]
        for item in runs.custom.list_namespaced_custom_object(
            "agentflows.io", "v1alpha1", runs.namespace, "agentsessions"
        )["items"]
        if item["spec"]["session"] == "T-1"
    ]
    assert [(s["memory"], s["turns"]) for s in saved] == [("support", 1)]


def test_an_output_offloaded_by_one_attempt_reaches_the_next_through_its_pods_volume(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    big = {"id": "big", "transform": '={blob: ("x" * 20000), tail: "end"}'}
    gate = {"id": "gate", "approval": {"message": "Use it?"}}
    use = {
        "id": "use",
        "transform": "={size: (.nodes.big.json.blob | length), tail: .nodes.big.json.tail}",
    }
    runs.apply(
        flow("carry", [big, gate, use], output="=.nodes.use.json"), flowrun("carry-1", "carry")
    )
    status = runs.wait_phase("carry-1", "Waiting")
    ref = status["nodes"]["big"]["outputRef"]
    assert ref.startswith("configmap:carry-1-out-"), status["nodes"]["big"]
    control_plane.kubectl(
        "patch", "flowrun", "carry-1", "-n", runs.namespace, "--subresource=status",
        "--type=merge", "-p",
        json.dumps({"status": {"requests": {"gate": {"decision": "approve", "decidedBy": "admin"}}}}),
    )  # fmt: skip
    status = runs.wait_phase("carry-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"size": 20000, "tail": "end"}
    second = control_plane.core().read_namespaced_pod(status["pod"], runs.namespace)
    [volume] = [v for v in second.spec.volumes if v.name == "run-configmaps"]
    mounted_names = {source.config_map.name for source in volume.projected.sources}
    prefix, parts = ref.split(":")[1], int(ref.split(":")[2])
    assert {f"{prefix}-{i}" for i in range(parts)} <= mounted_names
    assert "carry-1-snapshot" in mounted_names


def snapshot_of(flow_name: str, value: str) -> str:
    spec = {"nodes": [{"id": "say", "transform": f'="{value}"'}], "output": "=.nodes.say.json"}
    return json.dumps({"flow": flow_name, "flows": {flow_name: spec}, "agents": {}})


def test_a_snapshot_planted_before_its_run_exists_is_replaced_by_the_operators(
    control_plane: Cluster, runs: FlowRuns, editor: str
) -> None:
    control_plane.core(EDITOR).create_namespaced_config_map(
        runs.namespace,
        {
            "metadata": {"name": "future-1-snapshot", "labels": {"agentflows.io/run": "future-1"}},
            "data": {"snapshot.json": snapshot_of("future", "planted")},
        },
    )
    real = flow("future", [{"id": "say", "transform": '="real"'}], output="=.nodes.say.json")
    runs.apply(real, flowrun("future-1", "future"))

    status = runs.wait_phase("future-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == "real"
    stored = control_plane.core().read_namespaced_config_map("future-1-snapshot", runs.namespace)
    assert [r.uid for r in stored.metadata.owner_references] == [
        runs.run("future-1")["metadata"]["uid"]
    ]
    text = stored.data["snapshot.json"]
    assert status["snapshotDigest"] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_a_snapshot_changed_while_its_run_waits_is_refused_by_the_next_attempt(
    control_plane: Cluster, runs: FlowRuns, editor: str, tool_board: ToolBoard
) -> None:
    runs.apply(gate_flow("swap", tool_board, None), flowrun("swap-1", "swap"))
    runs.wait_phase("swap-1", "Waiting")
    control_plane.core(EDITOR).patch_namespaced_config_map(
        "swap-1-snapshot", runs.namespace, {"data": {"snapshot.json": snapshot_of("swap", "x")}}
    )
    control_plane.kubectl(
        "patch", "flowrun", "swap-1", "-n", runs.namespace, "--subresource=status",
        "--type=merge", "-p",
        json.dumps({"status": {"requests": {"review": {"decision": "approve", "decidedBy": "admin"}}}}),
    )  # fmt: skip
    status = runs.wait_phase("swap-1", "Failed", "Succeeded")
    assert status["phase"] == "Failed" and status["reason"] == "SnapshotMissing", status
    assert "is not the snapshot the operator wrote for this run" in status["message"]
    assert shipped(tool_board, "swap") == 0
