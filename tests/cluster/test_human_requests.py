"""Humans in the loop on a real control plane: approve, reject, edit, answer, time out.

The operator runs as in test_operator.py (its ServiceAccount's token, config/rbac and
config/policies as shipped), runner pods run as local processes, and real users decide:
alice (group editors, the approvers of these flows), bob (group viewers) and mallory (no
group). RBAC lets all three read FlowRuns and patch ``flowruns/status``; the admission policy
decides who may decide. The ``agentflows`` CLI runs as a subprocess with each user's kubeconfig.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import parser

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator

pytestmark = pytest.mark.cluster

EDITORS = {"groups": ["editors"]}
TIMEOUT_DECIDER = "agentflows:timeout"


# ----- users, flows and helpers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def deciders(control_plane: Cluster, operator: Operator) -> Iterator[list[str]]:
    """alice, bob and mallory may read FlowRuns and patch their status (the policy decides).

    Removed after the module: the control plane is shared, and later modules test what these
    users may not do.
    """
    users = ["alice", "bob", "mallory"]
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "test-human-deciders"},
            "rules": [
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["flowruns"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["flowruns/status"],
                    "verbs": ["get", "patch"],
                },
            ],
        }
    )
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "test-human-deciders"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "test-human-deciders",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                for user in users
            ],
        }
    )
    yield users
    control_plane.kubectl(
        "delete", "clusterrolebinding/test-human-deciders", "clusterrole/test-human-deciders"
    )


@pytest.fixture
def humans(runs: FlowRuns, deciders: list[str]) -> FlowRuns:
    """The test's flow namespace, with the deciders' RBAC in place."""
    return runs


def flow(name: str, nodes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"kind": "Flow", "metadata": {"name": name}, "spec": {"nodes": nodes, **spec}}


def flowrun(name: str, flow_name: str, value: Any = None) -> dict[str, Any]:
    return {
        "kind": "FlowRun",
        "metadata": {"name": name},
        "spec": {"flow": flow_name, "input": value},
    }


def gate_flow(name: str, **approval: Any) -> dict[str, Any]:
    """review (editors approve) -> route: approve -> publish, edit -> edited, else -> done."""
    review = {
        "message": "Ship {{ .run.input.what }}?",
        "summary": "release notes for {{ .run.input.what }}",
        "approvers": EDITORS,
        **approval,
    }
    decision = ".nodes.review.json"
    return flow(
        name,
        [
            {"id": "review", "approval": review},
            {
                "id": "route",
                "branch": {
                    "value": f"={decision}.decision",
                    "cases": {"approve": "publish", "edit": "edited"},
                    "default": "done",
                },
            },
            {"id": "publish", "transform": f"={{published: true, by: {decision}.decidedBy}}"},
            {"id": "edited", "transform": f"={{published: true, edits: {decision}.edits}}"},
            {
                "id": "done",
                "transform": f"={{published: false, by: {decision}.decidedBy,"
                f" comment: {decision}.comment}}",
            },
        ],
        edges=[
            {"from": "review", "to": "route"},
            {"from": "route", "to": "publish", "branch": "approve"},
            {"from": "route", "to": "edited", "branch": "edit"},
            {"from": "route", "to": "done", "branch": "default"},
        ],
        output="=.nodes.publish.json // .nodes.edited.json // .nodes.done.json",
    )


def input_flow(name: str) -> dict[str, Any]:
    """ask (editors answer {count: integer >= 1}) -> use: {double: count * 2}."""
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 1}},
        "required": ["count"],
    }
    ask = {"message": "How many?", "schema": schema, "approvers": EDITORS}
    return flow(
        name,
        [
            {"id": "ask", "input": ask},
            {"id": "use", "transform": "={double: (.nodes.ask.json.count * 2)}"},
        ],
        output="=.nodes.use.json",
    )


def cli(cluster: Cluster, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``agentflows ARGS`` as ``user`` (the kubeconfig from $KUBECONFIG, as a user has it)."""
    return subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig(user))},
    )


