"""Attack (issue 19, item 26) on the real control plane: a trigger reading another namespace.

bob may `edit` in team-b only (the built-in role, with config/rbac/users aggregated into it).
Before the fix his Flow's `kubernetes` trigger on Events, written without a namespace or with
`namespace: team-a`, was handed team-a's Events. Now a trigger without a namespace watches its
Flow's own; another namespace or `*` is admitted only for a writer who may list and watch the
kind there (config/policies/trigger-scope.yaml, applied with config/policies by the operator
fixture): alice, who may also `view` team-a, may write one. The Flow's TriggersReady message
says which namespace each trigger watches.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.cluster.test_attack_trigger_filter import flow, post_probe
from tests.cluster.test_operator_triggers import flowruns_of
from tests.support.fixtures import *  # noqa: F403

pytestmark = pytest.mark.cluster


def events_trigger(namespace: str | None) -> dict[str, Any]:
    source: dict[str, Any] = {"apiVersion": "v1", "kind": "Event", "fieldSelector": "reason=Probe"}
    if namespace is not None:
        source["namespace"] = namespace
    return {
        "name": "events",
        "kubernetes": source,
        "input": {"name": "=.run.trigger.payload.object.involvedObject.name"},
    }


def apply_as(runs: FlowRuns, user: str, manifest: dict[str, Any]) -> Any:
    manifest = {"apiVersion": "agentflows.io/v1alpha1", **manifest}
    return runs.cluster.kubectl(
        "-n", runs.namespace, "apply", "-f", "-", user=user, stdin=json.dumps(manifest),
        check=False,
    )  # fmt: skip


def bind(cluster: Cluster, user: str, role: str, namespace: str) -> None:
    cluster.kubectl(
        "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
        "-n", namespace,
    )  # fmt: skip


@pytest.fixture
def team_a(control_plane: Cluster) -> Iterator[str]:
    name = f"team-a-{uuid.uuid4().hex[:8]}"
    control_plane.core().create_namespace({"metadata": {"name": name}})
    yield name
    control_plane.core().delete_namespace(name)


@pytest.fixture
def tenants(control_plane: Cluster, runs: FlowRuns, team_a: str) -> FlowRuns:
    """bob edits team-b (the runs' namespace); alice edits team-b and views team-a."""
    control_plane.kubectl("apply", "-k", str(REPO / "config/rbac/users"))
    bind(control_plane, "bob", "edit", runs.namespace)
    bind(control_plane, "alice", "edit", runs.namespace)
    bind(control_plane, "alice", "view", team_a)

    def enforced() -> bool:
        # the policy reaches the admission plugin asynchronously: wait until it denies
        result = apply_as(runs, "bob", flow("probe", [events_trigger(team_a)]))
        if result.returncode == 0:
            control_plane.kubectl("-n", runs.namespace, "delete", "flow", "probe", check=False)
        return "may not list and watch" in result.stderr

    wait_for(enforced, 60, "the trigger-scope policy to be enforced")
    return runs


def test_a_trigger_naming_a_namespace_its_writer_may_not_read_is_refused(
    tenants: FlowRuns, team_a: str
) -> None:
    other = apply_as(tenants, "bob", flow("spy", [events_trigger(team_a)]))
    assert other.returncode != 0
    assert (
        f"kubernetes trigger events watches v1 Event in namespace {team_a}, which bob may not "
        "list and watch: a trigger sees only what the Flow's writer may read"
    ) in other.stderr
    every = apply_as(tenants, "bob", flow("spy", [events_trigger("*")]))
    assert every.returncode != 0
    assert "watches v1 Event in every namespace, which bob may not list and watch" in (every.stderr)
    admitted = apply_as(tenants, "alice", flow("wide", [events_trigger(team_a)]))
    assert admitted.returncode == 0, admitted.stderr


def test_a_trigger_without_a_namespace_gets_only_its_flows_namespace_events_and_says_so(
    tenants: FlowRuns, team_a: str, operator: Operator
) -> None:
    own = tenants.namespace
    assert apply_as(tenants, "bob", flow("own", [events_trigger(None)])).returncode == 0
    assert apply_as(tenants, "alice", flow("wide", [events_trigger(team_a)])).returncode == 0

    def triggers_message(name: str) -> str | None:
        condition = tenants.condition("flows", name, "TriggersReady")
        return condition["message"] if condition and condition["status"] == "True" else None

    assert wait_for(lambda: triggers_message("own"), 60, "own's TriggersReady") == (
        f"watching: v1/Event in {own}"
    )
    assert wait_for(lambda: triggers_message("wide"), 60, "wide's TriggersReady") == (
        f"watching: v1/Event in {team_a}"
    )

    def inputs(name: str) -> list[str]:
        return sorted(r["spec"]["input"]["name"] for r in flowruns_of(tenants, name))

    # Both watches must be running before the Events that prove them are posted.
    post_probe(tenants.cluster, own, "warm-b")
    post_probe(tenants.cluster, team_a, "warm-a")
    wait_for(lambda: "warm-b" in inputs("own"), 60, "own's run for its namespace's Event")
    wait_for(lambda: "warm-a" in inputs("wide"), 60, "wide's run for team-a's Event")
    post_probe(tenants.cluster, team_a, "secret-of-team-a")
    post_probe(tenants.cluster, own, "sentinel")
    wait_for(lambda: "secret-of-team-a" in inputs("wide"), 60, "wide's run for team-a's Event")
    wait_for(lambda: "sentinel" in inputs("own"), 60, "own's run for the sentinel")
    # Events of one watch arrive in order; team-a's were posted before each sentinel.
    assert inputs("own") == ["sentinel", "warm-b"]
    assert inputs("wide") == ["secret-of-team-a", "warm-a"]
