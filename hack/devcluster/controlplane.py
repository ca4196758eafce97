"""Start, wait for, inspect and stop the development control plane.

Called by ``hack/control-plane`` (``up``/``down``/``status``/``env``) and by the session fixture in
``tests/cluster/conftest.py``. :func:`start` runs, each in its own process group with a pid file
and a log in the state directory: etcd (loopback, data under the state directory, no fsync),
kube-apiserver (TLS on 127.0.0.1, static-token users, Node+RBAC authorization, service-account
token issuing), kube-controller-manager (every default controller, per-controller service-account
credentials) and, by default, a real node: containerd, the kubelet, kube-proxy and
kube-scheduler, with the API server on the pod bridge (:mod:`devcluster.node`; one per machine).
``start(node_kind="process")`` (``hack/control-plane up --node process``) runs the process
kubelet instead (:mod:`devcluster.kubelet`: pods' commands as local processes), for a machine
without a container runtime and for benchmarks that measure the operator, not the node. Every
port is picked free at start, so several control planes with a process kubelet coexist.
:func:`stop` ends all of it, including the pods, removes the state directory and, for a real
node, restores the host.

The static users, all with token authentication:

- ``admin`` in ``system:masters`` (also the kubelet's identity, so the Node authorizer is not
  exercised by the process kubelet);
- ``alice`` in ``editors``, ``bob`` in ``viewers`` and ``mallory`` in no group, with no RBAC
  bindings: tests grant them what they need.

Each user has ``<state>/<user>.kubeconfig``; ``admin.kubeconfig`` is the default.

``start(audit=True)`` (``hack/control-plane up --audit-log``; bench/operator_scale.py) also
writes an audit log, ``<state>/logs/audit.log``: one JSON line per request stage at the
Metadata level (who, verb, resource, status; never a body), without health probes, the Node and
controller Lease renewals and the controllers' watches. Off by default: the log is written
synchronously on every request, which the test suite does not need to pay.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devcluster import build, images, node, pki
from devcluster.ports import free_port

DEFAULT_STATE_DIR = Path(os.environ.get("AGENTFLOWS_CP_DIR", "/tmp/agentflows-cp"))
NODE_NAME = "agentflows-dev"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
ISSUER = "https://kubernetes.default.svc.cluster.local"

# name -> groups; every user authenticates with a bearer token from the static token file.
USERS: dict[str, tuple[str, ...]] = {
    "admin": ("system:masters",),
    "alice": ("editors",),
    "bob": ("viewers",),
    "mallory": (),
}
_CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
# The real node's identities (static tokens): the kubelet's lets the Node authorizer and the
# NodeRestriction admission plugin bound it; the other two have the bootstrap RBAC bindings.
_NODE_USERS: dict[str, tuple[str, ...]] = {
    f"system:node:{NODE_NAME}": ("system:nodes",),
    "system:kube-proxy": (),
    "system:kube-scheduler": (),
}
# Order of shutdown: the scheduler and kubelet first (the kubelet stops the pods' processes; the
# real node's sandboxes are removed through containerd right after it), etcd last.
_PROCESS_ORDER = (
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "containerd",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)
# What each process's command line holds (guards against a recycled pid).
_EXPECTED_COMMAND = {
    "etcd": "etcd",
    "kube-apiserver": "kube-apiserver",
    "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "kubelet": "kubelet",
    "kube-proxy": "kube-proxy",
    "containerd": "containerd",
}
NODE_KINDS = ("process", "real")
_HACK_DIR = Path(__file__).resolve().parent.parent
# The audit policy of ``start(audit=True)``: rules are matched in order, the first one wins.
_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "nonResourceURLs": ["/healthz*", "/livez*", "/readyz*", "/version", "/metrics"],
        },
        # The process kubelet's Node heartbeat and the controllers' Leases.
        {
            "level": "None",
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            "namespaces": ["kube-node-lease", "kube-system"],
        },
        # The controller-manager's informers: dozens of watches, re-opened every few minutes.
        {
            "level": "None",
            "verbs": ["watch"],
            "userGroups": ["system:serviceaccounts:kube-system"],
        },
        {"level": "None", "users": [_CONTROLLER_MANAGER_USER], "verbs": ["watch"]},
        # The API server's own loopback client (bootstrap objects, its informers).
        {"level": "None", "users": ["system:apiserver"]},
        {"level": "Metadata"},
    ],
}


class ControlPlaneError(RuntimeError):
    """The control plane did not come up; the message carries the failing process's log tail."""


