"""Attack (issue 11, item 3) on the real control plane: a trigger filter that never ends.

A Flow author writes a ``kubernetes`` trigger whose jq ``filter`` loops forever
(``def f: f; f``) or allocates without end (``[range(1e9)]``). The operator evaluates filters
for every Flow of the cluster, so before the fix one such Flow stalled event handling for
everyone. Here, with the operator running as in tests/cluster/test_operator_triggers.py, the
bad Flow's triggers watch the same Events as another tenant's good Flow, and the good Flow
still gets a FlowRun for every Event (before the fix the first Event stalled the operator's
event loop for good, so none appeared); a plain FlowRun started meanwhile succeeds; the bad
triggers are suspended, each after one bound and once, and the operator's log says so with the
trigger's name and the bound it hit. No latency is asserted (machines are noisy): the waits
below only give up.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agentflows.triggers import common
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.cluster.test_operator_triggers import event_watch, flowruns_of
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster

LOOP = "def f: f; f"
ALLOCATE = "[range(1e9)] | length > 0"
#: When a wait for the good trigger's run gives up (not a latency bound).
GIVE_UP_SECONDS = 120
EVENTS_PER_PHASE = 3


def flow(name: str, triggers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {
            "nodes": [{"id": "echo", "transform": "={name: .run.input.name}"}],
            "output": "=.nodes.echo.json",
            "triggers": triggers,
        },
    }


def probe_trigger(name: str, namespace: str, jq_filter: str) -> dict[str, Any]:
    """A trigger on this namespace's ``Probe`` Events: every such trigger shares one watch."""
    return {
        "name": name,
        "kubernetes": {
            "apiVersion": "v1",
            "kind": "Event",
            "namespace": namespace,
            "fieldSelector": "reason=Probe",
            "filter": jq_filter,
        },
        "input": {"name": "=.run.trigger.payload.object.involvedObject.name"},
    }


def post_probe(cluster: Cluster, namespace: str, about: str) -> None:
    """A ``Probe`` Event about ConfigMap ``about`` (a new object each time: no dedup)."""
    body = {
        "metadata": {"generateName": f"{about}."},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": about,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
        },
        "reason": "Probe",
        "message": "a change worth a run",
        "type": "Normal",
        "count": 1,
        "source": {"component": "attack-test"},
    }
    cluster.core().create_namespaced_event(namespace, body)


def good_run(runs: FlowRuns, about: str) -> None:
    """Post a Probe Event about ``about`` and wait for the good Flow's run for it."""
    post_probe(runs.cluster, runs.namespace, about)

    def started() -> list[dict[str, Any]]:
        found = flowruns_of(runs, "good")
        return [r for r in found if (r["spec"].get("input") or {}).get("name") == about]

    wait_for(started, GIVE_UP_SECONDS, f"the good Flow's run for {about}", interval=0.1)


def ready(runs: FlowRuns, name: str) -> dict[str, Any] | None:
    condition = runs.condition("flows", name, "TriggersReady")
    return condition if condition and condition["status"] == "True" else None


def suspended_lines(operator: Operator, namespace: str) -> list[str]:
    prefix = f"trigger {namespace}/bad/"
    text = operator.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if prefix in line and "suspended" in line]


def test_a_looping_trigger_filter_delays_no_other_flows_runs_and_is_suspended_with_its_reason(
    runs: FlowRuns, operator: Operator
) -> None:
    namespace = runs.namespace
    runs.apply(flow("good", [probe_trigger("probe", namespace, '.event.object.type == "Normal"')]))
    wait_for(lambda: ready(runs, "good"), 60, "the good Flow's TriggersReady")
    wait_for(lambda: event_watch(operator) == "1.0", 60, "the operator's Event watch")
    for i in range(EVENTS_PER_PHASE):
        good_run(runs, f"alone-{i}")

    bad = [probe_trigger("loop", namespace, LOOP), probe_trigger("allocate", namespace, ALLOCATE)]
    runs.apply(flow("bad", bad), flow("plain", []))
    wait_for(lambda: ready(runs, "bad"), 60, "the bad Flow's TriggersReady")
    wait_for(lambda: event_watch(operator) == "1.0", 60, "the operator's Event watch")

    good_run(runs, "with-bad-0")
    runs.apply({"kind": "FlowRun", "metadata": {"name": "plain-1"}, "spec": {"flow": "plain"}})
    for i in range(1, EVENTS_PER_PHASE):
        good_run(runs, f"with-bad-{i}")

    plain = runs.wait_phase("plain-1", "Succeeded", "Failed")
    assert plain["phase"] == "Succeeded", plain
    started = flowruns_of(runs, "good")
    assert len(started) == 2 * EVENTS_PER_PHASE
    for run in started:
        status = runs.wait_phase(run["metadata"]["name"], "Succeeded", "Failed")
        assert status["output"] == {"name": run["spec"]["input"]["name"]}, status
    assert flowruns_of(runs, "bad") == []

    lines = wait_for(
        lambda: suspended_lines(operator, namespace) or None, 30, "the bad triggers suspended"
    )
    bound = f"{common.EXPRESSION_SECONDS:g}"
    loop = [line for line in lines if f"/bad/loop: jq {LOOP!r}: " in line]
    assert loop and f"expression exceeded {bound} s; suspended until the Flow changes" in loop[0]
    assert any(f"/bad/allocate: jq {ALLOCATE!r}: expression " in line for line in lines), lines
    assert len(lines) == 2, "each bad trigger costs one bound, once:\n" + "\n".join(lines)
    assert operator.alive
