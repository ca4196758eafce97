"""Fixtures for tests of the operator on the real control plane.

``operator`` (per module): the CRDs, config/rbac and config/policies applied as they are, and
the operator running as the ``agentflows-system/agentflows-operator`` ServiceAccount, so it has
exactly the permissions config/rbac grants: on the real node the chart's Deployment in a
container (:class:`OperatorPod`), else ``agentflows operator`` as a subprocess with a kubeconfig
that holds a TokenRequest token of that account (:class:`OperatorProcess`). ``flow_namespace``:
a fresh namespace with the runner's ServiceAccount, Role and RoleBinding from
config/rbac/runner. The servers a test starts for its runs listen at :func:`pod_host`. Wire them
in with ``from tests.cluster.operator_fixtures import *``.
"""

from __future__ import annotations

import contextlib
import json
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

from agentflows.api import runner as runner_api
from tests.cluster.harness import KUBECTL, REPO, Cluster, Helm, wait_for
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.tool_board import ToolBoard

from devcluster.ports import free_port  # isort: skip
from devcluster import appimage, node  # isort: skip  (hack/ is on sys.path through the harness)

#: What ``from tests.cluster.operator_fixtures import *`` gives a module: its fixtures and the
#: types and helpers a module names to drive the operator.
__all__ = [
    "FlowRuns",
    "Operator",
    "OperatorPod",
    "OperatorProcess",
    "flow_namespace",
    "operator",
    "pod_model_server",
    "running_operator",
    "runs",
    "tool_board",
]

OPERATOR_NAMESPACE = "agentflows-system"
#: ``checkout``: the ``operator`` fixture runs the operator from the checkout even on the real
#: node (a way to debug it: breakpoints, a changed source without rebuilding the image).
OPERATOR_FROM = "AGENTFLOWS_TEST_OPERATOR"
OPERATOR_ACCOUNT = "agentflows-operator"


