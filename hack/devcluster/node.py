"""A real node for the development control plane: containerd, runc, CNI, kubelet, kube-proxy.

``hack/control-plane up --node real`` (``controlplane.start(node="real")``) runs, besides etcd,
kube-apiserver and kube-controller-manager: containerd (Debian's, with runc and the Debian CNI
plugins), the kubelet, kube-proxy (iptables mode) and kube-scheduler, all v1.34.4 from the same
Go module as the control plane. Pods run in containers; the scheduler binds them.

Everything that can live in the state directory does (``<state>/node/``: containerd's root,
state and socket, the CNI configuration and IPAM data, the kubelet's root and pod logs). What
cannot, :func:`prepare_host` records first in ``<state>/node/host.json`` and :func:`stop_node`
puts back: the sysctls the kubelet sets, the host paths it and libcni create, the network
namespaces, the pod bridge :data:`BRIDGE`, the kubelet's cgroups, kube-proxy's and the CNI
plugins' iptables chains, and every mount under the state directory.

Host facts this depends on (see hack/README.md): this machine's capability bounding set lacks
CAP_SYS_RESOURCE, so containerd's CRI plugin runs with ``restrict_oom_score_adj = true`` (a
container's oom_score_adj is never set below containerd's own: the kernel's OOM killer no longer
orders victims by QoS class); containerd 1.6 has no RuntimeConfig RPC, so the kubelet is told
``cgroupDriver: cgroupfs`` (cgroup v1 here, ``failCgroupV1: false``). Only one real node runs
per machine: kube-proxy's iptables chains and the bridge are host-wide.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

BRIDGE = "agentflows0"
POD_CIDR = "10.244.0.0/24"
# The bridge's own address: the node's InternalIP, and the API server's bind address, so pods
# reach it directly and through the ``kubernetes`` Service.
NODE_IP = "10.244.0.1"
# The bridge's MAC address, set when it is made (locally administered, from NODE_IP). A bridge
# whose address was never set takes the lowest of its ports' (the pods' veths): deleting a pod
# whose veth had it changes the gateway's MAC under every other pod, whose ARP entry then points
# nowhere until it expires; their connections to the node and the API server time out for tens
# of seconds. A set address is kept whatever the ports.
BRIDGE_MAC = "02:00:" + ":".join(f"{int(octet):02x}" for octet in NODE_IP.split("."))
CNI_BIN_DIR = "/usr/lib/cni"
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# Paths the kubelet or libcni create on the host whatever their configuration says.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/var/run/netns",
)
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CGROUP_NAME = "kubepods"
# The state directory of the real node that made the bridge (written by prepare_host, removed by
# restore_host): how a later ``up`` finds what a node whose processes died left on the host.
OWNER_RECORD = Path("/run/agentflows-real-node")
# The files under ``<state>/node/`` that containerd, the kubelet and kube-proxy get as --config.
_CONFIG_FILES = ("containerd.toml", "kubelet.json", "kube-proxy.json")


class NodeError(RuntimeError):
    """The host cannot run a real node (a missing program, another real node running)."""


def node_dir(state_dir: Path) -> Path:
    """Return the directory that holds the real node's state under the control plane's."""
    return state_dir / "node"


def containerd_socket(state_dir: Path) -> Path:
    """Return the socket the node's containerd listens on."""
    return node_dir(state_dir) / "containerd" / "containerd.sock"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and completed.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {completed.stderr.strip()}")
    return completed


def _netns() -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir("/var/run/netns"))
    return []


def bridge_exists() -> bool:
    """Tell whether the pod bridge exists on this host (a real node runs, or one left it)."""
    return Path("/sys/class/net", BRIDGE).exists()


