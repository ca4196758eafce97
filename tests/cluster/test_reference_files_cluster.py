"""Reference files from a ConfigMap on a real control plane, read by ``agentflows runner``.

The FlowRun and its snapshot ConfigMap are created by hand (as the operator would), and the
runner runs as a process with the admin kubeconfig and its ConfigMaps volume filled from the
volume the operator would mount (tests/cluster/runner_process.py); the model is the scripted server on
loopback. The test looks at what the model received and at the digest recorded in status.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from agentflows.kube import client as kube_client
from tests.cluster import runner_process
from tests.cluster.harness import Cluster
from tests.cluster.kube_fixtures import (  # noqa: F401  (fixtures)
    crds,
    create_flowrun,
    get_flowrun,
    kube,
    kube_namespace,
    patch_status,
    unique,
)
from tests.support.model_server import Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster

HANDBOOK = "Escalate to the on-call engineer after 15 minutes."


async def _create(api: kube_client.Client, namespace: str, snapshot: dict[str, Any]) -> str:
    name = unique("files")
    await runner_process.prepare(api, namespace, name, snapshot)
    return name


async def _runner(
    cluster: Cluster, api: kube_client.Client, namespace: str, name: str
) -> tuple[int, str]:
    done = await runner_process.run(cluster, api, namespace, name)
    return done.returncode, done.stderr


async def test_configmap_files_reach_the_model_and_their_digest_is_in_status(
    control_plane: Cluster,
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
    model_server: ScriptedModelServer,
) -> None:
    await kube.create(
        kube_client.path_of("configmaps", kube_namespace),
        {
            "metadata": {"name": "handbook"},
            "data": {"oncall.md": HANDBOOK},
            "binaryData": {"logo.bin": base64.b64encode(b"not text \xff").decode()},
        },
    )
    agent = {
        "model": {"name": "openai/scripted-model", "apiBase": model_server.url, "retries": 0},
        "systemPrompt": "Answer from the handbook.",
        "files": [{"configMapKeyRef": {"name": "handbook", "key": "oncall.md"}}],
    }
    snapshot = {
        "flow": "answer",
        "flows": {
            "answer": {
                "nodes": [{"id": "ask", "agent": {"name": "helper", "prompt": "When to escalate?"}}]
            }
        },
        "agents": {"helper": agent},
    }
    name = await _create(kube, kube_namespace, snapshot)
    model_server.script(Reply.text("after 15 minutes"))

    code, stderr = await _runner(control_plane, kube, kube_namespace, name)

    assert code == 0, stderr
    assert model_server.requests[0].messages[1] == {
        "role": "user",
        "content": f'<file name="oncall.md">\n{HANDBOOK}\n</file>\n\nWhen to escalate?',
    }
    status = (await get_flowrun(kube, kube_namespace, name))["status"]
    assert status["nodes"]["ask"]["detail"]["files"] == [
        {
            "name": "oncall.md",
            "source": "configmap handbook/oncall.md",
            "contentType": "text/markdown",
            "size": len(HANDBOOK),
            "sha256": hashlib.sha256(HANDBOOK.encode()).hexdigest(),
        }
    ]

    agent["files"] = [{"configMapKeyRef": {"name": "handbook", "key": "missing.md"}}]
    failing = await _create(kube, kube_namespace, snapshot)
    code, stderr = await _runner(control_plane, kube, kube_namespace, failing)

    assert code != 0
    status = (await get_flowrun(kube, kube_namespace, failing))["status"]
    assert status["nodes"]["ask"]["error"] == (
        "configmap handbook has no key 'missing.md', or does not exist"
    )
    assert len(model_server.requests) == 1, "no model call for a turn whose file is missing"
