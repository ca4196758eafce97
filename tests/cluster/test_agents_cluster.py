"""Review inside an agent turn on a real control plane: pause, a human's patch, a new runner.

The FlowRun and its snapshot ConfigMap are created by hand (as the operator would), and
``agentflows runner`` runs as a process with the admin kubeconfig. The agent's model is the
scripted OpenAI-compatible server on loopback, which the runner process reaches directly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentflows.kube import client as kube_client
from tests.cluster import runner_process
from tests.cluster.harness import Cluster
from tests.cluster.kube_fixtures import (  # noqa: F401  (fixtures)
    crds,
    create_flowrun,
    get_flowrun,
    grant_deciders,
    kube,
    kube_namespace,
    patch_status,
    unique,
)
from tests.support.model_server import Reply, ScriptedModelServer, ToolCall

pytestmark = pytest.mark.cluster

DEPLOY = "import json, sys\nprint(json.dumps({'deployed': json.load(sys.stdin)['version']}))"


def _agent(server: ScriptedModelServer) -> dict[str, Any]:
    return {
        "model": {"name": "openai/scripted-model", "apiBase": server.url, "retries": 0},
        "systemPrompt": "You ship releases.",
        "tools": [{"name": "deploy", "python": {"script": DEPLOY}}],
        "humanReview": {"guidelines": "Ask before deploying.", "approvers": {"users": ["alice"]}},
    }


async def _create(api: kube_client.Client, namespace: str, snapshot: dict[str, Any]) -> str:
    name = unique("review")
    await runner_process.prepare(api, namespace, name, snapshot)
    return name


async def _runner(
    cluster: Cluster, api: kube_client.Client, namespace: str, name: str
) -> tuple[int, str]:
    """Run the runner to its end: exit status and stderr."""
    done = await runner_process.run(cluster, api, namespace, name)
    return done.returncode, done.stderr


async def test_review_pauses_the_run_and_a_new_runner_continues_the_same_turn_after_an_edit(
    control_plane: Cluster,
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
    model_server: ScriptedModelServer,
) -> None:
    snapshot = {
        "flow": "ship",
        "flows": {
            "ship": {"nodes": [{"id": "ship", "agent": {"name": "shipper", "prompt": "v2"}}]}
        },
        "agents": {"shipper": _agent(model_server)},
    }
    name = await _create(kube, kube_namespace, snapshot)
    model_server.script(
        Reply.calls(
            ToolCall(
                "request_human_review",
                {"message": "Deploy v2?", "tool": "deploy", "args": {"version": "v2"}},
                id="r1",
            ),
            content="Checks passed.",
        )
    )

    code, stderr = await _runner(control_plane, kube, kube_namespace, name)
    assert code == 3, stderr
    status = (await get_flowrun(kube, kube_namespace, name))["status"]
    request = status["requests"]["ship"]
    assert (request["kind"], request["message"], request["node"]) == (
        "review",
        "Deploy v2?",
        "ship",
    )
    assert request["proposal"] == {"tool": "deploy", "args": {"version": "v2"}}
    assert request["approvers"]["users"] == ["alice"]
    node = status["nodes"]["ship"]
    assert node["phase"] == "Waiting"
    saved = node["detail"]["state"]["messages"]
    assert [m["role"] for m in saved] == ["system", "user", "assistant"]
    assert node["detail"]["record"]["toolCalls"][0]["status"] == "pending"

    # alice, the approver, edits the proposed arguments with her own identity, as
    # `kubectl patch ... --subresource=status` does.
    grant_deciders(control_plane, kube_namespace)
    decision = {"decision": "edit", "edits": {"version": "v1"}, "decidedBy": "alice"}
    async with kube_client.Client.from_env(str(control_plane.kubeconfig("alice"))) as alice:
        await patch_status(alice, kube_namespace, name, {"requests": {"ship": decision}})
    await patch_status(kube, kube_namespace, name, {"attempt": 2})
    model_server.script(Reply.text("Deployed v1 instead of v2."))

    code, stderr = await _runner(control_plane, kube, kube_namespace, name)
    assert code == 0, stderr
    status = (await get_flowrun(kube, kube_namespace, name))["status"]
    assert status["result"]["phase"] == "Succeeded"
    node = status["nodes"]["ship"]
    assert node["output"]["text"] == "Deployed v1 instead of v2."
    assert [(c["name"], c["status"]) for c in node["detail"]["toolCalls"]] == [
        ("deploy", "success"),
        ("request_human_review", "success"),
    ]
    assert node["usage"]["llmCalls"] == 2
    assert status["usage"]["llmCalls"] == 2
    # The second pod continued the saved conversation: same system and user turns, then the
    # review's result holding the edited action's result.
    resumed = model_server.requests[1].messages
    assert resumed[:3] == saved
    assert json.loads(resumed[-1]["content"])["result"] == {"deployed": "v1"}
