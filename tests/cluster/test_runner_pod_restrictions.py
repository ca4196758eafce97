"""What the container runtime enforces on a runner pod, proved on the real node (issue 20, item 4).

The module runs on the session's shared real node (the default of tests/cluster/conftest.py);
the operator runs from the checkout (operator_fixtures) and every runner pod it creates runs in a
container of ``agentflows:<appVersion>`` under runc, in a namespace enforcing the restricted Pod
Security Standard:

- a python tool that allocates past the pod's memory limit is killed by the kernel's OOM killer,
  and the node's error says so (the runner, a smaller process of the same container, lives on);
- the model's Secret value is in no environment of the runner's container: not in the pod spec,
  not in what a process started by ``kubectl exec`` (as a user with the ``edit`` role) inherits,
  not in the runner's ``/proc/1/environ``; the one file holding it is the secrets volume's, which
  a python tool of the run — the runner's uid, next to it — cannot read (nor ``/proc/1/environ``),
  while the model server still gets the key in its ``Authorization`` header;
- deleting a runner pod with a grace period sends the runner SIGTERM: the node in flight is
  recorded Running with an "interrupted" attempt error before the runner exits, and the next
  attempt resumes without re-running the node that had finished.

A run is held in a node by a python tool that waits for a file in the pod's ``/tmp`` (the
emptyDir), which the test creates with ``kubectl exec`` when it is done looking: the runner never
waits in a pod for a human (an approval ends the attempt), so a tool is what keeps one running.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client

from agentflows.api import runner as runner_api
from agentflows.engine import lifecycle
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, python_tool
from tests.support import tool_scripts
from tests.support.model_server import Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster


RELEASE = "/tmp/release"
KEY_FILE = f"{runner_api.RUNNER_SECRETS_ROOT}/model-key/apiKey"
# Holds its node until RELEASE exists (the tool's own polling: a test never sleeps).
_HOLD = f"""
import json, os, sys, time
json.load(sys.stdin)
while not os.path.exists({RELEASE!r}):
    time.sleep(0.2)
print(json.dumps({{"released": True}}))
"""
_HOG = """
import json, sys
json.load(sys.stdin)
chunks = []
while True:
    chunks.append(b"x" * (8 * 2**20))
"""
# Run by `kubectl exec -i ... python -` with the value in place of VALUE: the script, read from
# stdin, is in no file and no command line of the container.
_SCAN = """
import json, os
value = VALUE.encode()
files = []
for root, dirs, names in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in names:
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as handle:
                if value in handle.read():
                    files.append(path)
        except OSError:
            pass
environs, unreadable = [], []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\\0", b" ").decode().strip()
    except OSError:
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environs.append({"command": command, "holds": value in handle.read()})
    except OSError:
        unreadable.append(command)
print(json.dumps({
    "files": files,
    "environs": environs,
    "unreadable": unreadable,
    "own_environment": value.decode() in os.environ.values(),
}))
"""


def _exec(cluster: Cluster, namespace: str, pod: str, script: str) -> str:
    """Run ``script`` with the image's python inside the runner container of ``pod``."""
    done = cluster.kubectl("exec", "-i", "-n", namespace, pod, "--", "python", "-", stdin=script)
    return done.stdout


def _release(cluster: Cluster, namespace: str, pod: str) -> None:
    _exec(cluster, namespace, pod, f"open({RELEASE!r}, 'w').close()")


def _held_pod(runs: FlowRuns, run: str, attempt: int) -> str:
    """Wait until ``run``'s attempt ``attempt`` runs its ``hold`` node; return the pod's name."""

    def holding() -> str | None:
        status = runs.status(run)
        hold = (status.get("nodes") or {}).get("hold") or {}
        pod = status.get("pod")
        if hold.get("phase") == "Running" and hold.get("attempts") == attempt and pod:
            phase = runs.cluster.pod(runs.namespace, pod).status.phase
            return str(pod) if phase == "Running" else None
        return None

    return wait_for(holding, 300, f"attempt {attempt} of {run} holding in its tool")


