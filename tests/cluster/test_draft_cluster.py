"""``agentflows draft -n NS`` on the real control plane: it reads and applies as the person.

The builder is told the namespace's Agents, Flows and (``--suggest``) recent runs as the
kubeconfig's user may read them; a user without read access gets exit 2 and the API's refusal,
and the model is never called. ``apply_flow`` dry-runs on the API server, shows the diff and
asks the person at a terminal (a pseudo-terminal here, answered as a person would), and
applies as that person: a user RBAC does not let write Flows gets the API server's refusal.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.kube_fixtures import crds, grant, kube_namespace  # noqa: F401  (fixtures)
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall
from tests.support.processes import Reading
from tests.unit.test_cli_draft import BAD, GOOD

pytestmark = pytest.mark.cluster


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    server = ScriptedModelServer().start()
    yield server
    server.stop()


def _argv(
    cluster: Cluster, namespace: str, user: str, server: ScriptedModelServer, *args: str
) -> list[str]:
    argv = [sys.executable, "-m", "agentflows.cli.main", "draft", *args, "-n", namespace]
    return [*argv, "--kubeconfig", str(cluster.kubeconfig(user)), "--api-base", server.url]


ENV = {**os.environ, "OPENAI_API_KEY": API_KEY, "AGENTFLOWS_BUILDER_MODEL": "openai/scripted"}


def _draft(
    cluster: Cluster, namespace: str, user: str, server: ScriptedModelServer, *args: str
) -> subprocess.CompletedProcess[str]:
    argv = _argv(cluster, namespace, user, server, *args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, env=ENV, check=False)


def _grant_readers(cluster: Cluster, namespace: str, user: str) -> None:
    rules = [
        {
            "apiGroups": ["agentflows.io"],
            "resources": ["agents", "flows", "flowruns"],
            "verbs": ["get", "list"],
        }
    ]
    grant(cluster, namespace, "draft-readers", (user,), rules)


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


AGENT = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "triage"},
    "spec": {"model": {"name": "openai/gpt-4o-mini"}, "systemPrompt": "Explain pods."},
}
READ = {"apiGroups": ["agentflows.io"], "resources": ["agents", "flows"], "verbs": ["get", "list"]}
WRITE = {"apiGroups": ["agentflows.io"], "resources": ["flows"], "verbs": ["create", "patch"]}
QUESTION = "Apply Flow failing-pods to namespace {ns}? [y/N]"


@pytest.fixture
def triage_namespace(
    control_plane: Cluster,
    crds: list[str],  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> str:
    """A fresh namespace holding the Agent ``triage`` the drafts use."""
    control_plane.apply({**AGENT, "metadata": {"name": "triage", "namespace": kube_namespace}})
    return kube_namespace


def _tool_results(server: ScriptedModelServer) -> list[Any]:
    messages = server.requests[-1].messages
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


def test_apply_flow_shows_the_server_side_dry_runs_diff_and_applies_as_the_person_on_yes(
    control_plane: Cluster,
    triage_namespace: str,
    model_server: ScriptedModelServer,
) -> None:
    ns = triage_namespace
    grant(control_plane, ns, "flow-writers", ("alice",), [READ, WRITE])
    model_server.script(
        Reply.calls(ToolCall("validate_flow", {"yaml": GOOD})),
        Reply.calls(ToolCall("apply_flow", {"yaml": GOOD})),
        Reply.calls(ToolCall("apply_flow", {"yaml": GOOD})),
        Reply.text("- approver alice"),
    )
    person, terminal = pty.openpty()
    argv = _argv(control_plane, ns, "alice", model_server, "list failing pods")
    session = Reading(argv, stdin=terminal, env=ENV)
    os.close(terminal)
    question = QUESTION.format(ns=ns)
    try:
        wait_for(lambda: question in session.text("stderr"), 120, "the first question")
        shown = session.text("stderr")
        assert (
            "+++ Flow failing-pods (after apply)" in shown
            and "--- Flow failing-pods (new)" in shown
        )
        # the API server's answer of the dry run, as the new object's lines
        assert "+    id: explain\n" in shown and "+      name: triage\n" in shown, shown
        assert (
            control_plane.kubectl("get", "flow", "failing-pods", "-n", ns, check=False).returncode
            != 0
        )
        os.write(person, b"n\n")  # the person says no: nothing is applied
        wait_for(lambda: session.text("stderr").count(question) == 2, 120, "the second question")
        declined = _tool_results(model_server)[-1]
        assert "not applied: the person did not confirm" in str(declined)
        assert (
            control_plane.kubectl("get", "flow", "failing-pods", "-n", ns, check=False).returncode
            != 0
        )
        os.write(person, b"y\n")
        code = session.finish(120)
    finally:
        os.close(person)
        if session.process.poll() is None:
            session.finish(0)
    assert code == 0, session.text("stderr")
    assert f"# Applied to namespace {ns}: Flow failing-pods" in session.text("stdout")
    assert _tool_results(model_server)[-1] == {"applied": ["Flow failing-pods"], "namespace": ns}
    applied = json.loads(
        control_plane.kubectl(
            "get", "flow", "failing-pods", "-n", ns, "-o", "json", "--show-managed-fields"
        ).stdout
    )
    assert applied["spec"]["nodes"][0]["agent"]["name"] == "triage"
    managers = {(f["manager"], f["operation"]) for f in applied["metadata"]["managedFields"]}
    assert ("agentflows-draft", "Apply") in managers


PATCH = {"apiGroups": ["agentflows.io"], "resources": ["flows"], "verbs": ["patch"]}


def test_apply_flow_of_a_person_without_create_on_flows_gets_the_api_servers_refusal_unasked(
    control_plane: Cluster,
    triage_namespace: str,
    model_server: ScriptedModelServer,
) -> None:
    ns = triage_namespace
    # bob may read and patch Flows but not create one: the dry run of a new Flow is refused
    grant(control_plane, ns, "flow-patchers", ("bob",), [READ, PATCH])
    bobs = GOOD.replace("failing-pods", "bobs-pods")  # the module's namespace is shared
    model_server.script(
        Reply.calls(ToolCall("apply_flow", {"yaml": bobs})), Reply.text("- approver alice")
    )
    result = _draft(control_plane, ns, "bob", model_server, "list failing pods")
    assert result.returncode == 0, result.stderr
    refusal = str(_tool_results(model_server)[-1])
    assert "not applied: the API server refused the dry run of Flow bobs-pods" in refusal
    assert 'User "bob" cannot create resource "flows"' in refusal, refusal
    # and bob is told too, in the API server's words, not only through the model's
    told = f"apply_flow: {_tool_results(model_server)[-1]['error']}"
    assert told in result.stderr, result.stderr
    assert "[y/N]" not in result.stderr and "# Applied" not in result.stdout
    assert control_plane.kubectl("get", "flow", "bobs-pods", "-n", ns, check=False).returncode != 0


def test_apply_flow_never_sends_a_draft_that_does_not_validate_even_for_a_person_who_may(
    control_plane: Cluster,
    triage_namespace: str,
    model_server: ScriptedModelServer,
) -> None:
    ns = triage_namespace
    grant(control_plane, ns, "flow-writers", ("alice",), [READ, WRITE])
    bad = BAD.replace("failing-pods", "bad-pods")
    model_server.script(
        Reply.calls(ToolCall("apply_flow", {"yaml": bad})), Reply.text("- approver alice")
    )
    person, terminal = pty.openpty()  # someone could answer: the question must not come
    session = Reading(
        _argv(control_plane, ns, "alice", model_server, "list failing pods"),
        stdin=terminal,
        env=ENV,
    )
    os.close(terminal)
    try:
        code = session.finish(120)
    finally:
        os.close(person)
    # the session ends as a draft that never validated ends: exit 1, with the problems
    assert code == 1, session.text("stderr")
    assert "error: the builder ended without a draft that validates" in session.text("stderr")
    refused = str(_tool_results(model_server)[-1])
    assert "not applied: the draft does not validate" in refused, refused
    assert "triager" in refused, refused
    assert "[y/N]" not in session.text("stderr") and "# Applied" not in session.text("stdout")
    assert control_plane.kubectl("get", "flow", "bad-pods", "-n", ns, check=False).returncode != 0