class Operator:
    """An operator the tests drive: started, stopped, restarted, read through its metrics server
    (``/readyz``, ``/metrics``) and its log. :class:`OperatorPod` (the chart's Deployment, in a
    container on the real node) and :class:`OperatorProcess` (``agentflows operator`` run from
    the checkout) are the two kinds."""

    def __init__(
        self, log_path: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> None:
        self.log_path = log_path
        self.args = list(args)
        self.env = dict(env or {})

    @property
    def address(self) -> str:
        """``host:port`` of its metrics server (``/metrics``, ``/readyz``, ``/healthz``)."""
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    @property
    def identity(self) -> str:
        """Its name on a Lease."""
        raise NotImplementedError

    def launch(self) -> None:
        """Start it and return at once (:meth:`start` also waits for /readyz)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def check_running(self) -> None:
        """Fail the test, with the log's tail, if it has exited."""
        raise NotImplementedError

    def remove(self) -> None:
        """Stop it for good (the next module starts its own)."""
        self.stop()

    def start(self) -> None:
        self.launch()
        wait_for(self.ready, 120, "the operator's /readyz")

    def restart(self) -> None:
        self.stop()
        self.start()

    def ready(self) -> bool:
        """True once the operator answers /readyz with 200 (its cache holds the first lists)."""
        return self.readyz()[0] == 200

    def readyz(self) -> tuple[int, str]:
        """The status and body of /readyz (0 and "" while nothing listens)."""
        self.check_running()
        try:
            with urllib.request.urlopen(f"http://{self.address}/readyz", timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except OSError:
            return 0, ""

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class OperatorProcess(Operator):
    """``agentflows operator`` (with extra ``args``) as a child process; its log goes to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(log_path, args, env)
        self.kubeconfig = kubeconfig
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def launch(self) -> None:
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

    def check_running(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the operator exited with {self.process.returncode}:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def identity(self) -> str:
        """Its name on the Lease: host and process id (no POD_NAME outside a pod)."""
        assert self.process is not None
        return f"{socket.gethostname()}_{self.process.pid}"


#: The chart's operator Deployment as the tests run it: one replica, no Lease (as
#: :class:`OperatorProcess` runs by default), the chart's defaults otherwise.
OPERATOR_VALUES = ("operator.replicas=1", "operator.leaderElection.enabled=false")


class OperatorPod(Operator):
    """The operator as a platform team runs it: the chart's Deployment (``helm template`` of
    ``charts/agentflows``, :data:`OPERATOR_VALUES`) in a container of the image built from the
    Dockerfile, on the real node, with its ServiceAccount's token mounted by the kubelet and the
    API server reached through the ``kubernetes`` Service.

    Extra ``args`` are appended to the container's command and ``env`` is set in its
    environment. Stopping scales the Deployment to 0 (the pod gets SIGTERM and its grace
    period); starting scales it to 1. The log file gathers every pod's log (``kubectl logs -f``
    of each pod, from its start), so it outlives the pods as the process's log file does.
    """

    def __init__(
        self,
        cluster: Cluster,
        log_path: Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(log_path, args, env)
        self.cluster = cluster
        self.metrics_port = 8080
        self.pod: client.V1Pod | None = None
        self._followers: list[subprocess.Popen[bytes]] = []
        self._followed: set[str] = set()

    def deployment(self) -> dict[str, Any]:
        """The chart's Deployment with this operator's args and env."""
        rendered = Helm(self.cluster)(
            "template", "agentflows", str(REPO / "charts/agentflows"),
            "--namespace", OPERATOR_NAMESPACE,
            "--show-only", "templates/operator-deployment.yaml",
            *(arg for value in OPERATOR_VALUES for arg in ("--set", value)),
        ).stdout  # fmt: skip
        document: dict[str, Any] = yaml.safe_load(rendered)
        container = document["spec"]["template"]["spec"]["containers"][0]
        container["command"] = [*container["command"], *self.args]
        env = [e for e in container.get("env", []) if e["name"] not in self.env]
        container["env"] = [*env, *({"name": k, "value": v} for k, v in self.env.items())]
        return document

    @property
    def name(self) -> str:
        return "agentflows-operator"

    def _scale(self, replicas: int) -> None:
        self.cluster.kubectl(
            "scale", "deployment", self.name, "-n", OPERATOR_NAMESPACE, f"--replicas={replicas}"
        )

    def _pods(self) -> list[client.V1Pod]:
        found = self.cluster.core().list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
        )
        return list(found.items)

    def launch(self) -> None:
        found = self.cluster.kubectl(
            "get", "deployment", self.name, "-n", OPERATOR_NAMESPACE, check=False
        )
        if found.returncode != 0:
            self.cluster.apply(self.deployment())
        else:
            self._scale(1)
        self.pod = None

    def check_running(self) -> None:
        if self.pod is None:  # launched: its pod, once the Deployment has made it
            live = [p for p in self._pods() if p.metadata.deletion_timestamp is None]
            if not live:
                return
            self.pod = live[0]
        pod = self.cluster.core().read_namespaced_pod(self.pod.metadata.name, OPERATOR_NAMESPACE)
        self.pod = pod
        for status in pod.status.container_statuses or []:
            if status.restart_count or status.state.terminated:
                pytest.fail(f"the operator's container ended: {status}\n{self.log_tail()}")
        if pod.status.phase == "Running" and pod.metadata.name not in self._followed:
            self._follow(pod.metadata.name)

    def _follow(self, pod: str) -> None:
        self._followed.add(pod)
        argv = [KUBECTL, f"--kubeconfig={self.cluster.kubeconfig()}", "logs", "-f"]
        with self.log_path.open("ab") as log:
            follower = subprocess.Popen(
                [*argv, "-n", OPERATOR_NAMESPACE, pod],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._followers.append(follower)

    @property
    def address(self) -> str:
        if self.pod is None or not self.pod.status.pod_ip:
            return "0.0.0.0:0"  # nothing listens yet: readyz answers 0
        return f"{self.pod.status.pod_ip}:{self.metrics_port}"

    def stop(self) -> None:
        if self.pod is None:
            return
        self._scale(0)
        wait_for(lambda: not self._pods(), 120, "the operator's pod gone")
        for follower in self._followers:
            try:
                follower.wait(timeout=30)
            except subprocess.TimeoutExpired:
                follower.kill()
        self._followers.clear()
        self.pod = None

    def remove(self) -> None:
        """Stop it and delete its Deployment (the next module applies its own)."""
        self.stop()
        self.cluster.kubectl(
            "delete", "deployment", self.name, "-n", OPERATOR_NAMESPACE, "--ignore-not-found"
        )

    @property
    def alive(self) -> bool:
        if self.pod is None:
            return False
        try:
            pod = self.cluster.core().read_namespaced_pod(
                self.pod.metadata.name, OPERATOR_NAMESPACE
            )
        except client.ApiException:
            return False
        statuses = pod.status.container_statuses or []
        return (
            pod.metadata.deletion_timestamp is None
            and pod.status.phase == "Running"
            and all(s.restart_count == 0 and s.state.running for s in statuses)
        )

    @property
    def identity(self) -> str:
        """Its name on the Lease: the pod's (``POD_NAME``)."""
        assert self.pod is not None
        return str(self.pod.metadata.name)


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


