"""Fixtures for tests of the operator on the real control plane.

``operator`` (per module): the CRDs, config/rbac and config/policies applied as they are, and
``agentflows operator`` running as a subprocess with a kubeconfig that holds a TokenRequest token
of the ``agentflows-system/agentflows-operator`` ServiceAccount, so it has exactly the
permissions config/rbac grants. ``flow_namespace``: a fresh namespace with the runner's
ServiceAccount, Role and RoleBinding from config/rbac/runner. Wire them in with
``from tests.cluster.operator_fixtures import *``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.support.model_server import Reply, ScriptedModelServer

from devcluster import appimage, node  # isort: skip  (hack/ is on sys.path through the harness)

__all__ = ["FlowRuns", "OperatorProcess", "flow_namespace", "operator", "pod_model_server", "runs"]

OPERATOR_NAMESPACE = "agentflows-system"
OPERATOR_ACCOUNT = "agentflows-operator"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OperatorProcess:
    """``agentflows operator`` (with extra ``args``) as a child process; its log goes to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.args = list(args)
        self.env = dict(env or {})
        self.metrics_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.launch()
        wait_for(self.ready, 60, "the operator's /readyz")

    def launch(self) -> None:
        """Start the process and return at once (:meth:`start` also waits for /readyz)."""
        # The image a real node has (the process kubelet ignores images).
        image = f"agentflows:{appimage.app_version()}"
        env = {**os.environ, "AGENTFLOWS_RUNNER_IMAGE": image, **self.env}
        env.pop("KUBECONFIG", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agentflows.cli.main",
                    "operator",
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--metrics-port",
                    str(self.metrics_port),
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def ready(self) -> bool:
        """True once the operator answers /readyz with 200 (its cache holds the first lists)."""
        return self.readyz()[0] == 200

    def readyz(self) -> tuple[int, str]:
        """The status and body of /readyz (0 and "" while nothing listens)."""
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the operator exited with {self.process.returncode}:\n{self.log_tail()}")
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except OSError:
            return 0, ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def identity(self) -> str:
        """Its name on the Lease: host and process id (no POD_NAME outside a pod)."""
        assert self.process is not None
        return f"{socket.gethostname()}_{self.process.pid}"

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text: str = response.read().decode()
            return text

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _apply_dir(cluster: Cluster, directory: str) -> None:
    cluster.kubectl("apply", "-k", str(REPO / directory))


def _crds_established(cluster: Cluster) -> bool:
    api = client.ApiextensionsV1Api(cluster.api())
    for name in (
        "agents.agentflows.io",
        "flows.agentflows.io",
        "flowruns.agentflows.io",
        "agentsessions.agentflows.io",
        "budgets.agentflows.io",
    ):
        crd = api.read_custom_resource_definition(name)
        if not any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        ):
            return False
    return True