def test_a_tools_memory_hog_is_oom_killed_at_the_pods_limit_and_the_node_says_so(
    runs: FlowRuns,
) -> None:
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "hog"},
            "spec": {
                "nodes": [{"id": "hog", "tool": python_tool(_HOG, {})}],
                "runner": {"resources": {"limits": {"memory": "256Mi"}}},
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "hog-1"}, "spec": {"flow": "hog"}},
    )
    status = runs.wait_phase("hog-1", "Succeeded", "Failed", timeout=300)
    assert status["phase"] == "Failed", status
    error = status["nodes"]["hog"]["error"]
    assert (
        "ran out of memory: killed by the kernel's OOM killer at the memory limit of its "
        "container, 256 MiB; exited with status 137"
    ) in error, error
    [listed] = runs.pods("hog-1")
    # The run fails as the runner writes it; the kubelet reports the container ended a moment later.
    pod = runs.cluster.wait_for_pod_phase(runs.namespace, listed.metadata.name, ("Failed",))
    [container] = pod.status.container_statuses
    # containerd saw the OOM kill in the container; the runner itself ended as the run failed.
    assert container.state.terminated.reason == "OOMKilled", container.state.terminated
    assert container.state.terminated.exit_code == 1


# Issue 19, items 2 and 3 in the pod: a fork bomb as the runner's uid, and processes that try
# to outlive their tool (a setsid child, and a daemon's double fork).
_SPAWN = """
import json, os, subprocess, sys
marker = json.load(sys.stdin)["marker"]
sleeper = [sys.executable, "-c", "import time; time.sleep(300)", marker]
subprocess.Popen(sleeper, start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
print(json.dumps("spawned"))
"""
_SURVIVORS = """
import json, os
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if MARKER.encode() in handle.read():
                found.append(pid)
    except OSError:
        pass
print(json.dumps(found))
"""


def test_a_tools_fork_bomb_stops_at_the_limit_and_no_process_it_starts_outlives_it_in_the_pod(
    runs: FlowRuns,
) -> None:
    marker = "marker-" + uuid.uuid4().hex
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "left"},
            "spec": {
                "nodes": [
                    {"id": "bomb", "tool": python_tool(tool_scripts.FORK_BOMB, {})},
                    {"id": "spawn", "tool": python_tool(_SPAWN, {"marker": marker})},
                    {"id": "hold", "tool": python_tool(_HOLD, {})},
                ],
                "edges": [{"from": "bomb", "to": "spawn"}, {"from": "spawn", "to": "hold"}],
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "left-1"}, "spec": {"flow": "left"}},
    )
    pod = _held_pod(runs, "left-1", 1)
    nodes = runs.status("left-1")["nodes"]
    started = nodes["bomb"]["output"]["json"]
    assert 0 < started < 64, started  # the runner's uid, not root: the limit holds for it too
    assert nodes["spawn"]["output"]["json"] == "spawned"
    # the container's whole process table, seen from outside every tool's own namespace
    survivors = _exec(runs.cluster, runs.namespace, pod, _SURVIVORS.replace("MARKER", repr(marker)))
    assert json.loads(survivors) == []
    _release(runs.cluster, runs.namespace, pod)
    assert runs.wait_phase("left-1", "Succeeded", "Failed")["phase"] == "Succeeded"


TOKEN_FILE = f"{runner_api.SERVICE_ACCOUNT_DIR}/token"
# A python tool's attempt at the runner's key and identity: the key's file, the runner's
# environment, and the pod's service-account token.
_STEAL = f"""
import json, os, sys
json.load(sys.stdin)
found = {{}}
for path in ({KEY_FILE!r}, "/proc/1/environ", {TOKEN_FILE!r}):
    try:
        with open(path, "rb") as handle:
            found[path] = "read %d bytes" % len(handle.read())
    except OSError as error:
        found[path] = error.strerror
print(json.dumps(found))
"""


