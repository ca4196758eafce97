"""A small async Kubernetes API client over aiohttp: retries, watches, kubectl's credentials.

Why not the ``kubernetes`` package's API client here: it is synchronous, and we need only JSON
verbs on a handful of paths. Why aiohttp: the operator makes thousands of small requests, and
aiohttp spends about 0.4 ms of CPU on one where httpx spends 2.8 (measured on loopback against
the development API server); it is a dependency already (the webhook receiver). Credentials
come from its kubeconfig loader (:mod:`agentflows.kube.kubeconfig`), so the client
authenticates exactly as kubectl does; an expired exec-plugin credential is renewed in a
thread, and once more on a 401. Transient failures (connection errors, and the statuses of
:func:`agentflows.api.retry.status_may_help`: 408, 425, 429, 5xx) are retried with capped
exponential backoff (0.2 s doubling to 5 s), never sooner than the answer's ``Retry-After``
asks, while a retry would begin within ``retry_seconds``, so a runner or operator rides out an
API server that is away for a while; everything else raises :class:`ApiError` at once. Request
bodies are never logged.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp
import multidict

from agentflows import api as api_group
from agentflows.api import errors, retry
from agentflows.kube import kubeconfig

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
GROUP_PATH = f"/apis/{api_group.API_VERSION}"
#: The delays between tries of one request: 0.2 s doubling to 5 s.
RETRY_INITIAL_SECONDS = 0.2
RETRY_CAP_SECONDS = 5.0


class ApiError(errors.AgentflowsError):
    """The API server refused a request. ``status`` is the HTTP status (0: no answer).

    ``retryable`` (no answer, or :func:`~agentflows.api.retry.status_may_help`) speaks of this
    one request: the client itself tries such a request again within ``retry_seconds``.
    """

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message if status == 0 else f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        #: Seconds the server's ``Retry-After`` asked to wait (429, 503), if it said.
        self.retry_after = retry_after
        self.retryable = status == 0 or retry.status_may_help(status)

    @property
    def not_found(self) -> bool:
        """404."""
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409 (AlreadyExists or a resourceVersion conflict)."""
        return self.status == 409


