"""The operator's cache on a real control plane: what it re-validates, and long names.

The operator reads Agents, Flows, FlowRuns and runner pods from watches. A change re-validates
only the Flows that reach what changed, runs never re-validate their Flow, and a Flow whose
name is longer than a label value (63 characters, valid for an object) runs like any other.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentflows.api import wellknown
from agentflows.kube import objects
from tests.cluster.harness import wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster


def agent(name: str, instructions: str) -> dict[str, Any]:
    return {
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"model": {"name": "openai/gpt-4o-mini"}, "systemPrompt": instructions},
    }


def agent_flow(name: str, agent_name: str) -> dict[str, Any]:
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {"nodes": [{"id": "ask", "agent": {"name": agent_name, "prompt": "hi"}}]},
    }


def transform_flow(name: str) -> dict[str, Any]:
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {"nodes": [{"id": "t", "transform": "={x: 1}"}], "output": "=.nodes.t.json"},
    }


def flowrun(name: str, flow_name: str) -> dict[str, Any]:
    return {"kind": "FlowRun", "metadata": {"name": name}, "spec": {"flow": flow_name}}


def validations(operator: Operator, namespace: str, flow: str) -> int:
    """How often the operator validated ``namespace/flow`` (its log says each time)."""
    marker = f"validated Flow {namespace}/{flow}:"
    return sum(marker in line for line in operator.log_path.read_text().splitlines())


def ready(runs: FlowRuns, kind: str, name: str) -> bool:
    condition = runs.condition(kind, name, "Ready")
    return condition is not None and condition["status"] == "True"


def test_an_agent_change_revalidates_only_the_flows_that_reach_it_and_runs_never_do(
    runs: FlowRuns, operator: Operator
) -> None:
    namespace = runs.namespace
    runs.apply(agent("x", "one"), agent("y", "one"))
    runs.apply(agent_flow("uses-x", "x"), agent_flow("uses-y", "y"), transform_flow("plain"))
    for name in ("uses-x", "uses-y", "plain"):
        wait_for(lambda name=name: ready(runs, "flows", name), 60, f"Flow {name} Ready")
    before = {f: validations(operator, namespace, f) for f in ("uses-x", "uses-y", "plain")}
    assert all(count >= 1 for count in before.values()), before

    runs.apply(agent("x", "two"))  # a new generation of x
    wait_for(
        lambda: validations(operator, namespace, "uses-x") > before["uses-x"],
        60,
        "uses-x validated again",
    )
    for index in range(3):
        runs.apply(flowrun(f"plain-{index}", "plain"))
    for index in range(3):
        runs.wait_phase(f"plain-{index}", "Succeeded")
    wait_for(
        lambda: (runs.get("flows", "plain") or {}).get("status", {}).get("activeRuns") == 0,
        60,
        "plain's summary",
    )

    assert validations(operator, namespace, "uses-y") == before["uses-y"]
    assert validations(operator, namespace, "plain") == before["plain"]
    assert runs.get("flows", "plain")["status"]["lastRun"].startswith("plain-")


def test_a_flow_named_with_70_characters_runs_and_its_pod_is_labelled_with_a_shortened_name(
    runs: FlowRuns,
) -> None:
    name = "a-flow-whose-name-is-longer-than-any-label-value-may-be-" + "x" * 14
    assert len(name) == 70
    runs.apply(transform_flow(name), flowrun("long-1", name))

    status = runs.wait_phase("long-1", "Succeeded")
    assert status["output"] == {"x": 1}
    [pod] = runs.pods("long-1")
    label = pod.metadata.labels[wellknown.FLOW]
    assert label == objects.label_value(name) and len(label) == 63
    wait_for(
        lambda: (runs.get("flows", name) or {}).get("status", {}).get("lastRun") == "long-1",
        60,
        "the Flow's lastRun",
    )
    assert ready(runs, "flows", name)
