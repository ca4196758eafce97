"""Cluster credentials read as kubectl reads them, with the ``kubernetes`` package's loader.

:func:`load` takes ``--kubeconfig`` (else every path of ``$KUBECONFIG``, merged: the first file
to name a cluster, user, context or the current context wins; else ``~/.kube/config``; else the
pod's service account) and ``--context``. The library does the merging, contexts, tokens and
token files, basic auth, OIDC and legacy auth providers (with their refresh) and in-cluster
config. Two things it does differently from kubectl are done here instead:

- ``*-data`` certificates and keys: the library writes each to a temporary file kept until the
  process exits (forever, if it is killed). They are taken out of the merged config before the
  library sees it and kept in memory; :func:`ssl_context` builds the TLS context from memory
  (a client key goes through an anonymous ``memfd``, never a named file).
- ``exec`` credential plugins (client.authentication.k8s.io/v1 and v1beta1): the library logs a
  failing plugin and goes on with no credentials, and writes certificates a plugin returns to
  temporary files. Here the library's :class:`ExecProvider` runs the plugin, a failure is an
  error in words, and the credential is re-run when it expires or the server answers 401.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import datetime
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.config import config_exception, exec_provider, incluster_config, kube_config

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Seconds before a credential's expiry at which it is renewed.
EXPIRY_MARGIN = datetime.timedelta(seconds=10)
#: Per list of the kubeconfig: the entry's key and its ``*-data`` keys kept in memory.
_DATA_KEYS = {
    "clusters": ("cluster", ("certificate-authority-data",)),
    "users": ("user", ("client-certificate-data", "client-key-data")),
}


class ConfigError(Exception):
    """The cluster credentials cannot be loaded; the message says why in words."""


class _ExecCredential:
    """An ``exec`` plugin's credential, re-run when it expires or is refused."""

    def __init__(self, spec: kube_config.ConfigNode, cwd: str, cluster: Any) -> None:
        self._provider = exec_provider.ExecProvider(spec, cwd, cluster)
        self.command = str(spec["command"])
        self.status: dict[str, Any] = {}
        self.expiry: datetime.datetime | None = None

    def run(self) -> None:
        """Run the plugin (blocking); raise :class:`ConfigError` when it fails."""
        try:
            status = self._provider.run(previous_response=self.status or None)
        except config_exception.ConfigException as exc:
            raise ConfigError(f"exec plugin {self.command}: {exc}") from None
        if not status.get("token") and not status.get("clientCertificateData"):
            raise ConfigError(f"exec plugin {self.command}: no token or clientCertificateData")
        self.status = status
        expiry = status.get("expirationTimestamp")
        self.expiry = kube_config.parse_rfc3339(expiry) if expiry else None

    def stale(self) -> bool:
        """True when the credential has expired (or is about to)."""
        now = datetime.datetime.now(datetime.UTC)
        return self.expiry is not None and now >= self.expiry - EXPIRY_MARGIN


@dataclasses.dataclass
class Config:
    """Where the API server is and how to authenticate (secrets stay in memory)."""

    server: str
    namespace: str = "default"
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    cert_data: str | None = None
    key_file: str | None = None
    key_data: str | None = dataclasses.field(default=None, repr=False)
    insecure: bool = False
    token: str | None = dataclasses.field(default=None, repr=False)
    library: k8s_client.Configuration | None = dataclasses.field(default=None, repr=False)
    exec_credential: _ExecCredential | None = dataclasses.field(default=None, repr=False)

    def authorization(self) -> str | None:
        """The ``Authorization`` header value; the library refreshes what it loaded."""
        if self.exec_credential is not None:
            token = self.exec_credential.status.get("token")
            return f"Bearer {token}" if token else None
        if self.library is None:
            return f"Bearer {self.token}" if self.token else None
        value = self.library.get_api_key_with_prefix("BearerToken")
        return str(value) if value else None

    @property
    def expiration(self) -> datetime.datetime | None:
        """When the current credential expires (None: not known to)."""
        return self.exec_credential.expiry if self.exec_credential else None

    @property
    def renewable(self) -> bool:
        """True when a refused credential can be renewed (an exec plugin's)."""
        return self.exec_credential is not None

    def stale(self) -> bool:
        """True when :meth:`renew` should run before the next request."""
        return self.exec_credential is not None and self.exec_credential.stale()

    def renew(self) -> None:
        """Run the exec plugin again (blocking: call it in a thread from async code)."""
        if self.exec_credential is not None:
            self.exec_credential.run()


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
    try:
        return _from_files(paths, context)
    except (config_exception.ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"kubeconfig {os.pathsep.join(paths)}: {exc}") from None


