"""The real node (``hack/control-plane up --node real``): pods in containers, and a clean ``down``.

Each test starts its own control plane with containerd, the kubelet, kube-proxy and kube-scheduler
(:mod:`devcluster.node`) in a private state directory, beside the session's process-kubelet one:
only one real node runs per machine (the pod bridge and kube-proxy's chains are host-wide).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.harness import Cluster, controlplane

from devcluster import images, node  # isort: skip  (hack/ is on sys.path through the harness)

pytestmark = pytest.mark.cluster

_RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _pause_pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": images.PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "securityContext": _RESTRICTED,
                }
            ]
        },
    }


def _run_pod(cluster: Cluster, name: str) -> client.V1Pod:
    cluster.core().create_namespaced_pod("default", _pause_pod(name))
    return cluster.wait_for_pod_phase("default", name, ("Running",), timeout=120)


def _iptables() -> list[str]:
    """Every chain and rule of the host, without counters (a table never loaded reads empty)."""
    lines = []
    for command in ("iptables-save", "ip6tables-save"):
        out = subprocess.run([command], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("-A") or (line.startswith(":") and "-" in line.split()[0]):
                lines.append(f"{command} {line.split(' [')[0]}")
    return sorted(lines)


def _host_snapshot() -> dict[str, object]:
    return {
        "iptables": _iptables(),
        "links": sorted(os.listdir("/sys/class/net")),
        "mounts": sorted(Path("/proc/self/mounts").read_text().splitlines()),
        "netns": sorted(os.listdir("/var/run/netns")) if Path("/var/run/netns").exists() else [],
        "sysctls": {name: Path("/proc/sys", name).read_text() for name in node.SYSCTLS},
        "paths": [path for path in node.HOST_PATHS if Path(path).exists()],
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")),
    }


@pytest.fixture
def real_node() -> Iterator[Cluster]:
    state_dir = controlplane.temporary_state_dir()
    cp = controlplane.start(state_dir, node_kind="real")
    try:
        yield Cluster(cp)
    finally:
        controlplane.stop(state_dir)


def test_real_node_runs_a_restricted_pod_in_a_container_on_the_pod_bridge(
    real_node: Cluster,
) -> None:
    pod = _run_pod(real_node, "restricted")
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node.POD_CIDR)
    [status] = pod.status.container_statuses
    assert status.container_id.startswith("containerd://")
    node_info = real_node.core().read_node(real_node.cp.node_name).status.node_info
    assert node_info.container_runtime_version == "containerd://1.6.20"
    assert node_info.kubelet_version == real_node.cp.versions["kubernetes"]
    # The API server reaches the kubelet with its client certificate (logs, exec, attach).
    assert real_node.kubectl("logs", "restricted").returncode == 0


def test_real_node_pods_reach_the_api_server_through_the_kubernetes_service(
    real_node: Cluster,
) -> None:
    endpoints = json.loads(
        real_node.kubectl("get", "endpointslices", "-n", "default", "-o", "json").stdout
    )
    [kubernetes] = [s for s in endpoints["items"] if s["metadata"]["name"] == "kubernetes"]
    assert [a for e in kubernetes["endpoints"] for a in e["addresses"]] == [node.NODE_IP]
    service = real_node.core().read_namespaced_service("kubernetes", "default")
    assert service.spec.cluster_ip == controlplane.SERVICE_IP


def test_down_leaves_the_host_as_it_was_before_up() -> None:
    before = _host_snapshot()
    state_dir = controlplane.temporary_state_dir()
    try:
        cluster = Cluster(controlplane.start(state_dir, node_kind="real"))
        _run_pod(cluster, "to-clean")
        # The pod left its marks on the host: a network namespace and the kubelet's cgroups.
        during = _host_snapshot()
        assert during["netns"] != before["netns"]
        assert during["cgroups"] != before["cgroups"]
    finally:
        controlplane.stop(state_dir)
    assert _host_snapshot() == before
    assert not state_dir.exists()
