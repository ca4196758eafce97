"""Attack (issue 19, item 31) on the real control plane: a run input the operator must hold.

Before the fix a 1.2 MB ``spec.input`` was admitted and held in the operator's memory for the
run's life (40 of them took it past its own memory limit). Now an input over
``MAX_INPUT_BYTES`` fails the run at once, with the reason and the field, and a finished run is
kept in the operator's cache without its input.
"""

from __future__ import annotations

import pytest

from agentflows.api import flowrun
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, OperatorProcess
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster

NODE = "real"


def test_a_run_whose_input_is_over_the_limit_fails_at_once_naming_the_field(
    runs: FlowRuns, operator: OperatorProcess
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
