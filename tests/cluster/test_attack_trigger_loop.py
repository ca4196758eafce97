"""Attack (issue 19, item 31) on the real control plane: a trigger fed by its own runs' Events.

Before the fix a Flow whose `kubernetes` trigger watched its namespace's FlowRun Events started
a run for each Event about its own runs (the operator posts one per phase change), and each of
those runs made more: about a run a second from one seed. Now the operator knows a run's own
objects from its cache and refuses them, with one Warning Event ``TriggerLoop`` on the Flow;
an Event about anything else still starts a run.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.cluster.test_attack_trigger_filter import flow, ready
from tests.cluster.test_operator_triggers import event_watch, flowruns_of
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster


TRIGGER = {
    "name": "runs",
    "kubernetes": {
        "apiVersion": "v1",
        "kind": "Event",
        "fieldSelector": "involvedObject.kind=FlowRun",
    },
    "input": {"name": "=.run.trigger.payload.object.involvedObject.name"},
}


def post_about_a_run(cluster: Cluster, namespace: str, name: str) -> None:
    """An Event about a FlowRun of that name that no run of this cluster is."""
    body = {
        "metadata": {"generateName": f"{name}."},
        "involvedObject": {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "FlowRun",
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
        },
        "reason": "Elsewhere",
        "message": "a run somewhere else changed",
        "type": "Normal",
        "source": {"component": "attack-test"},
    }
    cluster.core().create_namespaced_event(namespace, body)


def start_the_seed_of_a_trigger_on_its_runs(runs: FlowRuns, operator: Operator) -> None:
    """Flow echo, triggered by its namespace's FlowRun Events, watched; then its run seed."""
    runs.apply(flow("echo", [TRIGGER]))
    wait_for(lambda: ready(runs, "echo"), 60, "the Flow's TriggersReady")
    wait_for(lambda: event_watch(operator) == "1.0", 60, "the operator's Event watch")
    runs.apply({"kind": "FlowRun", "metadata": {"name": "seed"}, "spec": {"flow": "echo"}})


def started_for(runs: FlowRuns) -> list[str]:
    """The input names of every FlowRun of Flow echo (the seed, not labelled, included)."""
    listing = runs.custom.list_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "flowruns"
    )
    return sorted(
        str((r["spec"].get("input") or {}).get("name"))
        for r in listing["items"]
        if r["spec"]["flow"] == "echo"
    )


def run_for(runs: FlowRuns, about: str) -> dict[str, Any] | None:
    found = [
        r for r in flowruns_of(runs, "echo") if (r["spec"].get("input") or {}) == {"name": about}
    ]
    return found[0] if found else None


def test_a_trigger_on_its_runs_events_is_not_fed_by_its_own_runs(
    runs: FlowRuns, operator: Operator
) -> None:
    start_the_seed_of_a_trigger_on_its_runs(runs, operator)
    assert runs.wait_phase("seed", "Succeeded", "Failed")["phase"] == "Succeeded"

    def told() -> list[Any]:
        return [e for e in runs.events("echo") if e.reason == "TriggerLoop"]

    (loop,) = wait_for(told, 60, "the TriggerLoop Event on the Flow")
    assert loop.type == "Warning"
    assert "FlowRun seed belongs to a run of this Flow" in loop.message

    # An Event about a run that is not this Flow's starts one; its own Events start nothing.
    post_about_a_run(runs.cluster, runs.namespace, "elsewhere")
    started = wait_for(lambda: run_for(runs, "elsewhere"), 60, "the run for elsewhere")
    name = started["metadata"]["name"]
    assert runs.wait_phase(name, "Succeeded", "Failed")["phase"] == "Succeeded"
    wait_for(
        lambda: any(e.reason == "Succeeded" for e in runs.events(name)), 60, "its Succeeded Event"
    )
    # Events of one watch arrive in order: once the last sentinel's run exists, all came.
    post_about_a_run(runs.cluster, runs.namespace, "last")
    wait_for(lambda: run_for(runs, "last"), 60, "the run for the last sentinel")
    assert started_for(runs) == ["None", "elsewhere", "last"]
    assert len(told()) == 1


def test_a_trigger_fed_by_its_own_runs_says_so_in_the_flows_status(
    runs: FlowRuns, operator: Operator
) -> None:
    start_the_seed_of_a_trigger_on_its_runs(runs, operator)

    def refused() -> dict[str, Any] | None:
        condition = runs.condition("flows", "echo", "TriggersRefused")
        return condition if condition and condition["status"] == "True" else None

    condition = wait_for(refused, 60, "the Flow's TriggersRefused condition")
    assert condition["reason"] == "TriggerRefused"
    assert condition["message"].startswith(
        "trigger runs: FlowRun seed belongs to a run of this Flow"
    )
    assert runs.condition("flows", "echo", "TriggersReady")["status"] == "True"
