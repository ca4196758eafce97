"""Fixtures for cluster tests: real control planes started by the same code as hack/control-plane.

Two session clusters, each started on first use and stopped at the end of the session:

- :func:`process_cluster`: etcd, kube-apiserver, kube-controller-manager and the process kubelet
  (:mod:`devcluster.kubelet`), in a private temporary directory;
- :func:`real_cluster`: the same control plane with a real node (containerd, runc, CNI, kubelet,
  kube-proxy, kube-scheduler: :mod:`devcluster.node`), with ``agentflows:<appVersion>`` built
  from the ``Dockerfile`` and imported into its containerd (:func:`devcluster.appimage.load_into_node`).
  Only one real node runs on a machine, so every module that wants one shares this one.

Every module runs on the real node unless it says ``NODE = "process"`` at module level (only
the process kubelet's own tests do: ``hack/control-plane up --node process`` is for machines
without a container runtime); the module-scoped :func:`control_plane` hands it that cluster, so ``namespace``,
``crds``, the operator fixtures and everything else built on ``control_plane`` work on either.
The terminal summary says which node kind each module used and, for the real node, the RSS of
its own processes and the p50 of the kubelet's pod start latency (its
``kubelet_pod_start_sli_duration_seconds`` histogram, so a bucket bound).

A test that starts a real node of its own (``@pytest.mark.own_real_node``: the node's own
lifecycle, as ``down`` leaving the host clean) cannot run while the shared one is up — the pod
bridge and kube-proxy's chains are host-wide — so :func:`pytest_collection_modifyitems` runs
those first, before any module has asked for the shared node.

If a control plane cannot start, the fixture fails: cluster tests never skip. The ``namespace``
fixture gives each test a fresh namespace.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.harness import Cluster, controlplane, wait_for

from devcluster import appimage  # isort: skip  (hack/ is on sys.path through the harness)

# module name -> node kind, as the modules of this session asked (the terminal summary's lines)
_NODE_OF_MODULE: dict[str, str] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that start a real node of their own before any test of the shared one."""
    items.sort(key=lambda item: item.get_closest_marker("own_real_node") is None)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which node each module's tests ran on (a process kubelet or the real node)."""
    if not _NODE_OF_MODULE:
        return
    terminalreporter.section("cluster nodes")
    for kind in controlplane.NODE_KINDS:
        modules = sorted(m for m, k in _NODE_OF_MODULE.items() if k == kind)
        if modules:
            terminalreporter.write_line(
                f"{kind} node: {len(modules)} modules: {', '.join(modules)}"
            )
    for line in _REAL_NODE_FIGURES:
        terminalreporter.write_line(f"real node: {line}")


# what the shared real node measured of itself before it stopped (the terminal summary's lines)
_REAL_NODE_FIGURES: list[str] = []
_NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy", "kube-scheduler")
_POD_START = "kubelet_pod_start_sli_duration_seconds"


def _real_node_figures(cluster: Cluster) -> list[str]:
    """The node's own processes' memory, and the p50 bucket of the kubelet's pod start latency."""
    rss_kib = 0
    for name in _NODE_PROCESSES:
        with contextlib.suppress(OSError, KeyError, StopIteration):
            status = Path(f"/proc/{cluster.cp.pids[name]}/status").read_text()
            rss_kib += next(int(line.split()[1]) for line in status.splitlines() if "VmRSS" in line)
    figures = [f"RSS of {' + '.join(_NODE_PROCESSES)}: {rss_kib // 1024} MiB"]
    metrics = cluster.kubectl(
        "get", "--raw", f"/api/v1/nodes/{cluster.cp.node_name}/proxy/metrics", check=False
    ).stdout
    buckets = []
    for line in metrics.splitlines():
        if line.startswith(f"{_POD_START}_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
    if buckets and buckets[-1][1]:
        total = buckets[-1][1]
        p50 = next(bound for bound, count in buckets if count >= total / 2)
        figures.append(
            f"pod start (created to running, kubelet SLI): p50 <= {p50:g} s, {total:g} pods"
        )
    return figures


def _session_cluster(node_kind: str) -> Iterator[Cluster]:
    state_dir = controlplane.temporary_state_dir()
    cluster = Cluster(controlplane.start(state_dir, node_kind=node_kind, held_by=os.getpid()))
    try:
        if node_kind == "real":
            appimage.load_into_node(state_dir)
        yield cluster
        if node_kind == "real":
            _REAL_NODE_FIGURES.extend(_real_node_figures(cluster))
    finally:
        controlplane.stop(state_dir)


@pytest.fixture(scope="session")
def process_cluster() -> Iterator[Cluster]:
    """The control plane with the process kubelet (pods' commands run as host processes)."""
    yield from _session_cluster("process")


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[Cluster]:
    """The control plane with the real node and the agentflows image in its containerd."""
    yield from _session_cluster("real")


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Cluster:
    """The session cluster this module's ``NODE`` names (``"real"`` unless it says ``"process"``)."""
    kind = getattr(request.module, "NODE", "real")
    if kind not in controlplane.NODE_KINDS:
        pytest.fail(f"{request.module.__name__}.NODE must be one of {controlplane.NODE_KINDS}")
    cluster: Cluster = request.getfixturevalue(f"{kind}_cluster")
    _NODE_OF_MODULE[request.module.__name__.rpartition(".")[2]] = kind
    return cluster


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