@dataclass
class ControlPlane:
    """A running control plane, as recorded in ``<state_dir>/state.json``."""

    state_dir: Path
    server: str
    ca_cert: Path
    tokens: dict[str, str]
    ports: dict[str, int]
    pids: dict[str, int] = field(default_factory=dict)
    node_name: str = NODE_NAME
    versions: dict[str, str] = field(default_factory=dict)
    # "process": the process kubelet runs containers as host processes; "real": containerd,
    # the kubelet, kube-proxy and kube-scheduler (:mod:`devcluster.node`).
    node: str = "process"
    # The process that stops this control plane when it ends (a test session), if one does: a
    # real node whose holder is gone was orphaned, and the next start on this host removes it.
    held_by: int | None = None

    def kubeconfig(self, user: str = "admin") -> Path:
        """Return the kubeconfig path of one of :data:`USERS`."""
        return self.state_dir / f"{user}.kubeconfig"

    def pods_dir(self) -> Path:
        """Return the directory under which the kubelet keeps each pod's files and logs."""
        return self.state_dir / "pods"

    def save(self) -> None:
        """Write ``state.json`` so that ``status``/``down`` from another process find everything."""
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        data["ca_cert"] = str(self.ca_cert)
        path = self.state_dir / "state.json"
        path.write_text(json.dumps(data, indent=2))
        path.chmod(0o600)

    @classmethod
    def load(cls, state_dir: Path) -> ControlPlane:
        """Read ``state.json`` from ``state_dir``; raise FileNotFoundError if none is there."""
        data = json.loads((state_dir / "state.json").read_text())
        data["state_dir"] = Path(data["state_dir"])
        data["ca_cert"] = Path(data["ca_cert"])
        return cls(**data)


def _write_kubeconfig(path: Path, server: str, ca_cert: Path, user: str, token: str) -> None:
    # JSON is valid YAML, and keeps this module free of a YAML dependency.
    context = "agentflows-dev" if user == "admin" else f"agentflows-dev-{user}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "agentflows-dev",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": context,
                "context": {"cluster": "agentflows-dev", "user": user, "namespace": "default"},
            }
        ],
        "current-context": context,
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


def _spawn(cp: ControlPlane, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    log = (cp.state_dir / "logs" / f"{name}.log").open("ab")
    with log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cp.state_dir,
        )
    cp.pids[name] = process.pid
    (cp.state_dir / "run" / f"{name}.pid").write_text(f"{process.pid}\n")
    cp.save()


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        # Reap our own child if it already exited, so a zombie does not look alive.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        # Field 3 of /proc/<pid>/stat is the state; a zombie (Z) has exited already.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _log_tail(cp: ControlPlane, name: str, lines: int = 30) -> str:
    path = cp.state_dir / "logs" / f"{name}.log"
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _ssl_context(ca_cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_cert))


def api_get(
    cp: ControlPlane, path: str, user: str = "admin", timeout: float = 5
) -> tuple[int, str]:
    """GET ``path`` from the apiserver as ``user``; return (HTTP status, body)."""
    request = urllib.request.Request(
        cp.server + path, headers={"Authorization": f"Bearer {cp.tokens[user]}"}
    )
    try:
        with urllib.request.urlopen(
            request, context=_ssl_context(cp.ca_cert), timeout=timeout
        ) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def _wait(
    cp: ControlPlane,
    what: str,
    names: tuple[str, ...],
    check: Callable[[], bool],
    deadline: float,
) -> None:
    """Poll ``check()`` until true; fail early if one of ``names`` died, or at ``deadline``."""
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return
        for name in names:
            if not _alive(cp.pids[name]):
                raise ControlPlaneError(
                    f"{name} exited while waiting for {what}; log tail:\n{_log_tail(cp, name)}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n}:\n{_log_tail(cp, n)}" for n in names)
            raise ControlPlaneError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.5)


