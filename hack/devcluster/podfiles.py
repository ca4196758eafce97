"""A pod's files for the process kubelet: its directory, volumes, environment and kubeconfig.

Called by :mod:`devcluster.podworker` before it starts a pod's containers. Nothing is mounted
(no container runtime, no mount namespace): each volume is materialised as a directory under
``<state>/pods/<namespace>_<name>_<uid>/volumes/<volume>/`` and each ``volumeMount`` appears as a
symlink at ``$AGENTFLOWS_POD_ROOT/<mountPath>`` (a copy, for a read-only mount of a ConfigMap
volume, so paths under it resolve inside it), where
``AGENTFLOWS_POD_ROOT`` is set in every container's environment. A program that should find
``/etc/config/x`` in a pod reads ``$AGENTFLOWS_POD_ROOT/etc/config/x`` here. The pod's
service-account token (from the TokenRequest API, bound to the pod) is written as the projected
``kube-api-access`` volume and as a kubeconfig named by ``KUBECONFIG``, so the process has
exactly the pod's permissions.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 86400
_FIELD_WITH_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
# Variables every process gets from the kubelet's own environment, so the working tree's Python
# and agentflows are found as they would be in the image.
_PASSED_THROUGH = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE")


class PodSetupError(Exception):
    """A volume or variable cannot be resolved yet (a missing Secret, say); the kubelet retries."""


def pod_dir_name(namespace: str, name: str, uid: str) -> str:
    """Return the name of a pod's directory under ``<state>/pods``."""
    return f"{namespace}_{name}_{uid}"


def pod_log_path(state_dir: Path, namespace: str, name: str, uid: str, container: str) -> Path:
    """Return the file holding ``container``'s output (stdout and stderr, all restarts)."""
    return state_dir / "pods" / pod_dir_name(namespace, name, uid) / f"{container}.log"


@dataclass(frozen=True)
class Cluster:
    """What a pod worker needs to know about the cluster it serves."""

    core: client.CoreV1Api
    server: str
    ca_cert: Path
    state_dir: Path
    node_name: str


def field_value(pod: client.V1Pod, path: str) -> str:
    """Resolve a downward-API ``fieldPath`` against ``pod``; raise PodSetupError if unsupported."""
    meta = pod.metadata
    simple: dict[str, str | None] = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
        "status.podIPs": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
    }
    if path in simple:
        return simple[path] or ""
    if path in ("metadata.labels", "metadata.annotations"):
        values = (meta.labels if path == "metadata.labels" else meta.annotations) or {}
        return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(values.items()))
    match = _FIELD_WITH_KEY.match(path)
    if match:
        values = (meta.labels if match.group(1) == "labels" else meta.annotations) or {}
        return str(values.get(match.group(2), ""))
    raise PodSetupError(f"unsupported fieldRef.fieldPath {path!r}")


