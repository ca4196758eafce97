"""The process kubelet: a Node whose pods run as local processes (no container runtime).

Started by :func:`devcluster.controlplane.start` as ``python -m devcluster.kubelet``. It

- registers a Ready Node (capacity from this machine) and renews its Lease in kube-node-lease;
- binds every pod that has no ``nodeName`` to itself through ``pods/binding`` (the dev cluster
  has no kube-scheduler);
- runs each pod bound to its Node with a :class:`devcluster.podworker.PodWorker`;
- serves ``/containerLogs/<namespace>/<pod>/<container>`` over TLS so ``kubectl logs`` works.

It authenticates with the admin kubeconfig, so the Node authorizer is not exercised by it. On
SIGTERM it stops every pod process (SIGTERM, then SIGKILL after a few seconds) and exits.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import logging
import os
import platform
import signal
import ssl
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from devcluster import build, podfiles, podworker

log = logging.getLogger("kubelet")

_HEARTBEAT_SECONDS = 10
_LEASE_NAMESPACE = "kube-node-lease"


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _memory_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 4 * 2**20


class Kubelet:
    """The Node, its heartbeat, the pod watch and the pod workers."""

    def __init__(self, cluster: podfiles.Cluster, port: int) -> None:
        self.cluster = cluster
        self.core = cluster.core
        self.coordination = client.CoordinationV1Api(cluster.core.api_client)
        self.node = cluster.node_name
        self.port = port
        self.stopping = threading.Event()
        self.workers: dict[str, podworker.PodWorker] = {}
        self.finished: set[str] = set()
        self._lock = threading.Lock()
        self._registered_at = podworker.now()

    # ----- the Node ----------------------------------------------------------------------------

    def _node_status(self) -> dict[str, Any]:
        stamp = podworker.now()
        resources = {
            "cpu": str(os.cpu_count() or 1),
            "memory": f"{_memory_kib()}Ki",
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }

        def condition(kind: str, value: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": self._registered_at,
            }

        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                condition(
                    "Ready", "True", "KubeletReady", "process kubelet is posting ready status"
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {
                "machineID": self.node,
                "systemUUID": self.node,
                "bootID": self._registered_at,
                "kernelVersion": platform.release(),
                "osImage": "agentflows process kubelet",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": build.KUBERNETES_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def register(self) -> None:
        """Create (or take over) the Node and mark it Ready."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "agentflows.io/process-kubelet": "true",
                },
            },
        }
        try:
            self.core.create_node(body)
        except client.ApiException as error:
            if error.status != 409:
                raise
        self._patch_node_status()

    def _patch_node_status(self) -> None:
        self.core.patch_node_status(
            self.node, {"status": self._node_status()}, _content_type="application/merge-patch+json"
        )

    def _renew_lease(self) -> None:
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": _micro_now()}
        try:
            self.coordination.patch_namespaced_lease(
                self.node,
                _LEASE_NAMESPACE,
                {"spec": spec},
                _content_type="application/merge-patch+json",
            )
        except client.ApiException as error:
            if error.status != 404:
                raise
            node = self.core.read_node(self.node)
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": node.metadata.uid,
            }
            self.coordination.create_namespaced_lease(
                _LEASE_NAMESPACE,
                {"metadata": {"name": self.node, "ownerReferences": [owner]}, "spec": spec},
            )

    def heartbeat(self) -> None:
        """Thread body: keep the Lease and the Ready condition fresh."""
        while not self.stopping.wait(_HEARTBEAT_SECONDS):
            try:
                self._renew_lease()
                self._patch_node_status()
            except Exception as error:
                log.warning("heartbeat: %s", error)

    # ----- pods --------------------------------------------------------------------------------

    def _bind(self, pod: client.V1Pod) -> None:
        meta = pod.metadata
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta.name, "namespace": meta.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        try:
            # The client cannot decode the Status this returns, hence no preloading.
            self.core.create_namespaced_pod_binding(
                meta.name, meta.namespace, body, _preload_content=False
            )
        except client.ApiException as error:
            if error.status not in (404, 409):
                log.warning("binding %s/%s: %s", meta.namespace, meta.name, error.reason)

    def _worker_finished(self, worker: podworker.PodWorker) -> None:
        uid = worker.pod.metadata.uid
        with self._lock:
            self.workers.pop(uid, None)
            self.finished.add(uid)

    def handle(self, pod: client.V1Pod) -> None:
        """React to one observed state of a pod."""
        meta = pod.metadata
        if not pod.spec.node_name:
            if meta.deletion_timestamp is None:
                self._bind(pod)
            return
        if pod.spec.node_name != self.node:
            return
        deleting = meta.deletion_timestamp is not None
        with self._lock:
            worker = self.workers.get(meta.uid)
            if worker is None:
                finished = meta.uid in self.finished or pod.status.phase in (
                    podworker.SUCCEEDED,
                    podworker.FAILED,
                )
                if finished or deleting:
                    self.finished.add(meta.uid)
                    if deleting:
                        podworker.PodWorker.delete_from_api(self.core, pod)
                    return
                worker = podworker.PodWorker(self.cluster, pod, self._worker_finished)
                self.workers[meta.uid] = worker
                worker.start()
        if deleting:
            worker.request_deletion(meta.deletion_grace_period_seconds)

    def forget(self, pod: client.V1Pod) -> None:
        """Stop the worker of a pod gone from the API and drop its files."""
        uid = pod.metadata.uid
        with self._lock:
            worker = self.workers.get(uid)
            self.finished.discard(uid)
        if worker is not None:
            worker.request_deletion(0)
            worker.join(timeout=30)
        podfiles.remove(podfiles.PodFiles(self.cluster, pod).directory)

    def watch_pods(self) -> None:
        """Thread body: list and watch all pods, relisting every half minute as a resync."""
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces()
                for pod in listed.items:
                    self.handle(pod)
                stream = watch.Watch()
                for event in stream.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=30,
                    _request_timeout=60,
                ):
                    if self.stopping.is_set():
                        stream.stop()
                        break
                    if event["type"] == "ERROR":
                        break
                    if event["type"] == "DELETED":
                        self.forget(event["object"])
                    else:
                        self.handle(event["object"])
            except Exception as error:
                if not self.stopping.is_set():
                    log.warning("pod watch: %s", error)
                    time.sleep(1)

    def shutdown(self) -> None:
        """Stop every pod's processes and wait for the workers."""
        self.stopping.set()
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.shutdown()
        for worker in workers:
            worker.join(timeout=10)


