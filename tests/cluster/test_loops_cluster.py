"""A loop on the cluster: examples/review-loop.yaml drafted, rejected twice, revised, approved.

The operator runs the example as it ships (models pointed at the scripted model server). alice
(group editors) decides each review with ``kubectl patch --subresource=status``, as the README
shows: two rejections with comments, then an approval of the third draft. The runner pod is
deleted once while iteration 2's revision waits for its model reply (the server holds it), so
the next attempt resumes inside iteration 2. The model server's request log is the proof: every
model call of a finished iteration was made once, the interrupted one twice, and each
rejection's comment is in the next revision's prompt. The example runs at its default
``retry.maxAttempts`` (3): the three attempts that decisions start are no retries, only the
killed one counts (``status.attemptsLost``). ``agentflows graph RUN`` draws the run from the
cluster with its back edge and each loop node's latest iteration.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

from agentflows.api import flowrun as flowrun_api
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns
from tests.cluster.test_examples_cluster import apply_example, cli, grant_deciders, start
from tests.cluster.test_human_requests import decide_with_kubectl, wait_waiting
from tests.support.fixtures import *  # noqa: F403
from tests.support.mermaid import ParsedMermaid
from tests.support.model_server import Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster

TOPIC = "our new pricing"
COMMENTS = ("mention the free tier", "say it is free for a month")
DRAFTS = ("Pricing v1.", "Pricing v2, with a free tier.", "Pricing v3, free for a month.")


def _prompt(request: Any) -> str:
    return str(request.messages[-1]["content"])


def _revise_prompt(text: str, comment: str) -> str:
    """The review-loop example's revise prompt, as its template renders it."""
    return f"Revise this announcement:\n{text}\nThe reviewer said: {comment}"


def _decide(cluster: Cluster, runs: FlowRuns, run: str, request: str, **fields: str) -> None:
    done = decide_with_kubectl(
        cluster, "alice", runs.namespace, run, {request: {**fields, "decidedBy": "alice"}}
    )
    assert done.returncode == 0, done.stderr


def _pod_gone(cluster: Cluster, namespace: str, pod: str) -> bool:
    try:
        cluster.core().read_namespaced_pod(pod, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_review_loop_rejected_twice_and_killed_mid_iteration_reruns_no_finished_iteration(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    held = threading.Event()
    pod_model_server.script(
        Reply.text(DRAFTS[0]),
        Reply.text(DRAFTS[1]),
        Reply.text("never delivered: its runner is killed first", hold=held),
        Reply.text(DRAFTS[2]),
    )
    # the example as it ships: the default retry (maxAttempts 3). The run makes five runner
    # attempts, three of them started by decisions; only the one killed counts against it.
    apply_example(control_plane, runs, pod_model_server, "review-loop")
    grant_deciders(control_plane, runs.namespace)
    try:
        info = start(control_plane, runs, "review-loop", f"topic={TOPIC}")
        name = info["name"]
        assert info["phase"] == "Waiting", info["message"]
        assert DRAFTS[0] in info["requests"]["review"]["message"]
        _decide(control_plane, runs, name, "review", decision="reject", comment=COMMENTS[0])
        second = wait_waiting(runs, name, "review#2")
        assert DRAFTS[1] in second["requests"]["review#2"]["message"]
        _decide(control_plane, runs, name, "review#2", decision="reject", comment=COMMENTS[1])

        # iteration 2's revision asks the model, which holds its reply: kill the runner there
        wait_for(lambda: len(pod_model_server.requests) == 3, 180, "revise#2's model request")
        status = runs.status(name)
        pod, attempt = status["pod"], status["attempt"]
        assert status["nodes"]["decide#2"]["phase"] == "Succeeded"
        assert "revise#2" not in status["nodes"] or (
            status["nodes"]["revise#2"]["phase"] == "Running"
        )
        # a graceful delete: the pod object goes only once the kubelet has ended its process,
        # so the held reply cannot reach a runner that still lives
        control_plane.core().delete_namespaced_pod(pod, runs.namespace)
        wait_for(lambda: _pod_gone(control_plane, runs.namespace, pod), 120, f"pod {pod} gone")
    finally:
        held.set()  # the held request's thread ends (its client is gone)

    third = wait_waiting(runs, name, "review#3")
    assert third["attempt"] == attempt + 1
    assert third["attemptsLost"] == 1
    assert DRAFTS[2] in third["requests"]["review#3"]["message"]
    _decide(control_plane, runs, name, "review#3", decision="approve")
    status = runs.wait_phase(name, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {
        "text": DRAFTS[2],
        "reviews": [
            {"decision": "reject", "comment": COMMENTS[0]},
            {"decision": "reject", "comment": COMMENTS[1]},
            {"decision": "approve", "comment": None},
        ],
    }

    # the request log: draft and iteration 1's revision once each; only the revision that was
    # in flight when its pod died was asked again; each comment reached the next revision
    prompts = [_prompt(r) for r in pod_model_server.requests]
    assert prompts == [
        f"Write a three-sentence announcement about {TOPIC}.",
        _revise_prompt(DRAFTS[0], COMMENTS[0]),
        _revise_prompt(DRAFTS[1], COMMENTS[1]),
        _revise_prompt(DRAFTS[1], COMMENTS[1]),
    ]
    assert pod_model_server.pending == 0
    nodes = status["nodes"]
    assert [nodes[k]["phase"] for k in ("review", "review#2", "review#3")] == ["Succeeded"] * 3
    assert nodes["revise"]["attempts"] == 1 and nodes["draft"]["attempts"] == 1
    assert nodes["revise#3"]["phase"] == "Skipped" and nodes["publish"]["phase"] == "Succeeded"
    assert sorted(status["requests"]) == ["review", "review#2", "review#3"]
    assert (status["attempt"], status["attemptsLost"]) == (5, 1)

    # the run's picture, drawn from the cluster: the back edge and each node's latest iteration
    drawn = cli(control_plane, runs.namespace, "graph", name)
    assert drawn.returncode == 0, drawn.stderr
    picture = ParsedMermaid(drawn.stdout)
    back = {(picture.labels[a][0], picture.labels[b][0]) for a, b in picture.back_edges}
    assert back == {("revise", "review")}
    for node in ("review", "decide", "revise"):
        assert picture.labels[picture.key(node)][-1] == "iteration 3", picture.labels
    assert picture.labels[picture.key("draft")][-1].startswith("Succeeded")

    shown = control_plane.kubectl("-n", runs.namespace, "get", "flowrun", name, "-o", "json")
    size = len(shown.stdout.encode())
    iterations = sum(1 for k in nodes if flowrun_api.node_of_key(k)[0] == "review")
    print(
        f"review-loop on the cluster: {iterations} iterations, {len(prompts)} model calls "
        f"({len(set(prompts))} distinct prompts, 1 repeated after the kill), "
        f"{status['attempt']} runner attempts ({status['attemptsLost']} lost), FlowRun {size} bytes (kubectl get -o json); "
        f"records: {', '.join(sorted(nodes, key=flowrun_api.key_order))}"
    )