@contextlib.contextmanager
def running_operator(
    cluster: Cluster, directory: Path, env: Mapping[str, str] | None = None
) -> Iterator[Operator]:
    """The operator installed from config/ (:func:`install_operator`) and running with ``env``
    until the block ends: on the real node the chart's Deployment in a container
    (:class:`OperatorPod`); on a process kubelet, or with ``AGENTFLOWS_TEST_OPERATOR=checkout``
    (to debug it), ``agentflows operator`` from the checkout (:class:`OperatorProcess`)."""
    kubeconfig = install_operator(cluster, directory)
    log = directory / "operator.log"
    running: Operator
    if cluster.cp.node == "real" and os.environ.get(OPERATOR_FROM) != "checkout":
        running = OperatorPod(cluster, log, env=env)
    else:
        running = OperatorProcess(kubeconfig, log, env=env)
    running.start()
    try:
        yield running
    finally:
        running.remove()
        print(f"operator log: {running.log_path}")


@pytest.fixture(scope="module")
def operator(
    control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """The operator, installed from config/ and running with its ServiceAccount's token
    (:func:`running_operator`).

    Module-scoped: it watches every namespace, so it must be gone before other modules create
    FlowRuns that they drive by hand (tests/cluster/test_runner.py).
    """
    with running_operator(control_plane, tmp_path_factory.mktemp("operator")) as running:
        yield running


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
def flow_namespace(control_plane: Cluster, namespace: str, operator: Operator) -> str:
    """A namespace that can run flows (:func:`prepare_flow_namespace`), with the operator on.

    On: a test that stops the module's operator and fails before it starts it again leaves it
    stopped, and every later test of the module would wait for a reconcile that never comes.
    """
    if not operator.alive:
        operator.start()
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

        try:
            return wait_for(reached, timeout, f"FlowRun {name} in {phases}")
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{self.describe(name)}")

    def describe(self, name: str) -> str:
        """The run's status and its pods, as a failed wait reports them (CI keeps no cluster)."""
        run = self.get("flowruns", name)
        status = (run or {}).get("status") or {}
        nodes = {n: r.get("phase") for n, r in (status.get("nodes") or {}).items()}
        kept = {k: v for k, v in status.items() if k not in ("nodes", "usage", "output")}
        pods = [
            (p.metadata.name, p.status.phase, p.metadata.deletion_timestamp is not None)
            for p in self.pods(name)
        ]
        return (
            f"FlowRun {self.namespace}/{name}: "
            + ("gone" if run is None else json.dumps(kept, sort_keys=True))
            + f"\nnodes: {nodes}\npods (name, phase, deleting): {pods}"
        )

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
        """A kubeconfig holding a running pod's own (pod-bound) service-account token.

        On the real node the token is read where the kubelet mounted it, with ``kubectl exec``
        as the admin: the test stands for whoever may exec into the pod. The process kubelet
        writes it beside the pod's files.
        """
        if self.cluster.cp.node != "real":
            from devcluster import podfiles

            pod = self.cluster.pod(self.namespace, pod_name)
            directory = podfiles.pod_dir_name(self.namespace, pod_name, pod.metadata.uid)
            return self.cluster.cp.state_dir / "pods" / directory / "kubeconfig"
        token = self.cluster.kubectl(
            "exec", "-n", self.namespace, pod_name, "--",
            "cat", f"{runner_api.SERVICE_ACCOUNT_DIR}/token",
        ).stdout  # fmt: skip
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "cluster", "cluster": {
                    "server": self.cluster.cp.server,
                    "certificate-authority": str(self.cluster.cp.ca_cert),
                }},
            ],
            "users": [{"name": pod_name, "user": {"token": token.strip()}}],
            "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": pod_name}}],
            "current-context": "pod",
        }  # fmt: skip
        path = self.cluster.cp.state_dir / f"pod-{self.namespace}-{pod_name}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


def pod_host(cluster: Cluster) -> str:
    """The address a server of the test listens on so that the run's pods reach it: the node's
    bridge address on the real node (its pods are in containers), else loopback."""
    return node.NODE_IP if cluster.cp.node == "real" else "127.0.0.1"


@pytest.fixture
def pod_model_server(control_plane: Cluster) -> Iterator[ScriptedModelServer]:
    """A scripted model server where the run's pods reach it (:func:`pod_host`)."""
    server = ScriptedModelServer(host=pod_host(control_plane)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tool_board(control_plane: Cluster) -> Iterator[ToolBoard]:
    """Files the test shares with its runs' python tools, where the pods reach them
    (:func:`pod_host`): counts, journals and release marks that outlive the pods. (It asks for
    the control plane: the bridge address exists once the node is up.)"""
    board = ToolBoard(host=pod_host(control_plane)).start()
    try:
        yield board
    finally:
        board.stop()


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
