"""Fixtures and helpers for tests of ``agentflows.kube`` and the runner on the real control plane.

Test modules import the fixtures they use by name (``from tests.cluster.kube_fixtures import
crds, kube, kube_namespace``). Built on the ``control_plane`` session fixture of ``conftest.py``:

- ``crds``: the project's CRDs applied once per session cluster and Established;
- ``kube_namespace``: one namespace per test module (FlowRuns get unique names in it);
- ``kube``: an :class:`agentflows.kube.client.Client` with the admin kubeconfig, per test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from agentflows.kube import client as kube_client
from tests.cluster.harness import REPO, Cluster, wait_for


def _established(cluster: Cluster, name: str) -> bool:
    crd = client.ApiextensionsV1Api(cluster.api()).read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


@pytest.fixture(scope="module")
def crds(control_plane: Cluster) -> list[str]:
    """Apply crds/*.yaml and wait until every CRD is Established; return their names.

    Once per session cluster (the process kubelet's and the real node's are two).
    """
    if control_plane.crds:
        return control_plane.crds
    names = []
    for path in sorted((REPO / "crds").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names += [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d]
    for name in names:
        wait_for(lambda name=name: _established(control_plane, name), 60, f"{name} Established")
    control_plane.crds = names
    return names


@pytest.fixture(scope="module")
def kube_namespace(control_plane: Cluster) -> Iterator[str]:
    """A namespace for one test module, deleted afterwards."""
    name = f"k-{uuid.uuid4().hex[:10]}"
    control_plane.core().create_namespace({"metadata": {"name": name}})
    yield name
    control_plane.core().delete_namespace(name)


@pytest.fixture
async def kube(control_plane: Cluster, crds: list[str]) -> AsyncIterator[kube_client.Client]:
    """The project's own API client, as admin."""
    async with kube_client.Client.from_env(
        str(control_plane.kubeconfig()), retry_seconds=30
    ) as api:
        yield api


def unique(prefix: str) -> str:
    """A unique object name."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def create_flowrun(
    api: kube_client.Client,
    namespace: str,
    name: str,
    *,
    flow: str = "flow",
    input_value: Any = None,
    trigger: Any = None,
) -> dict[str, Any]:
    """Create a FlowRun (no Flow object needed) and return it as stored."""
    spec: dict[str, Any] = {"flow": flow}
    if input_value is not None:
        spec["input"] = input_value
    if trigger is not None:
        spec["trigger"] = trigger
    body = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    created: dict[str, Any] = await api.create(kube_client.path_of("flowruns", namespace), body)
    return created


async def patch_status(
    api: kube_client.Client, namespace: str, name: str, status: dict[str, Any]
) -> dict[str, Any]:
    """Merge-patch a FlowRun's status, as the operator or a human does."""
    path = kube_client.path_of("flowruns", namespace, name, sub="status")
    patched: dict[str, Any] = await api.merge_patch(path, {"status": status})
    return patched


async def get_flowrun(api: kube_client.Client, namespace: str, name: str) -> dict[str, Any]:
    """Read a FlowRun."""
    obj: dict[str, Any] = await api.get(kube_client.path_of("flowruns", namespace, name))
    return obj


def grant(
    cluster: Cluster, namespace: str, role: str, users: Iterable[str], rules: list[dict[str, Any]]
) -> None:
    """A Role ``role`` of ``rules`` in ``namespace``, bound to ``users``."""
    rbac = "rbac.authorization.k8s.io"
    meta = {"name": role, "namespace": namespace}
    cluster.apply({"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta, "rules": rules})
    subjects = [{"apiGroup": rbac, "kind": "User", "name": user} for user in users]
    cluster.apply(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": role},
            "subjects": subjects,
        }
    )


def grant_deciders(cluster: Cluster, namespace: str) -> None:
    """Let alice and bob patch FlowRun status in ``namespace`` (what an approver role grants)."""
    rules = [
        {
            "apiGroups": ["agentflows.io"],
            "resources": ["flowruns/status"],
            "verbs": ["get", "patch"],
        }
    ]
    grant(cluster, namespace, "deciders", ("alice", "bob"), rules)