def _operator_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig with a TokenRequest token of the operator's ServiceAccount."""
    token = cluster.core().create_namespaced_service_account_token(
        OPERATOR_ACCOUNT,
        OPERATOR_NAMESPACE,
        {"spec": {"expirationSeconds": 86400}},
    )
    admin = yaml.safe_load(cluster.kubeconfig().read_text())
    entry = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [{"name": OPERATOR_ACCOUNT, "user": {"token": token.status.token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": entry["name"], "user": OPERATOR_ACCOUNT}}
        ],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def install_operator(cluster: Cluster, directory: Path) -> Path:
    """CRDs, config/rbac and config/policies as they ship; a kubeconfig of the operator's account."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    wait_for(lambda: _crds_established(cluster), 60, "agentflows CRDs Established")
    cluster.kubectl("apply", "-f", str(REPO / "config/manager/namespace.yaml"))
    _apply_dir(cluster, "config/rbac")
    _apply_dir(cluster, "config/policies")
    return _operator_kubeconfig(cluster, directory / "kubeconfig")


@pytest.fixture(scope="module")
def operator(
    control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator, installed from config/ and running with its ServiceAccount's token.

    Module-scoped: it watches every namespace, so it must be gone before other modules create
    FlowRuns that they drive by hand (tests/cluster/test_runner.py).
    """
    directory = tmp_path_factory.mktemp("operator")
    kubeconfig = install_operator(control_plane, directory)
    process = OperatorProcess(kubeconfig, directory / "operator.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()
        print(f"operator log: {process.log_path}")


def prepare_flow_namespace(cluster: Cluster, namespace: str) -> None:
    """Let ``namespace`` run flows: the runner account from config/rbac/runner.

    The API server enforces the restricted Pod Security Standard there, so every runner pod
    the operator creates is checked against it for real.
    """
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    directory = REPO / "config/rbac/runner"
    for name in ("service_account.yaml", "role.yaml", "role_binding.yaml"):
        document = yaml.safe_load((directory / name).read_text())
        document["metadata"]["namespace"] = namespace
        for subject in document.get("subjects", []):
            subject["namespace"] = namespace
        cluster.apply(document)


@pytest.fixture
def flow_namespace(control_plane: Cluster, namespace: str, operator: OperatorProcess) -> str:
    """A namespace that can run flows (:func:`prepare_flow_namespace`), with the operator on."""
    prepare_flow_namespace(control_plane, namespace)
    return namespace


class FlowRuns:
    """Reading and waiting on the agentflows resources of one namespace (admin's view)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(cluster.api())

    def apply(self, *documents: dict[str, Any]) -> None:
        for document in documents:
            document.setdefault("apiVersion", "agentflows.io/v1alpha1")
            document["metadata"]["namespace"] = self.namespace
            self.cluster.apply(document)

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                "agentflows.io", "v1alpha1", self.namespace, plural, name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def run(self, name: str) -> dict[str, Any]:
        obj = self.get("flowruns", name)
        assert obj is not None, f"FlowRun {name} is gone"
        return obj

    def status(self, name: str) -> dict[str, Any]:
        return self.run(name).get("status") or {}

    def wait_phase(self, name: str, *phases: str, timeout: float = 180) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") in phases else None

        return wait_for(reached, timeout, f"FlowRun {name} in {phases}")

    def wait_node(self, name: str, node: str, phase: str, timeout: float = 180) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            found = (status.get("nodes") or {}).get(node) or {}
            return status if found.get("phase") == phase else None

        return wait_for(reached, timeout, f"node {node} of {name} {phase}")

    def condition(self, plural: str, name: str, kind: str) -> dict[str, Any] | None:
        obj = self.get(plural, name) or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == kind), None)

    def pods(self, run: str) -> list[client.V1Pod]:
        pods = self.cluster.core().list_namespaced_pod(
            self.namespace, label_selector=f"agentflows.io/run={run}"
        )
        return sorted(pods.items, key=lambda p: p.metadata.name)

    def events(self, name: str) -> list[client.CoreV1Event]:
        found = self.cluster.core().list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return list(found.items)

    def pod_kubeconfig(self, pod_name: str) -> Path:
        """The kubeconfig (pod-bound token) the process kubelet wrote for a running pod."""
        from devcluster import podfiles

        pod = self.cluster.pod(self.namespace, pod_name)
        directory = podfiles.pod_dir_name(self.namespace, pod_name, pod.metadata.uid)
        return self.cluster.cp.state_dir / "pods" / directory / "kubeconfig"


@pytest.fixture
def pod_model_server(
    request: pytest.FixtureRequest, control_plane: Cluster
) -> Iterator[ScriptedModelServer]:
    """A scripted model server where the run's pods reach it: the node's bridge address for a
    module on the real node (``NODE = "real"``: its pods are in containers), else loopback."""
    real = getattr(request.module, "NODE", "process") == "real"
    server = ScriptedModelServer(host=node.NODE_IP if real else "127.0.0.1").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def runs(control_plane: Cluster, flow_namespace: str) -> FlowRuns:
    """The agentflows resources of the test's flow namespace."""
    return FlowRuns(control_plane, flow_namespace)


def python_tool(script: str, args: Any, *, timeout: float = 120) -> dict[str, Any]:
    """An inline python tool call (a node's ``tool``)."""
    return {"python": {"script": script, "timeoutSeconds": timeout}, "args": args}


#: The answer the scripted model streams in :func:`start_told`'s runs, piece by piece.
PIECES = ["Restart ", "the ", "api pod ", "after ", "draining ", "its ", "node."]


def start_told(runs: FlowRuns, server: ScriptedModelServer, run: str, gap: float = 0.0) -> None:
    """Start ``run`` of a Flow ``told``: one agent node, ``answer``, on the scripted ``server``.

    The server streams :data:`PIECES` and holds after the third (``server.holding``) until
    ``server.release()``, so a test sees what a reader showed while the answer was written;
    ``gap`` seconds pass between two pieces.
    """
    model = {"name": "openai/scripted-model", "apiBase": server.url, "retries": 0}
    runs.apply(
        {"kind": "Agent", "metadata": {"name": "oncall"},
         "spec": {"model": model, "systemPrompt": "You advise the on-call engineer."}},
        {"kind": "Flow", "metadata": {"name": "told"},
         "spec": {"nodes": [{"id": "answer", "agent": {"name": "oncall", "prompt": "What now?"}}],
                  "output": "=.nodes.answer.text"}},
    )  # fmt: skip
    wait_for(
        lambda: (c := runs.condition("flows", "told", "Ready")) and c["status"] == "True",
        60,
        "Flow told Ready",
    )
    server.script(Reply.text("".join(PIECES), pieces=PIECES, hold_after=3, gap=gap))
    runs.apply({"kind": "FlowRun", "metadata": {"name": run}, "spec": {"flow": "told"}})
