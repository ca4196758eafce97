"""Kubeconfig files for :func:`agentflows.kube.kubeconfig.load`, read by the library's loader.

Imported only when there are kubeconfig files (the package is slow to import). The library
merges the files, picks the context and loads tokens, token files, basic auth, OIDC and legacy
auth providers with their refresh; ``*-data`` certificates and keys are taken out of the merged
config first and kept in memory, and exec plugins run here through the library's
:class:`ExecProvider` (see :mod:`agentflows.kube.kubeconfig` for why).
"""

from __future__ import annotations

import base64
import copy
import datetime
import os
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.config import config_exception, exec_provider, kube_config

from agentflows.api import times
from agentflows.kube import kubeconfig_types as kubeconfig

#: Seconds before a credential's expiry at which it is renewed.
EXPIRY_MARGIN = datetime.timedelta(seconds=10)
#: Per list of the kubeconfig: the entry's key and its ``*-data`` keys kept in memory.
_DATA_KEYS = {
    "clusters": ("cluster", ("certificate-authority-data",)),
    "users": ("user", ("client-certificate-data", "client-key-data")),
}


class ExecCredential:
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
            raise kubeconfig.ConfigError(
                f"exec plugin {self.command}: {exc}", retryable=True
            ) from None
        if not status.get("token") and not status.get("clientCertificateData"):
            raise kubeconfig.ConfigError(
                f"exec plugin {self.command}: no token or clientCertificateData"
            )
        self.status = status
        expiry = status.get("expirationTimestamp")
        self.expiry = times.parse_time(expiry) if isinstance(expiry, str) else None
        if expiry and self.expiry is None:
            raise kubeconfig.ConfigError(
                f"exec plugin {self.command}: status.expirationTimestamp {expiry!r} is not an "
                "RFC 3339 time (e.g. 2026-01-02T03:04:05Z)"
            )

    def stale(self) -> bool:
        """True when the credential has expired (or is about to)."""
        return self.expiry is not None and times.now() >= self.expiry - EXPIRY_MARGIN


def load(paths: list[str], context: str | None) -> kubeconfig.Config:
    """Credentials of ``context`` (default: the current one) from the merged ``paths``."""
    try:
        return _from_files(paths, context)
    except (config_exception.ConfigException, OSError, ValueError) as exc:
        raise kubeconfig.ConfigError(f"kubeconfig {os.pathsep.join(paths)}: {exc}") from None


def _from_files(paths: list[str], context: str | None) -> kubeconfig.Config:
    merger = kube_config.KubeConfigMerger(os.pathsep.join(paths))
    merged = merger.config
    if merged is None:
        raise kubeconfig.ConfigError("no kubeconfig: set KUBECONFIG or --kubeconfig")
    data = _take_data(merged)
    names = [str(c["name"]) for c in merged.value.get("contexts") or []]
    chosen = context or _first_current_context(merger)
    if not chosen:
        raise kubeconfig.ConfigError(
            f"no current-context in {os.pathsep.join(paths)}: give --context"
        )
    if chosen not in names:
        raise kubeconfig.ConfigError(
            f'context "{chosen}" not in kubeconfig (have: {", ".join(names)})'
        )
    loader = kube_config.KubeConfigLoader(
        config_dict=merged, active_context=chosen, config_base_path=None
    )
    current = loader.current_context["context"]
    cluster_data = data["clusters"].get(str(current["cluster"]), {})
    user_data = data["users"].get(str(current.get("user", "")), {})
    library = k8s_client.Configuration()
    exec_credential = _exec_credential(merged, current)
    loader.load_and_set(library)
    config = kubeconfig.Config(
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
) -> ExecCredential | None:
    """The context's exec plugin, run once (None when the user has none, or a token first)."""
    if not current.get("user"):
        return None
    user = merged["users"].get_with_name(current["user"], safe=True)
    static = ("token", "tokenFile", "auth-provider")
    if user is None or "exec" not in user["user"] or any(k in user["user"] for k in static):
        return None
    cluster = merged["clusters"].get_with_name(current["cluster"])["cluster"]
    cwd = str(Path(user.path).resolve().parent) if user.path else ""
    credential = ExecCredential(user["user"]["exec"], cwd, cluster)
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