def running_node_processes() -> list[tuple[int, Path]]:
    """Return ``(pid, state dir)`` of every containerd, kubelet and kube-proxy of a real node."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for arg in argv:
            config = Path(arg.removeprefix("--config="))
            ours = config.name in _CONFIG_FILES and config.parent.name == "node"
            if arg.startswith("--config=") and ours:
                found.append((int(entry.name), config.parent.parent))
    return found


def recorded_owner() -> Path | None:
    """Return the state directory of the node that made the bridge, as :data:`OWNER_RECORD` says."""
    try:
        return Path(OWNER_RECORD.read_text().strip())
    except OSError:
        return None


def remove_bridge() -> None:
    """Delete the pod bridge and the owner record (what is left once its node's state is gone)."""
    _run("ip", "link", "del", BRIDGE, check=False)
    with contextlib.suppress(FileNotFoundError):
        OWNER_RECORD.unlink()


def prepare_host(state_dir: Path) -> None:
    """Check the host, record what :func:`stop_node` must restore, and create the pod bridge."""
    missing = [p for p in ("containerd", "ctr", "runc", "iptables") if not shutil.which(p)]
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        missing.append(f"{CNI_BIN_DIR}/bridge")
    if missing:
        raise NodeError(
            f"a real node needs {', '.join(missing)}: run hack/install-node (Debian packages "
            "containerd, runc, containernetworking-plugins, iptables)"
        )
    if bridge_exists():
        raise NodeError(
            f"bridge {BRIDGE} exists: another real node runs (state directory "
            f"{recorded_owner() or 'unknown'}: hack/control-plane down --state-dir DIR stops it)"
        )
    host = {
        "sysctls": {name: Path("/proc/sys", name).read_text().strip() for name in SYSCTLS},
        "paths": [path for path in HOST_PATHS if Path(path).exists()],
        "netns": _netns(),
        "chains": _chains(),
        "cgroups": [str(d) for d in _CGROUP_ROOT.glob(f"*/{_CGROUP_NAME}") if d.is_dir()],
    }
    directory = node_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "host.json").write_text(json.dumps(host, indent=2))
    _run("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    OWNER_RECORD.write_text(f"{state_dir}\n")


def write_containerd_config(state_dir: Path, pause_image: str, service_cidr: str) -> Path:
    """Write containerd's config (root, state, socket, CNI under the state dir); return it."""
    base = node_dir(state_dir)
    cni_conf = base / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    network = {
        "cniVersion": "0.4.0",
        "name": "agentflows",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    # Only the Services go through the bridge address (kube-proxy's DNAT); no
                    # default route, so a pod reaches nothing beyond this host.
                    "routes": [{"dst": service_cidr}],
                    "dataDir": str(base / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (cni_conf / "10-agentflows.conflist").write_text(json.dumps(network, indent=2))
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = f"""version = 2
root = "{base / "containerd" / "root"}"
state = "{base / "containerd" / "state"}"

[grpc]
  address = "{containerd_socket(state_dir)}"

[ttrpc]
  address = "{containerd_socket(state_dir)}.ttrpc"

[debug]
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  disable_apparmor = true

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"

[{cri}.containerd]
  snapshotter = "overlayfs"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
"""
    path = base / "containerd.toml"
    path.write_text(config)
    return path


def write_kubelet_config(state_dir: Path, ca_cert: Path, port: int, healthz_port: int) -> Path:
    """Write the KubeletConfiguration (JSON is YAML) and return its path."""
    base = node_dir(state_dir)
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket(state_dir)}",
        "podLogsDir": str(base / "pod-logs"),
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        # The machine is shared: never evict test pods for another workload's disk or memory.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "staticPodPath": "",
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": True,
        "localStorageCapacityIsolation": True,
    }
    path = base / "kubelet.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def write_proxy_config(
    state_dir: Path, kubeconfig: Path, node_name: str, ports: dict[str, int]
) -> Path:
    """Write the KubeProxyConfiguration (iptables mode) and return its path."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        # Leave the host's conntrack table size alone (a sysctl down would have to restore).
        "conntrack": {"maxPerCore": 0, "min": 0},
    }
    path = node_dir(state_dir) / "kube-proxy.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def kubelet_argv(
    kubelet: Path, state_dir: Path, kubeconfig: Path, node_name: str, keys: tuple[Path, Path]
) -> list[str]:
    """Return the kubelet's command line (``keys``: its serving certificate and key)."""
    base = node_dir(state_dir)
    return [
        str(kubelet),
        f"--config={base / 'kubelet.json'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={base / 'kubelet'}",
        f"--hostname-override={node_name}",
        f"--node-ip={NODE_IP}",
        f"--tls-cert-file={keys[0]}",
        f"--tls-private-key-file={keys[1]}",
        "--v=1",
    ]


def _mounts_under(prefix: Path) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].encode().decode("unicode_escape")
        if target == str(prefix) or target.startswith(f"{prefix}/"):
            mounts.append(target)
    return mounts


