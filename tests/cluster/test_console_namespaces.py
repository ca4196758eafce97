"""The console's runs list for a user who may not list runs cluster-wide, on a real API server.

carol has a RoleBinding that lets her list FlowRuns in two namespaces of three. The console
(configured with the three) asks the API server as carol — SelfSubjectAccessReviews made with
her impersonated identity — and lists, and follows live, the runs of exactly those two.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import test_utils
from kubernetes import client

from agentflows.console import app, identity
from agentflows.kube import client as kube
from tests.cluster.harness import REPO, Cluster, wait_for

pytestmark = pytest.mark.cluster

CAROL = {"X-Forwarded-User": "carol", "X-Forwarded-Groups": "staff"}


def _crds_established(cluster: Cluster) -> bool:
    crd = client.ApiextensionsV1Api(cluster.api()).read_custom_resource_definition(
        "flowruns.agentflows.io"
    )
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


@pytest.fixture
def three_namespaces(control_plane: Cluster) -> Iterator[list[str]]:
    """Three namespaces with a Flow and a FlowRun each; carol may list them in the first two."""
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    wait_for(lambda: _crds_established(control_plane), 60, "the FlowRun CRD Established")
    suffix = uuid.uuid4().hex[:8]
    names = [f"t-scope-{letter}-{suffix}" for letter in "abc"]
    for namespace in names:
        control_plane.core().create_namespace({"metadata": {"name": namespace}})
        control_plane.apply({"apiVersion": "agentflows.io/v1alpha1", "kind": "Flow",
                             "metadata": {"name": f"flow-{namespace}", "namespace": namespace},
                             "spec": {"nodes": [{"id": "a", "transform": "=1"}]}})  # fmt: skip
        control_plane.apply({"apiVersion": "agentflows.io/v1alpha1", "kind": "FlowRun",
                             "metadata": {"name": f"run-{namespace}", "namespace": namespace},
                             "spec": {"flow": "hello"}})  # fmt: skip
    rules = [{"apiGroups": ["agentflows.io"], "resources": ["flowruns", "flows"],
              "verbs": ["get", "list", "watch"]}]  # fmt: skip
    for namespace in names[:2]:
        meta = {"name": "runs-reader", "namespace": namespace}
        control_plane.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                             "metadata": meta, "rules": rules})  # fmt: skip
        control_plane.apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "runs-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "carol"}],
        })  # fmt: skip
    try:
        yield names
    finally:
        for namespace in names:
            control_plane.core().delete_namespace(namespace)


@pytest.fixture
async def console(
    control_plane: Cluster, three_namespaces: list[str]
) -> AsyncIterator[test_utils.TestClient]:
    """The console behind a proxy at 127.0.0.1, told to look in the three namespaces."""
    api = kube.Client.from_env(str(control_plane.kubeconfig()), None, retry_seconds=10)
    gate = identity.Gate(api, trusted_proxy=ipaddress.ip_network("127.0.0.1/32"))
    web_app = app.cluster_app(gate, three_namespaces[0], namespaces=tuple(three_namespaces))
    async with test_utils.TestClient(test_utils.TestServer(web_app)) as served:
        yield served


async def _event(stream: Any) -> dict[str, Any]:
    while True:
        line = (await stream.content.readline()).decode()
        if line.startswith("data: "):
            found: dict[str, Any] = json.loads(line[len("data: ") :])
            return found


async def test_a_user_bound_in_two_namespaces_of_three_sees_the_runs_of_exactly_those_two(
    console: test_utils.TestClient, three_namespaces: list[str]
) -> None:
    first, second, third = three_namespaces
    answer = await console.get("/runs", params={"namespace": ""}, headers=CAROL)
    page = await answer.text()
    assert answer.status == 200, page
    assert f"in the namespaces you may list: {first}, {second}" in page
    assert f'data-key="{first}/run-{first}"' in page
    assert f'data-key="{second}/run-{second}"' in page
    assert third not in page
    assert 'data-live="/events/runs?namespace=&amp;' in page

    stream = await console.get("/events/runs", params={"namespace": ""}, headers=CAROL)
    keys = {(await _event(stream))["row"]["key"] for _ in range(2)}
    stream.close()
    assert keys == {f"{first}/run-{first}", f"{second}/run-{second}"}


async def test_the_inbox_of_a_user_bound_in_two_namespaces_looks_in_those_two(
    console: test_utils.TestClient, three_namespaces: list[str]
) -> None:
    first, second, _ = three_namespaces
    answer = await console.get("/requests", params={"namespace": ""}, headers=CAROL)
    page = await answer.text()
    assert answer.status == 200, page
    assert f"0 pending request(s) in {first}, {second}" in page


async def test_the_flows_page_of_a_user_bound_in_two_namespaces_shows_those_twos_flows(
    console: test_utils.TestClient, three_namespaces: list[str]
) -> None:
    first, second, third = three_namespaces
    answer = await console.get("/flows", params={"namespace": ""}, headers=CAROL)
    page = await answer.text()
    assert answer.status == 200, page
    assert f"2 flow(s) in {first}, {second}" in page
    assert f"<h2>{first}/flow-{first}</h2>" in page and f"<h2>{second}/flow-{second}</h2>" in page
    assert third not in page


async def test_a_forwarded_system_identity_is_refused_where_the_api_server_would_obey_it(
    console: test_utils.TestClient, three_namespaces: list[str]
) -> None:
    # the console's account may impersonate anyone (here: admin), so the API server itself
    # would list the third namespace for system:masters: only the console's refusal stops it
    third = three_namespaces[2]
    masters = {"X-Forwarded-User": "carol", "X-Forwarded-Groups": "staff, system:masters"}
    answer = await console.get("/runs", params={"namespace": third}, headers=masters)
    page = await answer.text()
    assert answer.status == 403, page
    assert "the group 'system:masters', a Kubernetes system identity" in page
    assert f"run-{third}" not in page
    operator = {"X-Forwarded-User": "system:serviceaccount:agentflows-system:agentflows-operator"}
    answer = await console.get("/runs", params={"namespace": third}, headers=operator)
    page = await answer.text()
    assert answer.status == 403, page
    assert "a Kubernetes system" in page and f"run-{third}" not in page
