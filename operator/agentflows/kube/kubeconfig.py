"""Cluster credentials read as kubectl reads them, with the ``kubernetes`` package's loader.

:func:`load` takes ``--kubeconfig`` (else every path of ``$KUBECONFIG``, merged: the first file
to name a cluster, user, context or the current context wins; else ``~/.kube/config``; else the
pod's service account) and ``--context``. The library does the merging, contexts, tokens and
token files, basic auth, OIDC and legacy auth providers (with their refresh). In a pod without
a kubeconfig, the service account's CA and token file (re-read per request: it rotates) are
used, as the library's in-cluster loader does. Two things the library does differently from
kubectl are done here instead:

- ``*-data`` certificates and keys: the library writes each to a temporary file kept until the
  process exits (forever, if it is killed). They are taken out of the merged config before the
  library sees it and kept in memory; :func:`ssl_context` builds the TLS context from memory
  (a client key goes through an anonymous ``memfd``, never a named file).
- ``exec`` credential plugins (client.authentication.k8s.io/v1 and v1beta1): the library logs a
  failing plugin and goes on with no credentials, and writes certificates a plugin returns to
  temporary files. Here the library's :class:`ExecProvider` runs the plugin, a failure is an
  error in words, and the credential is re-run when it expires or the server answers 401.

The files are read by :mod:`agentflows.kube.kubeconfig_files`, imported only when there are
files: importing the ``kubernetes`` package costs about 0.3 s and 40 MB, and a runner pod on a
real cluster (no kubeconfig, the service account's token file and CA) should not pay it. One
plain file (a context whose user has only a token, a token file or a client certificate, the
kind a pod is given) is read here without the library, for the same reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentflows.api import runner as runner_api
from agentflows.kube.kubeconfig_types import Config as Config
from agentflows.kube.kubeconfig_types import ConfigError as ConfigError

SERVICE_ACCOUNT_DIR = Path(runner_api.SERVICE_ACCOUNT_DIR)
_PLAIN_CLUSTER_KEYS = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
)
_PLAIN_USER_KEYS = frozenset(
    {
        "token",
        "tokenFile",
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
    }
)


def kubeconfig_paths(path: str | None) -> list[str]:
    """The kubeconfig files to merge, as kubectl picks them; [] means in-cluster."""
    if path:
        if not Path(path).expanduser().is_file():
            raise ConfigError(f"kubeconfig {path}: no such file")
        return [path]
    env = os.environ.get("KUBECONFIG", "")
    found = [p for p in env.split(os.pathsep) if p and Path(p).expanduser().is_file()]
    if found or env.strip(os.pathsep):
        return found
    default = Path.home() / ".kube" / "config"
    return [str(default)] if default.is_file() else []


def load(path: str | None = None, context: str | None = None) -> Config:
    """Credentials of ``context`` (default: the current one) from kubeconfig, else in-cluster."""
    paths = kubeconfig_paths(path)
    if not paths:
        if context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ConfigError("no kubeconfig: set KUBECONFIG or --kubeconfig")
        return _in_cluster()
    if len(paths) == 1:
        plain = _plain_file(Path(paths[0]).expanduser(), context)
        if plain is not None:
            return plain
    from agentflows.kube import kubeconfig_files

    return kubeconfig_files.load(paths, context)


def _plain_file(path: Path, context: str | None) -> Config | None:
    """``context`` of one kubeconfig file that needs no loader (None: let the library read it).

    Plain means: the context exists, its cluster has a server and only a CA (file or data) or
    ``insecure-skip-tls-verify``, and its user only a token, a token file or a client
    certificate and key (files or data). That is what a pod's kubeconfig holds (the dev
    cluster's process kubelet writes one), and what a runner needs to start without importing
    the library. Anything else (exec plugins, auth providers, passwords, impersonation, a
    proxy, a malformed file) goes to the library, which also words the errors.
    """
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text) if text.lstrip().startswith("{") else _yaml_document(text)
        chosen = context or doc.get("current-context")
        current = _named(doc.get("contexts"), chosen, "context")
        cluster = _named(doc.get("clusters"), current.get("cluster"), "cluster")
        user = _named(doc.get("users"), current.get("user"), "user") if "user" in current else {}
    except (OSError, ValueError, AttributeError, LookupError, TypeError):
        return None
    if (
        set(current) - {"cluster", "user", "namespace"}
        or set(cluster) - _PLAIN_CLUSTER_KEYS
        or set(user) - _PLAIN_USER_KEYS
        or not isinstance(cluster.get("server"), str)
    ):
        return None
    base = path.parent

    def file_of(key: str) -> str | None:
        value = cluster.get(key) if key in cluster else user.get(key)
        return str(base / str(value)) if value else None

    def data_of(entry: dict[str, Any], key: str) -> str | None:
        value = entry.get(key)
        return base64.b64decode(str(value)).decode() if value else None

    return Config(
        server=cluster["server"].rstrip("/"),
        namespace=str(current.get("namespace") or "default"),
        ca_file=file_of("certificate-authority"),
        ca_data=data_of(cluster, "certificate-authority-data"),
        cert_file=file_of("client-certificate"),
        cert_data=data_of(user, "client-certificate-data"),
        key_file=file_of("client-key"),
        key_data=data_of(user, "client-key-data"),
        insecure=cluster.get("insecure-skip-tls-verify") is True,
        token=str(user["token"]) if user.get("token") else None,
        token_file=file_of("tokenFile") if not user.get("token") else None,
    )


def _yaml_document(text: str) -> dict[str, Any]:
    import yaml  # only for a kubeconfig that is not JSON

    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise ValueError("not a kubeconfig")
    return doc


def _named(entries: Any, name: Any, key: str) -> dict[str, Any]:
    """The ``key`` mapping of the entry called ``name`` in a kubeconfig list."""
    for entry in entries:
        if entry["name"] == name:
            found = entry[key]
            if not isinstance(found, dict):
                raise ValueError(f"{key} {name} is not a mapping")
            return found
    raise LookupError(name)


def _in_cluster() -> Config:
    """The pod's service account, as the library's in-cluster loader reads it."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token, ca = SERVICE_ACCOUNT_DIR / "token", SERVICE_ACCOUNT_DIR / "ca.crt"
    if not token.is_file() or not ca.is_file():
        raise ConfigError(f"in-cluster config: no service-account token or CA in {token.parent}")
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    return Config(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
        ca_file=str(ca),
        token_file=str(token),
    )


def ssl_context(config: Config) -> ssl.SSLContext | bool:
    """The TLS context of ``config``, built from memory (False: verification is off)."""
    if config.insecure:
        return False
    context = ssl.create_default_context(cafile=config.ca_file, cadata=config.ca_data)
    if config.cert_file and config.key_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    elif config.cert_data and config.key_data:
        with _anonymous_file(config.cert_data) as cert, _anonymous_file(config.key_data) as key:
            context.load_cert_chain(cert, key)
    return context


@contextlib.contextmanager
def _anonymous_file(text: str) -> Iterator[str]:
    """A path to ``text`` that names no file on disk where the OS allows (Linux memfd)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("agentflows-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, text.encode())
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile(prefix="agentflows-", suffix=".pem") as handle:
        handle.write(text.encode())
        handle.flush()
        yield handle.name