class PodFiles:
    """Build one pod's directory, volumes and per-container environment."""

    def __init__(self, cluster: Cluster, pod: client.V1Pod) -> None:
        self.cluster = cluster
        self.pod = pod
        meta = pod.metadata
        self.namespace: str = meta.namespace
        self.directory = (
            cluster.state_dir / "pods" / pod_dir_name(meta.namespace, meta.name, meta.uid)
        )
        self.root = self.directory / "root"
        self.kubeconfig: Path | None = None
        self.environments: dict[str, dict[str, str]] = {}
        self._objects: dict[tuple[str, str], dict[str, str | bytes] | None] = {}

    # ----- API objects -------------------------------------------------------------------------

    def _data(self, kind: str, name: str) -> dict[str, str | bytes] | None:
        """Return a ConfigMap's or Secret's decoded data, or None when it does not exist."""
        if (kind, name) not in self._objects:
            data: dict[str, str | bytes] | None
            try:
                if kind == "secret":
                    secret = self.cluster.core.read_namespaced_secret(name, self.namespace)
                    data = {
                        k: base64.b64decode(v).decode(errors="replace")
                        for k, v in (secret.data or {}).items()
                    }
                else:
                    config_map = self.cluster.core.read_namespaced_config_map(name, self.namespace)
                    data = dict(config_map.data or {})
                    binary = config_map.binary_data or {}
                    data.update({k: base64.b64decode(v) for k, v in binary.items()})
            except client.ApiException as error:
                if error.status != 404:
                    raise
                data = None
            self._objects[(kind, name)] = data
        return self._objects[(kind, name)]

    def _required(self, kind: str, name: str, optional: bool | None) -> dict[str, str | bytes]:
        data = self._data(kind, name)
        if data is None:
            if optional:
                return {}
            raise PodSetupError(f'{kind} "{name}" not found')
        return data

    # ----- volumes -----------------------------------------------------------------------------

    def _token(self) -> str:
        meta = self.pod.metadata
        request = self.cluster.core.create_namespaced_service_account_token(
            self.pod.spec.service_account_name or "default",
            self.namespace,
            {
                "spec": {
                    "expirationSeconds": TOKEN_SECONDS,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta.name,
                        "uid": meta.uid,
                    },
                }
            },
        )
        return str(request.status.token)

    def _write_items(
        self,
        target: Path,
        data: dict[str, str | bytes],
        items: list[Any] | None,
        optional: bool | None = None,
    ) -> None:
        """Write ``items`` (else every key) of ``data``; skip a missing key if optional."""
        pairs = [(item.key, item.path) for item in items] if items else [(k, k) for k in data]
        for key, relative in pairs:
            if key not in data:
                if optional:
                    continue
                raise PodSetupError(f'key "{key}" not found')
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            value = data[key]
            if isinstance(value, bytes):
                path.write_bytes(value)
            else:
                path.write_text(value)

    def _write_downward(self, target: Path, items: list[Any] | None) -> None:
        for item in items or []:
            if item.field_ref is None:
                continue
            path = target / item.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(field_value(self.pod, item.field_ref.field_path))

    def _materialise(self, volume: client.V1Volume, target: Path) -> None:
        if volume.config_map is not None:
            source = volume.config_map
            data = self._required("configmap", source.name, source.optional)
            self._write_items(target, data, source.items, source.optional)
        elif volume.secret is not None:
            source = volume.secret
            data = self._required("secret", source.secret_name, source.optional)
            self._write_items(target, data, source.items)
        elif volume.downward_api is not None:
            self._write_downward(target, volume.downward_api.items)
        elif volume.projected is not None:
            for source in volume.projected.sources or []:
                if source.service_account_token is not None:
                    path = target / source.service_account_token.path
                    path.write_text(self._token())
                elif source.config_map is not None:
                    optional = source.config_map.optional
                    data = self._required("configmap", source.config_map.name, optional)
                    self._write_items(target, data, source.config_map.items, optional)
                elif source.secret is not None:
                    data = self._required("secret", source.secret.name, source.secret.optional)
                    self._write_items(target, data, source.secret.items)
                elif source.downward_api is not None:
                    self._write_downward(target, source.downward_api.items)
        # emptyDir, persistentVolumeClaim and anything else: an empty directory.

    def prepare(self) -> None:
        """Create the pod directory, volumes, mount links, kubeconfig and environments.

        Idempotent; raises PodSetupError while a referenced ConfigMap, Secret or key is missing,
        and the caller retries (the pod stays Pending in ContainerCreating, as on a kubelet).
        """
        self._objects = {}
        volumes_dir = self.directory / "volumes"
        volumes_dir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(exist_ok=True)
        (self.directory / "home").mkdir(exist_ok=True)
        paths: dict[str, Path] = {}
        # volumes whose files are written here once, so a read-only mount may be a copy
        written: set[str] = set()
        for volume in self.pod.spec.volumes or []:
            if volume.config_map is not None:
                written.add(volume.name)
            if volume.host_path is not None:
                paths[volume.name] = Path(volume.host_path.path)
                continue
            target = volumes_dir / volume.name
            if target.exists() and volume.empty_dir is None:
                shutil.rmtree(target)
            target.mkdir(exist_ok=True)
            self._materialise(volume, target)
            paths[volume.name] = target
        containers = [*(self.pod.spec.init_containers or []), *self.pod.spec.containers]
        for container in containers:
            for mount in container.volume_mounts or []:
                if mount.name not in paths:
                    raise PodSetupError(f'volumeMount "{mount.name}" names no volume')
                source = paths[mount.name] / (mount.sub_path or "")
                link = self.root / mount.mount_path.lstrip("/")
                link.parent.mkdir(parents=True, exist_ok=True)
                if link.is_dir() and not link.is_symlink():
                    shutil.rmtree(link)
                elif link.is_symlink() or link.exists():
                    link.unlink()
                if mount.read_only and mount.name in written:
                    _copy(source, link)
                else:
                    link.symlink_to(source)
        self._write_kubeconfig()
        self.environments = {c.name: self._environment(c) for c in containers}

    def _write_kubeconfig(self) -> None:
        token_file = self.root / SERVICE_ACCOUNT_MOUNT.lstrip("/") / "token"
        if not token_file.exists():
            # automountServiceAccountToken: false, so the process gets no credentials.
            self.kubeconfig = None
            return
        self.kubeconfig = self.directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {
                        "server": self.cluster.server,
                        "certificate-authority": str(self.cluster.ca_cert),
                    },
                }
            ],
            "users": [{"name": "pod", "user": {"token": token_file.read_text().strip()}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {
                        "cluster": "in-cluster",
                        "user": "pod",
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "in-cluster",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))
        self.kubeconfig.chmod(0o600)

    # ----- environment -------------------------------------------------------------------------

    def _value_from(self, source: client.V1EnvVarSource) -> str | None:
        if source.field_ref is not None:
            return field_value(self.pod, source.field_ref.field_path)
        if source.secret_key_ref is not None:
            ref = source.secret_key_ref
            data = self._required("secret", ref.name, ref.optional)
        elif source.config_map_key_ref is not None:
            ref = source.config_map_key_ref
            data = self._required("configmap", ref.name, ref.optional)
        elif source.resource_field_ref is not None:
            return "0"
        else:
            return None
        if ref.key not in data:
            if ref.optional:
                return None
            raise PodSetupError(f'key "{ref.key}" not found in "{ref.name}"')
        value = data[ref.key]
        return value.decode(errors="replace") if isinstance(value, bytes) else value

    def _environment(self, container: client.V1Container) -> dict[str, str]:
        """Return ``container``'s process environment: the pod's variables over a base set."""
        env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
        env.update(
            {
                "HOME": str(self.directory / "home"),
                "HOSTNAME": self.pod.metadata.name,
                "AGENTFLOWS_POD_ROOT": str(self.root),
                # Where a real pod mounts runner.files; a Flow may not set this (its prefix is
                # the operator's), so the process kubelet points the runner at its copy.
                "AGENTFLOWS_FILES_ROOT": str(self.root / "var/run/agentflows/files"),
                # and where it mounts the run's ConfigMaps (agentflows.kube.mounted)
                "AGENTFLOWS_CONFIGMAPS_ROOT": str(self.root / "var/run/agentflows/configmaps"),
                # And at its copy of the secrets volume (agentflows.agents.secrets.root).
                "AGENTFLOWS_SECRETS_ROOT": str(self.root / "var/run/agentflows/secrets"),
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": self.cluster.server.rsplit(":", 1)[1],
            }
        )
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        for source in container.env_from or []:
            if source.config_map_ref is not None:
                ref = source.config_map_ref
                data = self._required("configmap", ref.name, ref.optional)
            elif source.secret_ref is not None:
                ref = source.secret_ref
                data = self._required("secret", ref.name, ref.optional)
            else:
                continue
            prefix = source.prefix or ""
            env.update({f"{prefix}{k}": v for k, v in data.items() if isinstance(v, str)})
        for variable in container.env or []:
            if variable.value_from is not None:
                value = self._value_from(variable.value_from)
                if value is not None:
                    env[variable.name] = value
            else:
                env[variable.name] = expand(variable.value or "", env)
        return env


def _copy(source: Path, target: Path) -> None:
    """Put a read-only mount in place as a copy of its volume (or of its subPath).

    A copy, not a link, so that a path under the mount resolves inside it, as under a real bind
    mount: a program that refuses paths leading out of a directory accepts the mount's files.
    """
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    elif source.exists():
        shutil.copy2(source, target)
    else:
        target.symlink_to(source)


def expand(text: str, env: dict[str, str]) -> str:
    """Expand ``$(NAME)`` references like Kubernetes does (``$$`` escapes, unknown names stay)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


def command_line(container: client.V1Container, env: dict[str, str]) -> list[str]:
    """Return the argv to run, ``command`` followed by ``args``.

    The image is ignored, so a container without ``command`` runs its ``args`` as the whole
    command line.
    """
    argv = [*(container.command or []), *(container.args or [])]
    return [expand(part, env) for part in argv]


def remove(directory: Path) -> None:
    """Delete a pod directory once the pod is gone (logs included)."""
    shutil.rmtree(directory, ignore_errors=True)
