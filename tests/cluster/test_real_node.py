"""The real node (``hack/control-plane up``, its default): pods in containers, and a clean ``down``.

Most tests run on the session's shared real node (the default of tests/cluster/conftest.py).
The one about ``down`` needs a node of its own, started and stopped inside the test: it is marked
``own_real_node``, which the conftest runs before any test asks for the shared node (only one
real node runs per machine: the pod bridge and kube-proxy's chains are host-wide), beside the
process kubelet's control plane if that is up.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.harness import Cluster, controlplane, wait_for

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


def _run_pod(cluster: Cluster, name: str, namespace: str = "default") -> client.V1Pod:
    cluster.core().create_namespaced_pod(namespace, _pause_pod(name))
    return cluster.wait_for_pod_phase(namespace, name, ("Running",), timeout=120)


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


def test_modules_share_one_session_real_node_running_containerd_by_default(
    control_plane: Cluster, real_cluster: Cluster
) -> None:
    assert control_plane is real_cluster
    assert control_plane.cp.node == "real"
    node_info = control_plane.core().read_node(control_plane.cp.node_name).status.node_info
    assert node_info.container_runtime_version == "containerd://1.6.20"
    assert node_info.os_image != "agentflows process kubelet"


def test_real_node_runs_a_restricted_pod_in_a_container_on_the_pod_bridge(
    control_plane: Cluster, namespace: str
) -> None:
    pod = _run_pod(control_plane, "restricted", namespace)
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node.POD_CIDR)
    [status] = pod.status.container_statuses
    assert status.container_id.startswith("containerd://")
    node_info = control_plane.core().read_node(control_plane.cp.node_name).status.node_info
    assert node_info.container_runtime_version == "containerd://1.6.20"
    assert node_info.kubelet_version == control_plane.cp.versions["kubernetes"]
    # The API server reaches the kubelet with its client certificate (logs, exec, attach).
    assert control_plane.kubectl("logs", "restricted", "-n", namespace).returncode == 0


def test_pod_bridge_keeps_its_address_when_pods_come_and_go(
    control_plane: Cluster, namespace: str
) -> None:
    bridge = Path("/sys/class/net", node.BRIDGE)
    # 3: NET_ADDR_SET, an address given by hand, which a bridge keeps whatever its ports
    assert (bridge / "addr_assign_type").read_text().strip() == "3"
    assert (bridge / "address").read_text().strip() == node.BRIDGE_MAC
    # pods' veths join and leave; without a set address the bridge took the lowest of theirs
    for name in ("first", "second"):
        _run_pod(control_plane, name, namespace)
    control_plane.core().delete_namespaced_pod("first", namespace, grace_period_seconds=0)
    wait_for(
        lambda: (
            not control_plane.core()
            .list_namespaced_pod(namespace, field_selector="metadata.name=first")
            .items
        ),
        60,
        "the first pod gone",
    )
    assert (bridge / "address").read_text().strip() == node.BRIDGE_MAC


def test_real_node_pods_reach_the_api_server_through_the_kubernetes_service(
    control_plane: Cluster,
) -> None:
    endpoints = json.loads(
        control_plane.kubectl("get", "endpointslices", "-n", "default", "-o", "json").stdout
    )
    [kubernetes] = [s for s in endpoints["items"] if s["metadata"]["name"] == "kubernetes"]
    assert [a for e in kubernetes["endpoints"] for a in e["addresses"]] == [node.NODE_IP]
    service = control_plane.core().read_namespaced_service("kubernetes", "default")
    assert service.spec.cluster_ip == controlplane.SERVICE_IP


@pytest.mark.own_real_node
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


@pytest.mark.own_real_node
def test_a_real_node_whose_holder_died_is_stopped_by_the_next_start_and_a_held_one_is_named() -> (
    None
):
    before = _host_snapshot()
    exited = subprocess.Popen(["true"])
    exited.wait()
    orphan_dir, next_dir, third_dir = (controlplane.temporary_state_dir() for _ in range(3))
    try:
        # A test session that died (SIGKILL, a lost machine) leaves its node running.
        orphan = Cluster(controlplane.start(orphan_dir, node_kind="real", held_by=exited.pid))
        _run_pod(orphan, "orphaned")
        assert node.recorded_owner() == orphan_dir.resolve()
        nxt = Cluster(controlplane.start(next_dir, node_kind="real"))
        assert not orphan_dir.exists()
        assert not any(state == orphan_dir.resolve() for _, state in node.running_node_processes())
        _run_pod(nxt, "after-the-orphan")
        # A node nobody orphaned (``up``, or a session still running) is another's: named.
        with pytest.raises(controlplane.ControlPlaneError) as refused:
            controlplane.start(third_dir, node_kind="real")
        assert f"state directory {next_dir.resolve()}" in str(refused.value)
        assert f"hack/control-plane down --state-dir {next_dir.resolve()}" in str(refused.value)
        assert (
            nxt.core().read_namespaced_pod("after-the-orphan", "default").status.phase == "Running"
        )
    finally:
        for state_dir in (third_dir, next_dir, orphan_dir):
            controlplane.stop(state_dir)
    assert _host_snapshot() == before
    assert node.recorded_owner() is None
