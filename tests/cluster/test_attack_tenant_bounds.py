"""Attacks (issue 19, items 27 and 31) on the real control plane, as a tenant would try them.

Item 27: a Flow's ``runner.env`` and an MCP server's ``env`` once set the operator's own
variables (``AGENTFLOWS_BUDGET`` emptied let a run spend past its Budget); the API server now
refuses such a Flow or Agent from a namespace editor, naming the field.

Item 31: a run input the operator must hold.

Before the fix a 1.2 MB ``spec.input`` was admitted and held in the operator's memory for the
run's life (40 of them took it past its own memory limit). Now an input over
``MAX_INPUT_BYTES`` fails the run at once, with the reason and the field, and a finished run is
kept in the operator's cache without its input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflows.api import flowrun
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.support import tenant_documents
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster


def test_a_run_whose_input_is_over_the_limit_fails_at_once_naming_the_field(
    runs: FlowRuns, operator: Operator
) -> None:
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "echo"},
            "spec": {"nodes": [{"id": "echo", "transform": "=.run.input"}]},
        }
    )
    # created, not applied: kubectl apply would copy it into an annotation, which is bounded
    huge = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "metadata": {"name": "huge"},
        "spec": {"flow": "echo", "input": {"document": "a" * 1_200_000}},
    }
    runs.custom.create_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "flowruns", huge
    )
    status = runs.wait_phase("huge", "Succeeded", "Failed")
    assert status["phase"] == "Failed"
    assert status["reason"] == flowrun.RunReason.INPUT_TOO_LARGE
    assert status["message"].startswith(
        "spec.input: 1200015 bytes of JSON, over the 262144 a run's input may hold"
    )
    assert runs.pods("huge") == []


OPERATORS = "variables starting with AGENTFLOWS_ are set by the operator and cannot be set"


def test_an_editor_cannot_set_the_operators_variables_and_the_api_server_names_the_field(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    control_plane.kubectl("apply", "-k", str(Path(__file__).parents[2] / "config/rbac/users"))
    control_plane.kubectl(
        "create", "rolebinding", "bob-edit", "--clusterrole=edit", "--user=bob",
        "-n", runs.namespace,
    )  # fmt: skip

    def may_create_flows() -> bool:
        answer = control_plane.kubectl(
            "auth", "can-i", "create", "flows.agentflows.io", "-n", runs.namespace, "--as=bob",
            check=False,
        )  # fmt: skip
        return answer.stdout.strip() == "yes"

    wait_for(may_create_flows, 60, "bob's edit role reaches flows")
    flow = tenant_documents.flow_emptying_the_budget()
    agent = tenant_documents.agent_setting_the_attempt()
    for document, field in ((flow, "spec.runner.env[0]"), (agent, "spec.tools[0].mcp")):
        refused = control_plane.kubectl(
            "apply", "-n", runs.namespace, "-f", "-", user="bob", stdin=json.dumps(document),
            check=False,
        )  # fmt: skip
        assert refused.returncode != 0, refused.stdout
        assert field in refused.stderr and OPERATORS in refused.stderr, refused.stderr
    assert runs.get("flows", "spend") is None and runs.get("agents", "tools") is None