def _etcd_healthy(cp: ControlPlane) -> bool:
    url = f"http://127.0.0.1:{cp.ports['etcd']}/health"
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(json.loads(response.read()).get("health") == "true")


def _node_ready(cp: ControlPlane) -> bool:
    status, body = api_get(cp, f"/api/v1/nodes/{cp.node_name}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _controllers_working(cp: ControlPlane) -> bool:
    # The serviceaccount and root-ca-cert-publisher controllers have each done their first job.
    account, _ = api_get(cp, "/api/v1/namespaces/default/serviceaccounts/default")
    root_ca, _ = api_get(cp, "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
    return account == 200 and root_ca == 200


def _start_etcd(cp: ControlPlane, binaries: build.Binaries) -> None:
    client = f"http://127.0.0.1:{cp.ports['etcd']}"
    peer = f"http://127.0.0.1:{cp.ports['etcd-peer']}"
    _spawn(
        cp,
        "etcd",
        [
            str(binaries.etcd),
            "--name=dev",
            f"--data-dir={cp.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=dev={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )


def audit_log(state_dir: Path) -> Path:
    """Return where the API server of ``start(state_dir, audit=True)`` writes its audit log."""
    return state_dir / "logs" / "audit.log"


def _audit_flags(state_dir: Path) -> list[str]:
    policy = state_dir / "audit-policy.json"
    policy.write_text(json.dumps(_AUDIT_POLICY, indent=2))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log(state_dir)}",
        "--audit-log-format=json",
        # blocking: a request's line is written before it completes, so a reader right after a
        # response sees it (batching would delay lines by seconds)
        "--audit-log-mode=blocking",
    ]


def _apiserver_network_flags(cp: ControlPlane, keys: pki.Pki) -> list[str]:
    if cp.node != "real":
        return [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The only "node" address is 127.0.0.1, which the endpoints of the kubernetes Service
            # may not hold; nothing in the process kubelet's cluster routes through that Service.
            "--endpoint-reconciler-type=none",
        ]
    # Pods reach the API server on the bridge, directly and through the kubernetes Service
    # (whose Endpoints the lease reconciler keeps); the kubelet takes its client certificate.
    return [
        f"--bind-address={node.NODE_IP}",
        f"--advertise-address={node.NODE_IP}",
        "--endpoint-reconciler-type=lease",
        f"--kubelet-client-certificate={keys.ca_cert.parent / 'kubelet-client.crt'}",
        f"--kubelet-client-key={keys.ca_cert.parent / 'kubelet-client.key'}",
    ]


def _start_apiserver(
    cp: ControlPlane, binaries: build.Binaries, keys: pki.Pki, audit: bool
) -> None:
    _spawn(
        cp,
        "kube-apiserver",
        [
            str(binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{cp.ports['etcd']}",
            *_apiserver_network_flags(cp, keys),
            f"--secure-port={cp.ports['kube-apiserver']}",
            f"--tls-cert-file={keys.apiserver_cert}",
            f"--tls-private-key-file={keys.apiserver_key}",
            f"--client-ca-file={keys.ca_cert}",
            f"--token-auth-file={cp.state_dir / 'tokens.csv'}",
            f"--service-account-issuer={ISSUER}",
            f"--api-audiences={ISSUER}",
            f"--service-account-key-file={keys.service_account_pub}",
            f"--service-account-signing-key-file={keys.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,"
            "DefaultTolerationSeconds,NodeRestriction,PodSecurity,Priority,ResourceQuota,"
            "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
            "--allow-privileged=true",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--profiling=false",
            *(_audit_flags(cp.state_dir) if audit else []),
        ],
    )


def _start_controller_manager(cp: ControlPlane, binaries: build.Binaries, keys: pki.Pki) -> None:
    _spawn(
        cp,
        "kube-controller-manager",
        [
            str(binaries.kube_controller_manager),
            f"--kubeconfig={cp.state_dir / 'controller-manager.kubeconfig'}",
            "--controllers=*",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={keys.service_account_key}",
            f"--root-ca-file={keys.ca_cert}",
            f"--cluster-signing-cert-file={keys.ca_cert}",
            f"--cluster-signing-key-file={keys.ca_key}",
            "--bind-address=127.0.0.1",
            f"--secure-port={cp.ports['kube-controller-manager']}",
            "--profiling=false",
        ],
    )


def _start_kubelet(cp: ControlPlane, keys: pki.Pki) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_HACK_DIR), env.get("PYTHONPATH")]))
    # Pods run the working tree's Python: put this interpreter's bin directory first on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    _spawn(
        cp,
        "kubelet",
        [
            sys.executable,
            "-m",
            "devcluster.kubelet",
            f"--kubeconfig={cp.kubeconfig('admin')}",
            f"--state-dir={cp.state_dir}",
            f"--node-name={cp.node_name}",
            f"--port={cp.ports['kubelet']}",
            f"--tls-cert={keys.kubelet_cert}",
            f"--tls-key={keys.kubelet_key}",
        ],
        env=env,
    )


