"""Helpers for cluster tests: the running control plane as tests see it, and polling.

Used by ``conftest.py`` (which builds a :class:`Cluster` in the session fixture) and by the test
modules. The ``hack/`` directory is put on ``sys.path`` here so that ``devcluster`` (the code
behind ``hack/control-plane``) is importable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))

from devcluster import build, controlplane, podfiles  # noqa: E402

KUBECTL = "kubectl"
T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    timeout: float = 120,
    what: str = "condition",
    interval: float = 0.5,
) -> T:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")


@dataclass
class Cluster:
    """The running control plane as tests see it."""

    cp: controlplane.ControlPlane
    _clients: dict[str, client.ApiClient] = field(default_factory=dict)
    #: The CRDs the ``crds`` fixture applied and saw Established (once per cluster).
    crds: list[str] = field(default_factory=list)

    def kubeconfig(self, user: str = "admin") -> Path:
        return self.cp.kubeconfig(user)

    def api(self, user: str = "admin") -> client.ApiClient:
        if user not in self._clients:
            self._clients[user] = config.new_client_from_config(str(self.kubeconfig(user)))
        return self._clients[user]

    def core(self, user: str = "admin") -> client.CoreV1Api:
        return client.CoreV1Api(self.api(user))

    def batch(self, user: str = "admin") -> client.BatchV1Api:
        return client.BatchV1Api(self.api(user))

    def rbac(self) -> client.RbacAuthorizationV1Api:
        return client.RbacAuthorizationV1Api(self.api())

    def kubectl(
        self, *args: str, user: str = "admin", stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [KUBECTL, f"--kubeconfig={self.kubeconfig(user)}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and completed.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed: {completed.stderr}")
        return completed

    def apply(self, manifest: dict[str, Any], user: str = "admin") -> None:
        self.kubectl("apply", "-f", "-", user=user, stdin=json.dumps(manifest))

    def pod(self, namespace: str, name: str) -> client.V1Pod:
        return self.core().read_namespaced_pod(name, namespace)

    def wait_for_pod_phase(
        self, namespace: str, name: str, phases: tuple[str, ...], timeout: float = 120
    ) -> client.V1Pod:
        def reached() -> client.V1Pod | None:
            pod = self.pod(namespace, name)
            return pod if pod.status.phase in phases else None

        return wait_for(reached, timeout, f"pod {namespace}/{name} in {phases}")

    def log_path(self, pod: client.V1Pod, container: str) -> Path:
        meta = pod.metadata
        return podfiles.pod_log_path(
            self.cp.state_dir, meta.namespace, meta.name, meta.uid, container
        )


class Helm:
    """The pinned helm binary (``hack/control-plane build-helm``), talking to a cluster as admin."""

    def __init__(self, cluster: Cluster) -> None:
        self.binary = build.helm_binary()
        self.cluster = cluster

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.cluster.kubeconfig()}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check and done.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done


def python_pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """Return a Pod manifest whose one container runs ``python -c code``."""
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", code]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def adopt_into_helm_release(
    cluster: Cluster, documents: list[dict[str, Any]], release: str, namespace: str
) -> list[str]:
    """Mark the objects of ``documents`` that already exist as the release's, as Helm asks.

    Helm installs nothing it does not own; moving a cluster from ``kubectl apply -k`` to the
    chart means labelling and annotating what kustomize installed (the CRDs, the operator's
    ClusterRole, the admission policies) first — the chart README gives the commands. The
    control plane of the cluster tests is shared, and earlier modules installed config/.
    Returns ``kind/name`` of each object adopted.
    """
    adopted = []
    for doc in documents:
        meta = doc["metadata"]
        where = ["-n", meta["namespace"]] if meta.get("namespace") else []
        group = doc["apiVersion"].rpartition("/")[0]
        kind = f"{doc['kind'].lower()}.{group}" if group else doc["kind"].lower()
        if cluster.kubectl("get", kind, meta["name"], *where, check=False).returncode:
            continue
        target = [kind, meta["name"], *where, "--overwrite"]
        cluster.kubectl("label", *target, "app.kubernetes.io/managed-by=Helm")
        cluster.kubectl(
            "annotate",
            *target,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        )
        adopted.append(f"{doc['kind']}/{meta['name']}")
    return adopted