def _from_files(paths: list[str], context: str | None) -> Config:
    merger = kube_config.KubeConfigMerger(os.pathsep.join(paths))
    merged = merger.config
    if merged is None:
        raise ConfigError("no kubeconfig: set KUBECONFIG or --kubeconfig")
    data = _take_data(merged)
    names = [str(c["name"]) for c in merged.value.get("contexts") or []]
    chosen = context or _first_current_context(merger)
    if not chosen:
        raise ConfigError(f"no current-context in {os.pathsep.join(paths)}: give --context")
    if chosen not in names:
        raise ConfigError(f'context "{chosen}" not in kubeconfig (have: {", ".join(names)})')
    loader = kube_config.KubeConfigLoader(
        config_dict=merged, active_context=chosen, config_base_path=None
    )
    current = loader.current_context["context"]
    cluster_data = data["clusters"].get(str(current["cluster"]), {})
    user_data = data["users"].get(str(current.get("user", "")), {})
    library = k8s_client.Configuration()
    exec_credential = _exec_credential(merged, current)
    loader.load_and_set(library)
    config = Config(
        server=str(library.host).rstrip("/"),
        namespace=str(current.get("namespace") or "default"),
        ca_file=library.ssl_ca_cert,
        ca_data=_pem(cluster_data.get("certificate-authority-data")),
        cert_file=library.cert_file,
        cert_data=_pem(user_data.get("client-certificate-data")),
        key_file=library.key_file,
        key_data=_pem(user_data.get("client-key-data")),
        insecure=not library.verify_ssl,
        library=library,
        exec_credential=exec_credential,
    )
    if exec_credential is not None and exec_credential.status.get("clientCertificateData"):
        config.cert_data = str(exec_credential.status["clientCertificateData"])
        config.key_data = str(exec_credential.status.get("clientKeyData") or "")
    return config


def _exec_credential(
    merged: kube_config.ConfigNode, current: dict[str, Any]
) -> _ExecCredential | None:
    """The context's exec plugin, run once (None when the user has none, or a token first)."""
    if not current.get("user"):
        return None
    user = merged["users"].get_with_name(current["user"], safe=True)
    static = ("token", "tokenFile", "auth-provider")
    if user is None or "exec" not in user["user"] or any(k in user["user"] for k in static):
        return None
    cluster = merged["clusters"].get_with_name(current["cluster"])["cluster"]
    cwd = str(Path(user.path).resolve().parent) if user.path else ""
    credential = _ExecCredential(user["user"]["exec"], cwd, cluster)
    credential.run()
    # the library would run it again, swallow its errors and write its certificates to files
    user["user"].value.pop("exec")
    return credential


def _first_current_context(merger: kube_config.KubeConfigMerger) -> str | None:
    """The current context by kubectl's rule: the first file to set it wins (library: the last)."""
    for path in merger.paths:
        value = (merger.config_files.get(path) or {}).get("current-context")
        if value:
            return str(value)
    return None


def _take_data(merged: kube_config.ConfigNode) -> dict[str, dict[str, dict[str, str]]]:
    """Move the ``*-data`` keys out of the merged config (copies: the files stay as they are)."""
    taken: dict[str, dict[str, dict[str, str]]] = {}
    for list_key, (entry_key, data_keys) in _DATA_KEYS.items():
        taken[list_key] = {}
        for node in merged.value.get(list_key) or []:
            entry = node.value if isinstance(node, kube_config.ConfigNode) else node
            inner = copy.deepcopy(entry.get(entry_key) or {})
            found = {k: inner.pop(k) for k in data_keys if inner.get(k)}
            if isinstance(node, kube_config.ConfigNode):
                node.value = {**entry, entry_key: inner}
            else:
                entry[entry_key] = inner
            taken[list_key][str(entry["name"])] = found
    return taken


def _pem(data: str | None) -> str | None:
    """A kubeconfig ``*-data`` value (base64 of PEM) as PEM text."""
    return base64.b64decode(data).decode() if data else None


def _in_cluster() -> Config:
    library = k8s_client.Configuration()
    try:
        incluster_config.InClusterConfigLoader(
            token_filename=str(SERVICE_ACCOUNT_DIR / "token"),
            cert_filename=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        ).load_and_set(library)
    except config_exception.ConfigException as exc:
        raise ConfigError(f"in-cluster config: {exc}") from None
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    return Config(
        server=str(library.host),
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
        ca_file=library.ssl_ca_cert,
        library=library,
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
