"""Triggers through the operator on a real control plane: CronJobs, Event watches, bad triggers.

The operator runs as in tests/cluster/test_operator.py (its ServiceAccount's token, config/rbac
as it ships). Here the operator itself syncs a Flow's schedule CronJobs and runs the shared
watches of kubernetes triggers; the runs those start go all the way to Succeeded. Standalone
tests of the trigger machinery are in tests/cluster/test_triggers.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster


EVENT_WATCH = re.compile(
    r'^agentflows_trigger_watches\{api_version="v1",kind="Event"\} (\S+)$', re.MULTILINE
)


def flow(name: str, triggers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    nodes = [
        {
            "id": "diagnose",
            "transform": "={pod: .run.trigger.payload.object.involvedObject.name,"
            " reason: .run.trigger.payload.object.reason}",
        }
    ]
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {"nodes": nodes, "output": "=.nodes.diagnose.json", "triggers": triggers, **spec},
    }


def cronjobs(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    listing = cluster.kubectl("get", "cronjobs", "-n", namespace, "-o", "json")
    items: list[dict[str, Any]] = json.loads(listing.stdout)["items"]
    return items


def event_watch(operator: Operator) -> str | None:
    """The value of the operator's Event watch gauge ("1.0": established), None: no watch."""
    found = EVENT_WATCH.search(operator.metrics())
    return found.group(1) if found else None


def flowruns_of(runs: FlowRuns, flow_name: str) -> list[dict[str, Any]]:
    listing = runs.custom.list_namespaced_custom_object(
        "agentflows.io",
        "v1alpha1",
        runs.namespace,
        "flowruns",
        label_selector=f"agentflows.io/flow={flow_name}",
    )
    items: list[dict[str, Any]] = listing["items"]
    return items


def sleeping_pod(cluster: Cluster, namespace: str, name: str) -> Any:
    body = {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            # the namespace enforces the restricted Pod Security Standard
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "main",
                    "image": "app",
                    "command": ["python", "-c", "import time; time.sleep(300)"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
        },
    }
    return cluster.core().create_namespaced_pod(namespace, body)


def post_event(cluster: Cluster, namespace: str, pod: Any, reason: str) -> None:
    """An Event about ``pod``, as the kubelet posts one (created here as admin)."""
    body = {
        "metadata": {"generateName": f"{pod.metadata.name}."},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "namespace": namespace,
            "uid": pod.metadata.uid,
        },
        "reason": reason,
        "message": "Back-off restarting failed container main",
        "type": "Warning",
        "count": 1,
        "source": {"component": "kubelet"},
    }
    cluster.core().create_namespaced_event(namespace, body)


def test_a_schedule_trigger_gets_a_cronjob_owned_by_the_flow_that_goes_with_the_trigger(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    schedule = {"name": "nightly", "schedule": {"cron": "0 3 * * *"}}
    runs.apply(flow("report", [schedule]))

    def created() -> list[dict[str, Any]]:
        return cronjobs(control_plane, runs.namespace)

    (cronjob,) = wait_for(created, 60, "the schedule trigger's CronJob")
    owner = runs.get("flows", "report")
    assert owner is not None
    assert cronjob["metadata"]["name"] == "report-nightly"
    assert cronjob["spec"]["schedule"] == "0 3 * * *"
    assert cronjob["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Flow",
            "name": "report",
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    shown = control_plane.kubectl("get", "cronjobs", "-n", runs.namespace).stdout
    assert "report-nightly" in shown and "0 3 * * *" in shown

    def triggers_ready() -> dict[str, Any] | None:
        condition = runs.condition("flows", "report", "TriggersReady")
        return condition if condition and condition["status"] == "True" else None

    assert "report-nightly" in wait_for(triggers_ready, 60, "TriggersReady")["message"]

    runs.apply(flow("report", []))
    wait_for(lambda: not created(), 60, "the removed trigger's CronJob deleted")


def test_backoff_events_start_one_run_per_pod_that_succeeds_and_a_deleted_flow_stops_watching(
    control_plane: Cluster, runs: FlowRuns, operator: Operator
) -> None:
    trigger = {
        "name": "crashloop",
        "kubernetes": {
            "apiVersion": "v1",
            "kind": "Event",
            "namespace": runs.namespace,
            "fieldSelector": "involvedObject.kind=Pod,reason=BackOff",
            "filter": '.event.object.type == "Warning"',
        },
        "input": {"pod": "=.run.trigger.payload.object.involvedObject.name"},
    }
    runs.apply(flow("doctor", [trigger]))
    wait_for(lambda: event_watch(operator) == "1.0", 60, "the operator's Event watch")

    pods = [sleeping_pod(control_plane, runs.namespace, n) for n in ("web-0", "web-1", "last")]
    for _ in range(3):
        for pod in pods[:2]:
            post_event(control_plane, runs.namespace, pod, "BackOff")
    post_event(control_plane, runs.namespace, pods[0], "Pulled")
    # Events reach the watch in order: once the last pod's run exists, every Event came through.
    post_event(control_plane, runs.namespace, pods[2], "BackOff")

    def last_pods_run() -> list[dict[str, Any]]:
        found = flowruns_of(runs, "doctor")
        return [r for r in found if r["spec"]["input"]["pod"] == "last"]

    wait_for(last_pods_run, 60, "the last pod's run")
    started = flowruns_of(runs, "doctor")
    assert sorted(r["spec"]["input"]["pod"] for r in started) == ["last", "web-0", "web-1"]
    for run in started:
        name = run["metadata"]["name"]
        assert run["spec"]["trigger"]["type"] == "kubernetes"
        assert run["metadata"]["labels"]["agentflows.io/trigger"] == "crashloop"
        status = runs.wait_phase(name, "Succeeded", "Failed")
        assert status["phase"] == "Succeeded", status
        assert status["output"] == {"pod": run["spec"]["input"]["pod"], "reason": "BackOff"}

    control_plane.kubectl("delete", "flow", "doctor", "-n", runs.namespace)
    wait_for(lambda: event_watch(operator) is None, 60, "the Event watch stopped")
    assert operator.alive


def test_a_flow_with_a_bad_trigger_filter_or_input_is_not_ready_and_says_where(
    runs: FlowRuns, operator: Operator
) -> None:
    bad_filter = {
        "name": "events",
        "kubernetes": {"apiVersion": "v1", "kind": "Event", "filter": ".reason == ("},
    }
    bad_input = {
        "name": "nightly",
        "schedule": {"cron": "0 3 * * *"},
        "input": {"day": "=.run.trigger.scheduledTime | (("},
    }
    runs.apply(flow("broken", [bad_filter, bad_input]))

    def not_ready() -> dict[str, Any] | None:
        condition = runs.condition("flows", "broken", "Ready")
        return condition if condition and condition["status"] == "False" else None

    message = wait_for(not_ready, 60, "Ready=False")["message"]
    # the same path-named problems `agentflows validate` prints, down to the input's key
    assert "spec.triggers[0].kubernetes.filter: jq syntax error in '.reason == ('" in message
    assert "spec.triggers[1].input.day: jq syntax error in '.run.trigger.scheduledTime" in message
    triggers_ready = runs.condition("flows", "broken", "TriggersReady")
    assert triggers_ready is not None and triggers_ready["status"] == "False"
    assert triggers_ready["reason"] == "FlowNotReady"
    assert cronjobs(runs.cluster, runs.namespace) == []
    assert event_watch(operator) is None
    assert operator.alive