class Client:
    """JSON verbs on API paths, with retries of transient failures."""

    def __init__(
        self, config: kubeconfig.Config, *, retry_seconds: float = 120.0, timeout: float = 30.0
    ) -> None:
        self.config = config
        #: How one request is tried again: no retry starts that would begin after
        #: ``retry_seconds``.
        self.backoff = retry.Backoff(
            initial=RETRY_INITIAL_SECONDS, cap=RETRY_CAP_SECONDS, deadline=retry_seconds
        )
        self._timeout = timeout
        self._ssl = kubeconfig.ssl_context(config)
        self._session: aiohttp.ClientSession | None = None
        self._acting_as: tuple[tuple[str, str], ...] = ()
        #: Called with the method and the seconds of each answered request (the operator's
        #: ``agentflows_api_request_seconds``); watches are not counted.
        self.on_response: Callable[[str, float], None] | None = None

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool (made in the running event loop, at first use)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                self.config.server.rstrip("/"),
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=100),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                auto_decompress=True,
            )
        return self._session

    @classmethod
    def from_env(cls, path: str | None = None, context: str | None = None, **kwargs: Any) -> Client:
        """A client as kubectl would connect: ``--kubeconfig``, ``--context``, else in-cluster.

        Raises :class:`kubeconfig.ConfigError` when there are no usable credentials.
        """
        return cls(kubeconfig.load(path, context), **kwargs)

    def acting_as(self, headers: Iterable[tuple[str, str]]) -> Client:
        """A client on these connections and credentials whose requests all carry ``headers``.

        The console acts for a user with ``Impersonate-User``/``Impersonate-Group`` headers
        (a name may repeat: one ``Impersonate-Group`` per group); the API server checks that
        this client may impersonate, then authorizes the request as that user. Close only this
        client, not the views it hands out: they share its connection pool.
        """
        view = copy.copy(self)
        view._session = self._http()
        view._acting_as = tuple(headers)
        return view

    async def close(self) -> None:
        """Close connections."""
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _headers(self, content_type: str | None) -> multidict.CIMultiDict[str]:
        headers = multidict.CIMultiDict([("Accept", "application/json"), *self._acting_as])
        if self.config.stale():
            await asyncio.to_thread(self.config.renew)
        authorization = self.config.authorization()
        if authorization:
            headers["Authorization"] = authorization
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
    ) -> bytes:
        """Send one request, retrying transient failures; the answer's body."""
        loop = asyncio.get_running_loop()
        tries = self.backoff.tries(loop.time)
        renewed = False
        query = _query(params)
        while True:
            try:
                headers = await self._headers(content_type)
                headers["Accept"] = accept
                sent = loop.time()
                async with self._http().request(
                    method, path, data=content, params=query, headers=headers
                ) as response:
                    body = await response.read()
                if self.on_response is not None:
                    self.on_response(method, loop.time() - sent)
                if response.status < 400:
                    return body
                if response.status == 401 and self.config.renewable and not renewed:
                    renewed = True
                    await asyncio.to_thread(self.config.renew)
                    continue
                error = _error_of(response.status, response.reason or "", body)
                error.retry_after = retry.retry_after(response.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = unreachable(self.config.server, exc)
            delay = tries.failed(error.retry_after) if error.retryable else None
            if delay is None:
                raise error
            asked = retry.retry_after_note(error.retry_after)
            log.info("%s %s: %s; retrying in %.1fs%s", method, path, error.reason, delay, asked)
            await asyncio.sleep(delay)

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
        answer = await self._send(method, path, content, params, content_type, accept)
        return json.loads(answer) if answer else None

    async def request_text(self, method: str, path: str, **params: Any) -> str:
        """A request whose answer is text (pod logs)."""
        answer = await self._send(method, path, None, params or None, None)
        return answer.decode(errors="replace")

    async def get(self, path: str, **params: Any) -> Any:
        """GET."""
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: Any) -> Any:
        """POST a new object."""
        return await self.request("POST", path, body)

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
        # events are lines of JSON of any length (a FlowRun may be a megabyte)
        async for line in self._lines(path, query, read_seconds=timeout_seconds + 30):
            if line.strip():
                yield json.loads(line)

    async def follow_lines(self, path: str, **params: Any) -> AsyncIterator[str]:
        """Yield the lines of an answer that goes on (a pod's log with ``follow=true``).

        No read timeout: a followed log may be silent for as long as its container thinks.
        """
        async for line in self._lines(path, params, read_seconds=None):
            yield line.decode(errors="replace")

    async def _lines(
        self, path: str, query: dict[str, Any], *, read_seconds: float | None
    ) -> AsyncIterator[bytes]:
        """The lines of a streamed GET as they arrive, until the server ends the answer."""
        headers = await self._headers(None)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=read_seconds)
        try:
            async with self._http().get(
                path, params=_query(query), headers=headers, timeout=timeout
            ) as response:
                if response.status >= 400:
                    raise _error_of(response.status, response.reason or "", await response.read())
                pending = b""
                async for chunk in response.content.iter_any():
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        yield line
                if pending:
                    yield pending
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unreachable(self.config.server, exc) from exc


def _query(params: dict[str, Any] | None) -> dict[str, str] | None:
    """Query parameters as the strings a URL carries (``true``, not ``True``)."""
    if not params:
        return None
    return {
        k: ("true" if v is True else "false" if v is False else str(v)) for k, v in params.items()
    }


def unreachable(server: str, exc: BaseException) -> ApiError:
    """``cannot reach https://...: connection refused``: the cause in words, not a class name."""
    why = str(exc) or type(exc).__name__
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            # asyncio's strerror names the address; the errno's own text is kubectl's wording
            why = (os.strerror(cause.errno) if cause.errno > 0 else cause.strerror or why).lower()
            break
        if isinstance(cause, BaseExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]
        else:
            cause = cause.__cause__ or cause.__context__
    return ApiError(0, "Unreachable", f"cannot reach {server}: {why}")


def _error_of(status: int, reason: str, body: bytes) -> ApiError:
    try:
        answer = json.loads(body)
        return ApiError(status, answer.get("reason", ""), answer.get("message", ""))
    except (ValueError, AttributeError):
        return ApiError(status, reason, body[:500].decode(errors="replace"))


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
    elif plural in ("roles", "rolebindings"):
        base = "/apis/rbac.authorization.k8s.io/v1"
    else:
        base = GROUP_PATH
    path = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path
