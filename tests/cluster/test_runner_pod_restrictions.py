"""What the container runtime enforces on a runner pod, proved on the real node (issue 20, item 4).

The module runs on the session's shared real node (``NODE = "real"``, tests/cluster/conftest.py);
the operator runs from the checkout (operator_fixtures) and every runner pod it creates runs in a
container of ``agentflows:<appVersion>`` under runc, in a namespace enforcing the restricted Pod
Security Standard:

- a python tool that allocates past the pod's memory limit is killed by the kernel's OOM killer,
  and the node's error says so (the runner, a smaller process of the same container, lives on);
- ``kubectl exec`` into a running runner finds the model's Secret value in no file of the
  container and not in the tool's environment — only in the container's configured environment,
  which the operator's ``secretKeyRef`` puts there (an exec'd process inherits it), while the
  runner's own ``/proc/<pid>/environ`` is unreadable (it is not dumpable);
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

from agentflows.engine import lifecycle
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, python_tool

pytestmark = pytest.mark.cluster

NODE = "real"

RELEASE = "/tmp/release"
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


def test_exec_into_a_running_runner_finds_the_model_key_in_no_file_and_not_in_the_tools_env(
    control_plane: Cluster, runs: FlowRuns
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
    model = {
        "name": "openai/never-called",
        "apiBase": "http://127.0.0.1:9/v1",
        "apiKey": {"secretKeyRef": {"name": "model-key", "key": "apiKey"}},
    }
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "held"},
            "spec": {
                "nodes": [
                    {"id": "hold", "tool": python_tool(_HOLD, {})},
                    {"id": "ask", "llm": {"model": model, "prompt": "never asked"}},
                ]
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "held-1"}, "spec": {"flow": "held"}},
    )
    pod = _held_pod(runs, "held-1", 1)
    found: dict[str, Any] = json.loads(
        _exec(control_plane, runs.namespace, pod, _SCAN.replace("VALUE", repr(value)))
    )
    # The value is there to be found: the container's environment holds it (secretKeyRef).
    assert found["own_environment"] is True
    assert found["files"] == []
    tools = [e for e in found["environs"] if "tool.py" in e["command"]]
    assert tools, found
    assert [e for e in found["environs"] if e["holds"]] == []
    # The runner, the one process that must hold it, is not dumpable: its environ is closed.
    assert any("agentflows runner" in command for command in found["unreadable"]), found
    patch = {"spec": {"cancel": True}}
    runs.custom.patch_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "flowruns", "held-1", patch
    )
    assert runs.wait_phase("held-1", "Cancelled", timeout=120)["phase"] == "Cancelled"


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
