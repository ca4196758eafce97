"""A FlowRun whose runner pod the API server refuses says so where users look, then goes on.

The namespace has no runner ServiceAccount, so the ServiceAccount admission plugin refuses the
pod. The run must show it in ``kubectl describe flowrun`` (the ``PodCreated`` condition),
``kubectl get flowruns -o wide`` (reason and message), a Warning Event and the operator's
metrics; once the account is installed with the README's command, the same FlowRun succeeds.
"""

from __future__ import annotations

import re

import pytest

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator

pytestmark = pytest.mark.cluster


ACCOUNT = "agentflows-runner"


def test_a_run_without_its_service_account_says_why_and_succeeds_once_it_exists(
    control_plane: Cluster, namespace: str, operator: Operator
) -> None:
    runs = FlowRuns(control_plane, namespace)
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "tiny"},
            "spec": {
                "nodes": [{"id": "one", "transform": "=41 + 1"}],
                "output": "=.nodes.one.json",
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "tiny-1"}, "spec": {"flow": "tiny"}},
    )

    def refused() -> dict[str, str] | None:
        condition = runs.condition("flowruns", "tiny-1", "PodCreated")
        return condition if condition and condition["status"] == "False" else None

    condition = wait_for(refused, 120, "PodCreated False on tiny-1")
    assert condition["reason"] == "Forbidden"
    message = condition["message"]
    assert message.startswith('cannot create runner pod tiny-1-1: pods "tiny-1-1" is forbidden')
    assert f'serviceaccount "{ACCOUNT}" not found' in message
    assert (
        f"create ServiceAccount {ACCOUNT} in {namespace} (helm: add {namespace} to "
        f"runnerNamespaces; kustomize: kubectl apply -k config/rbac/runner -n {namespace})"
    ) in message
    status = runs.status("tiny-1")
    assert (status["phase"], status["reason"], status["message"]) == (
        "Pending",
        "PodCreateFailed",
        message,
    )

    described = control_plane.kubectl("describe", "flowrun", "tiny-1", "-n", namespace).stdout
    assert "Pod Created" in described or "PodCreated" in described
    assert f'serviceaccount "{ACCOUNT}" not found' in described
    wide = control_plane.kubectl("get", "flowruns", "-n", namespace, "-o", "wide").stdout
    header, row = wide.splitlines()
    assert header.split()[-3:] == ["REASON", "MESSAGE", "AGE"]
    assert "Pending" in row and "PodCreateFailed" in row and "cannot create runner pod" in row

    warnings = [
        e for e in runs.events("tiny-1") if e.type == "Warning" and e.reason == "PodCreateFailed"
    ]
    assert len(warnings) == 1 and warnings[0].message == message
    sample = re.search(
        rf'agentflows_pod_create_failures_total\{{namespace="{namespace}",reason="Forbidden"\}} '
        r"(\d+)\.0",
        operator.metrics(),
    )
    assert sample is not None and int(sample.group(1)) >= 1

    control_plane.kubectl("apply", "-k", str(REPO / "config/rbac/runner"), "-n", namespace)
    status = runs.wait_phase("tiny-1", "Succeeded", "Failed", timeout=180)
    assert status["phase"] == "Succeeded", status.get("message")
    assert (status["attempt"], status["output"]) == (1, 42)
    created = runs.condition("flowruns", "tiny-1", "PodCreated")
    assert created is not None
    assert (created["status"], created["reason"]) == ("True", "Created")
    assert [p.metadata.name for p in runs.pods("tiny-1")] == ["tiny-1-1"]