def decide_with_kubectl(
    cluster: Cluster,
    user: str,
    namespace: str,
    run: str,
    requests: dict[str, Any],
    *flags: str,
) -> subprocess.CompletedProcess[str]:
    """The README's ``kubectl patch flowrun RUN --subresource=status --type=merge -p ...``."""
    body = json.dumps({"status": {"requests": requests}})
    return cluster.kubectl(
        "-n", namespace, "patch", "flowrun", run, "--subresource=status", "--type=merge",
        "-p", body, *flags, user=user, check=False,
    )  # fmt: skip


def wait_waiting(runs: FlowRuns, name: str, *request_ids: str) -> dict[str, Any]:
    """Wait until the run waits on exactly ``request_ids``; return its status."""

    def reached() -> dict[str, Any] | None:
        status = runs.status(name)
        if status.get("phase") == "Failed":
            pytest.fail(f"{name} failed: {status.get('message')}")
        pending = {
            rid for rid, r in (status.get("requests") or {}).items() if not r.get("decision")
        }
        return status if status.get("phase") == "Waiting" and pending == set(request_ids) else None

    return wait_for(reached, 180, f"{name} Waiting on {request_ids}")


def events_of(runs: FlowRuns, name: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in runs.events(name) if e.reason == reason]


def wait_event(runs: FlowRuns, name: str, reason: str) -> client.CoreV1Event:
    found = wait_for(lambda: events_of(runs, name, reason), 60, f"a {reason} Event on {name}")
    return found[0]


def samples(operator: Operator, metric: str, **labels: str) -> float | None:
    """The value of one sample of the operator's metrics (None when it is not there)."""
    for family in parser.text_string_to_metric_families(operator.metrics()):
        for sample in family.samples:
            if sample.name == metric and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def policy_enforced(cluster: Cluster, runs: FlowRuns, name: str, request: str = "review") -> None:
    """The policy reaches the admission plugin asynchronously: wait until it denies bob.

    A server-side dry run: admission runs, nothing is stored even before the policy is active.
    """
    probe = {request: {"decision": "approve", "decidedBy": "bob"}}

    def denies() -> bool:
        denied = decide_with_kubectl(
            cluster, "bob", runs.namespace, name, probe, "--dry-run=server"
        )
        return "bob is not an approver" in denied.stderr

    wait_for(denies, 60, "the decision policy to be enforced")


