"""A small async Kubernetes API client over httpx: kubeconfig, retries, watches.

Why not the ``kubernetes`` package here: it is synchronous and slow to import (the runner's
cold start counts), and we need only JSON verbs on a handful of paths. Transient failures
(connection errors, 429, 5xx) are retried with capped exponential backoff up to
``retry_seconds``, so a runner or operator rides out an API server that is away for a while;
everything else raises :class:`ApiError` at once. Request bodies are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
GROUP_PATH = "/apis/agentflows.io/v1alpha1"


class ApiError(Exception):
    """The API server refused a request. ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        """404."""
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409 (AlreadyExists or a resourceVersion conflict)."""
        return self.status == 409

    @property
    def retryable(self) -> bool:
        """True when trying again later may help."""
        return self.status in (0, 429) or self.status >= 500


@dataclasses.dataclass
class Config:
    """Where the API server is and how to authenticate."""

    server: str
    namespace: str = "default"
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    def bearer(self) -> str | None:
        """The bearer token, re-read from its file (projected tokens rotate)."""
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token


def _data_file(data: str, suffix: str) -> str:
    with tempfile.NamedTemporaryFile(prefix="agentflows-", suffix=suffix, delete=False) as handle:
        handle.write(base64.b64decode(data))
    os.chmod(handle.name, 0o600)
    return handle.name


def load_config(path: str | None = None, context: str | None = None) -> Config:
    """Load a kubeconfig (``path``, ``$KUBECONFIG`` or ``~/.kube/config``), else in-cluster."""
    candidate = path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    if candidate is None and (Path.home() / ".kube" / "config").exists():
        candidate = str(Path.home() / ".kube" / "config")
    if candidate is None:
        return _in_cluster()
    doc = yaml.safe_load(Path(candidate).read_text())
    ctx_name = context or doc.get("current-context")
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    user: dict[str, Any] = next(
        (u["user"] for u in doc.get("users", []) if u["name"] == ctx.get("user")), {}
    )
    base = Path(candidate).parent

    def file_of(entry: dict[str, Any], key: str, suffix: str) -> str | None:
        if entry.get(f"{key}-data"):
            return _data_file(entry[f"{key}-data"], suffix)
        if entry.get(key):
            return str(base / entry[key])
        return None

    return Config(
        server=cluster["server"].rstrip("/"),
        namespace=ctx.get("namespace", "default"),
        token=user.get("token"),
        token_file=str(base / user["tokenFile"]) if user.get("tokenFile") else None,
        ca_file=file_of(cluster, "certificate-authority", ".crt"),
        cert_file=file_of(user, "client-certificate", ".crt"),
        key_file=file_of(user, "client-key", ".key"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def _in_cluster() -> Config:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ApiError(
            0, "NoConfig", "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod"
        )
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    return Config(
        server=f"https://{host}:{port}",
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
        token_file=str(SERVICE_ACCOUNT_DIR / "token"),
        ca_file=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
    )


def _ssl_context(config: Config) -> ssl.SSLContext | bool:
    if config.insecure:
        return False
    context = ssl.create_default_context(cafile=config.ca_file)
    if config.cert_file and config.key_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


class Client:
    """JSON verbs on API paths, with retries of transient failures."""

    def __init__(
        self, config: Config, *, retry_seconds: float = 120.0, timeout: float = 30.0
    ) -> None:
        self.config = config
        self.retry_seconds = retry_seconds
        self._http = httpx.AsyncClient(
            base_url=config.server, verify=_ssl_context(config), timeout=timeout
        )

    @classmethod
    def from_env(cls, kubeconfig: str | None = None, **kwargs: Any) -> Client:
        """A client from the kubeconfig or the pod's service account."""
        return cls(load_config(kubeconfig), **kwargs)

    async def close(self) -> None:
        """Close connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self.config.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def _send(
        self,
        method: str,
        path: str,
        content: bytes | None,
        params: dict[str, Any] | None,
        content_type: str | None,
        accept: str = "application/json",
    ) -> httpx.Response:
        """Send one request, retrying transient failures with capped exponential backoff."""
        delay = 0.2
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_seconds
        while True:
            try:
                headers = self._headers(content_type)
                headers["Accept"] = accept
                response = await self._http.request(
                    method, path, content=content, params=params, headers=headers
                )
                if response.status_code < 400:
                    return response
                error = _error_of(response)
            except httpx.TransportError as exc:
                error = ApiError(0, "Unreachable", f"{type(exc).__name__}: {exc}")
            if not error.retryable or loop.time() + delay > deadline:
                raise error
            log.info("%s %s: %s; retrying in %.1fs", method, path, error.reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> Any:
        """Send a JSON request; return the decoded JSON answer."""
        content = None if body is None else json.dumps(body).encode()
        if content is not None and content_type is None:
            content_type = "application/json"
        response = await self._send(method, path, content, params, content_type, accept)
        return response.json() if response.content else None

    async def request_text(self, method: str, path: str, **params: Any) -> str:
        """A request whose answer is text (pod logs)."""
        response = await self._send(method, path, None, params or None, None)
        return response.text

    async def get(self, path: str, **params: Any) -> Any:
        """GET."""
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: Any) -> Any:
        """POST a new object."""
        return await self.request("POST", path, body)

    async def create_or_get(self, path: str, body: Any) -> Any:
        """Create, or return the existing object of that name (idempotent creates)."""
        try:
            return await self.create(path, body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            return await self.get(f"{path}/{body['metadata']['name']}")

    async def merge_patch(self, path: str, patch: Any) -> Any:
        """JSON merge patch (RFC 7386): only the keys given change; null deletes."""
        return await self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> Any:
        """JSON patch (RFC 6902), e.g. with a ``test`` operation for compare-and-set."""
        return await self.request("PATCH", path, operations, content_type=JSON_PATCH)

    async def delete(
        self,
        path: str,
        *,
        grace_seconds: int | None = None,
        missing_ok: bool = True,
        propagation: str | None = None,
    ) -> Any:
        """DELETE; a missing object is fine unless ``missing_ok`` is False."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if propagation:
            body["propagationPolicy"] = propagation
        try:
            return await self.request("DELETE", path, body)
        except ApiError as exc:
            if exc.not_found and missing_ok:
                return None
            raise

    async def watch(
        self,
        path: str,
        *,
        resource_version: str | None = None,
        timeout_seconds: int = 300,
        **params: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events ``{type, object}`` until the server ends the watch."""
        query: dict[str, Any] = {"watch": "true", "timeoutSeconds": timeout_seconds, **params}
        if resource_version:
            query["resourceVersion"] = resource_version
            query["allowWatchBookmarks"] = "true"
        async with self._http.stream(
            "GET", path, params=query, headers=self._headers(None), timeout=timeout_seconds + 30
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise _error_of(response)
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)


def _error_of(response: httpx.Response) -> ApiError:
    try:
        status = response.json()
        return ApiError(response.status_code, status.get("reason", ""), status.get("message", ""))
    except ValueError:
        return ApiError(response.status_code, response.reason_phrase, response.text[:500])


def path_of(
    plural: str, namespace: str | None, name: str | None = None, *, sub: str | None = None
) -> str:
    """The API path of a resource: core kinds and agentflows.io kinds by plural."""
    core = {"pods", "configmaps", "secrets", "events", "serviceaccounts", "namespaces"}
    batch = {"cronjobs", "jobs"}
    if plural in core:
        base = "/api/v1"
    elif plural in batch:
        base = "/apis/batch/v1"
    elif plural in ("leases",):
        base = "/apis/coordination.k8s.io/v1"
    else:
        base = GROUP_PATH
    path = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path