def test_the_model_key_is_in_no_environment_and_no_tool_can_read_it_but_the_model_gets_it(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    value = f"sk-canary-{uuid.uuid4().hex}"
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "model-key", "namespace": runs.namespace},
            "stringData": {"apiKey": value},
        }
    )
    # bob may exec into the namespace's pods (the built-in edit role), as a namespace's
    # developers usually may.
    control_plane.kubectl(
        "create", "rolebinding", "bob-edit", "--clusterrole=edit", "--user=bob",
        "-n", runs.namespace,
    )  # fmt: skip
    model = {
        "name": "openai/scripted-model",
        "apiBase": pod_model_server.url,
        "apiKey": {"secretKeyRef": {"name": "model-key", "key": "apiKey"}},
        "retries": 0,
    }
    pod_model_server.script(Reply.text("answered"))
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "held"},
            "spec": {
                "nodes": [
                    {"id": "steal", "tool": python_tool(_STEAL, {})},
                    {"id": "hold", "tool": python_tool(_HOLD, {})},
                    {"id": "ask", "llm": {"model": model, "prompt": "say something"}},
                ],
                "output": "={steal: .nodes.steal.json, answer: .nodes.ask.text}",
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "held-1"}, "spec": {"flow": "held"}},
    )
    pod = _held_pod(runs, "held-1", 1)
    spec = runs.cluster.pod(runs.namespace, pod).to_dict()
    assert value not in json.dumps(spec, default=str)
    [container] = spec["spec"]["containers"]
    assert [e for e in container["env"] if (e.get("value_from") or {}).get("secret_key_ref")] == []
    # What a process bob starts in the container inherits, and what the runner started with.
    own = control_plane.kubectl(
        "exec", "-n", runs.namespace, pod, "--", "cat", "/proc/self/environ", user="bob"
    )
    assert "KUBERNETES_SERVICE_HOST" in own.stdout and value not in own.stdout
    runner = control_plane.kubectl(
        "exec", "-n", runs.namespace, pod, "--", "cat", "/proc/1/environ", user="bob", check=False
    )
    assert value not in runner.stdout
    found: dict[str, Any] = json.loads(
        _exec(control_plane, runs.namespace, pod, _SCAN.replace("VALUE", repr(value)))
    )
    assert found["own_environment"] is False
    assert [e for e in found["environs"] if e["holds"]] == []
    # The one file that holds it is the secrets volume's (whoever can exec holds what the
    # runner holds: README's Security section).
    assert [path.rpartition("/")[2] for path in found["files"]] == ["apiKey"], found
    _release(control_plane, runs.namespace, pod)
    status = runs.wait_phase("held-1", "Succeeded", "Failed", timeout=300)
    assert status["phase"] == "Succeeded", status
    # The tool ran as the runner's uid, next to the file, and could not read it.
    assert status["output"] == {
        "steal": {
            KEY_FILE: "Permission denied",
            "/proc/1/environ": "Permission denied",
            TOKEN_FILE: "Permission denied",
        },
        "answer": "answered",
    }
    [request] = pod_model_server.requests
    assert request.headers["authorization"] == f"Bearer {value}"


def test_a_runner_pod_deleted_with_a_grace_period_saves_the_node_in_flight_and_the_next_resumes(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "durable"},
            "spec": {
                "nodes": [
                    {"id": "first", "tool": python_tool("print(1)", {})},
                    {"id": "hold", "tool": python_tool(_HOLD, {})},
                ],
                "output": "={first: .nodes.first.json, hold: .nodes.hold.json}",
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "durable-1"}, "spec": {"flow": "durable"}},
    )
    pod = _held_pod(runs, "durable-1", 1)
    first = runs.status("durable-1")["nodes"]["first"]
    control_plane.core().delete_namespaced_pod(
        pod, runs.namespace, body=client.V1DeleteOptions(grace_period_seconds=30)
    )
    second = _held_pod(runs, "durable-1", 2)
    assert second != pod
    hold = runs.status("durable-1")["nodes"]["hold"]
    assert hold["attemptErrors"] == [f"attempt 1: {lifecycle.INTERRUPTED}"]
    _release(control_plane, runs.namespace, second)
    status = runs.wait_phase("durable-1", "Succeeded", "Failed", timeout=300)
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"first": 1, "hold": {"released": True}}
    # The node that had finished was not run again; the one in flight ran twice.
    assert status["nodes"]["first"] == first
    assert status["nodes"]["hold"]["attempts"] == 2
    assert status["attempt"] == 2