def _log_handler(state_dir: Path) -> type[http.server.BaseHTTPRequestHandler]:
    class ContainerLogs(http.server.BaseHTTPRequestHandler):
        """Serve ``/containerLogs/<ns>/<pod>/<container>`` with tailLines, limitBytes and follow."""

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if parts == ["healthz"]:
                self._send(200, b"ok")
                return
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._send(404, b"not found")
                return
            _, namespace, name, container = parts
            candidates = sorted(
                (state_dir / "pods").glob(f"{namespace}_{name}_*/{container}.log"),
                key=lambda p: p.stat().st_mtime,
            )
            if not candidates:
                self._send(404, f"no log for container {container} of {name}".encode())
                return
            query = urllib.parse.parse_qs(url.query)
            data = candidates[-1].read_bytes()
            if "tailLines" in query:
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-int(query["tailLines"][0]) :])
            if "limitBytes" in query:
                data = data[: int(query["limitBytes"][0])]
            if query.get("follow") == ["true"]:
                self._follow(candidates[-1], data)
            else:
                self._send(200, data)

        def _follow(self, path: Path, data: bytes) -> None:
            # HTTP/1.0 without Content-Length: the body ends when the connection closes, which
            # happens once the container's process has ended (its pid file is gone).
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            offset = path.stat().st_size
            pid_file = path.with_suffix(".pid")
            try:
                self.wfile.write(data)
                self.wfile.flush()
                while True:
                    running = pid_file.exists()
                    with path.open("rb") as log_file:
                        log_file.seek(offset)
                        chunk = log_file.read()
                    if chunk:
                        offset += len(chunk)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    elif not running:
                        return
                    time.sleep(0.2)
            except (OSError, ConnectionError):
                return

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return ContainerLogs


def serve_logs(state_dir: Path, port: int, cert: Path, key: Path) -> http.server.HTTPServer:
    """Start the TLS log server on 127.0.0.1:``port`` in a daemon thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _log_handler(state_dir))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="log-server", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    """Run the process kubelet until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", type=Path, required=True)
    parser.add_argument("--tls-key", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    configuration = client.Configuration()
    config.load_kube_config(str(args.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = 64
    core = client.CoreV1Api(client.ApiClient(configuration))
    cluster = podfiles.Cluster(
        core=core,
        server=configuration.host,
        ca_cert=Path(configuration.ssl_ca_cert),
        state_dir=args.state_dir,
        node_name=args.node_name,
    )
    kubelet = Kubelet(cluster, args.port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = serve_logs(args.state_dir, args.port, args.tls_cert, args.tls_key)
    kubelet.register()
    threading.Thread(target=kubelet.heartbeat, name="heartbeat", daemon=True).start()
    threading.Thread(target=kubelet.watch_pods, name="pod-watch", daemon=True).start()
    log.info("node %s registered; serving logs on port %d", args.node_name, args.port)
    stop.wait()
    log.info("stopping")
    kubelet.shutdown()
    server.shutdown()


if __name__ == "__main__":
    main()
