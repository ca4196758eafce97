"""Fixtures for cluster tests: a real control plane started by the same code as hack/control-plane.

The session fixture :func:`control_plane` starts etcd, kube-apiserver, kube-controller-manager and
the process kubelet in a private temporary directory (building or finding the cached binaries
first), and stops everything at the end of the session. If the control plane cannot start, the
fixture fails: cluster tests never skip. The ``namespace`` fixture gives each test a fresh
namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.cluster.harness import Cluster, controlplane, wait_for


@pytest.fixture(scope="session")
def control_plane() -> Iterator[Cluster]:
    state_dir = controlplane.temporary_state_dir()
    cp = controlplane.start(state_dir)
    try:
        yield Cluster(cp)
    finally:
        controlplane.stop(state_dir)


@pytest.fixture
def namespace(control_plane: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.core().create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: _default_service_account(control_plane, name),
        60,
        f"default service account in {name}",
    )
    yield name
    control_plane.core().delete_namespace(name)


def _default_service_account(cluster: Cluster, namespace: str) -> bool:
    try:
        cluster.core().read_namespaced_service_account("default", namespace)
    except client.ApiException:
        return False
    return True
