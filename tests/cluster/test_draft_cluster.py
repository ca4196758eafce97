"""``agentflows draft -n NS`` on the real control plane: it reads as the person's kubeconfig.

The builder is told the namespace's Agents, Flows and (``--suggest``) recent runs as the
kubeconfig's user may read them; a user without read access gets exit 2 and the API's refusal,
and the model is never called.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.kube_fixtures import crds, kube_namespace  # noqa: F401  (fixtures)
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall
from tests.unit.test_cli_draft import GOOD

pytestmark = pytest.mark.cluster


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    server = ScriptedModelServer().start()
    yield server
    server.stop()


def _draft(
    cluster: Cluster, namespace: str, user: str, server: ScriptedModelServer, *args: str
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "agentflows.cli.main", "draft", *args, "-n", namespace]
    argv += ["--kubeconfig", str(cluster.kubeconfig(user)), "--api-base", server.url]
    env = {**os.environ, "OPENAI_API_KEY": API_KEY, "AGENTFLOWS_BUILDER_MODEL": "openai/scripted"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, check=False)


def _grant_readers(cluster: Cluster, namespace: str, user: str) -> None:
    rbac = "rbac.authorization.k8s.io"
    cluster.apply(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": "draft-readers", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["agents", "flows", "flowruns"],
                    "verbs": ["get", "list"],
                }
            ],
        }
    )
    cluster.apply(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "draft-readers", "namespace": namespace},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "draft-readers"},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": user}],
        }
    )


def test_draft_suggest_reads_the_namespace_as_the_kubeconfig_user(
    control_plane: Cluster,
    crds: list[str],  # noqa: F811
    kube_namespace: str,  # noqa: F811
    model_server: ScriptedModelServer,
) -> None:
    ns = kube_namespace
    control_plane.apply(
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "triage", "namespace": ns},
            "spec": {"model": {"name": "openai/gpt-4o-mini"}, "systemPrompt": "Explain pods."},
        }
    )
    run = f"nightly-{uuid.uuid4().hex[:6]}"
    control_plane.apply(
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "FlowRun",
            "metadata": {"name": run, "namespace": ns},
            "spec": {"flow": "nightly"},
        }
    )
    refused = _draft(control_plane, ns, "alice", model_server, "--suggest")
    assert refused.returncode == 2, refused.stderr
    assert f"cannot read namespace {ns}: 403" in refused.stderr
    assert model_server.requests == []

    _grant_readers(control_plane, ns, "alice")
    model_server.script(
        Reply.calls(ToolCall("validate_flow", {"yaml": GOOD})), Reply.text("- a triage Flow")
    )
    result = _draft(control_plane, ns, "alice", model_server, "--suggest")

    assert result.returncode == 0, result.stderr
    told = model_server.requests[0].body["messages"][-1]["content"]
    assert "name: triage" in told and "Explain pods." in told
    assert f"FlowRun {run}: Flow nightly, Pending" in told
    assert "# Flow failing-pods: validated" in result.stdout