_REAL_NODE_PORTS = (
    "kubelet-healthz",
    "kube-proxy-healthz",
    "kube-proxy-metrics",
    "kube-scheduler",
)


def _prepare(state_dir: Path, node_kind: str, held_by: int | None) -> tuple[ControlPlane, pki.Pki]:
    if (state_dir / "state.json").exists():
        raise ControlPlaneError(
            f"a control plane is already recorded in {state_dir}; run `hack/control-plane down`"
        )
    if node_kind not in NODE_KINDS:
        raise ControlPlaneError(f"node must be one of {', '.join(NODE_KINDS)}, not {node_kind!r}")
    for sub in ("logs", "run", "pods"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    real = node_kind == "real"
    keys = pki.generate(state_dir / "pki", SERVICE_IP, node.NODE_IP if real else None)
    names = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kubelet"]
    ports = {name: free_port() for name in names + (list(_REAL_NODE_PORTS) if real else [])}
    node_users = _NODE_USERS if real else {}
    tokens = {u: secrets.token_hex(24) for u in [*USERS, _CONTROLLER_MANAGER_USER, *node_users]}
    host = node.NODE_IP if real else "127.0.0.1"
    cp = ControlPlane(
        state_dir=state_dir,
        server=f"https://{host}:{ports['kube-apiserver']}",
        ca_cert=keys.ca_cert,
        tokens=tokens,
        ports=ports,
        versions={"kubernetes": build.KUBERNETES_VERSION, "etcd": build.ETCD_VERSION},
        node=node_kind,
        held_by=held_by,
    )
    if real:
        _clear_leftover_node()
        # Recorded before anything touches the host, so a failed start is undone by stop().
        cp.save()
        node.prepare_host(state_dir)
    rows = [f'{tokens[u]},{u},uid-{u},"{",".join(g)}"' for u, g in {**USERS, **node_users}.items()]
    rows.append(f"{tokens[_CONTROLLER_MANAGER_USER]},{_CONTROLLER_MANAGER_USER},uid-kcm")
    (state_dir / "tokens.csv").write_text("\n".join(rows) + "\n")
    (state_dir / "tokens.csv").chmod(0o600)
    for user in USERS:
        _write_kubeconfig(cp.kubeconfig(user), cp.server, cp.ca_cert, user, tokens[user])
    _write_kubeconfig(
        state_dir / "controller-manager.kubeconfig",
        cp.server,
        cp.ca_cert,
        _CONTROLLER_MANAGER_USER,
        tokens[_CONTROLLER_MANAGER_USER],
    )
    for user in node_users:
        _write_kubeconfig(
            _component_kubeconfig(state_dir, user), cp.server, cp.ca_cert, user, tokens[user]
        )
    cp.save()
    return cp, keys


def _clear_leftover_node() -> None:
    """Undo what a real node whose processes are gone left on the host, or say which one runs.

    A node whose owner was killed (a test session's SIGKILL, a machine that lost the process
    that ran ``up``) leaves its bridge, chains and mounts: ``stop`` of its state directory puts
    the host back as its ``host.json`` says. A node whose containerd, kubelet or kube-proxy still
    runs is another's: only one runs per machine, and this start fails naming it.
    """
    if not node.bridge_exists():
        return
    running = node.running_node_processes()
    if running:
        pid, other = running[0]
        holder = _holder(other)
        if holder is not None and not _alive(holder):
            print(
                f"the real node of {other} (pid {pid}) outlived the process that held it "
                f"(pid {holder}): stopping it",
                file=sys.stderr,
            )
            stop(other)
            if not node.bridge_exists():
                return
            running = node.running_node_processes()
    if running:
        pid, other = running[0]
        raise ControlPlaneError(
            f"a real node runs on this host (pid {pid}, state directory {other}) and only one can: "
            f"stop it with `hack/control-plane down --state-dir {other}`"
        )
    owner = node.recorded_owner()
    print(
        f"the bridge {node.BRIDGE} of a real node that no longer runs is on this host (state "
        f"directory {owner or 'not recorded'}): removing what it left",
        file=sys.stderr,
    )
    if owner is not None and (owner / "node" / "host.json").is_file():
        stop(owner)
    node.remove_bridge()


def _holder(state_dir: Path) -> int | None:
    try:
        return ControlPlane.load(state_dir).held_by
    except (OSError, ValueError, TypeError):
        return None


def _component_kubeconfig(state_dir: Path, user: str) -> Path:
    return node.node_dir(state_dir) / f"{user.rsplit(':', 1)[-1]}.kubeconfig"


def _containerd_serving(cp: ControlPlane) -> bool:
    socket = node.containerd_socket(cp.state_dir)
    argv = ["ctr", "--address", str(socket), "version"]
    return (
        socket.exists() and subprocess.run(argv, capture_output=True, check=False).returncode == 0
    )


def _start_real_node(cp: ControlPlane, keys: pki.Pki, deadline: float) -> None:
    """Start containerd (with the pause image), kube-scheduler, the kubelet and kube-proxy."""
    directory = build.ensure_node_binaries()
    pause = images.pause_image()
    config = node.write_containerd_config(cp.state_dir, images.PAUSE_IMAGE, SERVICE_CIDR)
    _spawn(cp, "containerd", ["containerd", f"--config={config}"])
    _wait(cp, "containerd", ("containerd",), lambda: _containerd_serving(cp), deadline)
    images.import_image(node.containerd_socket(cp.state_dir), pause)
    _spawn(
        cp,
        "kube-scheduler",
        [
            str(directory / "kube-scheduler"),
            f"--kubeconfig={_component_kubeconfig(cp.state_dir, 'system:kube-scheduler')}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={cp.ports['kube-scheduler']}",
            "--profiling=false",
        ],
    )
    node.write_kubelet_config(
        cp.state_dir, cp.ca_cert, cp.ports["kubelet"], cp.ports["kubelet-healthz"]
    )
    kubelet_kubeconfig = _component_kubeconfig(cp.state_dir, f"system:node:{cp.node_name}")
    _spawn(
        cp,
        "kubelet",
        node.kubelet_argv(
            directory / "kubelet",
            cp.state_dir,
            kubelet_kubeconfig,
            cp.node_name,
            (keys.kubelet_cert, keys.kubelet_key),
        ),
    )
    proxy_kubeconfig = _component_kubeconfig(cp.state_dir, "system:kube-proxy")
    proxy_config = node.write_proxy_config(cp.state_dir, proxy_kubeconfig, cp.node_name, cp.ports)
    _spawn(cp, "kube-proxy", [str(directory / "kube-proxy"), f"--config={proxy_config}"])


def start(
    state_dir: Path | None = None,
    timeout: float = 240,
    *,
    audit: bool = False,
    node_kind: str = "real",
    held_by: int | None = None,
) -> ControlPlane:
    """Start the whole control plane in ``state_dir`` and wait until it serves and a Node is Ready.

    With ``audit``, the API server writes :func:`audit_log` (see the module docstring).
    ``node_kind`` is ``"real"`` (:mod:`devcluster.node`) or ``"process"`` (the process kubelet, for
    a machine without a container runtime).
    ``held_by`` is the pid of the process that will stop it (a test session): if that process
    dies first, the next real node started on this host stops this one instead of failing.

    On failure everything started so far is stopped and the state directory removed before the
    :class:`ControlPlaneError` (with the failing process's log tail) propagates.
    """
    binaries = build.ensure_binaries()
    if state_dir is None:
        state_dir = DEFAULT_STATE_DIR
    state_dir = state_dir.resolve()
    deadline = time.monotonic() + timeout
    try:
        cp, keys = _prepare(state_dir, node_kind, held_by)
        _start_etcd(cp, binaries)
        _wait(cp, "etcd /health", ("etcd",), lambda: _etcd_healthy(cp), deadline)
        _start_apiserver(cp, binaries, keys, audit)
        _wait(
            cp,
            "kube-apiserver /readyz",
            ("etcd", "kube-apiserver"),
            lambda: api_get(cp, "/readyz")[0] == 200,
            deadline,
        )
        _start_controller_manager(cp, binaries, keys)
        if cp.node == "real":
            _start_real_node(cp, keys, deadline)
        else:
            _start_kubelet(cp, keys)
        _wait(
            cp,
            "the controllers",
            ("kube-apiserver", "kube-controller-manager"),
            lambda: _controllers_working(cp),
            deadline,
        )
        _wait(
            cp,
            f"Node {cp.node_name} Ready",
            (
                "kube-apiserver",
                "kubelet",
                *(("containerd", "kube-proxy") if cp.node == "real" else ()),
            ),
            lambda: _node_ready(cp),
            deadline,
        )
    except BaseException:
        stop(state_dir)
        raise
    return cp


def _own_process(pid: int, expected: str) -> bool:
    """Tell whether ``pid`` still runs ``expected`` (guards against a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return expected in cmdline


def _terminate_group(pid: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _pod_process_pids(state_dir: Path) -> list[int]:
    pids = []
    for pid_file in (state_dir / "pods").glob("*/*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pids.append(int(pid_file.read_text().strip()))
    return pids


def stop(state_dir: Path | None = None) -> None:
    """Stop every process of the control plane in ``state_dir`` and remove the directory."""
    state_dir = (state_dir or DEFAULT_STATE_DIR).resolve()
    for name in _PROCESS_ORDER:
        if name == "kube-proxy":
            # The kubelet is gone and containerd still serves: remove every pod sandbox now.
            node.remove_pod_sandboxes(state_dir, build.crictl_binary_if_built())
        pid_file = state_dir / "run" / f"{name}.pid"
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text().strip())
            if _own_process(pid, _EXPECTED_COMMAND[name]):
                _terminate_group(pid, grace=10)
    # The kubelet stops its pods' processes on SIGTERM; these are the ones it could not.
    for pid in _pod_process_pids(state_dir):
        if _alive(pid) and _own_process(pid, ""):
            _terminate_group(pid, grace=2)
    proxy = build.cache_root() / f"kubernetes-{build.KUBERNETES_VERSION}" / "kube-proxy"
    node.restore_host(state_dir, proxy if proxy.is_file() else None)
    shutil.rmtree(state_dir, ignore_errors=True)


def status(state_dir: Path | None = None) -> dict[str, object]:
    """Describe the control plane in ``state_dir``: processes alive, readiness, kubeconfig."""
    state_dir = (state_dir or DEFAULT_STATE_DIR).resolve()
    try:
        cp = ControlPlane.load(state_dir)
    except FileNotFoundError:
        return {"running": False, "state_dir": str(state_dir)}
    processes = {name: _alive(pid) for name, pid in cp.pids.items()}
    try:
        ready = api_get(cp, "/readyz")[0] == 200
    except OSError:
        ready = False
    return {
        "running": ready and all(processes.values()),
        "state_dir": str(state_dir),
        "server": cp.server,
        "readyz": ready,
        "processes": processes,
        "versions": cp.versions,
        "kubeconfig": str(cp.kubeconfig("admin")),
    }


def temporary_state_dir() -> Path:
    """Return a fresh private directory for a control plane (what the test fixture uses)."""
    return Path(tempfile.mkdtemp(prefix="agentflows-cp-"))
