"""A Flow's ``runner.files`` volume on a real control plane: an agent's ``path`` file from it.

The operator runs as in ``test_operator.py`` and builds the runner pod; the namespace enforces
the restricted Pod Security Standard, so the API server checks the pod with its read-only
ConfigMap volume, and the real node's kubelet mounts it where the pod says (the runner's files
root is the mount's own path; a Flow may not set ``AGENTFLOWS_FILES_ROOT``). The model is the
scripted server, on the node's bridge address.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster

NOTES = "Escalate to the on-call engineer after 15 minutes."


def test_an_agent_reads_a_path_file_from_a_configmap_the_flow_mounts_as_a_files_volume(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "oncall", "namespace": runs.namespace},
            "data": {"notes.md": NOTES},
        }
    )
    runs.apply(
        {
            "kind": "Agent",
            "metadata": {"name": "helper"},
            "spec": {
                "model": {"name": "openai/scripted-model", "apiBase": pod_model_server.url},
                "systemPrompt": "Answer from the handbook.",
                "files": [{"path": "handbook/notes.md"}],
            },
        },
        {
            "kind": "Flow",
            "metadata": {"name": "answer"},
            "spec": {
                "nodes": [{"id": "ask", "agent": {"name": "helper", "prompt": "When?"}}],
                "runner": {
                    "files": [{"name": "handbook", "configMap": {"name": "oncall"}}],
                },
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "ask-1"}, "spec": {"flow": "answer"}},
    )
    pod_model_server.script(Reply.text("after 15 minutes"))

    status = runs.wait_phase("ask-1", "Succeeded", "Failed")

    assert status["phase"] == "Succeeded", status.get("nodes", {}).get("ask")
    assert pod_model_server.requests[0].messages[1] == {
        "role": "user",
        "content": f'<file name="notes.md">\n{NOTES}\n</file>\n\nWhen?',
    }
    assert status["nodes"]["ask"]["detail"]["files"] == [
        {
            "name": "notes.md",
            "source": "path handbook/notes.md",
            "contentType": "text/markdown",
            "size": len(NOTES),
            "sha256": hashlib.sha256(NOTES.encode()).hexdigest(),
        }
    ]
    [pod] = runs.pods("ask-1")
    [mount] = [m for m in pod.spec.containers[0].volume_mounts if m.name == "files-handbook"]
    assert (mount.mount_path, mount.read_only) == ("/var/run/agentflows/files/handbook", True)


def test_the_api_server_refuses_a_files_volume_from_a_host_path_or_writable_or_repeated(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    def applied(files: list[dict[str, Any]]) -> str:
        flow = {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Flow",
            "metadata": {"name": "answer", "namespace": runs.namespace},
            "spec": {"nodes": [{"id": "only", "transform": "."}], "runner": {"files": files}},
        }
        done = control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(flow), check=False)
        assert done.returncode != 0, done.stdout
        return done.stderr

    assert 'unknown field "spec.runner.files[0].hostPath"' in applied(
        [{"name": "etc", "configMap": {"name": "etc"}, "hostPath": {"path": "/etc"}}]
    )
    assert "set exactly one of configMap or persistentVolumeClaim" in applied([{"name": "etc"}])
    assert "spec.runner.files[0].persistentVolumeClaim.readOnly: Unsupported value: false" in (
        applied([{"name": "d", "persistentVolumeClaim": {"claimName": "d", "readOnly": False}}])
    )
    repeated = [
        {"name": "a", "configMap": {"name": "x"}},
        {"name": "a", "configMap": {"name": "y"}},
    ]
    assert "files: names must be unique" in applied(repeated)