def _remove_containers(state_dir: Path) -> None:
    """Stop and remove what containerd still runs (the kubelet is stopped by now)."""
    socket = containerd_socket(state_dir)
    if not socket.exists():
        return
    ctr = ["ctr", "--address", str(socket), "-n", "k8s.io"]
    tasks = _run(*ctr, "tasks", "list", "-q", check=False).stdout.split()
    for task in tasks:
        _run(*ctr, "tasks", "kill", "-a", "-s", "SIGKILL", task, check=False)
    for task in tasks:
        for _ in range(50):
            if _run(*ctr, "tasks", "delete", task, check=False).returncode == 0:
                break
            time.sleep(0.1)
    for container in _run(*ctr, "containers", "list", "-q", check=False).stdout.split():
        _run(*ctr, "containers", "delete", container, check=False)


def remove_pod_sandboxes(state_dir: Path, crictl: Path | None) -> None:
    """Tear down every pod sandbox through the CRI (its CNI DEL frees the veth and iptables)."""
    socket = containerd_socket(state_dir)
    if crictl is None or not socket.exists():
        return
    endpoint = f"--runtime-endpoint=unix://{socket}"
    for sandbox in _run(str(crictl), endpoint, "pods", "-q", check=False).stdout.split():
        _run(str(crictl), endpoint, "stopp", sandbox, check=False)
        _run(str(crictl), endpoint, "rmp", "-f", sandbox, check=False)
    _remove_containers(state_dir)


def _remove_cgroups(recorded: list[str]) -> None:
    for controller in _CGROUP_ROOT.iterdir():
        top = controller / _CGROUP_NAME
        if str(top) in recorded or not top.is_dir():
            continue
        # Deepest first: a cgroup directory is removed with rmdir once it has no children.
        for directory in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir():
                with contextlib.suppress(OSError):
                    directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _chains() -> dict[str, list[str]]:
    """Return the KUBE-* and CNI-* chains of each (iptables command, table)."""
    found = {}
    for command in ("iptables", "ip6tables"):
        for table in ("nat", "filter", "mangle"):
            lines = _run(f"{command}-save", "-t", table, check=False).stdout.splitlines()
            found[f"{command} {table}"] = [
                line[1:].split()[0] for line in lines if line.startswith((":KUBE-", ":CNI-"))
            ]
    return found


def _remove_iptables(recorded: dict[str, list[str]], proxy: Path | None) -> None:
    """Remove the KUBE-* and CNI-* chains that were not there before ``up``, and their jumps."""
    if proxy is not None:
        _run(str(proxy), "--cleanup", check=False)
    for key, chains in _chains().items():
        ours = set(chains) - set(recorded.get(key, []))
        if not ours:
            continue
        command, table = key.split()
        for line in _run(f"{command}-save", "-t", table, check=False).stdout.splitlines():
            words = shlex.split(line)
            if words[:1] == ["-A"] and ours & set(words):
                _run(command, "-t", table, "-D", *words[1:], check=False)
        for chain in ours:
            _run(command, "-t", table, "-F", chain, check=False)
        for chain in ours:
            _run(command, "-t", table, "-X", chain, check=False)


def restore_host(state_dir: Path, proxy: Path | None) -> None:
    """Put back what :func:`prepare_host` recorded, once every node process has stopped."""
    try:
        host = json.loads((node_dir(state_dir) / "host.json").read_text())
    except FileNotFoundError:
        return
    for target in sorted(_mounts_under(state_dir), key=len, reverse=True):
        _run("umount", "-l", target, check=False)
    for name in _netns():
        if name not in host["netns"]:
            _run("umount", f"/var/run/netns/{name}", check=False)
            with contextlib.suppress(OSError):
                os.unlink(f"/var/run/netns/{name}")
    _remove_iptables(host["chains"], proxy)
    if recorded_owner() in (state_dir, None):
        remove_bridge()
    _remove_cgroups(host["cgroups"])
    for name, value in host["sysctls"].items():
        with contextlib.suppress(OSError):
            Path("/proc/sys", name).write_text(value)
    for path in HOST_PATHS:
        if path not in host["paths"]:
            for target in sorted(_mounts_under(Path(path)), key=len, reverse=True):
                _run("umount", "-l", target, check=False)
            shutil.rmtree(path, ignore_errors=True)