def assert_listed_by_the_cli(cluster: Cluster, namespace: str) -> None:
    """``agentflows requests`` (one namespace, and -A) shows gate-1's review with its columns."""
    listed = cli(cluster, "alice", "requests", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    header, line = listed.stdout.splitlines()
    assert header.split() == ["FLOW", "RUN", "REQUEST", "KIND", "MESSAGE", "SUMMARY", "AGE"]
    assert line.split()[:4] == ["gate", "gate-1", "review", "approval"]
    assert "Ship v2?" in line and "release notes for v2" in line
    assert re.fullmatch(r"\d+[smhd]", line.split()[-1]), line  # the AGE column
    everywhere = cli(cluster, "alice", "requests", "-A")
    assert any(
        row.split()[:3] == [namespace, "gate", "gate-1"] for row in everywhere.stdout.splitlines()
    ), everywhere.stdout


# ----- approving, and who may -------------------------------------------------------------------


def test_an_approver_approves_with_the_cli_and_a_new_pod_continues_the_run(
    control_plane: Cluster, humans: FlowRuns, operator: Operator
) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    status = wait_waiting(runs, "gate-1", "review")
    assert status["attempt"] == 1 and runs.pods("gate-1")[0].metadata.name == "gate-1-1"
    row = control_plane.kubectl("get", "flowruns", "-n", runs.namespace, "--no-headers").stdout
    assert row.split()[:3] == ["gate-1", "gate", "Waiting"]
    created = wait_event(runs, "gate-1", "RequestCreated")
    assert "approval request review from node review: Ship v2?" in created.message
    assert "group editors" in created.message
    pending = wait_for(
        lambda: samples(
            operator, "agentflows_requests_pending", namespace=runs.namespace, flow="gate"
        ),
        60,
        "the pending-requests gauge",
    )
    assert pending == 1.0

    assert_listed_by_the_cli(control_plane, runs.namespace)

    policy_enforced(control_plane, runs, "gate-1")
    approved = cli(
        control_plane, "alice", "approve", "gate-1", "-n", runs.namespace, "--comment", "lgtm"
    )
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.strip() == "gate-1 review: approve by alice"

    status = runs.wait_phase("gate-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"published": True, "by": "alice"}
    assert status["attempt"] == 2
    assert [p.metadata.name for p in runs.pods("gate-1")] == ["gate-1-1", "gate-1-2"]
    request = status["requests"]["review"]
    assert (request["decision"], request["decidedBy"], request["comment"]) == (
        "approve", "alice", "lgtm",
    )  # fmt: skip
    assert request["decidedAt"]
    node = status["nodes"]["review"]["output"]["json"]
    assert node["decision"] == "approve" and node["decidedBy"] == "alice"
    assert node["decidedAt"] == request["decidedAt"]
    decided = wait_event(runs, "gate-1", "RequestDecided")
    assert decided.message == 'alice approved request review: "lgtm"'
    assert len(events_of(runs, "gate-1", "RequestCreated")) == 1
    waited = wait_for(
        lambda: samples(
            operator, "agentflows_request_wait_seconds_count",
            namespace=runs.namespace, flow="gate", kind="approval", decision="approve",
        ),
        60,
        "the wait-time histogram",
    )  # fmt: skip
    assert waited == 1.0
    no_pending = {"namespace": runs.namespace, "flow": "gate"}
    wait_for(
        lambda: samples(operator, "agentflows_requests_pending", **no_pending) == 0.0, 30, "gauge 0"
    )
    assert "gate-1" not in operator.metrics()


def test_a_user_who_is_not_an_approver_is_denied_by_the_api_server(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    wait_waiting(runs, "gate-1", "review")
    policy_enforced(control_plane, runs, "gate-1")

    denied = decide_with_kubectl(
        control_plane,
        "bob",
        runs.namespace,
        "gate-1",
        {"review": {"decision": "approve", "decidedBy": "bob"}},
    )
    assert denied.returncode != 0
    assert "bob is not an approver of this request" in denied.stderr
    by_cli = cli(control_plane, "mallory", "approve", "gate-1", "review", "-n", runs.namespace)
    assert by_cli.returncode != 0
    assert "mallory is not an approver of this request" in by_cli.stderr

    # Admission denied both writes: nothing was stored, so the request is still undecided.
    status = runs.status("gate-1")
    assert status["phase"] == "Waiting" and status["attempt"] == 1
    assert "decision" not in status["requests"]["review"]
    # And the operator never saw a decision from them: once alice decides, her decision is the
    # only one it announced, and none was taken back.
    approved = cli(control_plane, "alice", "approve", "gate-1", "review", "-n", runs.namespace)
    assert approved.returncode == 0, approved.stderr
    decided = wait_event(runs, "gate-1", "RequestDecided")
    assert decided.message.startswith("alice approved request review")
    assert len(events_of(runs, "gate-1", "RequestDecided")) == 1
    assert events_of(runs, "gate-1", "RequestDecisionInvalid") == []


def test_a_forged_decided_by_is_denied(control_plane: Cluster, humans: FlowRuns) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    wait_waiting(runs, "gate-1", "review")
    policy_enforced(control_plane, runs, "gate-1")

    forged = decide_with_kubectl(
        control_plane, "alice", runs.namespace, "gate-1",
        {"review": {"decision": "approve", "decidedBy": "carol"}},
    )  # fmt: skip
    assert forged.returncode != 0
    assert "decidedBy must be your user name, alice" in forged.stderr

    fair = decide_with_kubectl(
        control_plane, "alice", runs.namespace, "gate-1",
        {"review": {"decision": "approve", "decidedBy": "alice"}},
    )  # fmt: skip
    assert fair.returncode == 0, fair.stderr
    status = runs.wait_phase("gate-1", "Succeeded", "Failed")
    assert status["output"] == {"published": True, "by": "alice"}


# ----- edit, reject, input ----------------------------------------------------------------------


def test_edits_reach_the_branch_after_an_edit_decision(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    wait_waiting(runs, "gate-1", "review")
    edits = {"title": "v2.1", "notes": ["fixed", None]}
    done = cli(
        control_plane,
        "alice",
        "approve",
        "gate-1",
        "-n",
        runs.namespace,
        "--edits",
        json.dumps(edits),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gate-1 review: edit by alice"

    status = runs.wait_phase("gate-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"published": True, "edits": edits}
    assert (
        "alice approved with edits request review (edits:"
        in wait_event(runs, "gate-1", "RequestDecided").message
    )


def test_a_rejection_takes_the_branch_and_without_one_fails_the_run_as_rejected(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(
        gate_flow("gate"),
        flow(
            "strict",
            [
                {"id": "review", "approval": {"message": "Go?", "approvers": EDITORS}},
                {"id": "after", "transform": "=1"},
            ],
        ),
        flowrun("gate-1", "gate", {"what": "v2"}),
        flowrun("strict-1", "strict"),
    )
    wait_waiting(runs, "gate-1", "review")
    wait_waiting(runs, "strict-1", "review")
    for run in ("gate-1", "strict-1"):
        rejected = cli(
            control_plane, "alice", "reject", run, "-n", runs.namespace, "--comment", "not yet"
        )
        assert rejected.returncode == 0, rejected.stderr

    routed = runs.wait_phase("gate-1", "Succeeded", "Failed")
    assert routed["output"] == {"published": False, "by": "alice", "comment": "not yet"}
    ended = runs.wait_phase("strict-1", "Succeeded", "Failed")
    assert (ended["phase"], ended["reason"]) == ("Failed", "Rejected")
    assert "rejected by alice: not yet" in ended["message"]
    assert ended["requests"]["review"]["decision"] == "reject"


def test_an_invalid_answer_is_taken_back_with_an_error_and_the_run_keeps_waiting(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(input_flow("ask"), flowrun("ask-1", "ask"))
    wait_waiting(runs, "ask-1", "ask")
    refused = cli(
        control_plane,
        "alice",
        "respond",
        "ask-1",
        "ask",
        "-n",
        runs.namespace,
        "--data",
        '{"count": "x"}',
    )
    assert refused.returncode != 0 and "does not match the schema" in refused.stderr

    wrong = decide_with_kubectl(
        control_plane, "alice", runs.namespace, "ask-1",
        {"ask": {"decision": "respond", "decidedBy": "alice", "data": {"count": 0}}},
    )  # fmt: skip
    assert wrong.returncode == 0, wrong.stderr
    request = wait_for(
        lambda: (r := runs.status("ask-1")["requests"]["ask"]).get("error") and r,
        60,
        "the operator's error on the request",
    )
    assert "data['count'] does not match the request's schema" in request["error"]
    assert not {"decision", "decidedBy", "decidedAt", "data"} & request.keys()
    warning = wait_event(runs, "ask-1", "RequestDecisionInvalid")
    assert warning.type == "Warning" and "request ask by alice" in warning.message
    status = runs.status("ask-1")
    assert (status["phase"], status["attempt"]) == ("Waiting", 1)

    answered = cli(
        control_plane,
        "alice",
        "respond",
        "ask-1",
        "ask",
        "-n",
        runs.namespace,
        "--data",
        '{"count": 21}',
    )
    assert answered.returncode == 0, answered.stderr
    status = runs.wait_phase("ask-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"double": 42}
    assert "error" not in status["requests"]["ask"]
    assert (
        wait_event(runs, "ask-1", "RequestDecided").message
        == "alice answered request ask (data: 12 bytes of JSON)"
    )


def test_a_decision_the_request_kind_does_not_take_is_taken_back(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    wait_waiting(runs, "gate-1", "review")
    odd = decide_with_kubectl(
        control_plane, "alice", runs.namespace, "gate-1",
        {"review": {"decision": "respond", "decidedBy": "alice", "data": 1}},
    )  # fmt: skip
    assert odd.returncode == 0, odd.stderr
    request = wait_for(
        lambda: (r := runs.status("gate-1")["requests"]["review"]).get("error") and r, 60, "error"
    )
    assert request["error"] == (
        "decision 'respond' is not valid for an approval request (valid: approve, edit, reject)"
    )
    assert "decision" not in request
    again = cli(control_plane, "alice", "approve", "gate-1", "-n", runs.namespace)
    assert again.returncode == 0, again.stderr
    assert runs.wait_phase("gate-1", "Succeeded", "Failed")["phase"] == "Succeeded"


# ----- time: request expiry, the run deadline, cancelling ---------------------------------------


def test_an_expired_approval_applies_on_timeout_and_records_it(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(
        gate_flow("lenient", timeoutSeconds=3, onTimeout="reject"),
        gate_flow("firm", timeoutSeconds=3, onTimeout="fail"),
        flowrun("lenient-1", "lenient", {"what": "v2"}),
        flowrun("firm-1", "firm", {"what": "v2"}),
    )
    lenient = runs.wait_phase("lenient-1", "Succeeded", "Failed", timeout=120)
    assert lenient["phase"] == "Succeeded", lenient.get("message")
    assert lenient["output"]["published"] is False
    assert lenient["output"]["by"] == TIMEOUT_DECIDER
    decided = lenient["nodes"]["review"]["output"]["json"]
    assert decided["decision"] == "reject" and decided["decidedBy"] == TIMEOUT_DECIDER
    assert decided["comment"].startswith("expired at ")
    assert lenient["attempt"] == 2
    expired = wait_event(runs, "lenient-1", "RequestExpired")
    assert expired.type == "Warning" and "onTimeout: reject" in expired.message

    firm = runs.wait_phase("firm-1", "Succeeded", "Failed", timeout=120)
    assert (firm["phase"], firm["reason"]) == ("Failed", "RequestExpired")
    # the phase change has the same reason; the operator's request Event says what applied
    messages = [e.message for e in events_of(runs, "firm-1", "RequestExpired")]
    assert any("request review expired at" in m and "onTimeout: fail" in m for m in messages)


def test_the_run_deadline_keeps_counting_while_a_run_waits(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    spec = gate_flow("slow")
    spec["spec"]["limits"] = {"timeoutSeconds": 6}
    runs.apply(spec, flowrun("slow-1", "slow", {"what": "v2"}))
    wait_waiting(runs, "slow-1", "review")
    status = runs.wait_phase("slow-1", "Failed", "Succeeded", timeout=120)
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert status["attempt"] == 1


def test_a_waiting_run_is_cancelled(
    control_plane: Cluster, humans: FlowRuns, operator: Operator
) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    wait_waiting(runs, "gate-1", "review")
    control_plane.kubectl(
        "-n", runs.namespace, "patch", "flowrun", "gate-1", "--type=merge",
        "-p", json.dumps({"spec": {"cancel": True}}),
    )  # fmt: skip
    status = runs.wait_phase("gate-1", "Cancelled")
    assert status["attempt"] == 1
    listed = cli(control_plane, "alice", "requests", "-n", runs.namespace)
    assert "gate-1" not in listed.stdout
    no_pending = {"namespace": runs.namespace, "flow": "gate"}
    wait_for(
        lambda: samples(operator, "agentflows_requests_pending", **no_pending) == 0.0, 30, "gauge 0"
    )
    late = cli(control_plane, "alice", "approve", "gate-1", "review", "-n", runs.namespace)
    assert late.returncode != 0 and "no pending request" in late.stderr
    wait_for(lambda: runs.pods("gate-1") == [], 120, "the ended pod deleted")


# ----- durability and scale ---------------------------------------------------------------------


def test_a_run_decided_while_the_operator_is_down_continues_once_after_its_restart(
    control_plane: Cluster, humans: FlowRuns, operator: Operator
) -> None:
    runs = humans
    runs.apply(gate_flow("gate"), flowrun("gate-1", "gate", {"what": "v2"}))
    wait_waiting(runs, "gate-1", "review")
    wait_event(runs, "gate-1", "RequestCreated")
    policy_enforced(control_plane, runs, "gate-1")
    operator.stop()
    try:
        approved = cli(control_plane, "alice", "approve", "gate-1", "-n", runs.namespace)
        assert approved.returncode == 0, approved.stderr
        # no operator is running to start an attempt: the decision waits for it in the status
        assert not operator.alive
        status = runs.status("gate-1")
        assert status["attempt"] == 1 and status["requests"]["review"]["decision"] == "approve"
    finally:
        operator.start()

    status = runs.wait_phase("gate-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["attempt"] == 2
    assert [p.metadata.name for p in runs.pods("gate-1")] == ["gate-1-1", "gate-1-2"]
    assert len(events_of(runs, "gate-1", "RequestCreated")) == 1
    assert len(events_of(runs, "gate-1", "RequestDecided")) == 1


def test_two_approvals_on_parallel_branches_are_decided_one_at_a_time(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    runs.apply(
        flow(
            "both",
            [
                {"id": "start", "transform": "={}"},
                {"id": "legal", "approval": {"message": "Legal?", "approvers": EDITORS}},
                {
                    "id": "security",
                    "approval": {"message": "Security?", "approvers": {"users": ["bob"]}},
                },
                {
                    "id": "join",
                    "transform": "={legal: .nodes.legal.json.decidedBy,"
                    " security: .nodes.security.json.decidedBy}",
                },
            ],
            edges=[
                {"from": "start", "to": "legal"},
                {"from": "start", "to": "security"},
                {"from": "legal", "to": "join"},
                {"from": "security", "to": "join"},
            ],
            output="=.nodes.join.json",
        ),
        flowrun("both-1", "both"),
    )
    wait_waiting(runs, "both-1", "legal", "security")
    policy_enforced(control_plane, runs, "both-1", "legal")
    ambiguous = cli(control_plane, "alice", "approve", "both-1", "-n", runs.namespace)
    assert ambiguous.returncode != 0 and "2 requests pending (legal, security)" in ambiguous.stderr

    assert (
        cli(control_plane, "alice", "approve", "both-1", "legal", "-n", runs.namespace).returncode
        == 0
    )
    status = wait_for(
        lambda: (
            (s := runs.status("both-1")).get("attempt") == 2 and s.get("phase") == "Waiting" and s
        ),
        180,
        "attempt 2 waiting on security",
    )
    assert status["nodes"]["legal"]["phase"] == "Succeeded"
    assert status["nodes"]["security"]["phase"] == "Waiting"
    denied = cli(control_plane, "alice", "approve", "both-1", "security", "-n", runs.namespace)
    assert "alice is not an approver of this request" in denied.stderr
    assert (
        cli(control_plane, "bob", "approve", "both-1", "security", "-n", runs.namespace).returncode
        == 0
    )

    status = runs.wait_phase("both-1", "Succeeded", "Failed")
    assert status["output"] == {"legal": "alice", "security": "bob"}
    assert status["attempt"] == 3


def test_a_hundred_waiting_runs_are_approved_with_one_command_and_all_finish(
    control_plane: Cluster, humans: FlowRuns
) -> None:
    runs = humans
    count = 100
    spec = gate_flow("bulk")
    spec["spec"]["successfulRunsHistoryLimit"] = 1000
    runs.apply(spec)
    items = []
    for i in range(count):
        item = flowrun(f"bulk-{i:03d}", "bulk", {"what": f"v{i}"})
        item["apiVersion"] = "agentflows.io/v1alpha1"
        item["metadata"]["namespace"] = runs.namespace
        items.append(item)
    custom = client.CustomObjectsApi(control_plane.api())

    def phases() -> dict[str, int]:
        listed = custom.list_namespaced_custom_object(
            "agentflows.io", "v1alpha1", runs.namespace, "flowruns"
        )
        counts: dict[str, int] = {}
        for run in listed["items"]:
            phase = (run.get("status") or {}).get("phase", "None")
            counts[phase] = counts.get(phase, 0) + 1
        return counts

    started = time.monotonic()
    control_plane.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    wait_for(lambda: phases().get("Waiting") == count, 900, f"{count} runs Waiting", interval=2)
    all_waiting = time.monotonic()
    approved = cli(
        control_plane, "alice", "approve", "--all", "--flow", "bulk", "-n", runs.namespace
    )
    decided = time.monotonic()
    assert approved.returncode == 0, approved.stderr
    assert f"{count} request(s) decided approve by alice" in approved.stderr
    wait_for(lambda: phases().get("Succeeded") == count, 900, f"{count} runs Succeeded", interval=2)
    finished = time.monotonic()
    print(
        f"\n{count} runs: all Waiting after {all_waiting - started:.1f}s; one approve --all took"
        f" {decided - all_waiting:.1f}s; all Succeeded {finished - decided:.1f}s later"
        f" (total {finished - started:.1f}s)"
    )
    assert phases() == {"Succeeded": count}
